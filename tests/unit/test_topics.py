"""Topic planning: creates, clamps, grows, config filtering and deletes, RF errors, ACL mapping, idempotence; and
applying a plan against an in-memory destination: each topic on its own, failures reported beside what was done."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AlterConfigOpType

from mirror_core.config import parse_config
from mirror_core.topics import AclEntry, ClusterState, TopicInfo, acl_for_destination, apply_topic_plan, plan_topics


def group(mirrors: str, extra: str = "", policy: str = "identity"):
    raw = f"""
clusters:
  src: {{kafka: {{bootstrap.servers: "s:1"}}}}
  dst: {{kafka: {{bootstrap.servers: "d:1"}}}}
groups:
  - name: g
    source: src
    destination: dst
    replication_policy: {policy}
    topics_mirroring:
      partition_count: {{type: mirror_source, min: 3, max: 12}}
      replication_factor: {{type: fix, value: 1}}
      config_exclude: ["segment\\\\.bytes"]
{extra}
    mirrors: {mirrors}
"""
    import yaml

    return parse_config(yaml.safe_load(raw), env={}).groups[0]


SRC = ClusterState({
    "orders": TopicInfo("orders", 6, 3, {"retention.ms": "1000", "min.insync.replicas": "2"}),
    "audit": TopicInfo("audit", 1, 1, {"cleanup.policy": "compact", "segment.bytes": "1048576"}),
    "clicks": TopicInfo("clicks", 24, 1, {}),
    "dst.loop": TopicInfo("dst.loop", 1, 1, {}),
    "__consumer_offsets": TopicInfo("__consumer_offsets", 50, 1, {}),
}, broker_count=3)
EMPTY = ClusterState({}, broker_count=1)


def by_topic(plan):
    return {a.topic: a for a in plan.actions}


def test_creates_with_clamped_partitions_and_filtered_configs():
    g = group('[{topics: {include: ".*"}}]')
    plan = by_topic(plan_topics(g, SRC, EMPTY))
    assert (plan["orders"].kind, plan["orders"].partitions, plan["orders"].replication_factor) == ("create", 6, 1)
    assert plan["audit"].partitions == 3  # clamped up to min
    assert plan["clicks"].partitions == 12  # clamped down to max
    assert plan["orders"].configs == {"retention.ms": "1000"}  # min.insync.replicas: MM2 default exclusion
    assert plan["audit"].configs == {"cleanup.policy": "compact"}  # segment.bytes: user exclusion
    assert "__consumer_offsets" not in plan
    assert "segment.bytes" in plan["audit"].reason


def test_fewer_destination_partitions_warns():
    g = group('[{topics: {include: "clicks"}}]')
    plan = plan_topics(g, SRC, EMPTY)
    assert any("cannot be preserved" in w and "clicks" in w for w in plan.warnings)


def test_replication_factor_above_broker_count_is_a_clear_error():
    g = group('[{source_topic: orders, topics_mirroring: {replication_factor: {type: fix, value: 3}}}]')
    plan = plan_topics(g, SRC, EMPTY)
    err = by_topic(plan)["orders"]
    assert err.kind == "error" and "replication factor 3" in err.reason and "1 broker" in err.reason


def test_second_plan_after_apply_is_unchanged_and_grow_detected():
    g = group('[{source_topic: orders}]')
    first = by_topic(plan_topics(g, SRC, EMPTY))
    dst = ClusterState({t: TopicInfo(t, a.partitions or 1, a.replication_factor or 1, dict(a.configs))
                        for t, a in first.items()}, broker_count=1)
    again = plan_topics(g, SRC, dst)
    assert {a.kind for a in again.actions} == {"unchanged"}
    grown = ClusterState({**SRC.topics, "orders": TopicInfo("orders", 8, 3, SRC.topics["orders"].configs)}, 3)
    plan = by_topic(plan_topics(g, grown, dst))
    assert plan["orders"].kind == "grow" and plan["orders"].partitions == 8


def test_partitions_never_decrease():
    g = group('[{source_topic: orders}]')
    dst = ClusterState({"orders": TopicInfo("orders", 10, 1, {"retention.ms": "1000"})}, 1)
    assert by_topic(plan_topics(g, SRC, dst))["orders"].kind == "unchanged"


def test_config_drift_is_altered():
    g = group('[{source_topic: orders}]')
    dst = ClusterState({"orders": TopicInfo("orders", 6, 1, {"retention.ms": "5"})}, 1)
    a = by_topic(plan_topics(g, SRC, dst))["orders"]
    assert a.kind == "alter_configs" and a.configs == {"retention.ms": "1000"}


def test_prefix_policy_does_not_mirror_back_and_names_remote_topics():
    g = group('[{topics: {include: ".*"}}]', policy="prefix")
    plan = plan_topics(g, SRC, EMPTY)
    topics = by_topic(plan)
    assert "src.orders" in topics and "src.dst.loop" not in topics
    assert any(t == "dst.loop" and "cycle" in r for t, r in plan.skipped)


def test_identity_plan_says_loop_prevention_relies_on_provenance():
    plan = plan_topics(group('[{source_topic: orders}]'), SRC, EMPTY)
    assert any("provenance" in n for n in plan.notes)


def test_internal_topics_planned_on_destination():
    plan = by_topic(plan_topics(group('[{source_topic: orders}]'), SRC, EMPTY))
    assert plan["mirrorflow-offset-syncs.src.internal"].configs["cleanup.policy"] == "delete"
    assert plan["src.checkpoints.internal"].configs == {"cleanup.policy": "compact"}
    assert "g.mirrorflow.dlq" in plan


def test_an_existing_destination_topic_with_another_replication_factor_warns():
    """Provisioning never changes an existing topic's replication factor: a destination made with another one
    (by hand, by MM2, before the rule changed) is named with what it has and what the rule wants."""
    g = group('[{source_topic: orders}]')  # the rule: fix 1
    dst = ClusterState({"orders": TopicInfo("orders", 6, 3, {"retention.ms": "1000"})}, 3)
    plan = plan_topics(g, SRC, dst)
    assert by_topic(plan)["orders"].kind == "unchanged"
    assert plan.warnings == ["orders: destination topic has replication factor 3, the rule wants 1 (fixed); "
                             "provisioning does not change an existing topic's replication factor"]
    same = ClusterState({"orders": TopicInfo("orders", 6, 1, {"retention.ms": "1000"})}, 3)
    assert plan_topics(g, SRC, same).warnings == []


@pytest.mark.parametrize(("configs", "effective", "whose"), [
    ({"min.insync.replicas": "2"}, None, "the topic's"),  # an override on the topic
    ({}, 2, "the brokers'"),  # the brokers' setting (read_state reads the effective value)
])
def test_a_destination_topic_below_its_min_insync_replicas_warns(configs, effective, whose):
    """RF below min.insync.replicas: every acks=all write (all the mirror's) fails with NOT_ENOUGH_REPLICAS."""
    g = group('[{source_topic: orders}]')
    dst = ClusterState({"orders": TopicInfo("orders", 6, 1, {"retention.ms": "1000", **configs},
                                            min_insync_replicas=effective)}, 3)
    plan = plan_topics(g, SRC, dst)
    assert plan.warnings == [f"orders: destination topic has replication factor 1, below {whose} min.insync.replicas "
                             "2: every acks=all write to it (the mirror's) fails with NOT_ENOUGH_REPLICAS"]
    # the same for a topic the mirror's offset handling writes
    syncs = "mirrorflow-offset-syncs.src.internal"
    dst = ClusterState({syncs: TopicInfo(syncs, 1, 1, configs, min_insync_replicas=effective)}, 3)
    assert [w for w in plan_topics(g, SRC, dst).warnings if w.startswith(syncs)] == [
        f"{syncs}: destination topic has replication factor 1, below {whose} min.insync.replicas 2: every acks=all "
        "write to it (the mirror's) fails with NOT_ENOUGH_REPLICAS"]


@pytest.mark.parametrize("acl,expected", [
    (AclEntry("User:a", "*", "READ", "ALLOW"), AclEntry("User:a", "*", "READ", "ALLOW")),
    (AclEntry("User:a", "*", "WRITE", "ALLOW"), None),
    (AclEntry("User:a", "*", "ALL", "ALLOW"), AclEntry("User:a", "*", "READ", "ALLOW")),
    (AclEntry("User:a", "*", "READ", "DENY"), AclEntry("User:a", "*", "READ", "DENY")),
    (AclEntry("User:a", "*", "ALL", "DENY"), AclEntry("User:a", "*", "ALL", "DENY")),
    (AclEntry("User:a", "*", "WRITE", "DENY"), AclEntry("User:a", "*", "WRITE", "DENY")),
    (AclEntry("User:a", "*", "ALTER_CONFIGS", "ALLOW"), AclEntry("User:a", "*", "ALTER_CONFIGS", "ALLOW")),
])
def test_acl_mapping_like_mm2(acl, expected):
    assert acl_for_destination(acl) == expected


def test_acl_sync_creates_missing_acls_only_when_enabled():
    src = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (AclEntry("User:x", "*", "ALL", "ALLOW"),
                                                                 AclEntry("User:y", "*", "WRITE", "ALLOW")))}, 1)
    off = plan_topics(group('[{source_topic: orders}]'), src, EMPTY)
    assert not [a for a in off.actions if a.kind == "create_acls"]
    on = plan_topics(group('[{source_topic: orders, topics_mirroring: {sync_acls: true}}]'), src, EMPTY)
    acls = [a for a in on.actions if a.kind == "create_acls"]
    assert len(acls) == 1 and acls[0].acls == (AclEntry("User:x", "*", "READ", "ALLOW"),)


