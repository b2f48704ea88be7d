"""Strimzi's newer KafkaMirrorMaker2 shape (``spec.target``, ``spec.mirrors[].source``) -> mirrorflow."""

from __future__ import annotations

import pytest
from importer_samples import fixture_text, load, run_import

from mirror_core.config import resolve_mirrors
from mirror_core.errors import ConfigError
from mirror_core.importers import import_config

CR = fixture_text("strimzi-target.yaml")


def test_target_and_each_mirrors_source_become_clusters_and_groups():
    res = run_import("strimzi", "strimzi-target.yaml")
    cfg = load(res)
    assert sorted(cfg.clusters) == ["central", "dc-east", "edge-7"]
    assert [(g.name, g.source, g.destination) for g in cfg.groups] == [
        ("dc-east-to-central", "dc-east", "central"), ("edge-7-to-central", "edge-7", "central")]
    central = cfg.clusters["central"].kafka_properties()
    assert central["security.protocol"] == "SASL_SSL" and central["sasl.mechanism"] == "SCRAM-SHA-512"
    assert central["sasl.username"] == "central-mm2" and central["sasl.password"] == "value-of-CENTRAL_SASL_PASSWORD"
    east = cfg.clusters["dc-east"].kafka_properties()
    assert east["sasl.username"] == "mm2-reader" and east["sasl.password"] == "value-of-DC_EAST_SASL_PASSWORD"
    edge = cfg.clusters["edge-7"].kafka_properties()
    assert edge["security.protocol"] == "SSL"
    assert edge["ssl.key.location"] == "value-of-EDGE_7_SSL_KEY_LOCATION"
    what = dict(res.env_vars)
    assert "secret dc-east-mm2-reader" in what["DC_EAST_SASL_PASSWORD"]


def test_mirrors_map_as_in_the_older_shape():
    cfg = load(run_import("strimzi", "strimzi-target.yaml"))
    east, edge = cfg.groups
    assert east.replication_policy == "identity" and edge.replication_policy == "prefix"
    assert east.delivery == "exactly_once" == edge.delivery  # the target's config.exactly.once.source.support
    flow = resolve_mirrors(east)[0].topics
    assert flow is not None and flow.matches("orders.eu") and flow.matches("payments.card")
    assert not flow.matches("orders.eu.tmp") and not flow.matches("refunds")
    assert east.offsets.groups.matches("billing-eu") and not east.offsets.groups.matches("shipping")
    assert east.offsets.sync_group_offsets and east.offsets.interval == 20.0
    assert east.topics_mirroring.sync_acls is False and east.topics_mirroring.replication_factor.value == 3
    assert not east.heartbeats.enabled  # no heartbeatConnector (v1 has none): no heartbeats
    assert edge.enabled and not edge.offsets.emit_checkpoints  # no checkpointConnector


def test_connect_worker_fields_of_the_target_are_reported():
    res = run_import("strimzi", "strimzi-target.yaml")
    found = {f.where: f.message for f in res.findings}
    for key in ("groupId", "configStorageTopic", "statusStorageTopic", "offsetStorageTopic"):
        assert "Kafka Connect worker setting" in found[f"spec.target.{key}"]
    assert "spec.mirrors[0].sourceConnector.tasksMax" in found and "spec.replicas" in found
    assert not any(w.startswith("spec.target.alias") or w.endswith(".source") for w in found)


def test_a_source_shared_by_two_mirrors_is_one_cluster():
    cr = CR
    east = cr[cr.index("    - source:\n        alias: dc-east"):cr.index("    - source:\n        alias: edge-7")]
    cr = cr.replace(east, east + east.replace('topicsPattern: "orders\\\\..*, payments\\\\..*"', 'topicsPattern: "audit"'))
    cfg = load(import_config("strimzi", cr, "kmm2.yaml"))
    assert sorted(cfg.clusters) == ["central", "dc-east", "edge-7"]
    assert [g.name for g in cfg.groups] == ["dc-east-to-central", "dc-east-to-central-2", "edge-7-to-central"]


@pytest.mark.parametrize(("change", "where", "problem"), [
    (("  target:\n", "  clusters: []\n  target:\n"), "spec.clusters", "one shape"),
    (("    alias: central\n", ""), "spec.target.alias", "missing"),
    (("        alias: edge-7\n", "        alias: central\n"), "spec.mirrors[1].source.alias", "the target's alias"),
    (("        alias: edge-7\n", "        alias: dc-east\n"), "spec.mirrors[1].source.alias", "defined otherwise in spec.mirrors[0].source"),
    (("    - source:\n        alias: edge-7", "    - sourceCluster: edge-7\n      source:\n        alias: edge-7"),
     "spec.mirrors[1].sourceCluster", "spec.target"),
    (("    bootstrapServers: central-kafka-bootstrap.kafka.svc:9093\n", ""), "spec.target.bootstrapServers", "missing"),
    (("          type: tls\n", "          type: kerberos\n"), "spec.mirrors[1].source.authentication.type", "unknown type"),
])
def test_malformed_target_shape_names_the_key(change, where, problem):
    old, new = change
    assert old in CR
    with pytest.raises(ConfigError) as info:
        import_config("strimzi", CR.replace(old, new, 1), "kmm2.yaml")
    issue = info.value.issues[0]
    assert (issue.path, info.value.source) == (where, "kmm2.yaml") and problem in issue.message, issue


def test_a_mirror_without_source_is_an_error():
    cr = CR.replace("    - source:\n        alias: edge-7\n", "    - from:\n        alias: edge-7\n")
    assert cr != CR
    with pytest.raises(ConfigError) as info:
        import_config("strimzi", cr, "kmm2.yaml")
    assert info.value.issues[0].path == "spec.mirrors[1].source"


def test_a_mirror_from_the_target_to_itself_names_the_keys_of_this_shape():
    """The same-cluster error names the keys the resource has (``source``, ``spec.target``), not the older
    shape's ``sourceCluster`` / ``targetCluster``."""
    cr = """apiVersion: kafka.strimzi.io/v1
kind: KafkaMirrorMaker2
metadata: {name: loop}
spec:
  target: {alias: central, bootstrapServers: "central:9092"}
  mirrors:
    - source: {alias: central, bootstrapServers: "central:9092"}
      topicsPattern: "orders"
"""
    with pytest.raises(ConfigError) as info:
        import_config("strimzi", cr, "kmm2.yaml")
    issue = info.value.issues[0]
    assert (issue.path, issue.message) == ("spec.mirrors[0].source", "the mirror's source and spec.target are the same "
                                                                     "cluster ('central')")
