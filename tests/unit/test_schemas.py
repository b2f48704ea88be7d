"""Subject mirroring decisions against an in-memory registry (:class:`tests.fakes.FakeRegistry`), plus the
registry client's error handling."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx
import pybreaker
import pytest
from pydantic import SecretStr

from mirror_core.config import SchemaRegistryConfig
from mirror_core.registry import (
    RETRY_AFTER_MAX,
    RegisteredSchema,
    RegistryClient,
    RegistryError,
    RegistryUnavailableError,
    Schema,
    SchemaReference,
    breaker_for,
    is_not_found,
    retry_after_seconds,
)
from mirror_core.schemas import (
    SubjectPair,
    apply_subjects,
    canonical_schema,
    make_id_resolver,
    plan_subjects,
    subject_pairs,
)
from mirror_core.wire import WireError
from tests.fakes import FakeRegistry, RefusingRegistry


def avro(name: str, *fields: str, ns: str = "t") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": ns,
                       "fields": [{"name": f, "type": "long"} for f in fields]})


V1 = avro("Order", "id")
V2 = avro("Order", "id", "qty")
V3 = avro("Order", "id", "qty", "price")
OTHER = avro("Order", "id", "other")


@pytest.fixture
def src() -> FakeRegistry:
    return FakeRegistry(url="http://src", next_id=0)


@pytest.fixture
def dst() -> FakeRegistry:
    return FakeRegistry(url="http://dst", next_id=500)


def pair(subject: str = "orders-value", mirror: str = "m1", dst_subject: str | None = None) -> SubjectPair:
    return SubjectPair(subject, dst_subject or subject, mirror)


def schema_strs(reg: FakeRegistry, subject: str) -> list[str]:
    return reg.live_schemas(subject)


# --------------------------------------------------------------------------- subject pairs


def test_subject_pairs_follow_topic_name_strategy_for_schema_serdes_only():
    assert subject_pairs("orders", "dr.orders", "g.orders", "string", "avro") == [
        SubjectPair("orders-value", "dr.orders-value", "g.orders")]
    assert subject_pairs("a", "b", "m", "protobuf", "json_schema") == [
        SubjectPair("a-key", "b-key", "m"), SubjectPair("a-value", "b-value", "m")]
    assert subject_pairs("a", "b", "m", "bytes", "string") == []


def test_canonical_form_ignores_key_order_whitespace_and_primitive_wrapping():
    pretty = '{\n  "namespace": "t", "type": "record", "name": "R",\n  "fields": [{"type": {"type": "string"}, "name": "s"}]}'
    compact = '{"type":"record","name":"R","namespace":"t","fields":[{"name":"s","type":"string"}]}'
    assert canonical_schema("AVRO", pretty) == canonical_schema("AVRO", compact)
    assert canonical_schema("AVRO", '"string"') == canonical_schema("AVRO", '{"type": "string"}')
    # field order and defaults are meaningful
    assert canonical_schema("AVRO", avro("R", "a", "b")) != canonical_schema("AVRO", avro("R", "b", "a"))
    proto_a = 'syntax = "proto3";\n// c\nmessage  Foo {\n  string a = 1;\n}\n'
    proto_b = 'syntax="proto3"; message Foo { string a=1; }'
    assert canonical_schema("PROTOBUF", proto_a) == canonical_schema("PROTOBUF", proto_b)
    assert canonical_schema("JSON", '{"b": 1, "a": {"y": 2, "x": 1}}') == canonical_schema(
        "JSON", '{"a":{"x":1,"y":2},"b":1}')


# --------------------------------------------------------------------------- strict


def test_strict_repairs_a_destination_prefix_in_order(src, dst):
    src_ids = src.add("orders-value", V1, V2, V3)
    dst_ids = dst.add("orders-value", V1)
    plan = plan_subjects(src, dst, [pair()], "strict", None)
    assert plan.errors == []
    assert [(s.action, s.source_version, s.level) for s in plan.steps] == [
        ("set_compatibility", None, "NONE"), ("unchanged", 1, None), ("register", 2, None), ("register", 3, None),
        ("set_compatibility", None, "BACKWARD")]
    assert dst.registrations() == [("register", "orders-value", V1, ())]  # planning wrote nothing new

    res = apply_subjects(src, dst, [pair()], "strict", None)
    assert res.errors == []
    assert schema_strs(dst, "orders-value") == schema_strs(src, "orders-value")
    dst_all = [v.schema_id for v in dst.subjects_["orders-value"]]
    assert res.id_map == dict(zip(src_ids, dst_all, strict=True))
    assert dst_all[0] == dst_ids[0]
    assert [s.action for s in res.steps_applied] == ["set_compatibility", "register", "register", "set_compatibility"]


def test_strict_conflict_names_first_differing_version_and_stops_only_that_mirror(src, dst):
    src.add("orders-value", V1, V2, V3)
    dst.add("orders-value", V1, OTHER)
    src.add("payments-value", V1)
    pairs = [pair("orders-value", "bad"), pair("payments-value", "good")]

    plan = plan_subjects(src, dst, pairs, "strict", None)
    assert [m for m, _ in plan.errors] == ["bad"]
    msg = plan.errors[0][1]
    assert "destination version 2 differs from source version 2" in msg
    assert '"other"' in msg and '"qty"' in msg
    assert any(s.action == "conflict" and s.mirror_name == "bad" for s in plan.steps)

    before = len(dst.writes)
    res = apply_subjects(src, dst, pairs, "strict", None)
    assert [m for m, _ in res.errors] == ["bad"]
    assert "destination version 2 differs from source version 2" in res.errors[0][1]
    assert all(w[1] == "payments-value" for w in dst.writes[before:])  # nothing written for the bad mirror
    assert schema_strs(dst, "payments-value") == schema_strs(src, "payments-value")
    assert len(dst.subjects_["orders-value"]) == 2


def test_strict_destination_with_more_versions_is_a_conflict(src, dst):
    src.add("orders-value", V1)
    dst.add("orders-value", V1, V2)
    plan = plan_subjects(src, dst, [pair()], "strict", None)
    assert "destination version 2 has no counterpart" in plan.errors[0][1]


def test_missing_source_subject_is_reported_not_an_error(src, dst):
    plan = plan_subjects(src, dst, [pair()], "strict", None)
    assert plan.errors == []
    assert [s.action for s in plan.steps] == ["missing_source"]


# --------------------------------------------------------------------------- lenient


def test_lenient_accepts_extra_destination_versions(src, dst):
    src.add("orders-value", V1, V2, V3)
    dst.add("orders-value", V1, OTHER, V2)
    res = apply_subjects(src, dst, [pair()], "lenient", None)
    assert res.errors == []
    got = schema_strs(dst, "orders-value")
    assert got == [canonical_schema("AVRO", s) for s in (V1, OTHER, V2, V3)]
    assert [s.source_version for s in res.steps_applied if s.action == "register"] == [3]
    assert set(res.id_map) == {v.schema_id for v in src.subjects_["orders-value"]}


def test_lenient_order_violation_is_a_conflict(src, dst):
    src.add("orders-value", V1, V2, V3)
    dst.add("orders-value", V2, V1)
    plan = plan_subjects(src, dst, [pair()], "lenient", None)
    assert len(plan.errors) == 1
    assert "destination version 1 holds source version 2 where source version 1 was expected" in plan.errors[0][1]


def test_lenient_with_compatibility_none_just_registers_what_is_missing(src, dst):
    src.add("orders-value", V1, V2, V3)
    dst.add("orders-value", V2, V1)
    res = apply_subjects(src, dst, [pair()], "lenient", "NONE")
    assert res.errors == []
    assert [w[2] for w in dst.registrations()[2:]] == [V3]
    assert len(res.id_map) == 3


def test_lenient_missing_middle_version_is_an_order_violation(src, dst):
    src.add("orders-value", V1, V2, V3)
    dst.add("orders-value", V1, V3)
    plan = plan_subjects(src, dst, [pair()], "lenient", None)
    assert "where source version 2 was expected" in plan.errors[0][1]


# --------------------------------------------------------------------------- compatibility


@dataclass
class CheckingRegistry(FakeRegistry):
    """A FakeRegistry that enforces a crude BACKWARD for Avro records (a new version may only keep or drop
    fields of the latest one), answering 409 as Confluent does; other levels accept anything."""

    def register(self, subject: str, schema_str: str, schema_type: str = "AVRO",
                 references: Sequence[SchemaReference] = (), normalize: bool = False, *,
                 schema_id: int | None = None, version: int | None = None) -> int:
        level = self.levels.get(subject, self.global_level)
        live = self.versions(subject)
        if live and level.startswith("BACKWARD") and self.lookup(subject, schema_str, schema_type, references) is None:
            fields = {f["name"] for f in json.loads(schema_str)["fields"]}
            latest = {f["name"] for f in json.loads(self.version(subject, live[-1]).schema_str)["fields"]}
            if not fields <= latest:
                raise RegistryError(f"Schema being registered is incompatible with an earlier schema for subject "
                                    f"{subject!r}", subject=subject, http_status=409, error_code=409)
        return super().register(subject, schema_str, schema_type, references, normalize, schema_id=schema_id,
                                version=version)


def test_history_is_copied_at_none_then_the_source_level_is_set(src):
    """A history registered under NONE and tightened to BACKWARD later is copied whole; the level comes last."""
    src.global_level = "NONE"
    src.add("orders-value", V1, V2, V3)
    src.levels["orders-value"] = "BACKWARD"
    dst = CheckingRegistry(url="http://dst", next_id=500)  # global BACKWARD: V2 after V1 would be refused
    res = apply_subjects(src, dst, [pair()], "strict", None)
    assert res.errors == []
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")
    assert [(w[0], w[2] if w[0] == "set_compatibility" else None) for w in dst.writes] == [
        ("set_compatibility", "NONE"), ("register", None), ("register", None), ("register", None),
        ("set_compatibility", "BACKWARD")]
    assert dst.levels["orders-value"] == "BACKWARD"
    assert apply_subjects(src, dst, [pair()], "strict", None).steps_applied == []  # and it stays done


def test_forced_level_stricter_than_the_history_is_set_after_copying_it(src):
    src.add("orders-value", V1, V2)
    src.levels["orders-value"] = "NONE"
    dst = CheckingRegistry(url="http://dst", next_id=500)
    dst.add("orders-value", V1)
    dst.levels["orders-value"] = "BACKWARD"  # as a forced level left it
    res = apply_subjects(src, dst, [pair()], "strict", "backward")
    assert res.errors == []
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")
    assert [w[2] for w in dst.writes if w[0] == "set_compatibility"] == ["NONE", "BACKWARD"]


def test_a_copy_that_stops_half_way_leaves_the_wanted_level_not_none(src):
    src.add("orders-value", V1, V2, V3)
    src.levels["orders-value"] = "FULL"
    dst = RefusingRegistry(url="http://dst", next_id=500, refuse=V2)
    res = apply_subjects(src, dst, [pair()], "strict", None)
    assert len(res.errors) == 1 and "HTTP 422" in res.errors[0][1]
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")[:1]
    assert dst.levels["orders-value"] == "FULL"


def test_compatibility_falls_back_to_source_global(src, dst):
    src.add("orders-value", V1)
    src.global_level = "FORWARD_TRANSITIVE"
    apply_subjects(src, dst, [pair()], "strict", None)
    assert dst.levels["orders-value"] == "FORWARD_TRANSITIVE"


def test_forced_compatibility_wins_and_equal_level_is_skipped(src, dst):
    src.add("orders-value", V1)
    src.levels["orders-value"] = "FULL"
    res = apply_subjects(src, dst, [pair()], "strict", "none")
    assert dst.levels["orders-value"] == "NONE"
    assert res.steps_applied[0].action == "set_compatibility" and res.steps_applied[0].level == "NONE"
    plan = plan_subjects(src, dst, [pair()], "strict", "NONE")
    assert [s.action for s in plan.steps] == ["unchanged"]


def test_unknown_mode_is_rejected(src, dst):
    with pytest.raises(Exception, match="unknown subject mirror mode"):
        plan_subjects(src, dst, [pair()], "sloppy", None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- references


ADDR_V1 = avro("Addr", "street")
ADDR_V2 = avro("Addr", "street", "zip")
ORDER_REF = json.dumps({"type": "record", "name": "Order", "namespace": "t",
                        "fields": [{"name": "id", "type": "long"}, {"name": "addr", "type": "t.Addr"}]})


def test_references_are_mirrored_first_with_translated_versions(src, dst):
    addr_ids = src.add("addr-value", ADDR_V1, ADDR_V2)
    order_id = src.add("orders-value", ORDER_REF, refs=[SchemaReference("t.Addr", "addr-value", 2)])[0]
    dst.add("addr-value", avro("Unrelated", "x"))  # lenient: an extra version shifts numbering by one

    plan = plan_subjects(src, dst, [pair()], "lenient", None)
    assert plan.errors == []
    subjects_in_order = [s.subject for s in plan.steps if s.action == "register"]
    assert subjects_in_order == ["addr-value", "addr-value", "orders-value"]

    res = apply_subjects(src, dst, [pair()], "lenient", None)
    assert res.errors == []
    registered = dst.subjects_["orders-value"][0]
    assert registered.references == (SchemaReference("t.Addr", "addr-value", 3),)
    assert set(res.id_map) == {*addr_ids, order_id}
    assert res.id_map[addr_ids[1]] == dst.subjects_["addr-value"][2].schema_id


def test_conflicting_reference_stops_the_referencing_mirror(src, dst):
    src.add("addr-value", ADDR_V1)
    src.add("orders-value", ORDER_REF, refs=[SchemaReference("t.Addr", "addr-value", 1)])
    dst.add("addr-value", ADDR_V2)
    res = apply_subjects(src, dst, [pair()], "strict", None)
    assert len(res.errors) == 1 and "addr-value" in res.errors[0][1]
    assert "orders-value" not in dst.subjects_


# --------------------------------------------------------------------------- idempotence and id preservation


def test_second_apply_registers_nothing_and_returns_the_full_id_map(src, dst):
    src.add("addr-value", ADDR_V1)
    src.add("orders-value", ORDER_REF, refs=[SchemaReference("t.Addr", "addr-value", 1)])
    src.add("orders-value", V1)
    src.levels["orders-value"] = "NONE"
    first = apply_subjects(src, dst, [pair()], "strict", None)
    writes = len(dst.writes)
    second = apply_subjects(src, dst, [pair()], "strict", None)
    assert first.errors == second.errors == []
    assert second.steps_applied == []
    assert len(dst.writes) == writes
    assert second.id_map == first.id_map and len(first.id_map) == 3


def test_id_preserving_refused_when_destination_does_not_honour_import(src, dst):
    src.add("orders-value", V1)
    res = apply_subjects(src, dst, [pair("orders-value", "a"), pair("orders-value", "b", "x-value")],
                         "strict", None, id_preserving=True)
    assert [m for m, _ in res.errors] == ["a", "b"]
    assert "does not preserve schema ids" in res.errors[0][1]
    assert "in-flight schema-id rewriting" in res.errors[0][1]
    assert dst.writes == []


def test_id_preserving_keeps_source_ids_where_honoured(src, dst):
    ids = src.add("orders-value", V1, V2)
    dst.honours_import = True
    res = apply_subjects(src, dst, [pair()], "strict", None, id_preserving=True)
    assert res.errors == []
    assert res.id_map == {i: i for i in ids}
    assert dst.modes.get("orders-value") == "READWRITE"  # restored


# --------------------------------------------------------------------------- in-flight resolver


def test_id_resolver_registers_a_miss_under_the_mapped_subject(src, dst):
    src.add("addr-value", ADDR_V1)
    (sid,) = src.add("orders-value", ORDER_REF, refs=[SchemaReference("t.Addr", "addr-value", 1)])
    resolve = make_id_resolver(src, dst, "orders", "dr.orders", not_found_retries=0)
    got = resolve(sid)
    assert got == dst.subjects_["dr.orders-value"][0].schema_id
    assert "addr-value" in dst.subjects_
    assert resolve(99999) is None


def _provisioned(src: FakeRegistry, dst: FakeRegistry, *schemas: str) -> list[int]:
    """The source subject holds ``schemas`` and the destination a strict copy of it."""
    ids = src.add("orders-value", *schemas)
    assert apply_subjects(src, dst, [pair()], "strict", None).errors == []
    return ids


def _checks_pass(src: FakeRegistry, dst: FakeRegistry) -> None:
    """The destination subject is the source's, as every provisioning check sees it."""
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")
    for mode in ("strict", "lenient"):
        assert plan_subjects(src, dst, [pair()], mode, None).errors == []  # type: ignore[arg-type]
    before = len(dst.writes)
    assert apply_subjects(src, dst, [pair()], "strict", None).errors == []
    assert dst.writes[before:] == []