def test_acl_sync_keeps_a_deny_so_the_mirror_is_no_more_open_than_the_source():
    """Source: everyone may read orders except bob. The destination gets both entries: with the ALLOW alone,
    bob could read the mirror."""
    allow_all, deny_bob = AclEntry("User:*", "*", "READ", "ALLOW"), AclEntry("User:bob", "*", "READ", "DENY")
    src = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (allow_all, deny_bob))}, 1)
    g = group('[{source_topic: orders, topics_mirroring: {sync_acls: true}}]')
    (acls,) = [a for a in plan_topics(g, src, EMPTY).actions if a.kind == "create_acls"]
    assert acls.acls == (allow_all, deny_bob) and not acls.warnings
    # an existing mirror that has only the ALLOW (copied before DENYs were) gets the DENY added
    has_allow = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (allow_all,))}, 1)
    (acls,) = [a for a in plan_topics(g, src, has_allow).actions if a.kind == "create_acls"]
    assert acls.acls == (deny_bob,)


def test_a_copied_deny_write_is_flagged_since_it_can_stop_the_mirror():
    src = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (AclEntry("User:*", "*", "WRITE", "DENY"),))}, 1)
    plan = plan_topics(group('[{source_topic: orders, topics_mirroring: {sync_acls: true}}]'), src, EMPTY)
    assert plan.warnings == ["orders: copies DENY WRITE for User:*: if that covers the destination principal, "
                             "the mirror can no longer write orders"]


