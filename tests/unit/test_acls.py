"""The least-privilege grants of :mod:`mirror_core.acls`: what heartbeats and ``sync_acls`` add, and how
cluster-level grants are printed and applied."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
import yaml

from mirror_core.acls import Grant, apply_acls, required_acls
from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.policy import build_replication_policy
from mirror_core.stream import heartbeat_selection


def config(policy: str = "prefix", group: str = "", mirrors: str = '[{topics: {include: "payments\\\\..*"}}]'
           ) -> MirrorsConfig:
    raw = f"""
clusters:
  src: {{kafka: {{bootstrap.servers: "s:1", security.protocol: SASL_SSL, sasl.mechanism: PLAIN,
                 sasl.username: srcu, sasl.password: x}}}}
  dst: {{kafka: {{bootstrap.servers: "d:1", security.protocol: SASL_SSL, sasl.mechanism: PLAIN,
                 sasl.username: dstu, sasl.password: x}}}}
groups:
  - name: g
    source: src
    destination: dst
    replication_policy: {policy}
{group}
    mirrors: {mirrors}
"""
    return parse_config(yaml.safe_load(raw), env={})


def grants_by_resource(cfg: MirrorsConfig) -> dict[tuple[str, str, str, str], tuple[str, ...]]:
    return {(g.side, g.resource_type, g.name, g.pattern): g.operations for g in required_acls(cfg, cfg.groups[0])}


@pytest.mark.parametrize("policy,remote", [("prefix", "src.heartbeats"), ("identity", "heartbeats")])
def test_heartbeats_are_granted_on_both_sides(policy, remote):
    """Heartbeats are on by default. The source principal writes them (creating the topic when missing) and,
    as any mirrored topic, reads them and their configs (planning reads the configs of every topic it sees);
    the heartbeat mirror commits under its own consumer group; the destination principal creates and writes
    their mirror, which no flow prefix covers."""
    cfg = config(policy)
    grants = grants_by_resource(cfg)
    assert set(grants[("source", "TOPIC", "heartbeats", "LITERAL")]) == {
        "CREATE", "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"}
    g = cfg.groups[0]
    hb = heartbeat_selection(g, build_replication_policy(g), ["heartbeats"], [])
    assert hb is not None and hb.destination_topic == remote
    assert grants[("source", "GROUP", hb.mirror.consumer_group, "LITERAL")] == ("READ",)
    assert {"CREATE", "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS"} <= set(
        grants[("destination", "TOPIC", remote, "LITERAL")])


def test_heartbeats_off_grants_nothing_for_them():
    grants = grants_by_resource(config(group="    heartbeats: {enabled: false}"))
    assert not [k for k in grants if "heartbeats" in k[2]]


def test_sync_acls_adds_the_cluster_grants_it_needs():
    """Listing ACLs takes Describe on the cluster, creating them Alter: without them planning cannot see the
    source's ACLs nor the destination's."""
    assert not [k for k in grants_by_resource(config()) if k[1] == "CLUSTER"]
    on = grants_by_resource(config(group="    topics_mirroring: {sync_acls: true}"))
    assert on[("source", "CLUSTER", "kafka-cluster", "LITERAL")] == ("DESCRIBE",)
    assert on[("destination", "CLUSTER", "kafka-cluster", "LITERAL")] == ("DESCRIBE", "ALTER")
    # one mirror of several syncing ACLs is enough
    mirrors = '[{source_topic: a}, {source_topic: b, topics_mirroring: {sync_acls: true}}]'
    assert ("destination", "CLUSTER", "kafka-cluster", "LITERAL") in grants_by_resource(config(mirrors=mirrors))


def test_a_cluster_grant_prints_as_kafka_acls_cluster():
    grant = Grant("destination", "dst", "User:dstu", "CLUSTER", "kafka-cluster", "LITERAL", ("DESCRIBE", "ALTER"), "")
    assert grant.kafka_acls_command("d:1") == (
        "kafka-acls.sh --bootstrap-server d:1 --command-config admin.properties --add --allow-principal User:dstu "
        "--operation Describe --operation Alter --cluster")


class RecordingAdmin:
    def __init__(self) -> None:
        self.bindings: list[Any] = []

    def create_acls(self, bindings: list[Any], request_timeout: float | None = None) -> dict[Any, Future[None]]:
        self.bindings += bindings
        out: dict[Any, Future[None]] = {}
        for b in bindings:
            fut: Future[None] = Future()
            fut.set_result(None)
            out[b] = fut
        return out


def test_apply_acls_grants_the_cluster_resource():
    from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

    admin = RecordingAdmin()
    grant = Grant("source", "src", "User:srcu", "CLUSTER", "kafka-cluster", "LITERAL", ("DESCRIBE",), "")
    assert apply_acls(admin, [grant]) == 1
    (b,) = admin.bindings
    assert (b.restype, b.name, b.resource_pattern_type, b.principal, b.operation) == (
        ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:srcu", AclOperation.DESCRIBE)