def test_ids_missed_out_of_order_leave_the_destination_in_source_order(src, dst):
    _provisioned(src, dst, V1)
    id2, id3 = src.add("orders-value", V2, V3)
    resolve = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)
    got3 = resolve(id3)  # a partition with v3 records is read before one with v2 records
    got2 = resolve(id2)
    _checks_pass(src, dst)
    assert (got2, got3) == (dst.version("orders-value", 2).schema_id, dst.version("orders-value", 3).schema_id)


def test_a_version_no_record_uses_is_copied_before_the_one_records_need(src, dst):
    _provisioned(src, dst, V1)
    _, id3 = src.add("orders-value", V2, V3)  # v2 registered by CI, never used by a producer
    resolve = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)
    assert resolve(id3) == dst.version("orders-value", 3).schema_id
    _checks_pass(src, dst)


def test_a_miss_copies_only_up_to_the_version_needed(src, dst):
    _provisioned(src, dst, V1)
    id2, _ = src.add("orders-value", V2, V3)
    resolve = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)
    resolve(id2)
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")[:2]


def test_records_of_a_soft_deleted_version_resolve_without_changing_the_live_history(src, dst):
    ids = src.add("orders-value", V1, V2, V3)
    src.delete_version("orders-value", 2)  # records written with v2 are still in the topic
    assert apply_subjects(src, dst, [pair()], "strict", None).errors == []
    resolve = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)
    got = resolve(ids[1])
    assert got is not None and canonical_schema("AVRO", dst.schema_by_id(got).schema_str) == canonical_schema(
        "AVRO", V2)  # destination consumers decode the record
    _checks_pass(src, dst)
    # another writer (or a restart) missing the same id finds it and registers nothing again
    before = len(dst.writes)
    assert make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)(ids[1]) == got
    assert dst.writes[before:] == []


