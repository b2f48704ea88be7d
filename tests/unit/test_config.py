"""The mirrors YAML: interpolation, merge, derived names, secrets, and every way to get it wrong."""

from __future__ import annotations

import copy
import json
import re
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, SecretStr
from typer.testing import CliRunner

from mirror_core.cli import app
from mirror_core.config import (
    WRITER_SLOTS,
    ClusterConfig,
    CountRule,
    GroupConfig,
    MirrorsConfig,
    MirrorSettings,
    MirrorSpec,
    RegexFilter,
    flow_id,
    load_config,
    load_group,
    load_groups,
    parse_config,
    resolve_mirrors,
    with_master,
)
from mirror_core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "config" / "mirrors.example.yaml"
LOCAL = REPO / "config" / "local.yaml"


def base_config() -> dict[str, Any]:
    """A small valid config; malformed cases are one mutation of it."""
    return {
        "clusters": {
            "src": {
                "kafka": {"bootstrap.servers": "src-1:9092,src-2:9092"},
                "schema_registry": {"url": "http://src-registry:8081/apis/ccompat/v7"},
            },
            "dst": {
                "kafka": {
                    "bootstrap.servers": "dst-1:9092",
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": "mirror",
                    "sasl.password": "hunter2-secret",
                },
                "schema_registry": {"url": "http://dst-registry:8081", "basic.auth.user.info": "key:sr-secret"},
            },
        },
        "groups": [
            {
                "name": "prod",
                "source": "src",
                "destination": "dst",
                "serdes": {"key": "string", "value": "avro"},
                "mirrors": [
                    {"source_topic": "orders"},
                    {"topics": {"include": "payments\\..*", "exclude": ".*\\.tmp"}},
                ],
            }
        ],
    }


def parse(raw: dict[str, Any], env: dict[str, str] | None = None) -> MirrorsConfig:
    return parse_config(raw, env or {})


def run_validate(path: Path) -> Any:
    return CliRunner().invoke(app, ["validate", str(path)])


# --------------------------------------------------------------------------- valid configs


@pytest.mark.parametrize("path", [EXAMPLE, LOCAL], ids=["example", "local"])
def test_shipped_configs_validate_with_cli(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DST_USER", "DST_PASSWORD", "SRC_BOOTSTRAP", "DST_BOOTSTRAP", "SPARK_MASTER"):
        monkeypatch.delenv(var, raising=False)
    result = run_validate(path)
    assert result.exit_code == 0, result.output
    assert ": OK" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("path", [EXAMPLE, LOCAL], ids=["example", "local"])
def test_shipped_configs_load_without_env(path: Path) -> None:
    cfg = load_config(path, env={})
    for group in cfg.groups:
        assert resolve_mirrors(group)


def _collect(nodes: list[Any], model: type[BaseModel], where: str, missing: list[str]) -> None:
    """Record every field of ``model`` that none of ``nodes`` (YAML mappings) sets."""
    own = model.model_fields
    if model is MirrorSpec:  # inherited settings are documented on the group (or its mirrors)
        own = {k: f for k, f in own.items() if k not in MirrorSettings.model_fields}
    for name, field in own.items():
        key = field.alias or name
        holders = list(nodes)
        if model is GroupConfig and name in MirrorSettings.model_fields:
            holders += [m for n in nodes if isinstance(n, dict) for m in n.get("mirrors", [])]
        values = [n[key] for n in holders if isinstance(n, dict) and key in n]
        if not values:
            missing.append(f"{where}.{key}")
            continue
        for sub, container in _models_in(field.annotation):
            subnodes: list[Any] = []
            for v in values:
                if container is dict and isinstance(v, dict):
                    subnodes.extend(v.values())
                elif container is list and isinstance(v, list):
                    subnodes.extend(v)
                else:
                    subnodes.append(v)
            _collect(subnodes, sub, f"{where}.{key}", missing)


def _models_in(annotation: Any, container: type | None = None) -> list[tuple[type[BaseModel], type | None]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, container)]
    origin = typing.get_origin(annotation)
    if origin in (list, tuple):
        container = list
    elif origin is dict:
        container = dict
    out = []
    for arg in typing.get_args(annotation):
        if arg is not type(None) and not isinstance(arg, (str, int, types.EllipsisType)):
            out.extend(_models_in(arg, container))
    return out


def test_example_documents_every_option() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    missing: list[str] = []
    _collect([raw], MirrorsConfig, "", missing)
    assert missing == []


def test_example_uses_the_documented_shapes() -> None:
    cfg = load_config(EXAMPLE, env={})
    dst = cfg.cluster("cloud")
    assert dst.kafka["security.protocol"] == "SASL_SSL"
    assert isinstance(dst.kafka["sasl.password"], SecretStr)
    policies = {g.replication_policy for g in cfg.groups}
    assert policies == {"identity", "prefix"}
    assert {g.delivery for g in cfg.groups} == {"exactly_once", "at_least_once"}
    assert {g.mirror_mode for g in cfg.groups} == {"strict", "lenient"}
    assert [g.name for g in cfg.enabled_groups()] == ["payments-prod"]


# --------------------------------------------------------------------------- interpolation


def test_interpolation_plain_default_and_escape() -> None:
    raw = base_config()
    raw["clusters"]["dst"]["kafka"]["sasl.username"] = "${DST_USER}"
    raw["clusters"]["dst"]["kafka"]["sasl.password"] = "${DST_PASSWORD:-fallback}"
    raw["clusters"]["src"]["kafka"]["bootstrap.servers"] = "${SRC_HOST:-src-1}:${SRC_PORT:-9092}"
    raw["clusters"]["src"]["kafka"]["client.id"] = "$${NOT_A_VAR}-${DST_USER}"
    raw["groups"][0]["spark"] = {"conf": {"spark.eventLog.dir": "$${env:SPARK_HOME}/events"}}
    cfg = parse(raw, {"DST_USER": "alice", "SRC_PORT": "19092"})
    dst = cfg.cluster("dst").kafka_properties()
    src = cfg.cluster("src").kafka_properties()
    assert dst["sasl.username"] == "alice"
    assert dst["sasl.password"] == "fallback"
    assert src["bootstrap.servers"] == "src-1:19092"
    assert src["client.id"] == "${NOT_A_VAR}-alice"
    assert cfg.groups[0].spark.conf["spark.eventLog.dir"] == "${env:SPARK_HOME}/events"


def test_interpolation_env_wins_over_default_and_empty_default() -> None:
    raw = base_config()
    raw["clusters"]["dst"]["kafka"]["sasl.password"] = "${DST_PASSWORD:-fallback}"
    raw["clusters"]["dst"]["kafka"]["sasl.username"] = "${DST_USER:-}"
    cfg = parse(raw, {"DST_PASSWORD": "from-env"})
    props = cfg.cluster("dst").kafka_properties()
    assert props["sasl.password"] == "from-env"
    assert props["sasl.username"] == ""