@pytest.mark.parametrize("brokers,rf", [(1, 1), (2, 2), (3, 3), (5, 3)])
def test_internal_topics_replication_factor_is_clamped_to_the_destination_brokers(brokers, rf):
    """Internal topics want RF 3, but never more than the destination has brokers (a 1-broker dev cluster)."""
    plan = by_topic(plan_topics(group('[{source_topic: orders}]'), SRC, ClusterState({}, broker_count=brokers)))
    internal = [a for a in plan.values() if a.mirror == "g (internal)"]
    assert sorted(a.topic for a in internal) == ["g.mirrorflow.dlq", "mirrorflow-offset-syncs.src.internal",
                                                  "mirrorflow-stops.internal", "src.checkpoints.internal"]
    assert all(a.kind == "create" for a in internal) and {a.replication_factor for a in internal} == {rf}
    assert plan["mirrorflow-stops.internal"].configs == {"cleanup.policy": "compact"}


def test_a_stops_topic_made_with_the_default_policy_is_compacted():
    """A stops topic someone made beforehand with cleanup.policy=delete would drop a failover's stop after its
    retention (and the stream DAG start the stopped mirror again), and so would one compacted and deleted:
    provisioning makes it compacted only; a compacted one is left as it is."""
    g = group('[{source_topic: orders}]')
    for configs, planned in (({}, "alter_configs"), ({"cleanup.policy": "delete"}, "alter_configs"),
                             ({"cleanup.policy": "compact"}, "unchanged"), ({"cleanup.policy": "compact,delete"},
                                                                            "alter_configs")):
        dst = ClusterState({"mirrorflow-stops.internal": TopicInfo("mirrorflow-stops.internal", 1, 1, configs)}, 1)
        action = by_topic(plan_topics(g, SRC, dst))["mirrorflow-stops.internal"]
        assert action.kind == planned, configs
        if planned == "alter_configs":
            assert action.configs == {"cleanup.policy": "compact"} and "a stop expires" in action.reason