def test_a_soft_deleted_version_missed_first_comes_after_the_live_versions_before_it(src, dst):
    _provisioned(src, dst, V1)
    id2, id3 = src.add("orders-value", V2, V3)
    src.delete_version("orders-value", 2)
    resolve = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)
    assert resolve(id2) is not None and resolve(id3) is not None
    _checks_pass(src, dst)


def test_a_destination_already_in_conflict_still_gets_the_schema_records_need(src, dst):
    src.add("orders-value", V1, V2)
    dst.add("orders-value", V2, V1)  # out of order: even lenient mirroring cannot repair it
    (id3,) = src.add("orders-value", V3)
    got = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)(id3)
    assert got == dst.version("orders-value", 3).schema_id  # as before: records flow, provisioning reports


@pytest.mark.parametrize("status", [409, 422])
def test_a_refused_schema_is_a_dead_letter_reason_and_is_not_asked_again_at_once(src, status):
    dst = RefusingRegistry(url="http://dst", next_id=500, refuse=V3, status=status)
    clock = [0.0]
    _provisioned(src, dst, V1)
    id2, id3 = src.add("orders-value", V2, V3)
    resolve = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0, clock=lambda: clock[0])
    refused = resolve(id3)
    assert isinstance(refused, WireError) and refused.reason == "schema_registration_refused"
    assert f"schema id {id3}" in refused.detail and f"HTTP {status}" in refused.detail
    assert "orders-value version 3" in refused.detail and f"error code {status * 100 + 1}" in refused.detail
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")[:2]  # v2 copied before it
    assert resolve(id2) == dst.version("orders-value", 2).schema_id  # the other ids resolve
    dst.refuse = ""
    assert resolve(id3) == refused  # remembered for a while: a hot partition does not ask per record
    clock[0] += 61
    assert resolve(id3) == dst.version("orders-value", 3).schema_id  # then asked again