def test_interpolation_reaches_non_string_fields() -> None:
    raw = base_config()
    raw["groups"][0]["enabled"] = "${PROD_ENABLED:-false}"
    raw["groups"][0]["spark"] = {"max_offsets_per_trigger": "${MAX_OFFSETS:-1000}"}
    cfg = parse(raw)
    assert cfg.groups[0].enabled is False
    assert cfg.groups[0].spark.max_offsets_per_trigger == 1000


def test_every_missing_variable_is_reported() -> None:
    raw = base_config()
    raw["clusters"]["dst"]["kafka"]["sasl.username"] = "${A_USER}"
    raw["clusters"]["dst"]["kafka"]["sasl.password"] = "${A_PASSWORD}"
    with pytest.raises(ConfigError) as info:
        parse(raw)
    paths = [i.path for i in info.value.issues]
    assert paths == ["clusters.dst.kafka.sasl.username", "clusters.dst.kafka.sasl.password"]
    assert "${A_PASSWORD}" in info.value.issues[1].message


# --------------------------------------------------------------------------- one group's mistake


def _three_groups() -> dict[str, Any]:
    """base_config's clusters plus a third, used by one group only; three groups."""
    raw = base_config()
    raw["clusters"]["other"] = {"kafka": {"bootstrap.servers": "other:9092", "sasl.password": "${OTHER_PASSWORD}"}}
    prod = raw["groups"][0]
    raw["groups"] = [
        prod,
        {"name": "audit", "source": "src", "destination": "dst", "mirrors": [{"source_topic": "audit"}]},
        {"name": "legacy", "source": "other", "destination": "dst", "mirrors": [{"source_topic": "legacy"}]},
    ]
    return raw


def _write(tmp_path: Path, raw: dict[str, Any]) -> Path:
    path = tmp_path / "mirrors.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_one_groups_mistake_leaves_the_other_groups_usable(tmp_path: Path) -> None:
    """An unset ${VAR} in a cluster only one group uses, and a typo in another group's keys: the DAGs, their tasks
    and the Spark job (load_groups / load_group) still get the valid group; each left-out group keeps its problems,
    located in the file as it is (groups[2] although groups[1] was left out before it)."""
    raw = _three_groups()
    raw["groups"][1]["mirorrs"] = raw["groups"][1].pop("mirrors")
    path = _write(tmp_path, raw)
    with pytest.raises(ConfigError):
        load_config(path, env={})  # the CLI's validate still wants every group right

    cfg, invalid = load_groups(path, env={})
    assert [g.name for g in cfg.groups] == ["prod"]
    assert "other" not in cfg.clusters
    assert [(g.path, g.name) for g in invalid] == [("groups[1]", "audit"), ("groups[2]", "legacy")]
    assert sorted(str(i) for i in invalid[0].issues) == ["groups[1].mirorrs: unknown key",
                                                         "groups[1].mirrors: Field required"]
    assert [i.path for i in invalid[1].issues] == ["clusters.other.kafka.sasl.password"]
    assert "${OTHER_PASSWORD}" in str(invalid[1])

    assert load_group(path, "prod", env={}).group("prod").mirrors[0].source_topic == "orders"
    assert [g.name for g in load_group(path, "prod", env={"OTHER_PASSWORD": "x"}).groups] == ["prod"]  # its own
    with pytest.raises(ConfigError) as info:
        load_group(path, "legacy", env={})
    assert [i.path for i in info.value.issues] == ["clusters.other.kafka.sasl.password"]
    with pytest.raises(ConfigError, match="no group named 'nope'"):
        load_group(path, "nope", env={})

    cfg, invalid = load_groups(path, env={"OTHER_PASSWORD": "set"})  # set where it runs: that group is back
    assert [g.name for g in cfg.groups] == ["prod", "legacy"] and [g.name for g in invalid] == ["audit"]


def test_a_later_groups_problem_keeps_its_place_in_the_file(tmp_path: Path) -> None:
    """groups[0]'s unset variable is found first (interpolation), groups[2]'s bad value only once groups[0] is out:
    it is still called groups[2]."""
    raw = _three_groups()
    raw["groups"][0]["spark"] = {"max_offsets_per_trigger": "${NOT_SET}"}
    raw["groups"][2]["source"] = "src"
    raw["groups"][2]["spark"] = {"mode": "sometimes"}
    cfg, invalid = load_groups(_write(tmp_path, raw), env={"OTHER_PASSWORD": "x"})
    assert [g.name for g in cfg.groups] == ["audit"]
    assert [(g.name, [i.path for i in g.issues]) for g in invalid] == [
        ("prod", ["groups[0].spark.max_offsets_per_trigger"]), ("legacy", ["groups[2].spark.mode"])]


def test_groups_that_share_a_name_are_both_left_out(tmp_path: Path) -> None:
    """Which of two groups named alike owns the name's DAGs, checkpoint and stop cannot be told: neither runs. Nor
    does one whose namesake is left out for a mistake of its own (else the name would pass from one to the other
    as that mistake comes and goes)."""
    raw = _three_groups()
    raw["groups"][2] = {**raw["groups"][1], "mirrors": [{"source_topic": "audit2"}]}
    del raw["clusters"]["other"]
    cfg, invalid = load_groups(_write(tmp_path, raw), env={})
    assert [g.name for g in cfg.groups] == ["prod"]
    assert [(g.path, [str(i) for i in g.issues]) for g in invalid] == [
        ("groups[1]", ["groups[1].name: group name 'audit' is also groups[2]'s, which is left out"]),
        ("groups[2]", ["groups[2].name: duplicate group name 'audit' (also groups[1])"])]
    with pytest.raises(ConfigError, match="also groups"):
        load_group(_write(tmp_path, raw), "audit", env={})

    raw = _three_groups()
    raw["groups"][0]["spark"] = {"max_offsets_per_trigger": "${NOT_SET}"}
    raw["groups"][2] = {**raw["groups"][2], "name": "prod", "source": "src"}
    del raw["clusters"]["other"]
    cfg, invalid = load_groups(_write(tmp_path, raw), env={})
    assert [g.name for g in cfg.groups] == ["audit"]
    assert [(g.path, g.name) for g in invalid] == [("groups[0]", "prod"), ("groups[2]", "prod")]