def test_an_offset_sync_topic_made_compacted_is_given_delete_retention():
    """An offset-sync topic someone made beforehand compacted (MirrorMaker 2 makes its own so) keeps each
    partition's newest sync only: a group's offset committed before it could no longer be translated. Provisioning
    gives it delete retention; one with delete retention (or none set) is left as it is."""
    g = group('[{source_topic: orders}]')
    name = "mirrorflow-offset-syncs.src.internal"
    for configs, planned in (({}, "unchanged"), ({"cleanup.policy": "delete"}, "unchanged"),
                             ({"cleanup.policy": "compact"}, "alter_configs"),
                             ({"cleanup.policy": "delete, compact"}, "alter_configs")):
        action = by_topic(plan_topics(g, SRC, ClusterState({name: TopicInfo(name, 1, 1, configs)}, 1)))[name]
        assert action.kind == planned, configs
        if planned == "alter_configs":
            assert action.configs == {"cleanup.policy": "delete"} and "cannot be translated" in action.reason


def test_acls_already_on_the_destination_are_not_planned_again():
    x_read, z_read = AclEntry("User:x", "*", "READ", "ALLOW"), AclEntry("User:z", "*", "DESCRIBE", "ALLOW")
    src = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (AclEntry("User:x", "*", "ALL", "ALLOW"), z_read))}, 1)
    g = group('[{source_topic: orders, topics_mirroring: {sync_acls: true}}]')
    both = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (x_read, z_read))}, 1)
    assert by_topic(plan_topics(g, src, both))["orders"].kind == "unchanged"
    one = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (x_read,))}, 1)
    (acls,) = [a for a in plan_topics(g, src, one).actions if a.kind == "create_acls"]
    assert acls.acls == (z_read,) and "1 literal topic ACL(s) missing" in acls.reason


def _done(exc: KafkaException | None = None) -> Future[Any]:
    f: Future[Any] = Future()
    if exc is None:
        f.set_result(None)
    else:
        f.set_exception(exc)
    return f


def _refused(code: int, message: str) -> KafkaException:
    return KafkaException(KafkaError(code, message))