def test_an_earlier_version_refused_refuses_the_one_needed_with_its_version(src):
    dst = RefusingRegistry(url="http://dst", next_id=500, refuse=V2, status=409)
    _provisioned(src, dst, V1)
    _, id3 = src.add("orders-value", V2, V3)
    refused = make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)(id3)
    assert isinstance(refused, WireError) and "registering orders-value version 2" in refused.detail
    assert dst.live_schemas("orders-value") == src.live_schemas("orders-value")[:1]  # never out of order


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_fail_with_one_line_naming_the_registry(src, status):
    dst = RefusingRegistry(url="http://dst", next_id=500, status=status)
    _provisioned(src, dst, V1)
    (id2,) = src.add("orders-value", V2)
    dst.refuse = V2
    with pytest.raises(RegistryError) as err:
        make_id_resolver(src, dst, "orders", "orders", not_found_retries=0)(id2)
    msg = str(err.value)
    assert err.value.http_status == status and "\n" not in msg
    assert "http://dst" in msg and "POST /subjects/orders-value/versions" in msg and "credentials" in msg


# --------------------------------------------------------------------------- registry client (no network)


def _client(handler, **kw) -> tuple[RegistryClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)

    breaker = pybreaker.CircuitBreaker(fail_max=kw.pop("fail_max", 100), reset_timeout=60,
                                       exclude=[lambda e: isinstance(e, RegistryError) and not e.transient])
    client = RegistryClient("http://user:pw@reg/apis/ccompat/v7", auth=("user", "s3cret"), backoff=0.0,
                            breaker=breaker, http=httpx.Client(transport=httpx.MockTransport(record)), **kw)
    return client, seen