def test_a_broken_cluster_of_a_group_left_out_already_and_messages_name_the_files_groups(tmp_path: Path) -> None:
    """groups[0] is left out for its own unset variable; its cluster also has an unknown key, found only on the next
    pass: it stays with groups[0] instead of failing the file. A message naming another group names it as the file
    does (groups[2] clashes with groups[1], not with the tree's groups[0] once the first is out)."""
    raw = _three_groups()
    raw["groups"][0] = {**raw["groups"][2], "name": "first", "spark": {"max_offsets_per_trigger": "${NOT_SET}"}}
    raw["clusters"]["other"] = {"kafka": {"bootstrap.servers": "o:9092"}, "typo": 1}
    raw["groups"][2] = {**raw["groups"][1], "name": "audit2"}  # writes audit's destination topic too
    cfg, invalid = load_groups(_write(tmp_path, raw), env={})
    assert [g.name for g in cfg.groups] == ["audit"]
    assert [(g.name, [i.path for i in g.issues]) for g in invalid] == [
        ("first", ["groups[0].spark.max_offsets_per_trigger", "clusters.other.typo"]),
        ("audit2", ["groups[2].mirrors[0]"] * len(invalid[1].issues))]
    assert all("groups[1]" in str(i) and "groups[0]" not in str(i) for i in invalid[1].issues), invalid[1]


@pytest.mark.parametrize("mistake", ["top-level key", "every group", "unused cluster"])
def test_a_mistake_no_group_owns_fails_the_whole_file(tmp_path: Path, mistake: str) -> None:
    """Nothing to build around: the whole file is rejected, every problem named (as load_config does)."""
    raw = _three_groups()
    if mistake == "top-level key":
        raw["grups"] = []
        expected = {"grups", "clusters.other.kafka.sasl.password"}
    elif mistake == "every group":
        for g in raw["groups"]:
            g["destination"] = "nowhere"
        raw["clusters"]["other"]["kafka"]["sasl.password"] = "plain"
        expected = {f"groups[{i}].destination" for i in range(3)}
    else:
        raw["groups"].pop()
        expected = {"clusters.other.kafka.sasl.password"}
    with pytest.raises(ConfigError) as info:
        load_groups(_write(tmp_path, raw), env={})
    assert {i.path for i in info.value.issues} == expected


# --------------------------------------------------------------------------- derived names and merge


def test_derived_names_for_pairs_and_flows() -> None:
    raw = base_config()
    raw["groups"][0]["mirrors"] = [
        {"source_topic": "orders"},
        {"source_topic": "customers", "destination_topic": "customers-v2"},
        {"source_topic": "invoices", "name": "invoices-migration", "consumer_group": "my-cg"},
        {"topics": {"include": "payments\\..*"}},
    ]
    mirrors = resolve_mirrors(parse(raw).groups[0])
    assert [(m.name, m.consumer_group, m.destination_topic) for m in mirrors] == [
        ("prod__orders__orders", "prod.mirrorflow.orders__orders", "orders"),
        ("prod__customers__customers-v2", "prod.mirrorflow.customers__customers-v2", "customers-v2"),
        ("invoices-migration", "my-cg", "invoices"),
        ("prod__" + flow_id(RegexFilter(include="payments\\..*")),
         "prod.mirrorflow." + flow_id(RegexFilter(include="payments\\..*")), None),
    ]
    assert [m.is_flow for m in mirrors] == [False, False, False, True]
    # a flow keeps its name and consumer group wherever it sits in the list
    moved = resolve_mirrors(parse({**raw, "groups": [{**raw["groups"][0],
                                                       "mirrors": raw["groups"][0]["mirrors"][::-1]}]}).groups[0])
    assert (moved[0].name, moved[0].consumer_group) == (mirrors[3].name, mirrors[3].consumer_group)
    assert mirrors[3].name.startswith("prod__flow-") and len(mirrors[3].name) == len("prod__flow-") + 8
    assert flow_id(RegexFilter(include="a")) != flow_id(RegexFilter(include="a", exclude="b"))
    assert all((m.source_cluster, m.destination_cluster) == ("src", "dst") for m in mirrors)


def test_prefix_policy_derives_alias_dot_topic() -> None:
    raw = base_config()
    raw["groups"][0]["replication_policy"] = "prefix"
    (pair, _flow) = resolve_mirrors(parse(raw).groups[0])
    assert pair.destination_topic == "src.orders"
    assert pair.name == "prod__orders__src.orders"
    assert pair.consumer_group == "prod.mirrorflow.orders__src.orders"


def test_prefix_policy_custom_separator() -> None:
    raw = base_config()
    raw["groups"][0]["replication_policy"] = "prefix"
    raw["groups"][0]["replication_policy_separator"] = "_"
    assert resolve_mirrors(parse(raw).groups[0])[0].destination_topic == "src_orders"


def test_group_settings_merge_into_mirrors_mirror_wins() -> None:
    raw = base_config()
    group = raw["groups"][0]
    group.update(
        delivery="exactly_once",
        mirror_mode="strict",
        on_error="dead_letter",
        force_subject_compatibility_level="BACKWARD",
        topics_mirroring={
            "partition_count": {"type": "mirror_source", "min": 3, "max": 12},
            "replication_factor": {"type": "fix", "value": 3},
            "config_exclude": ["retention\\.ms"],
        },
    )
    group["mirrors"] = [
        {"source_topic": "orders"},
        {
            "source_topic": "audit",
            "delivery": "at_least_once",
            "on_error": "fail",
            "serdes": {"value": "protobuf"},
            "topics_mirroring": {"partition_count": {"type": "fix", "value": 6}},
        },
    ]
    inherited, overridden = resolve_mirrors(parse(raw).groups[0])

    s = inherited.settings
    assert (s.delivery, s.mirror_mode, s.on_error) == ("exactly_once", "strict", "dead_letter")
    assert s.force_subject_compatibility_level == "BACKWARD"
    assert s.topics_mirroring.partition_count == CountRule(type="mirror_source", min=3, max=12)

    s = overridden.settings
    assert (s.delivery, s.on_error, s.mirror_mode) == ("at_least_once", "fail", "strict")
    assert (s.serdes.key, s.serdes.value) == ("string", "protobuf")  # key kept from the group
    tm = s.topics_mirroring
    assert tm.partition_count == CountRule(type="fix", value=6)
    assert tm.replication_factor == CountRule(type="fix", value=3)  # kept from the group
    assert tm.config_exclude == ("retention\\.ms",)
    assert tm.partition_count.resolve(1) == 6