class FakeDestination:
    """The part of confluent-kafka's AdminClient that applying a plan uses, over an in-memory cluster that
    refuses what a Kafka 4 broker refuses: configs it does not know, a replication factor above its brokers."""

    KNOWN = {"retention.ms", "cleanup.policy", "segment.bytes", "min.insync.replicas", "max.message.bytes"}

    def __init__(self, brokers: int = 1, topics: dict[str, TopicInfo] | None = None, refuse_grow: str = ""):
        self.brokers = brokers
        self.topics = dict(topics or {})
        self.refuse_grow = refuse_grow
        self.calls: list[str] = []

    def state(self) -> ClusterState:
        return ClusterState(dict(self.topics), self.brokers)

    def create_topics(self, new: list[Any], request_timeout: float | None = None) -> dict[str, Future[Any]]:
        out = {}
        for n in new:
            self.calls.append(f"create {n.topic}")
            unknown = sorted(set(n.config) - self.KNOWN)
            if unknown:
                out[n.topic] = _done(_refused(KafkaError.INVALID_CONFIG, f"Unknown topic config name: {unknown[0]}"))
            elif n.replication_factor > self.brokers:
                out[n.topic] = _done(_refused(KafkaError.INVALID_REPLICATION_FACTOR,
                                              f"Replication factor: {n.replication_factor} larger than available "
                                              f"brokers: {self.brokers}."))
            else:
                self.topics[n.topic] = TopicInfo(n.topic, n.num_partitions, n.replication_factor, dict(n.config))
                out[n.topic] = _done()
        return out

    def create_partitions(self, parts: list[Any], request_timeout: float | None = None) -> dict[str, Future[Any]]:
        out = {}
        for p in parts:
            self.calls.append(f"grow {p.topic}")
            if p.topic == self.refuse_grow:
                out[p.topic] = _done(_refused(KafkaError.POLICY_VIOLATION, "no more partitions here"))
                continue
            t = self.topics[p.topic]
            self.topics[p.topic] = TopicInfo(t.name, p.new_total_count, t.replication_factor, t.configs)
            out[p.topic] = _done()
        return out

    def list_offsets(self, req: dict[Any, Any], request_timeout: float | None = None) -> dict[Any, Future[Any]]:
        return {tp: _done() for tp in req}  # every partition is served at once

    def incremental_alter_configs(self, resources: list[Any], request_timeout: float | None = None
                                  ) -> dict[Any, Future[Any]]:
        out = {}
        for r in resources:
            self.calls.append(f"alter {r.name}")
            cfg = dict(self.topics[r.name].configs)
            for e in r.incremental_configs:
                if e.incremental_operation == AlterConfigOpType.DELETE:
                    cfg.pop(e.name, None)
                else:
                    cfg[e.name] = e.value
            t = self.topics[r.name]
            self.topics[r.name] = TopicInfo(t.name, t.partitions, t.replication_factor, cfg)
            out[r] = _done()
        return out

    def create_acls(self, bindings: list[Any], request_timeout: float | None = None) -> dict[Any, Future[Any]]:
        self.calls += [f"acl {b.name}" for b in bindings]
        return {b: _done() for b in bindings}


def test_a_topic_the_destination_refuses_does_not_stop_the_others():
    """A source still on Kafka 3 with a config the destination does not know (here one the fake refuses) for one
    topic: the other topics are created, grown and configured, and the refusal is reported for its topic."""
    g = group('[{topics: {include: ".*"}}]')
    src = ClusterState({"a-odd": TopicInfo("a-odd", 3, 1, {"local.retention.bytes": "5"}),
                        "b": TopicInfo("b", 3, 1, {"retention.ms": "1000"}),
                        "c": TopicInfo("c", 6, 1, {"retention.ms": "2000"})}, 1)
    dst = FakeDestination(topics={"c": TopicInfo("c", 3, 1, {})})
    applied = apply_topic_plan(dst, plan_topics(g, src, dst.state()))
    assert [(f.kind, f.topic, f.code) for f in applied.failures] == [("create", "a-odd", "INVALID_CONFIG")]
    assert "create topic a-odd failed: Unknown topic config name: local.retention.bytes" in str(applied.failures[0])
    assert applied.failed_topics == {"a-odd"}
    assert "created b (3 partitions, RF 1)" in applied.done
    assert "grew c to 6 partitions" in applied.done and "set retention.ms=2000 on c" in applied.done
    assert dst.topics["b"].configs == {"retention.ms": "1000"} and dst.topics["c"].partitions == 6
    assert "a-odd" not in dst.topics
    # a second run tries the refused topic again, and only it
    dst.calls.clear()
    again = apply_topic_plan(dst, plan_topics(g, src, dst.state()))
    assert dst.calls == ["create a-odd"] and again.failed_topics == {"a-odd"} and again.done == ()