def test_registry_error_keeps_status_and_code_and_is_not_retried():
    client, seen = _client(lambda r: httpx.Response(404, json={"error_code": 40402, "message": "Version 9 not found."}),
                           retries=3)
    with pytest.raises(RegistryError) as info:
        client.version("orders-value", 9)
    err = info.value
    assert (err.http_status, err.error_code, err.subject) == (404, 40402, "orders-value")
    assert is_not_found(err) and len(seen) == 1
    assert "pw" not in str(err) and "s3cret" not in str(err)
    assert client.versions("orders-value") == []  # "not found" on versions() is an empty list


@pytest.mark.parametrize("code", [40401, 40402, 40403, 40408])
def test_is_not_found_codes(code):
    assert is_not_found(RegistryError("x", http_status=404, error_code=code))
    assert not is_not_found(RegistryError("x", http_status=409, error_code=409))


def test_5xx_is_retried_then_raised_with_status():
    client, seen = _client(lambda r: httpx.Response(503, json={"error_code": 50003, "message": "busy"}), retries=2)
    with pytest.raises(RegistryError) as info:
        client.subjects()
    assert len(seen) == 3 and info.value.http_status == 503 and info.value.error_code == 50003


def test_429_is_retried_after_the_registry_s_retry_after_bounded():
    answers = iter([httpx.Response(429, headers={"Retry-After": "3"}, json={"error_code": 42901, "message": "slow"}),
                    httpx.Response(429, headers={"Retry-After": "3600"}, json={}),
                    httpx.Response(200, json=["orders-value"])])
    slept: list[float] = []
    client, seen = _client(lambda r: next(answers), retries=3, sleep=slept.append)
    assert client.subjects() == ["orders-value"]
    assert len(seen) == 3 and slept == [3.0, RETRY_AFTER_MAX]


