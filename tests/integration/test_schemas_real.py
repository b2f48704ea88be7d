"""Subject mirroring against the real registries (Apicurio Registry, Confluent-compatible API)."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import fastavro
import httpx
import pytest

from mirror_core.config import SchemaRegistryConfig
from mirror_core.registry import (
    RegistryClient,
    RegistryError,
    RegistryUnavailableError,
    Schema,
    SchemaReference,
    is_not_found,
)
from mirror_core.schemas import SubjectPair, apply_subjects, canonical_schema, make_id_resolver, subject_pairs

pytestmark = pytest.mark.integration


def record(name: str, fields: list[dict[str, Any]], ns: str = "it") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": ns, "fields": fields})


LONG = {"type": "long"}


def opt(name: str, typ: Any = "string") -> dict[str, Any]:
    return {"name": name, "type": ["null", typ], "default": None}


@pytest.fixture
def src(clusters) -> RegistryClient:
    with RegistryClient.from_config(SchemaRegistryConfig(url=clusters.src_registry)) as c:
        yield c


@pytest.fixture
def dst(clusters) -> RegistryClient:
    with RegistryClient.from_config(SchemaRegistryConfig(url=clusters.dst_registry)) as c:
        yield c


def contents(reg: RegistryClient, subject: str) -> list[str]:
    return [canonical_schema(v.schema_type, v.schema_str) for v in (reg.version(subject, n)
                                                                   for n in reg.versions(subject))]


def parsed_avro(reg: RegistryClient, schema: Schema, named: dict[str, Any] | None = None) -> Any:
    """fastavro schema for a registry schema, its references resolved on the same registry."""
    named = {} if named is None else named
    for ref in schema.references:
        parsed_avro(reg, reg.version(ref.subject, ref.version).schema, named)
    return fastavro.parse_schema(json.loads(schema.schema_str), named_schemas=named)


def frame(schema_id: int, parsed: Any, value: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, value)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def decode_with_registry(reg: RegistryClient, framed: bytes) -> dict[str, Any]:
    assert framed[0] == 0
    (schema_id,) = struct.unpack(">I", framed[1:5])
    return fastavro.schemaless_reader(io.BytesIO(framed[5:]), parsed_avro(reg, reg.schema_by_id(schema_id)))


def test_evolving_avro_with_reference_is_mirrored_and_ids_mapped(src, dst, unique):
    topic = unique("orders")
    addr_subject = unique("it.Addr")
    # unrelated schemas on the destination so ids cannot line up by accident
    for i in range(3):
        dst.register(unique("filler-value"), record(f"Filler{i}", [{"name": "f", "type": "int"}]))

    addr = record("Addr", [{"name": "street", "type": "string"}])
    src.register(addr_subject, addr)
    v1 = record("Order", [{"name": "id", **LONG}])
    v2 = record("Order", [{"name": "id", **LONG}, opt("note")])
    v3 = record("Order", [{"name": "id", **LONG}, opt("note"), opt("addr", "it.Addr")])
    refs = [SchemaReference("it.Addr", addr_subject, 1)]
    subject = f"{topic}-value"
    ids = [src.register(subject, v1), src.register(subject, v2), src.register(subject, v3, "AVRO", refs)]

    pairs = subject_pairs(topic, f"src.{topic}", "g.orders", "string", "avro")
    assert pairs == [SubjectPair(subject, f"src.{topic}-value", "g.orders")]
    res = apply_subjects(src, dst, pairs, "strict", None)
    assert res.errors == []

    dst_subject = f"src.{topic}-value"
    assert contents(dst, dst_subject) == contents(src, subject)
    assert contents(dst, addr_subject) == contents(src, addr_subject)
    assert dst.version(dst_subject, 3).references == (SchemaReference("it.Addr", addr_subject, 1),)
    addr_id = src.version(addr_subject, 1).schema_id
    assert set(res.id_map) == {*ids, addr_id}
    assert res.id_map[ids[2]] == dst.version(dst_subject, 3).schema_id
    assert res.id_map[addr_id] == dst.version(addr_subject, 1).schema_id
    assert dst.subject_compatibility(dst_subject) == src.global_compatibility()

    # a record framed with the source id decodes on the destination once its id is rewritten
    value = {"id": 7, "note": "hi", "addr": {"street": "Main St"}}
    framed = frame(ids[2], parsed_avro(src, src.schema_by_id(ids[2])), value)
    assert decode_with_registry(src, framed) == value
    rewritten = b"\x00" + struct.pack(">I", res.id_map[ids[2]]) + framed[5:]
    assert decode_with_registry(dst, rewritten) == value

    # idempotent: nothing registered the second time, same id map
    again = apply_subjects(src, dst, pairs, "strict", None)
    assert again.errors == [] and again.steps_applied == []
    assert again.id_map == res.id_map
    assert len(dst.versions(dst_subject)) == 3


def test_strict_conflict_stops_only_that_mirror(src, dst, unique):
    bad, good = unique("bad"), unique("good")
    v1 = record("Thing", [{"name": "id", **LONG}])
    v2 = record("Thing", [{"name": "id", **LONG}, opt("a")])
    other = record("Thing", [{"name": "id", **LONG}, opt("b")])
    for s in (f"{bad}-value", f"{good}-value"):
        src.register(s, v1)
        src.register(s, v2)
    dst.register(f"{bad}-value", v1)
    dst.register(f"{bad}-value", other)

    pairs = subject_pairs(bad, bad, "m.bad", "string", "avro") + subject_pairs(good, good, "m.good", "string", "avro")
    res = apply_subjects(src, dst, pairs, "strict", None)
    assert [m for m, _ in res.errors] == ["m.bad"]
    assert "destination version 2 differs from source version 2" in res.errors[0][1]
    assert contents(dst, f"{good}-value") == contents(src, f"{good}-value")
    assert len(dst.versions(f"{bad}-value")) == 2


def test_lenient_accepts_extra_destination_versions(src, dst, unique):
    topic = unique("lenient")
    subject = f"{topic}-value"
    v1 = record("L", [{"name": "id", **LONG}])
    v2 = record("L", [{"name": "id", **LONG}, opt("a")])
    extra = record("L", [{"name": "id", **LONG}, opt("z")])
    src.register(subject, v1)
    src.register(subject, v2)
    dst.register(subject, v1)
    dst.register(subject, extra)

    strict = apply_subjects(src, dst, [SubjectPair(subject, subject, "m")], "strict", None)
    assert len(strict.errors) == 1
    res = apply_subjects(src, dst, [SubjectPair(subject, subject, "m")], "lenient", None)
    assert res.errors == []
    assert contents(dst, subject) == [canonical_schema("AVRO", s) for s in (v1, extra, v2)]
    assert len(res.id_map) == 2


def test_forced_compatibility_is_applied(src, dst, unique):
    subject = f"{unique('forced')}-value"
    src.register(subject, record("F", [{"name": "id", **LONG}]))
    src.set_compatibility(subject, "FULL")
    assert src.subject_compatibility(subject) == "FULL"
    assert dst.subject_compatibility(subject) is None  # not set (Apicurio's 200-NONE quirk handled)

    res = apply_subjects(src, dst, [SubjectPair(subject, subject, "m")], "strict", "FORWARD_TRANSITIVE")
    assert res.errors == []
    assert dst.subject_compatibility(subject) == "FORWARD_TRANSITIVE"
    # the history is copied at NONE, then the forced level is set
    assert [(s.action, s.level) for s in res.steps_applied] == [
        ("set_compatibility", "NONE"), ("register", None), ("set_compatibility", "FORWARD_TRANSITIVE")]
    # forcing NONE is read back as NONE, not as "not set", so a re-run does nothing
    apply_subjects(src, dst, [SubjectPair(subject, subject, "m")], "strict", "NONE")
    again = apply_subjects(src, dst, [SubjectPair(subject, subject, "m")], "strict", "NONE")
    assert again.steps_applied == []


def test_id_preserving_is_refused_by_apicurio_with_a_clear_error(src, dst, unique):
    subject = f"{unique('idp')}-value"
    src.register(subject, record("P", [{"name": "id", **LONG}]))
    res = apply_subjects(src, dst, [SubjectPair(subject, subject, "m.idp")], "strict", None, id_preserving=True)
    assert res.id_map == {} and res.steps_applied == []
    [(mirror, msg)] = res.errors
    assert mirror == "m.idp"
    assert "does not preserve schema ids" in msg and "in-flight schema-id rewriting" in msg
    assert dst.versions(subject) == []


def test_id_resolver_registers_on_miss(src, dst, unique):
    topic = unique("resolve")
    sid = src.register(f"{topic}-value", record("R", [{"name": "id", **LONG}]))
    resolve = make_id_resolver(src, dst, topic, f"dr.{topic}", not_found_retries=1, not_found_backoff=0.05)
    got = resolve(sid)
    assert got == dst.version(f"dr.{topic}-value", 1).schema_id
    assert resolve(987_654_321) is None


def test_errors_keep_http_status_and_error_code(dst, unique):
    with pytest.raises(RegistryError) as info:
        dst.version(unique("nosuch"), 1)
    assert info.value.http_status == 404 and info.value.error_code == 40401 and is_not_found(info.value)
    with pytest.raises(RegistryError) as info:
        dst.schema_by_id(987_654_321)
    assert info.value.error_code == 40403 and is_not_found(info.value)
    with pytest.raises(RegistryError) as info:
        dst.register(unique("bad-value"), "{not json")
    assert info.value.http_status == 422 and info.value.error_code == 42201 and not is_not_found(info.value)
    assert dst.versions(unique("nosuch")) == []


def test_circuit_breaker_opens_against_a_dead_registry_and_fails_fast(unique):
    attempts: list[str] = []
    http = httpx.Client(event_hooks={"request": [lambda r: attempts.append(str(r.url))]})
    cfg = SchemaRegistryConfig(url=f"http://127.0.0.1:1/{unique('dead')}", retries=1, breaker_failures=3,
                               timeout=2, breaker_reset=600)
    client = RegistryClient.from_config(cfg, http=http, backoff=0.01)

    with pytest.raises(RegistryError) as first:
        client.subjects()
    assert first.value.transient and len(attempts) == 2  # one try + one retry
    with pytest.raises(RegistryUnavailableError):
        client.subjects()  # the third failure opens the breaker
    assert len(attempts) == 3
    for _ in range(10):
        with pytest.raises(RegistryUnavailableError) as fast:
            client.versions("x-value")
        assert "circuit breaker is open" in str(fast.value)
    assert len(attempts) == 3  # no further attempts while open
    # every client of that URL shares the open breaker
    other = RegistryClient.from_config(cfg, http=http)
    with pytest.raises(RegistryUnavailableError):
        other.global_compatibility()
    assert len(attempts) == 3
    http.close()


def test_item11_soft_deleted_schema_id_still_resolves(src, dst, unique):
    """A record written before its subject was soft-deleted still decodes at the source: its id must be
    mirrored, not dead-lettered as unknown."""
    topic = unique("softdel")
    sid = src.register(f"{topic}-value", record("Gone", [{"name": "id", **LONG}]))
    src.delete_subject(f"{topic}-value")  # soft delete: the id stays readable at the source
    assert src.schema_by_id(sid).schema_str
    resolve = make_id_resolver(src, dst, topic, f"dr.{topic}")
    got = resolve(sid)
    assert got is not None and canonical_schema("AVRO", dst.schema_by_id(got).schema_str) == canonical_schema(
        "AVRO", src.schema_by_id(sid).schema_str)
    assert dst.versions(f"dr.{topic}-value") == []  # soft-deleted there too, as on the source


def test_schema_changes_met_in_flight_keep_the_destination_history_the_source_s(src, dst, unique):
    """Versions first met out of order, one no record uses, and a soft-deleted one whose records remain:
    the destination subject still equals the source's, so strict provisioning finds nothing to do."""
    topic = unique("evolve")
    subject = f"{topic}-value"
    versions = [record("E", [{"name": "id", **LONG}, *[opt(f"f{i}") for i in range(n)]]) for n in range(5)]
    ids = [src.register(subject, v) for v in versions[:2]]
    pairs = [SubjectPair(subject, f"dr.{subject}", "m.evolve")]
    assert apply_subjects(src, dst, pairs, "strict", None).errors == []
    ids += [src.register(subject, v) for v in versions[2:]]  # v3 .. v5; v3 is used by no record
    src.delete_version(subject, 4)  # v4 soft-deleted; its records are still in the topic

    resolve = make_id_resolver(src, dst, topic, f"dr.{topic}")
    got5 = resolve(ids[4])  # a partition with v5 records is read first
    got4 = resolve(ids[3])
    got2 = resolve(ids[1])
    assert None not in (got2, got4, got5)
    assert contents(dst, f"dr.{subject}") == contents(src, subject)
    for sid, got in ((ids[1], got2), (ids[3], got4), (ids[4], got5)):
        framed = frame(sid, parsed_avro(src, src.schema_by_id(sid)), {"id": 1})
        rewritten = b"\x00" + struct.pack(">I", got) + framed[5:]
        assert decode_with_registry(dst, rewritten) == decode_with_registry(src, framed)
    for mode in ("strict", "lenient"):
        again = apply_subjects(src, dst, pairs, mode, None)
        assert again.errors == [] and again.steps_applied == []