def test_a_refused_create_skips_that_topics_acls_and_a_refused_grow_its_configs():
    g = group('[{topics: {include: ".*"}, topics_mirroring: {sync_acls: true, '
              'replication_factor: {type: mirror_source}}}]')
    read = (AclEntry("User:x", "*", "READ", "ALLOW"),)
    src = ClusterState({"wide": TopicInfo("wide", 1, 3, {}, read), "c": TopicInfo("c", 6, 1, {"retention.ms": "9"}),
                        "ok": TopicInfo("ok", 1, 1, {}, read)}, 3)
    dst = FakeDestination(brokers=3, topics={"c": TopicInfo("c", 3, 1, {})}, refuse_grow="c")
    dst.brokers = 1  # planned against 3 brokers; two were gone when the plan was applied
    applied = apply_topic_plan(dst, plan_topics(g, src, ClusterState(dict(dst.topics), 3)))
    assert {(f.kind, f.topic, f.code) for f in applied.failures if f.topic in src.topics} == {
        ("create", "wide", "INVALID_REPLICATION_FACTOR"), ("grow", "c", "POLICY_VIOLATION")}
    assert "acl wide" not in dst.calls and "alter c" not in dst.calls  # waits for its topic
    assert "acl ok" in dst.calls and "created 1 ACL(s) on ok" in applied.done


def test_configs_kafka_4_removed_are_not_copied():
    """Kafka 4 refuses a topic created with message.format.version (INVALID_CONFIG on 4.1.1): a source on Kafka 3
    with that override would fail every such topic."""
    g = group('[{source_topic: old}]')
    src = ClusterState({"old": TopicInfo("old", 1, 1, {"message.format.version": "2.8", "retention.ms": "5",
                                                       "message.downconversion.enable": "false"})}, 1)
    (create,) = [a for a in plan_topics(g, src, ClusterState({}, 1)).actions if a.topic == "old"]
    assert create.configs == {"retention.ms": "5"}
    assert "message.format.version" in create.reason  # shown as filtered out


def test_an_override_the_source_does_not_set_is_deleted_on_the_destination():
    """An override removed on the source (or the destination's own, made before the mirror), where the source has
    Kafka's own default, would keep the destination deleting or compacting records otherwise: the plan deletes it,
    as MM2's incremental config sync does. Not where the source's value comes from its brokers (max.message.bytes
    here: the destination's override may be what matches it); excluded configs (min.insync.replicas,
    config_exclude) stay as they are."""
    g = group('[{source_topic: orders}]')  # the group excludes segment.bytes
    src = ClusterState({"orders": TopicInfo("orders", 3, 1, {"retention.ms": "1000"}, defaults=frozenset(
        {"cleanup.policy", "min.insync.replicas", "segment.bytes"}))}, 1)
    dst = FakeDestination(topics={"orders": TopicInfo("orders", 3, 1, {
        "retention.ms": "1000", "cleanup.policy": "compact", "max.message.bytes": "100",
        "min.insync.replicas": "2", "segment.bytes": "1048576"})})
    (alter,) = [a for a in plan_topics(g, src, dst.state()).actions if a.topic == "orders"]
    assert alter.kind == "alter_configs" and alter.configs == {}
    assert alter.deletes == ("cleanup.policy",)
    assert "Kafka's default on the source" in alter.reason and "cleanup.policy" in alter.reason
    applied = apply_topic_plan(dst, plan_topics(g, src, dst.state()))
    assert [d for d in applied.done if "orders" in d] == [
        "deleted cleanup.policy on orders (Kafka's default on the source)"]
    assert dst.topics["orders"].configs == {"retention.ms": "1000", "max.message.bytes": "100",
                                            "min.insync.replicas": "2", "segment.bytes": "1048576"}
    assert [a.kind for a in plan_topics(g, src, dst.state()).actions if a.topic == "orders"] == ["unchanged"]