def test_429_without_retry_after_backs_off_and_is_transient_when_it_persists():
    slept: list[float] = []
    client, seen = _client(lambda r: httpx.Response(429, json={"error_code": 42901, "message": "slow"}), retries=2,
                           sleep=slept.append)
    with pytest.raises(RegistryError) as info:
        client.subjects()
    assert len(seen) == 3 and len(slept) == 2
    assert info.value.transient and info.value.http_status == 429  # an in-flight miss waits it out


def test_429_does_not_open_the_circuit_breaker():
    breaker = breaker_for(f"http://{uuid.uuid4().hex}", fail_max=2)  # the real one, with its exclusions
    client = RegistryClient("http://reg", retries=0, backoff=0.0, breaker=breaker,
                            http=httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(429, json={}))))
    for _ in range(5):
        with pytest.raises(RegistryError) as info:
            client.subjects()
        assert not isinstance(info.value, RegistryUnavailableError)
    assert breaker.current_state == "closed"


@pytest.mark.parametrize("value,seconds", [("7", 7.0), ("0", 0.0), ("-3", 0.0), ("soon", None), (None, None),
                                           ("Thu, 01 Jan 1970 00:01:40 GMT", 40.0)])
def test_retry_after_header_as_seconds_or_http_date(value, seconds):
    assert retry_after_seconds(value, now=60.0) == seconds


def test_breaker_opens_and_then_fails_without_calling():
    client, seen = _client(lambda r: httpx.Response(500, json={}), retries=1, fail_max=3)
    with pytest.raises(RegistryError):
        client.subjects()  # 2 attempts
    with pytest.raises(RegistryUnavailableError):
        client.subjects()  # 3rd attempt trips the breaker
    n = len(seen)
    for _ in range(5):
        with pytest.raises(RegistryUnavailableError):
            client.subjects()
    assert len(seen) == n == 3


def test_compatibility_not_set_detected_through_default_to_global():
    """Apicurio answers 200 NONE for a subject without a level; defaultToGlobal reveals it."""
    def handler(r: httpx.Request) -> httpx.Response:
        if r.url.path.endswith("/config"):
            return httpx.Response(200, json={"compatibilityLevel": "FULL"})
        if r.url.params.get("defaultToGlobal") == "true":
            return httpx.Response(200, json={"compatibilityLevel": "FULL" if "unset" in r.url.path else "NONE"})
        return httpx.Response(200, json={"compatibilityLevel": "NONE"})

    client, _ = _client(handler)
    assert client.subject_compatibility("unset-value") is None
    assert client.subject_compatibility("none-value") == "NONE"
    assert client.global_compatibility() == "FULL"
    gone, _ = _client(lambda r: httpx.Response(404, json={"error_code": 40408, "message": "not set"}))
    assert gone.subject_compatibility("x") is None


def test_secrets_never_in_repr_or_url():
    cfg = SchemaRegistryConfig(url="http://reg:8081", **{"basic.auth.user.info": SecretStr("key:topsecret")})
    client = RegistryClient.from_config(cfg)
    assert "topsecret" not in repr(client) and "topsecret" not in client.url
    client.close()
    client2, seen = _client(lambda r: httpx.Response(200, json=[]))
    assert client2.subjects() == []
    assert seen[0].headers["authorization"].startswith("Basic ")
    assert "pw@" not in client2.url and "s3cret" not in repr(client2)


