"""MirrorMaker 2 run as Kafka Connect connectors -> mirrorflow: one group per source -> target pair, merged
from its MirrorSourceConnector, MirrorCheckpointConnector and MirrorHeartbeatConnector configs."""

from __future__ import annotations

import json
from typing import Any

import pytest
from importer_samples import FIXTURES, load
from typer.testing import CliRunner

from mirror_core.cli import app
from mirror_core.config import resolve_mirrors
from mirror_core.errors import ConfigError
from mirror_core.importers import Imported, import_config

CONNECT = FIXTURES / "connect"
FILES = ("mm2-source.json", "mm2-checkpoint.json", "mm2-heartbeat.properties")
SECRET = "Cl0ud-Connect-S3cret"
SOURCE_CLASS = "org.apache.kafka.connect.mirror.MirrorSourceConnector"


def _three(**replace: tuple[str, str]) -> Imported:
    """The three sample connectors; ``replace`` maps a file's stem (``source``) to an (old, new) text edit."""
    inputs = []
    for name in FILES:
        text = (CONNECT / name).read_text()
        edit = replace.get(name.split("-")[1].split(".")[0])
        if edit:
            assert edit[0] in text, edit
            text = text.replace(*edit)
        inputs.append((text, f"connect/{name}"))
    return import_config("mm2", *inputs[0], more=inputs[1:])


def _one(config: dict[str, Any], name: str = "c.json") -> Imported:
    base = {"connector.class": SOURCE_CLASS, "source.cluster.alias": "A", "target.cluster.alias": "B",
            "source.cluster.bootstrap.servers": "a:9092", "target.cluster.bootstrap.servers": "b:9092"}
    return import_config("mm2", json.dumps({"name": "m", "config": base | config}), name)


def test_three_connectors_of_a_pair_merge_into_one_group():
    res = _three()
    cfg = load(res)
    assert [g.name for g in cfg.groups] == ["onprem-to-cloud"]
    g = cfg.groups[0]
    assert (g.source, g.destination, g.enabled) == ("onprem", "cloud", True)
    assert g.replication_policy == "prefix" and g.delivery == "exactly_once"
    flow = resolve_mirrors(g)[0].topics
    assert flow is not None and flow.matches("orders.eu") and flow.matches("payments.card")
    assert not flow.matches("orders.eu.tmp") and not flow.matches("refunds")
    assert g.offsets.emit_checkpoints and g.offsets.sync_group_offsets and g.offsets.interval == 15.0
    assert g.offsets.groups.matches("billing-eu") and g.offsets.groups.matches("reporting-1")
    assert not g.offsets.groups.matches("billing-test-1") and not g.offsets.groups.matches("shipping")
    assert g.heartbeats.enabled and g.heartbeats.interval == 5.0  # from the heartbeat connector's file
    assert g.topics_mirroring.replication_factor.value == 3 and g.topics_mirroring.sync_acls is False
    assert g.spark.source_options == {"kafka.max.poll.records": "2000"}  # consumer.* of the source connector


def test_cluster_settings_map_with_secrets_as_variables():
    res = _three()
    cfg = load(res)
    onprem = cfg.clusters["onprem"].kafka_properties()
    assert onprem["security.protocol"] == "SSL" and onprem["ssl.ca.location"] == "/etc/kafka/secrets/onprem-ca.pem"
    cloud = cfg.clusters["cloud"].kafka_properties()
    assert cloud["security.protocol"] == "SASL_SSL" and cloud["sasl.mechanism"] == "PLAIN"
    assert cloud["sasl.username"] == "mm2-connect" and cloud["sasl.password"] == "value-of-CLOUD_SASL_PASSWORD"
    assert cloud["compression.type"] == "zstd" and cloud["linger.ms"] == "20"  # producer.override.*
    assert dict(res.env_vars).keys() == {"CLOUD_SASL_PASSWORD"}
    seen = "\n".join([res.yaml_text, *map(str, res.findings), *(w for _, w in res.env_vars)])
    assert SECRET not in seen and "${CLOUD_SASL_PASSWORD}" in res.yaml_text


def test_what_concerns_one_connector_is_reported_for_its_file():
    res = _three()
    found = {(f.file, f.where) for f in res.findings}
    assert ("connect/mm2-source.json", "tasks.max") in found and ("connect/mm2-checkpoint.json", "tasks.max") in found
    assert ("connect/mm2-heartbeat.properties", "heartbeats.topic.replication.factor") in found
    assert ("connect/mm2-source.json", "errors.tolerance") in found
    assert "# mm2-checkpoint.json: refresh.groups.interval.seconds: " in res.yaml_text
    assert not any("converter" in w for _, w in found)  # byte-array converters: what mirrorflow does
    assert "converters: ByteArrayConverter" in res.yaml_text


def test_connectors_that_disagree_are_refused_naming_file_and_key():
    with pytest.raises(ConfigError) as info:
        _three(checkpoint=('"replication.policy.separator": "."', '"replication.policy.separator": "_"'))
    exc = info.value
    assert (exc.source, exc.issues[0].path) == ("connect/mm2-checkpoint.json", "replication.policy.separator")
    assert "'_' here but '.' in mm2-source.json" in exc.issues[0].message and "must agree" in exc.issues[0].message
    with pytest.raises(ConfigError) as info:  # a secret that differs is named, never shown
        _three(heartbeat=('password="Cl0ud-Connect-S3cret"', 'password="other-Pw"'))
    assert info.value.source == "connect/mm2-heartbeat.properties"
    assert info.value.issues[0].path == "target.cluster.sasl.jaas.config"
    assert SECRET not in str(info.value) and "other-Pw" not in str(info.value)