def test_without_sync_configs_destination_overrides_stay():
    g = group('[{source_topic: orders, topics_mirroring: {sync_configs: false}}]')
    src = ClusterState({"orders": TopicInfo("orders", 3, 1, {})}, 1)
    dst = ClusterState({"orders": TopicInfo("orders", 3, 1, {"cleanup.policy": "compact"})}, 1)
    assert [a.kind for a in plan_topics(g, src, dst).actions if a.topic == "orders"] == ["unchanged"]


def sync_acls_plan(source: ClusterState, destination: ClusterState):
    return plan_topics(group('[{source_topic: orders, topics_mirroring: {sync_acls: true}}]'), source, destination)


ORDERS_WITH_DENY = ClusterState({"orders": TopicInfo("orders", 6, 1, {}, (
    AclEntry("User:*", "*", "READ", "ALLOW"), AclEntry("User:bob", "*", "READ", "DENY")))}, 1)


def test_acls_the_source_will_not_list_are_a_plan_error_naming_the_cluster_and_permission():
    """The README's grants leave out cluster Describe: listing ACLs is refused. That is not "no ACLs": the plan
    says which cluster refused and what to grant (or to turn sync_acls off)."""
    denied = ClusterState({"orders": TopicInfo("orders", 6, 1, {})}, 1, acl_access="denied")
    plan = sync_acls_plan(denied, EMPTY)
    (err,) = plan.errors
    assert "source cluster 'src'" in err.reason and "CLUSTER_AUTHORIZATION_FAILED" in err.reason
    assert "Describe on the cluster" in err.reason and "sync_acls: false" in err.reason
    # without sync_acls, the same refusal does not matter
    assert not plan_topics(group('[{source_topic: orders}]'), denied, EMPTY).errors


def test_a_destination_that_will_not_list_acls_is_an_error_and_nothing_is_planned_again_each_run():
    """The source's ACLs are known, the destination's not: without the error every run planned all of them again
    and failed creating them."""
    denied = ClusterState({}, 1, acl_access="denied")
    plan = sync_acls_plan(ORDERS_WITH_DENY, denied)
    (err,) = plan.errors
    assert "destination cluster 'dst'" in err.reason and "Describe (to list) and Alter (to create)" in err.reason
    assert not [a for a in plan.actions if a.kind == "create_acls"]
    assert [a.kind for a in plan.actions if a.topic == "orders"] == ["create"]


def test_clusters_without_an_authorizer_are_noted_not_errors():
    no_auth = ClusterState({}, 1, acl_access="no_authorizer")
    plan = sync_acls_plan(ORDERS_WITH_DENY, no_auth)
    assert not plan.errors and not [a for a in plan.actions if a.kind == "create_acls"]
    assert any("destination cluster 'dst' has no authorizer" in n for n in plan.notes)
    src = ClusterState({"orders": TopicInfo("orders", 6, 1, {})}, 1, acl_access="no_authorizer")
    plan = sync_acls_plan(src, EMPTY)
    assert not plan.errors and any("source cluster 'src' has no authorizer" in n for n in plan.notes)


class AclAdmin:
    """The AdminClient calls read_state makes to list ACLs: the principal's cluster operations, then the ACLs
    (refused with ``acl_error``, a code)."""

    def __init__(self, cluster_ops: list[str] | None, acl_error: str | None = None):
        self.cluster_ops, self.acl_error, self.listed = cluster_ops, acl_error, False

    def list_topics(self, timeout: float) -> object:
        from types import SimpleNamespace

        return SimpleNamespace(topics={}, brokers={1: None})

    def describe_cluster(self, include_authorized_operations: bool, request_timeout: float) -> object:
        from types import SimpleNamespace

        from confluent_kafka.admin import AclOperation

        ops = None if self.cluster_ops is None else [AclOperation[o] for o in self.cluster_ops]
        return done(SimpleNamespace(authorized_operations=ops))

    def describe_acls(self, flt: object, request_timeout: float) -> object:
        from confluent_kafka import KafkaError, KafkaException

        self.listed = True
        return done(exc=KafkaException(KafkaError(getattr(KafkaError, self.acl_error)))) if self.acl_error \
            else done([])