def test_count_rule_is_replaced_whole_not_mixed() -> None:
    """A group's {type: fix, value: 3} and a mirror's {type: mirror_source, max: 10} make the mirror's rule."""
    raw = base_config()
    raw["groups"][0]["topics_mirroring"] = {"partition_count": {"type": "fix", "value": 3}}
    raw["groups"][0]["mirrors"] = [
        {"source_topic": "a", "topics_mirroring": {"partition_count": {"type": "mirror_source", "max": 10}}},
        {"source_topic": "b", "topics_mirroring": {"partition_count": {"max": 2}}},
    ]
    a, b = resolve_mirrors(parse(raw).groups[0])
    assert a.settings.topics_mirroring.partition_count == CountRule(type="mirror_source", max=10)
    assert a.settings.topics_mirroring.partition_count.resolve(30) == 10
    assert b.settings.topics_mirroring.partition_count.resolve(1) == 1


def test_count_rule_resolve_clamps() -> None:
    rule = CountRule(type="mirror_source", min=3, max=12)
    assert [rule.resolve(n) for n in (1, 5, 40)] == [3, 5, 12]
    assert CountRule(type="fix", value=4).resolve(100) == 4


def test_group_defaults() -> None:
    g = parse(base_config()).groups[0]
    assert g.enabled and g.replication_policy == "identity" and g.delivery == "exactly_once"
    assert g.dlq_topic == "prod.mirrorflow.dlq"
    assert g.offset_syncs == "mirrorflow-offset-syncs.src.internal"
    assert g.checkpoints_topic == "src.checkpoints.internal"
    assert g.offsets.interval == 10.0 and g.heartbeats.interval == 1.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("10s", 10.0), ("1 second", 1.0), ("2 minutes", 120.0), ("1h", 3600.0), (7, 7.0)],
)
def test_durations(text: Any, seconds: float) -> None:
    raw = base_config()
    raw["groups"][0]["offsets"] = {"interval": text}
    assert parse(raw).groups[0].offsets.interval == seconds


# --------------------------------------------------------------------------- secrets


def test_secrets_are_secretstr_and_never_rendered() -> None:
    raw = base_config()
    raw["clusters"]["src"]["kafka"]["sasl.jaas.config"] = "org.apache...PlainLoginModule password='jaas-secret';"
    raw["clusters"]["src"]["kafka"]["ssl.key.password"] = "key-secret"
    cfg = parse(raw)
    dst = cfg.cluster("dst")
    assert isinstance(dst.kafka["sasl.password"], SecretStr)
    assert isinstance(dst.kafka["sasl.username"], str)
    assert dst.schema_registry is not None and isinstance(dst.schema_registry.basic_auth_user_info, SecretStr)
    assert isinstance(cfg.cluster("src").kafka["ssl.key.password"], SecretStr)

    rendered = [repr(cfg), str(cfg), cfg.model_dump_json(), repr(cfg.model_dump()), repr(dst), str(dst)]
    rendered += [repr(m) for g in cfg.groups for m in resolve_mirrors(g)]
    for text in rendered:
        for secret in ("hunter2-secret", "sr-secret", "jaas-secret", "key-secret"):
            assert secret not in text
    # Revealed only on purpose, for a client.
    assert dst.kafka_properties()["sasl.password"] == "hunter2-secret"
    assert dst.schema_registry.basic_auth_user_info.get_secret_value() == "key:sr-secret"


def test_interpolated_secret_is_secret() -> None:
    raw = base_config()
    raw["clusters"]["dst"]["kafka"]["sasl.password"] = "${DST_PASSWORD:-x}"
    cfg = parse(raw, {"DST_PASSWORD": "from-env-secret"})
    assert "from-env-secret" not in repr(cfg) + cfg.model_dump_json()
    assert cfg.cluster("dst").kafka_properties()["sasl.password"] == "from-env-secret"


def test_kafka_scalars_become_strings() -> None:
    raw = base_config()
    raw["clusters"]["src"]["kafka"].update({"linger.ms": 20, "enable.idempotence": True})
    props = ClusterConfig.model_validate(raw["clusters"]["src"]).kafka_properties()
    assert props["linger.ms"] == "20" and props["enable.idempotence"] == "true"


def test_all_issues_reported_at_once() -> None:
    raw = base_config()
    raw["groups"][0]["delivery"] = "twice"
    raw["groups"][0]["mirrors"][1]["topics"]["include"] = "("
    with pytest.raises(ConfigError) as info:
        parse(raw)
    assert {i.path for i in info.value.issues} == {"groups[0].delivery", "groups[0].mirrors[1].topics.include"}


# --------------------------------------------------------------------------- malformed configs

Mutation = Callable[[dict[str, Any]], Any]


def _set(path: str, value: Any) -> Mutation:
    """A mutation setting ``a.b[0].c`` style paths (keys with dots go in brackets: kafka['x.y'])."""

    def mutate(raw: dict[str, Any]) -> None:
        node: Any = raw
        parts = _split(path)
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = value

    return mutate


def _del(path: str) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        node: Any = raw
        parts = _split(path)
        for p in parts[:-1]:
            node = node[p]
        del node[parts[-1]]

    return mutate


def _split(path: str) -> list[Any]:
    return [int(i) if i.isdigit() else i or k for k, i in re.findall(r"([^.\[\]]+)|\[([^\]]+)\]", path)]


def _all(*mutations: Mutation) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        for m in mutations:
            m(raw)

    return mutate


def _second_group(**fields: Any) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        group = {"name": "other", "source": "src", "destination": "dst", "mirrors": [{"source_topic": "x"}]}
        group.update(fields)
        raw["groups"].append(group)

    return mutate


def _add_cluster(alias: str, bootstrap: str) -> Mutation:
    def mutate(raw: dict[str, Any]) -> None:
        raw["clusters"][alias] = {"kafka": {"bootstrap.servers": bootstrap}}

    return mutate


G = "groups[0]"
M0 = "groups[0].mirrors[0]"
M1 = "groups[0].mirrors[1]"