def _import_mode_registry(assign) -> tuple[RegistryClient, list[httpx.Request]]:
    """A registry that accepts IMPORT mode; ``assign(requested_id)`` is the id it answers a register with."""
    def handler(r: httpx.Request) -> httpx.Response:
        if r.method == "POST" and r.url.path.endswith("/versions"):
            return httpx.Response(200, json={"id": assign(json.loads(r.content)["id"])})
        if r.method == "DELETE" and "/subjects/" in r.url.path:
            return httpx.Response(200, json=[1])
        return httpx.Response(200, json={"mode": "IMPORT"})

    return _client(handler)


@pytest.mark.parametrize("assign,honoured", [
    (lambda wanted: wanted, True),  # keeps the requested id (Confluent in IMPORT mode)
    (lambda wanted: 7, False),  # assigns its own (Apicurio)
    (lambda wanted: wanted + 1, False),  # close is not the same id
])
def test_id_preservation_probe_compares_the_id_it_got_back(assign, honoured):
    client, seen = _import_mode_registry(assign)
    assert client.probe_id_preservation() is honoured
    (mode, register, *cleanup) = seen
    assert mode.method == "PUT" and json.loads(mode.content) == {"mode": "IMPORT"}
    subject = mode.url.path.rsplit("/", 1)[1]
    assert subject.startswith("_mirrorflow-id-probe-") and register.url.path.endswith(f"/subjects/{subject}/versions")
    body = json.loads(register.content)
    assert body["version"] == 1 and body["id"] >= 1_000_000_000  # an explicit id, far from ones in use
    assert [(r.method, r.url.path.rsplit("/", 1)[1]) for r in cleanup] == [("DELETE", subject)] * 3
    n = len(seen)
    assert client.probe_id_preservation() is honoured and len(seen) == n  # cached: no second probe


@dataclass
class LaggingRegistry(FakeRegistry):
    """A source registry replica that has not yet seen the newest schemas: it answers "not found" for
    the first ``lag`` id lookups."""

    lag: int = 0
    id_lookups: int = 0

    def subject_versions_for_id(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        self.id_lookups += 1
        if self.id_lookups <= self.lag:
            return []
        return super().subject_versions_for_id(schema_id)


def test_item11_lagging_registry_not_found_is_retried_with_backoff(dst):
    src = LaggingRegistry(url="http://src", next_id=0, lag=2)
    sid = src.register("orders-value", V1)
    slept: list[float] = []
    resolve = make_id_resolver(src, dst, "orders", "dr.orders", not_found_retries=3, not_found_backoff=0.5,
                               sleep=slept.append)
    got = resolve(sid)
    assert got is not None and got == dst.version("dr.orders-value", 1).schema_id
    assert slept == [0.5, 1.0]  # two "not found" answers, exponential back-off

    # an id the source never knows: bounded (1 + retries lookups), then unknown for a while without asking again
    slept.clear()
    before = src.id_lookups
    assert resolve(424242) is None
    assert src.id_lookups - before == 4 and slept == [0.5, 1.0, 2.0]
    assert resolve(424242) is None and src.id_lookups - before == 4


@dataclass
class GuidRegistry(FakeRegistry):
    """A registry that reports schema GUIDs (Confluent 8+): one GUID per schema id, different per registry."""

    def guid_of(self, schema_id: int) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.url}/{schema_id}"))

    def _with_guid(self, v: RegisteredSchema | None) -> RegisteredSchema | None:
        return None if v is None else replace(v, guid=self.guid_of(v.schema_id))

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        got = self._with_guid(super().version(subject, version))
        assert got is not None
        return got

    def lookup(self, subject: str, schema_str: str, schema_type: str = "AVRO",
               references: Sequence[SchemaReference] = (), normalize: bool = False) -> RegisteredSchema | None:
        return self._with_guid(super().lookup(subject, schema_str, schema_type, references))

    def schema_by_guid(self, guid: str) -> Schema | None:
        for vs in self.subjects_.values():
            for v in vs:
                if self.guid_of(v.schema_id) == guid:
                    return v.schema
        return None

    def ids_for_guid(self, guid: str) -> list[int]:
        return sorted({v.schema_id for vs in self.subjects_.values() for v in vs if self.guid_of(v.schema_id) == guid})