def done(value: object = None, exc: Exception | None = None) -> object:
    from concurrent.futures import Future

    fut: Future[object] = Future()
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)
    return fut


@pytest.mark.parametrize("cluster_ops,access", [(None, "denied"), (["DESCRIBE"], "list"),
                                                (["ALTER", "DESCRIBE"], "manage")])
def test_read_state_asks_what_the_principal_may_do_with_acls(cluster_ops, access):
    """librdkafka answers a refused DescribeAcls with an empty list, as if there were no ACLs: read_state asks
    the cluster which operations the principal is authorized for instead of trusting that answer."""
    from mirror_core.topics import read_state

    admin = AclAdmin(cluster_ops)
    state = read_state(admin, with_acls=True)  # type: ignore[arg-type]
    assert state.acl_access == access and admin.listed == (access != "denied")


def test_read_state_reads_the_effective_min_insync_replicas():
    """A topic's min.insync.replicas may come from the brokers, not the topic: read_state keeps the value in
    effect (its configs hold only the topic's own overrides)."""
    from types import SimpleNamespace

    from confluent_kafka.admin import ConfigEntry, ConfigSource

    from mirror_core.topics import read_state

    def entries(source: ConfigSource, value: str) -> dict[str, ConfigEntry]:
        return {"min.insync.replicas": ConfigEntry("min.insync.replicas", value, source=source),
                "retention.ms": ConfigEntry("retention.ms", "604800000", source=ConfigSource.DEFAULT_CONFIG)}

    described = {"a": entries(ConfigSource.STATIC_BROKER_CONFIG, "2"), "b": entries(ConfigSource.DYNAMIC_TOPIC_CONFIG, "3")}

    class Admin:
        def list_topics(self, timeout: float) -> object:
            part = SimpleNamespace(replicas=[1])
            return SimpleNamespace(topics={t: SimpleNamespace(error=None, partitions={0: part}) for t in described},
                                   brokers={1: None})

        def describe_configs(self, resources: list[Any], request_timeout: float) -> dict[Any, Any]:
            return {r: done(described[r.name]) for r in resources}

    state = read_state(Admin())  # type: ignore[arg-type]
    assert (state.topics["a"].min_insync_replicas, state.topics["a"].configs) == (2, {})
    assert (state.topics["b"].min_insync_replicas, state.topics["b"].configs) == (3, {"min.insync.replicas": "3"})


def test_read_state_reports_a_cluster_without_authorizer():
    from mirror_core.topics import read_state

    state = read_state(AclAdmin(["ALTER", "DESCRIBE"], "SECURITY_DISABLED"), with_acls=True)  # type: ignore[arg-type]
    assert state.acl_access == "no_authorizer"


def test_a_destination_that_may_list_but_not_create_acls_is_an_error():
    plan = sync_acls_plan(ORDERS_WITH_DENY, ClusterState({}, 1, acl_access="list"))
    (err,) = plan.errors
    assert err.reason.startswith("cannot create the topic ACLs of destination cluster 'dst'") and "Alter" in err.reason
    assert not [a for a in plan.actions if a.kind == "create_acls"]
    # the source only needs to list them
    assert not sync_acls_plan(ClusterState({"orders": TopicInfo("orders", 6, 1, {})}, 1, acl_access="list"),
                              EMPTY).errors


def test_a_missing_acl_permission_stops_only_the_acl_copy() -> None:
    """Listing ACLs refused on both sides: two plan errors, neither of which keeps the topic from being made or the
    stream from running (TopicPlan.blocking); a topic the destination cannot hold still does."""
    denied = ClusterState({"orders": TopicInfo("orders", 6, 1, {})}, 1, acl_access="denied")
    plan = sync_acls_plan(denied, ClusterState({}, 1, acl_access="denied"))
    assert len(plan.errors) == 2 and plan.blocking == []
    assert [a.kind for a in plan.actions if a.topic == "orders"] == ["create"]
    no_brokers = ClusterState({}, 0, acl_access="denied")  # no broker to hold a replica
    assert [a.topic for a in sync_acls_plan(denied, no_brokers).blocking] == ["orders"]