# (id, mutation or raw YAML text, expected path, key word of the message)
MALFORMED: list[tuple[str, Mutation | str, str, str]] = [
    # unknown keys at every level
    ("unknown-top-key", _set("mirrors", []), "mirrors", "unknown key"),
    ("unknown-cluster-key", _set("clusters.src.registry", {}), "clusters.src.registry", "unknown key"),
    (
        "unknown-registry-key",
        _set("clusters.src.schema_registry.username", "u"),
        "clusters.src.schema_registry.username",
        "unknown key",
    ),
    ("unknown-group-key", _set(f"{G}.topic_filter", "x"), f"{G}.topic_filter", "unknown key"),
    ("unknown-mirror-key", _set(f"{M1}.topic", "x"), f"{M1}.topic", "unknown key"),
    ("unknown-topics-filter-key", _set(f"{M1}.topics.regex", "x"), f"{M1}.topics.regex", "unknown key"),
    (
        "unknown-topics-mirroring-key",
        _set(f"{G}.topics_mirroring", {"partitions": 3}),
        f"{G}.topics_mirroring.partitions",
        "unknown key",
    ),
    (
        "unknown-partition-count-key",
        _set(f"{G}.topics_mirroring", {"partition_count": {"count": 3}}),
        f"{G}.topics_mirroring.partition_count.count",
        "unknown key",
    ),
    (
        "unknown-mirror-nested-key",
        _set(f"{M0}.topics_mirroring", {"replication_factor": {"type": "fix", "valu": 3}}),
        f"{M0}.topics_mirroring.replication_factor.valu",
        "unknown key",
    ),
    ("unknown-offsets-key", _set(f"{G}.offsets", {"sync": True}), f"{G}.offsets.sync", "unknown key"),
    (
        "unknown-offsets-groups-key",
        _set(f"{G}.offsets", {"groups": {"includes": ".*"}}),
        f"{G}.offsets.groups.includes",
        "unknown key",
    ),
    ("unknown-heartbeats-key", _set(f"{G}.heartbeats", {"period": "1s"}), f"{G}.heartbeats.period", "unknown key"),
    ("unknown-spark-key", _set(f"{G}.spark", {"executors": 2}), f"{G}.spark.executors", "unknown key"),
    ("unknown-schemas-key", _set(f"{G}.schemas", {"mode": "strict"}), f"{G}.schemas.mode", "unknown key"),
    ("unknown-serdes-key", _set(f"{M0}.serdes", {"headers": "string"}), f"{M0}.serdes.headers", "unknown key"),
    # cluster references and clusters
    ("undefined-source", _set(f"{G}.source", "nowhere"), f"{G}.source", "undefined cluster"),
    ("undefined-destination", _set(f"{G}.destination", "dts"), f"{G}.destination", "undefined cluster"),
    ("bad-cluster-alias", _add_cluster("my.cluster", "h:1"), "clusters.my.cluster", "invalid cluster alias"),
    ("no-clusters", _set("clusters", {}), "clusters", "at least 1"),
    ("missing-bootstrap", _del("clusters.src.kafka[bootstrap.servers]"), "clusters.src.kafka", "bootstrap.servers"),
    ("empty-bootstrap", _set("clusters.src.kafka[bootstrap.servers]", ""), "clusters.src.kafka", "bootstrap.servers"),
    ("missing-kafka", _del("clusters.src.kafka"), "clusters.src.kafka", "required"),
    ("kafka-property-list", _set("clusters.src.kafka[linger.ms]", [5]), "clusters.src.kafka", "linger.ms"),
    (
        "bad-registry-url",
        _set("clusters.src.schema_registry.url", "src-registry:8081"),
        "clusters.src.schema_registry.url",
        "not an http(s) URL",
    ),
    (
        "registry-retries-range",
        _set("clusters.dst.schema_registry.retries", 99),
        "clusters.dst.schema_registry.retries",
        "less than or equal",
    ),
    (
        "bad-registry-timeout",
        _set("clusters.src.schema_registry.timeout", "soon"),
        "clusters.src.schema_registry.timeout",
        "not a duration",
    ),
    ("avro-without-registry", _del("clusters.dst.schema_registry"), f"{M0}.serdes.value", "schema_registry"),
    (
        "mirror-avro-key-without-registry",
        _all(
            _del("clusters.src.schema_registry"),
            _set(f"{G}.serdes", {"key": "string"}),
            _set(f"{M1}.serdes", {"key": "avro"}),
        ),
        f"{M1}.serdes.key",
        "schema_registry",
    ),
    # regexes
    ("bad-include-regex", _set(f"{M1}.topics.include", "payments.(*"), f"{M1}.topics.include", "invalid regex"),
    ("bad-exclude-regex", _set(f"{M1}.topics.exclude", "[tmp"), f"{M1}.topics.exclude", "invalid regex"),
    (
        "bad-offsets-groups-regex",
        _set(f"{G}.offsets", {"groups": {"include": "*"}}),
        f"{G}.offsets.groups.include",
        "invalid regex",
    ),
    (
        "bad-config-exclude-regex",
        _set(f"{G}.topics_mirroring", {"config_exclude": ["retention\\.ms", "+x"]}),
        f"{G}.topics_mirroring.config_exclude[1]",
        "invalid regex",
    ),
    # count rules
    (
        "min-greater-than-max",
        _set(f"{G}.topics_mirroring", {"partition_count": {"min": 12, "max": 3}}),
        f"{G}.topics_mirroring.partition_count",
        "min (12) > max (3)",
    ),
    (
        "zero-partitions",
        _set(f"{G}.topics_mirroring", {"partition_count": {"type": "fix", "value": 0}}),
        f"{G}.topics_mirroring.partition_count.value",
        "greater than 0",
    ),
    (
        "negative-rf-on-mirror",
        _set(f"{M0}.topics_mirroring", {"replication_factor": {"type": "fix", "value": -1}}),
        f"{M0}.topics_mirroring.replication_factor.value",
        "greater than 0",
    ),
    (
        "zero-min",
        _set(f"{G}.topics_mirroring", {"replication_factor": {"min": 0}}),
        f"{G}.topics_mirroring.replication_factor.min",
        "greater than 0",
    ),
    (
        "fix-without-value",
        _set(f"{G}.topics_mirroring", {"partition_count": {"type": "fix"}}),
        f"{G}.topics_mirroring.partition_count",
        "needs 'value'",
    ),
    (
        "mirror-source-with-value",
        _set(f"{G}.topics_mirroring", {"partition_count": {"type": "mirror_source", "value": 3}}),
        f"{G}.topics_mirroring.partition_count",
        "only used with type 'fix'",
    ),
    (
        "bad-count-type",
        _set(f"{G}.topics_mirroring", {"partition_count": {"type": "double"}}),
        f"{G}.topics_mirroring.partition_count.type",
        "'fix' or 'mirror_source'",
    ),
    # literals and names
    ("unknown-serde", _set(f"{G}.serdes", {"value": "xml"}), f"{G}.serdes.value", "'xml'"),
    (
        "unknown-policy",
        _set(f"{G}.replication_policy", "mirror"),
        f"{G}.replication_policy",
        "unknown replication policy",
    ),
    (
        "policy-not-importable",
        _set(f"{G}.replication_policy", "no_such_module_xyz.Policy"),
        f"{G}.replication_policy",
        "cannot import",
    ),
    (
        "policy-missing-class",
        _set(f"{G}.replication_policy", "mirror_core.policy.NoSuchPolicy"),
        f"{G}.replication_policy",
        "cannot import",
    ),
    ("policy-not-a-class", _set(f"{G}.replication_policy", "os.path"), f"{G}.replication_policy", "not a class"),
    (
        "policy-not-a-policy",
        _set(f"{G}.replication_policy", "collections.OrderedDict"),
        f"{G}.replication_policy",
        "not a replication policy",
    ),
    ("bad-separator", _set(f"{G}.replication_policy_separator", "/"), f"{G}.replication_policy_separator", "separator"),
    ("bad-delivery", _set(f"{G}.delivery", "exactly-once"), f"{G}.delivery", "'exactly_once' or 'at_least_once'"),
    ("bad-mirror-mode-on-mirror", _set(f"{M0}.mirror_mode", "loose"), f"{M0}.mirror_mode", "'strict' or 'lenient'"),
    ("bad-on-error", _set(f"{G}.on_error", "ignore"), f"{G}.on_error", "'dead_letter' or 'fail'"),
    (
        "bad-compat-level",
        _set(f"{M1}.force_subject_compatibility_level", "LOOSE"),
        f"{M1}.force_subject_compatibility_level",
        "'LOOSE'",
    ),
    ("bad-enabled", _set(f"{G}.enabled", "maybe"), f"{G}.enabled", "boolean"),
    ("bad-group-name", _set(f"{G}.name", "prod group"), f"{G}.name", "invalid name"),
    ("bad-mirror-name", _set(f"{M0}.name", "-orders"), f"{M0}.name", "invalid name"),
    ("duplicate-group-name", _second_group(name="prod"), "groups[1].name", "duplicate group name"),
    # mirrors: form
    ("empty-mirrors", _set(f"{G}.mirrors", []), f"{G}.mirrors", "at least 1"),
    ("both-source-topic-and-topics", _set(f"{M1}.source_topic", "payments.eu"), M1, "exactly one"),
    (
        "neither-source-topic-nor-topics",
        _set(f"{G}.mirrors", [{"source_topic": "a"}, {"delivery": "at_least_once"}]),
        M1,
        "exactly one",
    ),
    ("destination-topic-with-flow", _set(f"{M1}.destination_topic", "payments"), M1, "destination_topic"),
    ("invalid-source-topic", _set(f"{M0}.source_topic", "orders/eu"), f"{M0}.source_topic", "invalid topic name"),
    (
        "invalid-destination-topic",
        _set(f"{M0}.destination_topic", "x" * 250),
        f"{M0}.destination_topic",
        "invalid topic name",
    ),
    (
        "invalid-dead-letter-topic",
        _set(f"{G}.dead_letter_topic", "dlq topic"),
        f"{G}.dead_letter_topic",
        "invalid topic name",
    ),
    (
        "invalid-heartbeats-topic",
        _set(f"{G}.heartbeats", {"topic": "heart:beats"}),
        f"{G}.heartbeats.topic",
        "invalid topic name",
    ),
    # mirrors: clashes
    (
        "duplicate-name-override",
        _all(_set(f"{M0}.name", "same"), _set(f"{M1}.name", "same")),
        M1,
        "duplicate mirror name 'same'",
    ),
    (
        "same-pair-twice",
        _set(f"{G}.mirrors", [{"source_topic": "a"}, {"source_topic": "a"}]),
        M1,
        "duplicate mirror name",
    ),
    (
        "same-destination-in-group",
        _set(
            f"{G}.mirrors",
            [{"source_topic": "a", "destination_topic": "c"}, {"source_topic": "b", "destination_topic": "c"}],
        ),
        M1,
        "already written by groups[0].mirrors[0]",
    ),
    (
        "same-destination-across-groups",
        _second_group(mirrors=[{"source_topic": "orders"}]),
        "groups[1].mirrors[0]",
        "already written by groups[0].mirrors[0]",
    ),
    ("onto-itself-same-alias", _set(f"{G}.destination", "src"), M0, "onto itself"),
    (
        "onto-itself-same-bootstrap",
        _all(
            _add_cluster("src-again", "SRC-2:9092, src-1:9092"),
            _set(f"{G}.destination", "src-again"),
            _set(f"{G}.serdes", {"key": "bytes", "value": "bytes"}),
        ),
        M0,
        "onto itself",
    ),
    (
        "identity-flow-onto-itself",
        _all(_set(f"{G}.destination", "src"), _set(f"{G}.mirrors", [{"topics": {}}])),
        f"{M0}.topics",
        "onto itself",
    ),
    # interpolation
    (
        "missing-env-var",
        _set("clusters.dst.kafka[sasl.password]", "${MIRRORFLOW_TEST_UNSET_PASSWORD}"),
        "clusters.dst.kafka.sasl.password",
        "MIRRORFLOW_TEST_UNSET_PASSWORD",
    ),
    # durations
    (
        "bad-offsets-interval",
        _set(f"{G}.offsets", {"interval": "10 parsecs"}),
        f"{G}.offsets.interval",
        "not a duration",
    ),
    ("zero-heartbeat-interval", _set(f"{G}.heartbeats", {"interval": "0s"}), f"{G}.heartbeats.interval", "positive"),
    ("negative-interval", _set(f"{G}.offsets", {"interval": -5}), f"{G}.offsets.interval", "positive"),
    ("bad-spark-trigger", _set(f"{G}.spark", {"trigger": "sometimes"}), f"{G}.spark.trigger", "available_now"),
    ("bad-read-path", _set(f"{G}.spark", {"read_path": "jvm"}), f"{G}.spark.read_path", "'auto', 'spark', 'direct' or 'executors'"),
    ("negative-direct-processes", _set(f"{G}.spark", {"direct_processes": -1}), f"{G}.spark.direct_processes",
     "greater than or equal to 0"),
    ("per-writer-on-spark-path", _set(f"{G}.spark", {"transactions": "per_writer", "read_path": "spark"}),
     f"{G}.spark", "per_writer needs read_path: direct, executors or auto (with spark"),
    ("keep-writing-on-spark-path", _set(f"{G}.spark", {"keep_writing_for": "5s", "read_path": "spark"}),
     f"{G}.spark", "keep_writing_for needs read_path: direct or auto"),
    ("overlap-on-spark-path", _set(f"{G}.spark", {"overlap_writes": True, "read_path": "spark"}),
     f"{G}.spark", "overlap_writes needs read_path: direct or auto"),
    ("keep-writing-in-tasks", _set(f"{G}.spark", {"keep_writing_for": "5s", "read_path": "executors"}),
     f"{G}.spark", "keep_writing_for needs read_path: direct or auto (with executors"),
    ("overlap-in-tasks", _set(f"{G}.spark", {"overlap_writes": True, "read_path": "executors"}),
     f"{G}.spark", "overlap_writes needs read_path: direct or auto (with executors"),
    ("per-writer-too-many-processes",
     _set(f"{G}.spark", {"transactions": "per_writer", "read_path": "direct", "direct_processes": 17}),
     f"{G}.spark", "at most 16 direct_processes"),
    ("bad-transactions", _set(f"{G}.spark", {"transactions": "per_batch"}), f"{G}.spark.transactions",
     "'per_partition' or 'per_writer'"),
    ("zero-writer-producers",
     _set(f"{G}.spark", {"transactions": "per_writer", "read_path": "direct", "writer_producers": 0}),
     f"{G}.spark.writer_producers", "greater than or equal to 1"),
    ("too-many-writer-producers",
     _set(f"{G}.spark", {"transactions": "per_writer", "read_path": "direct", "writer_producers": 5}),
     f"{G}.spark.writer_producers", "less than or equal to 4"),
    (
        "zero-max-offsets",
        _set(f"{G}.spark", {"max_offsets_per_trigger": 0}),
        f"{G}.spark.max_offsets_per_trigger",
        "greater than 0",
    ),
    (
        "source-option-splits-partitions",
        _set(f"{G}.spark", {"source_options": {"minPartitions": "12"}}),
        f"{G}.spark.source_options",
        "one Kafka partition must stay in one Spark task",
    ),
    (
        "source-option-reads-uncommitted",
        _set(f"{G}.spark", {"source_options": {"kafka.isolation.level": "read_uncommitted"}}),
        f"{G}.spark.source_options",
        "read_committed",
    ),
    (
        "source-option-secret",
        _set(f"{G}.spark", {"source_options": {"kafka.sasl.jaas.config": "x required password=hunter2-secret;"}}),
        f"{G}.spark.source_options",
        "source cluster's config",
    ),
    (
        "spark-speculation",
        _set(f"{G}.spark", {"conf": {"spark.speculation": "true"}}),
        f"{G}.spark.conf",
        "a speculative copy of a task writes the same records",
    ),
    # file level
    (
        "invalid-yaml",
        "clusters:\n  src: {kafka: {bootstrap.servers: a:1}\ngroups: []\n",
        "line 3, column 1",
        "invalid YAML",
    ),
    ("top-level-list", "- clusters\n- groups\n", "", "top level must be a mapping"),
    ("empty-file", "", "", "top level must be a mapping"),
    ("missing-groups", _del("groups"), "groups", "required"),
    ("groups-not-a-list", _set("groups", {"prod": {}}), "groups", "valid list"),
]