def test_a_bad_value_is_an_error_in_the_file_that_holds_it():
    with pytest.raises(ConfigError) as info:
        _three(checkpoint=('"emit.checkpoints.interval.seconds": "15"', '"emit.checkpoints.interval.seconds": "often"'))
    assert info.value.source == "connect/mm2-checkpoint.json"
    assert info.value.issues[0].path == "emit.checkpoints.interval.seconds"


def test_one_source_connector_alone_copies_topics_only():
    res = import_config("mm2", (CONNECT / "mm2-source.json").read_text(), "mm2-source.json")
    g = load(res).groups[0]
    assert g.enabled and g.delivery == "exactly_once"
    assert not g.offsets.emit_checkpoints and not g.offsets.sync_group_offsets and not g.heartbeats.enabled
    assert "no MirrorCheckpointConnector config for onprem->cloud among the inputs" in res.yaml_text


def test_bare_map_short_class_name_and_properties_are_read():
    res = import_config("mm2", "connector.class = MirrorCheckpointConnector\nsource.cluster.alias = A\n"
                        "target.cluster.alias = B\nsource.cluster.bootstrap.servers = a:1\n"
                        "target.cluster.bootstrap.servers = b:1\ngroups = g.*\n", "cp.properties")
    g = load(res).groups[0]
    assert not g.enabled and g.offsets.emit_checkpoints and g.offsets.groups.matches("g1")
    assert "no MirrorSourceConnector config for A->B" in res.yaml_text


@pytest.mark.parametrize(("config", "policy", "remote"), [
    ({}, "prefix", "A.orders"),  # MM2's default policy
    ({"replication.policy.separator": "_"}, "prefix", "A_orders"),
    ({"replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"}, "identity", "orders"),
])
def test_replication_policy(config, policy, remote):
    from mirror_core.policy import build_replication_policy

    g = load(_one(config)).groups[0]
    assert g.replication_policy == policy and build_replication_policy(g).format_remote_topic("A", "orders") == remote


@pytest.mark.parametrize("eos", [None, "requested"])
def test_exactly_once_that_the_worker_decided_is_reported(eos):
    res = _one({"exactly.once.support": eos} if eos else {})
    assert load(res).groups[0].delivery == "at_least_once"
    found = [f for f in res.findings if f.where == "exactly.once.support"]
    assert found and "exactly.once.source.support = enabled" in found[0].message


def test_a_converter_other_than_byte_array_is_reported():
    res = _one({"value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter.schemas.enable": "false", "transforms": "route"})
    found = {f.where: f.message for f in res.findings}
    assert "copies the source's bytes unchanged" in found["value.converter"]
    assert "value.converter.schemas.enable" in found and "transforms" in found


def test_checkpoints_and_heartbeats_switched_off_in_their_connectors():
    res = _three(checkpoint=('"emit.checkpoints.enabled": "true"', '"emit.checkpoints.enabled": "false"'),
                 heartbeat=("emit.heartbeats.enabled = true", "emit.heartbeats.enabled = false"))
    g = load(res).groups[0]
    assert not g.offsets.emit_checkpoints and g.offsets.sync_group_offsets and not g.heartbeats.enabled
    res = _three(heartbeat=("tasks.max = 1", "enabled = false"))
    assert not load(res).groups[0].heartbeats.enabled


def test_two_pairs_become_two_groups_sharing_their_clusters():
    back = {"source.cluster.alias": "B", "target.cluster.alias": "A",
            "source.cluster.bootstrap.servers": "b:9092", "target.cluster.bootstrap.servers": "a:9092"}
    res = import_config("mm2", json.dumps({"connector.class": SOURCE_CLASS, "source.cluster.alias": "A",
                                           "target.cluster.alias": "B", "source.cluster.bootstrap.servers": "a:9092",
                                           "target.cluster.bootstrap.servers": "b:9092"}), "ab.json",
                        more=[(json.dumps({"connector.class": SOURCE_CLASS} | back), "ba.json")])
    cfg = load(res)
    assert [g.name for g in cfg.groups] == ["A-to-B", "B-to-A"] and sorted(cfg.clusters) == ["A", "B"]
    with pytest.raises(ConfigError) as info:
        import_config("mm2", json.dumps({"connector.class": SOURCE_CLASS, "source.cluster.alias": "A",
                                         "target.cluster.alias": "B", "source.cluster.bootstrap.servers": "a:9092",
                                         "target.cluster.bootstrap.servers": "b:9092"}), "ab.json",
                      more=[(json.dumps({"connector.class": SOURCE_CLASS} | back | {
                          "target.cluster.bootstrap.servers": "a2:9092"}), "ba.json")])
    assert (info.value.source, info.value.issues[0].path) == ("ba.json", "target.cluster.bootstrap.servers")
    assert "for cluster 'A'" in info.value.issues[0].message


def test_cli_takes_the_three_files_and_names_each_in_its_lines(tmp_path):
    out = tmp_path / "mirrors.yaml"
    res = CliRunner().invoke(app, ["import", "mm2", *(str(CONNECT / n) for n in FILES), "-o", str(out)])
    assert res.exit_code == 0, res.output
    for name in FILES:
        assert f"{CONNECT / name}: tasks.max: " in res.stderr
    assert SECRET not in res.stderr and SECRET not in out.read_text()
    assert out.read_text().startswith(f"# mirrorflow config imported from {', '.join(FILES)} (mm2)")
    res = CliRunner().invoke(app, ["validate", str(out)], env={"CLOUD_SASL_PASSWORD": "x"})
    assert res.exit_code == 0, res.output