def test_item10_guid_framed_records_get_the_destination_guid():
    """0x01+GUID framing (payload and header) is resolved like an id: source GUID -> schema -> registered
    under the mapped subject on the destination -> the destination's GUID; only those 16 bytes change."""
    from mirror_core.replicate import DeadLetter, OutRecord, SchemaIdTranslator, SourceRecord, WriterSettings, decide

    src, dst = GuidRegistry(url="http://src", next_id=0), GuidRegistry(url="http://dst", next_id=500)
    (sid,) = src.add("orders-value", V1)
    (other,) = src.add("shared-types", V2)  # a subject that is not the topic's own (record-name strategy)
    g_src, g_other = uuid.UUID(src.guid_of(sid)).bytes, uuid.UUID(src.guid_of(other)).bytes
    resolver = make_id_resolver(src, dst, "orders", "dr.orders", not_found_retries=0)
    translator = SchemaIdTranslator({}, resolver)
    s = WriterSettings(group="g", mirror="m", source_alias="src", destination_alias="dst", source_topic="orders",
                       destination_topic="dr.orders", source_partitions=1, destination_partitions=1,
                       delivery="exactly_once", key_serde="bytes", value_serde="avro", on_error="dead_letter",
                       dlq_topic="dlq", offset_syncs_topic="syncs", provenance=False, producer_config={})

    def rec(value: bytes, headers: tuple = ()) -> SourceRecord:
        return SourceRecord("orders", 0, 1, b"k", value, headers, 1)

    out = decide(rec(b"\x01" + g_src + b"avro-body"), s, translator)
    assert isinstance(out, OutRecord)
    registered = dst.version("dr.orders-value", 1)
    g_dst = uuid.UUID(registered.guid or "").bytes
    assert g_dst != g_src and out.value == b"\x01" + g_dst + b"avro-body"

    out = decide(rec(b"unframed", (("__value_schema_id", b"\x01" + g_other + b"\x00"),)), s, translator)
    assert isinstance(out, OutRecord) and out.value == b"unframed"
    assert out.headers == (("__value_schema_id", b"\x01" + uuid.UUID(dst.version("shared-types", 1).guid or "").bytes
                            + b"\x00"),)

    # unknown at the source: dead-lettered with the reason, never passed through
    dl = decide(rec(b"\x01" + bytes(16) + b"x"), s, translator)
    assert isinstance(dl, DeadLetter) and dl.reason == "unknown_schema_guid"

    # a destination that reports no GUIDs (Apicurio): the schema is registered, the record dead-lettered
    plain = FakeRegistry(url="http://plain", next_id=900)
    t2 = SchemaIdTranslator({}, make_id_resolver(src, plain, "orders", "dr.orders", not_found_retries=0))
    dl = decide(rec(b"\x01" + g_src + b"avro-body"), s, t2)
    assert isinstance(dl, DeadLetter) and dl.reason == "unknown_schema_guid"


@dataclass
class DownRegistry(FakeRegistry):
    """A source registry that cannot be reached for its first ``down`` id lookups (connection failure)."""

    down: int = 0
    id_lookups: int = 0

    def subject_versions_for_id(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        from mirror_core.registry import RegistryError

        self.id_lookups += 1
        if self.id_lookups <= self.down:
            raise RegistryError(f"schema registry {self.url} unreachable (GET /schemas/ids): ConnectError",
                                transient=True, reason="ConnectError")
        return super().subject_versions_for_id(schema_id)


def test_registry_outage_is_waited_out_within_the_deadline_then_fails_clearly(dst):
    from mirror_core.registry import RegistryError

    clock = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    src = DownRegistry(url="http://src", next_id=0, down=5)
    sid = src.register("orders-value", V1)
    resolve = make_id_resolver(src, dst, "orders", "dr.orders", sleep=sleep, clock=lambda: clock[0],
                               outage_deadline=60.0)
    assert resolve(sid) == dst.version("dr.orders-value", 1).schema_id  # waited 5 polls, then resolved
    assert src.id_lookups == 6 and sum(slept) == pytest.approx(10.0)

    # an outage longer than the deadline: one clear error (not None, which would dead-letter the record)
    src2 = DownRegistry(url="http://src2", next_id=0, down=10**6)
    sid2 = src2.register("orders-value", V1)
    clock[0] = 0.0
    resolve2 = make_id_resolver(src2, dst, "orders", "dr.orders", sleep=sleep, clock=lambda: clock[0],
                                outage_deadline=30.0)
    with pytest.raises(RegistryError) as err:
        resolve2(sid2)
    assert "stayed unavailable for 30s (outage_deadline)" in str(err.value) and clock[0] == pytest.approx(30.0)