@pytest.mark.parametrize(("mutation", "path", "word"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_config_exits_2_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutation: Mutation | str, path: str, word: str
) -> None:
    monkeypatch.delenv("MIRRORFLOW_TEST_UNSET_PASSWORD", raising=False)
    file = tmp_path / "mirrors.yaml"
    if isinstance(mutation, str):
        file.write_text(mutation)
    else:
        raw = copy.deepcopy(base_config())
        mutation(raw)
        file.write_text(yaml.safe_dump(raw, sort_keys=False))

    result = run_validate(file)

    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    prefix = f"{file}: {path}: " if path else f"{file}: "
    lines = [line for line in result.output.splitlines() if line.startswith(prefix)]
    assert lines, f"no line starting {prefix!r} in:\n{result.output}"
    assert any(word in line for line in lines), f"{word!r} not in {lines}"
    assert "hunter2-secret" not in result.output and "sr-secret" not in result.output


def test_enough_malformed_cases() -> None:
    assert len(MALFORMED) >= 35
    assert len({c[0] for c in MALFORMED}) == len(MALFORMED)


def test_base_config_is_valid(tmp_path: Path) -> None:
    """Each malformed case is one mutation away from this valid config."""
    file = tmp_path / "mirrors.yaml"
    file.write_text(yaml.safe_dump(base_config()))
    result = run_validate(file)
    assert result.exit_code == 0, result.output
    assert "1 topic pairs, 1 regex flows" in result.output


def test_unreadable_file_exits_2(tmp_path: Path) -> None:
    result = run_validate(tmp_path / "missing.yaml")
    assert result.exit_code == 2
    assert "cannot read" in result.output and "Traceback" not in result.output


# --------------------------------------------------------------------------- Airflow connections


def _conn_cfg() -> Any:
    return parse_config(yaml.safe_load("""
clusters:
  a: {kafka: {bootstrap.servers: "a:1"}}
  b: {connection: kafka_b, kafka: {client.id: mine}, schema_registry_connection: sr_b}
  c: {connection: kafka_c}
groups:
  - {name: bc, source: b, destination: c, mirrors: [{source_topic: t}]}
  - {name: ab, source: a, destination: b, mirrors: [{source_topic: t}]}
"""), env={})


def test_a_cluster_may_name_airflow_connections_resolved_later(tmp_path: Any) -> None:
    from mirror_core.config import connections_payload, with_connections, with_connections_file

    cfg = _conn_cfg()
    b = cfg.cluster("b")
    assert b.needs_connection and not cfg.cluster("a").needs_connection
    with pytest.raises(ConfigError, match="Airflow connection 'kafka_b'"):
        b.kafka_properties()

    def resolve(c: Any) -> Any:
        if c.connection == "kafka_b":
            return ({"bootstrap.servers": "b:9", "sasl.password": "s3cret", "client.id": "theirs"},
                    {"url": "http://reg:1/apis/ccompat/v7", "basic.auth.user.info": "u:p4ss"})
        return {"bootstrap.servers": "c:9"}, None

    resolved = with_connections(cfg, resolve)
    rb = resolved.cluster("b")
    assert not rb.needs_connection
    assert rb.kafka_properties() == {"bootstrap.servers": "b:9", "sasl.password": "s3cret", "client.id": "mine"}
    assert isinstance(rb.kafka["sasl.password"], SecretStr) and "s3cret" not in repr(rb)
    assert rb.schema_registry.url.get_secret_value() == "http://reg:1/apis/ccompat/v7"
    assert "p4ss" not in repr(rb.schema_registry)
    path = tmp_path / "conns.json"
    path.write_text(json.dumps(connections_payload(resolved)))
    again = with_connections_file(cfg, str(path))
    assert again.cluster("b").kafka_properties() == rb.kafka_properties()
    assert again.cluster("b").schema_registry.basic_auth_user_info.get_secret_value() == "u:p4ss"
    assert again.cluster("c").kafka_properties() == {"bootstrap.servers": "c:9"}


def test_a_cluster_needs_kafka_properties_or_a_connection() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(yaml.safe_load("""
clusters:
  a: {schema_registry: {url: "http://r:1"}}
  b: {schema_registry_connection: sr, schema_registry: {url: "http://r:1"}, connection: k}
groups: [{name: g, source: a, destination: b, mirrors: [{source_topic: t}]}]
"""), env={})
    assert [str(i) for i in err.value.issues] == [
        "clusters.a.kafka: required: the librdkafka properties, or 'connection' naming an Airflow connection",
        "clusters.b: give either 'schema_registry' or 'schema_registry_connection', not both"]


@pytest.mark.parametrize(("spark", "master", "reads", "per_writer"), [
    ({}, None, "direct", True),  # the defaults: both auto, on local[2]
    ({"master": "local[*]"}, None, "direct", True),
    # Spark plans, the executors' tasks read with mirrorflow's reader, a transaction per partition
    ({"master": "spark://spark-master:7077"}, None, "executors", False),
    ({"master": "yarn", "transactions": "per_writer"}, None, "direct", True),  # options only the direct path has
    ({"master": "yarn", "keep_writing_for": "5s"}, None, "direct", True),
    ({"master": "yarn", "overlap_writes": True}, None, "direct", True),
    ({"read_path": "spark"}, None, "spark", False),
    ({"read_path": "spark", "master": "yarn"}, None, "spark", False),
    ({"read_path": "executors"}, None, "executors", False),
    # a transaction per task share (asked for: auto takes a transaction per partition in the tasks)
    ({"read_path": "executors", "transactions": "per_writer"}, None, "executors", True),
    ({"read_path": "direct", "master": "yarn"}, None, "direct", True),
    ({"transactions": "per_partition"}, None, "direct", False),  # a transaction per partition, asked for
    ({"read_path": "direct", "master": "yarn", "transactions": "per_partition"}, None, "direct", False),
    # more writer processes than writer slots: a transaction per partition
    ({"direct_processes": WRITER_SLOTS + 1}, None, "direct", False),
    ({"direct_processes": WRITER_SLOTS}, None, "direct", True),
    # submitted to another master (Airflow's Spark connection): auto follows where the job runs
    ({}, "spark://spark-master:7077", "executors", False),
    ({"master": "spark://spark-master:7077"}, "local[2]", "direct", True),
    ({"read_path": "spark"}, "local[2]", "spark", False),
])
def test_auto_reads_directly_on_a_local_master_and_in_the_executors_tasks_on_a_cluster(
        spark: dict[str, Any], master: str | None, reads: str, per_writer: bool) -> None:
    """``read_path: auto`` reads directly on a local master (and where an option of the direct path is set),
    and ``transactions: auto`` then commits a transaction per writer process; on a cluster master the
    executors' tasks read with mirrorflow's reader, and they, like Spark's read path's tasks, write a
    transaction per partition. Spark's own read path only when asked for."""
    raw = base_config()
    raw["groups"][0]["spark"] = spark
    group = with_master(parse(raw).groups[0], master)
    s = group.spark
    assert (s.reads_directly, s.reads_in_tasks, s.plans_only) == (reads == "direct", reads == "executors",
                                                                  reads != "spark")
    assert group.spark.writes_per_writer is per_writer
    assert group.spark.master == (master or spark.get("master", "local[2]"))
    assert group.spark.read_path == spark.get("read_path", "auto")  # resolved where it is read, not rewritten
    assert group.spark.transactions == spark.get("transactions", "auto")


def _state_config(tmp_path: Path, spark: dict[str, Any]) -> Path:
    """base_config() as a file in ``tmp_path/conf``, the first group's spark settings ``spark``."""
    raw = base_config()
    raw["groups"][0]["spark"] = spark
    path = tmp_path / "conf" / "mirrors.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(raw))
    return path


def test_relative_state_dirs_are_relative_to_the_config_file_from_any_working_directory(tmp_path, monkeypatch):
    """The CLI, Airflow's tasks and the Spark job read one config from different directories: each must find
    the same checkpoint, lock and stop key (a second checkpoint would read the sources again from the
    earliest offsets, and a job started elsewhere would not see the first one's lock)."""
    path = _state_config(tmp_path, {"checkpoint_dir": "../state/ckpt", "secrets_dir": "secrets"})
    seen = []
    for cwd in (tmp_path, path.parent, REPO):
        monkeypatch.chdir(cwd)
        spark = load_config(path).groups[0].spark
        seen.append((spark.checkpoint_dir, spark.secrets_dir))
    assert seen == [(str(tmp_path / "state" / "ckpt"), str(tmp_path / "conf" / "secrets"))] * 3
    # a config path given relative to the working directory works the same
    monkeypatch.chdir(tmp_path)
    assert load_config(Path("conf") / "mirrors.yaml").groups[0].spark.checkpoint_dir == str(tmp_path / "state" / "ckpt")
    # the default is relative to the file as well; a full path and a URI stay as written
    assert load_config(_state_config(tmp_path / "d", {})).groups[0].spark.checkpoint_dir == \
        str(tmp_path / "d" / "conf" / ".state" / "checkpoints")
    for given in ("/var/lib/mirrorflow", "s3a://bucket/checkpoints", "file:///var/ckpt"):
        cfg = load_config(_state_config(tmp_path / given.replace("/", "_").replace(":", ""), {"checkpoint_dir": given}))
        assert cfg.groups[0].spark.checkpoint_dir == given
    # a config that is not read from a file keeps the path as written
    assert parse_config(base_config()).groups[0].spark.checkpoint_dir == ".state/checkpoints"


def test_a_checkpoint_found_only_against_the_working_directory_is_refused_until_it_is_moved(tmp_path, monkeypatch):
    """Before 7 December a relative checkpoint_dir was relative to the working directory: an existing
    checkpoint there is not left behind silently (the job would start a new one from the earliest offsets)."""
    path = _state_config(tmp_path, {"checkpoint_dir": "ckpt"})
    group = load_config(path).groups[0].name
    old = tmp_path / "ckpt" / group
    (old / "offsets").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    text = str(err.value)
    new = tmp_path / "conf" / "ckpt" / group
    assert "groups[0].spark.checkpoint_dir" in text and str(old) in text and str(new) in text
    assert len(text.splitlines()) <= 2  # one line, under the file's name
    # run from the config's directory, the two places are one: nothing to refuse
    monkeypatch.chdir(path.parent)
    assert load_config(path).groups[0].spark.checkpoint_dir == str(tmp_path / "conf" / "ckpt")
    # once moved, the config loads from anywhere
    monkeypatch.chdir(tmp_path)
    new.parent.mkdir(parents=True, exist_ok=True)
    old.rename(new)
    assert load_config(path).groups[0].spark.checkpoint_dir == str(tmp_path / "conf" / "ckpt")
