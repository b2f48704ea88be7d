"""Replication policies, topic / group / config-property filters."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from mirror_core.config import GroupConfig, MirrorsConfig, parse_config, resolve_mirrors
from mirror_core.errors import ConfigError
from mirror_core.policy import (
    DEFAULT_CONFIG_EXCLUDES,
    ConfigPropertyFilter,
    GroupFilter,
    IdentityReplicationPolicy,
    PolicyError,
    PrefixReplicationPolicy,
    ReplicationPolicy,
    TopicFilter,
    build_replication_policy,
    is_internal_topic,
    upstream_clusters,
)


@dataclass(frozen=True)
class UpperPolicy:
    """A user policy: ``<ALIAS>-<topic>``; referenced by dotted path from the YAML."""

    separator: str = "-"

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        return f"{source_cluster_alias.upper()}{self.separator}{topic}"

    def topic_source(self, topic: str) -> str | None:
        alias, sep, rest = topic.partition(self.separator)
        return alias.lower() if sep and alias.isupper() else None

    def upstream_topic(self, topic: str) -> str | None:
        alias, sep, rest = topic.partition(self.separator)
        return rest if sep and alias.isupper() else None


class SuffixPolicy:
    """A user policy whose constructor takes no separator."""

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        return f"{topic}.from-{source_cluster_alias}"

    def topic_source(self, topic: str) -> str | None:
        head, sep, alias = topic.rpartition(".from-")
        return alias if sep else None

    def upstream_topic(self, topic: str) -> str | None:
        head, sep, _ = topic.rpartition(".from-")
        return head if sep else None


class NotAPolicy:
    pass


def config(policy: str = "identity", mirrors: list[dict[str, Any]] | None = None, **group: Any) -> MirrorsConfig:
    raw = {
        "clusters": {
            "src": {"kafka": {"bootstrap.servers": "src:9092"}},
            "dst": {"kafka": {"bootstrap.servers": "dst:9092"}},
        },
        "groups": [
            {
                "name": "g",
                "source": "src",
                "destination": "dst",
                "replication_policy": policy,
                "mirrors": mirrors or [{"topics": {"include": ".*"}}],
                **group,
            }
        ],
    }
    return parse_config(raw, {})


def topic_filter(cfg: MirrorsConfig) -> TopicFilter:
    g: GroupConfig = cfg.groups[0]
    return TopicFilter(tuple(resolve_mirrors(g)), build_replication_policy(g), g.source, g.destination)


# --------------------------------------------------------------------------- replication policies


def test_identity_policy() -> None:
    p = IdentityReplicationPolicy()
    assert p.format_remote_topic("src", "orders") == "orders"
    assert p.topic_source("src.orders") is None
    assert p.upstream_topic("src.orders") is None
    assert isinstance(p, ReplicationPolicy)


@pytest.mark.parametrize(
    ("separator", "alias", "topic", "remote"),
    [(".", "src", "orders", "src.orders"), (".", "src", "a.b.c", "src.a.b.c"), ("_", "us-east", "t", "us-east_t")],
)
def test_prefix_policy_format_and_inverse(separator: str, alias: str, topic: str, remote: str) -> None:
    p = PrefixReplicationPolicy(separator)
    assert p.format_remote_topic(alias, topic) == remote
    assert p.topic_source(remote) == alias
    assert p.upstream_topic(remote) == topic


@pytest.mark.parametrize("topic", ["orders", ".orders", "src."])
def test_prefix_policy_not_remote(topic: str) -> None:
    p = PrefixReplicationPolicy()
    assert p.topic_source(topic) is None
    assert p.upstream_topic(topic) is None


def test_builtin_policies_by_name() -> None:
    assert build_replication_policy(config("identity").groups[0]) == IdentityReplicationPolicy()
    prefix = build_replication_policy(config("prefix", replication_policy_separator="_").groups[0])
    assert prefix == PrefixReplicationPolicy("_")


def test_dotted_path_user_policy_gets_separator() -> None:
    cfg = config(f"{__name__}.UpperPolicy", mirrors=[{"source_topic": "orders"}], replication_policy_separator="__")
    policy = build_replication_policy(cfg.groups[0])
    assert isinstance(policy, UpperPolicy) and policy.separator == "__"
    (m,) = resolve_mirrors(cfg.groups[0])
    assert m.destination_topic == "SRC__orders"
    assert m.name == "g__orders__SRC__orders"
    assert policy.topic_source("SRC__orders") == "src" and policy.upstream_topic("SRC__orders") == "orders"


def test_dotted_path_user_policy_without_separator() -> None:
    cfg = config(f"{__name__}.SuffixPolicy", mirrors=[{"source_topic": "orders"}])
    (m,) = resolve_mirrors(cfg.groups[0])
    assert m.destination_topic == "orders.from-src"


def test_dotted_path_not_a_policy_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        config(f"{__name__}.NotAPolicy")
    (issue,) = info.value.issues
    assert issue.path == "groups[0].replication_policy"
    assert "not a replication policy" in issue.message


def test_build_policy_raises_policy_error() -> None:
    group = config().groups[0].model_copy(update={"replication_policy": "no_such_pkg_xyz.Policy"})
    with pytest.raises(PolicyError, match="cannot import"):
        build_replication_policy(group)


# --------------------------------------------------------------------------- internal topics


INTERNAL = [
    "__consumer_offsets",
    "__transaction_state",
    "_schemas",
    "_confluent-metrics",
    "kafkasql-journal",
    "x.internal",
    "mm2-offset-syncs.a.internal",
    "src.checkpoints.internal",
    "mirrorflow-offset-syncs.src.internal",
    "g.mirrorflow.dlq",
    "connect-offsets-internal",
    "heartbeats",
    "orders.replica",  # MM2's DefaultTopicFilter excludes .*\.replica too
]


@pytest.mark.parametrize("topic", INTERNAL)
def test_internal_topics(topic: str) -> None:
    assert is_internal_topic(topic)


@pytest.mark.parametrize("topic", ["orders", "payments.eu", "internal.audit", "my_schemas", "heartbeats-app",
                                   "replica.orders", "orders.replicas", "orders-replica"])
def test_ordinary_topics_are_not_internal(topic: str) -> None:
    assert not is_internal_topic(topic)


def test_flow_never_selects_internal_topics() -> None:
    chosen, skipped = topic_filter(config()).select([*INTERNAL, "orders"])
    assert [s.source_topic for s in chosen] == ["orders"]
    assert {s.source_topic for s in skipped} == set(INTERNAL)
    assert all("internal" in s.reason for s in skipped)


def test_explicit_pair_never_selects_internal_topic() -> None:
    cfg = config(mirrors=[{"source_topic": "__consumer_offsets", "destination_topic": "offsets-copy"}])
    chosen, skipped = topic_filter(cfg).select(["__consumer_offsets"])
    assert chosen == []
    assert [(s.source_topic, "internal" in s.reason) for s in skipped] == [("__consumer_offsets", True)]


# --------------------------------------------------------------------------- topic filter


def test_explicit_pairs() -> None:
    cfg = config(
        mirrors=[
            {"source_topic": "orders"},
            {"source_topic": "customers", "destination_topic": "customers-v2"},
            {"source_topic": "missing"},
        ]
    )
    chosen, skipped = topic_filter(cfg).select(["orders", "customers", "other"])
    assert [(s.source_topic, s.destination_topic, s.mirror.name) for s in chosen] == [
        ("orders", "orders", "g__orders__orders"),
        ("customers", "customers-v2", "g__customers__customers-v2"),
    ]
    assert [s.source_topic for s in skipped] == ["missing"]
    assert "does not exist" in skipped[0].reason


def test_regex_flow_with_exclude() -> None:
    cfg = config(mirrors=[{"topics": {"include": "payments\\..*", "exclude": ".*\\.tmp"}}])
    chosen, skipped = topic_filter(cfg).select(
        ["payments.eu", "payments.us", "payments.eu.tmp", "orders", "xpayments.eu"]
    )
    assert [(s.source_topic, s.destination_topic) for s in chosen] == [
        ("payments.eu", "payments.eu"),
        ("payments.us", "payments.us"),
    ]
    assert skipped == []  # not matching a flow is not a skip
    sel = chosen[0]
    assert sel.mirror.name == "g__payments.eu__payments.eu"
    assert (sel.mirror.source_topic, sel.mirror.destination_topic) == ("payments.eu", "payments.eu")
    assert sel.mirror.consumer_group.startswith("g.mirrorflow.flow-")  # stable: from the regexes


def test_regex_is_a_full_match() -> None:
    cfg = config(mirrors=[{"topics": {"include": "orders"}}])
    chosen, _ = topic_filter(cfg).select(["orders", "orders-v2", "old-orders"])
    assert [s.source_topic for s in chosen] == ["orders"]


def test_explicit_pair_wins_over_flow() -> None:
    cfg = config(mirrors=[{"source_topic": "orders", "destination_topic": "orders-v2"}, {"topics": {"include": ".*"}}])
    chosen, _ = topic_filter(cfg).select(["orders", "refunds"])
    assert [(s.source_topic, s.destination_topic, s.mirror.index) for s in chosen] == [
        ("orders", "orders-v2", 0),
        ("refunds", "refunds", 1),
    ]


def test_first_matching_flow_wins() -> None:
    cfg = config(
        mirrors=[
            {"topics": {"include": "a\\..*"}, "delivery": "at_least_once"},
            {"topics": {"include": ".*"}},
        ]
    )
    chosen, _ = topic_filter(cfg).select(["a.x", "b.x"])
    assert [(s.source_topic, s.mirror.index, s.mirror.settings.delivery) for s in chosen] == [
        ("a.x", 0, "at_least_once"),
        ("b.x", 1, "exactly_once"),
    ]


def test_flow_does_not_overwrite_an_explicit_destination() -> None:
    cfg = config(
        mirrors=[{"source_topic": "orders-v1", "destination_topic": "orders"}, {"topics": {"include": "orders.*"}}]
    )
    chosen, skipped = topic_filter(cfg).select(["orders-v1", "orders"])
    assert [(s.source_topic, s.destination_topic) for s in chosen] == [("orders-v1", "orders")]
    assert [s.source_topic for s in skipped] == ["orders"]
    assert "already written" in skipped[0].reason


def test_prefix_policy_flow_names_and_cycle() -> None:
    cfg = config("prefix")
    chosen, skipped = topic_filter(cfg).select(["orders", "dst.x", "other.y"])
    assert [(s.source_topic, s.destination_topic) for s in chosen] == [
        ("orders", "src.orders"),
        ("other.y", "src.other.y"),
    ]
    assert [s.source_topic for s in skipped] == ["dst.x"]
    assert "cycle" in skipped[0].reason and "'dst'" in skipped[0].reason


def ring_filter(policy: ReplicationPolicy, source: str = "C", destination: str = "A") -> TopicFilter:
    """The C -> A leg of a ring A -> B -> C -> A, mirroring every topic."""
    g = config("prefix").groups[0].model_copy(update={"source": source, "destination": destination})
    return TopicFilter(tuple(resolve_mirrors(g)), policy, source, destination)


def test_a_ring_of_three_does_not_send_a_topic_back_to_its_origin() -> None:
    """A -> B -> C -> A under the prefix policy: C holds ``B.A.orders`` (A's data after two hops). Mirroring
    it to A would bring A's records home as ``C.B.A.orders``, and every turn of the ring would add a longer
    name. Only B's and C's own data (and C's copy of a third cluster's) goes to A."""
    tf = ring_filter(PrefixReplicationPolicy("."))
    chosen, skipped = tf.select(["B.A.orders", "B.orders", "orders", "A.x", "C.B.A.y", "D.B.z"])
    assert sorted(s.destination_topic for s in chosen) == ["C.B.orders", "C.D.B.z", "C.orders"]
    reasons = {s.source_topic: s.reason for s in skipped}
    assert set(reasons) == {"B.A.orders", "A.x", "C.B.A.y"}
    assert reasons["B.A.orders"] == "came from 'A' through 'B'; not mirrored back (cycle)"
    assert reasons["A.x"] == "came from 'A'; not mirrored back (cycle)"


def test_the_cycle_walk_uses_the_policy_and_ends() -> None:
    """A user policy is walked the same way; a policy whose upstream of a topic is the topic itself (or that
    names topics in a circle) ends the walk instead of looping."""
    chosen, skipped = ring_filter(SuffixPolicy()).select(["o.from-A.from-B", "o.from-B"])
    assert [s.source_topic for s in chosen] == ["o.from-B"]
    assert [s.source_topic for s in skipped] == ["o.from-A.from-B"]

    class SelfUpstream:
        def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
            return topic

        def topic_source(self, topic: str) -> str | None:
            return "B"

        def upstream_topic(self, topic: str) -> str | None:
            return {"t": "u", "u": "t"}.get(topic, topic)

    assert upstream_clusters(SelfUpstream(), "x") == ["B"]
    assert upstream_clusters(SelfUpstream(), "t") == ["B", "B"]
    assert [s.source_topic for s in ring_filter(SelfUpstream()).select(["t", "x"])[0]] == ["t", "x"]


def test_select_is_pure_and_deterministic() -> None:
    tf = topic_filter(config())
    topics = ["b", "a", "c"]
    assert tf.select(topics) == tf.select(list(reversed(topics)))
    assert topics == ["b", "a", "c"]


# --------------------------------------------------------------------------- group filter


def test_group_filter_include_exclude() -> None:
    f = GroupFilter(include="payments-.*|ledger", exclude=".*-tmp")
    assert f.matches("payments-api")
    assert f.matches("ledger")
    assert not f.matches("payments-api-tmp")
    assert not f.matches("ledger-2")  # full match
    assert not f.matches("orders")


def test_group_filter_from_default_offsets_config() -> None:
    groups = config().groups[0].offsets.groups
    f = GroupFilter(include=groups.include, exclude=groups.exclude)
    assert f.matches("orders-service")
    assert not f.matches("_confluent-controlcenter")
    assert not f.matches("g.mirrorflow.orders__orders")  # mirrorflow's own consumer groups


def test_group_filter_matches_all_by_default() -> None:
    assert GroupFilter().matches("anything")


# --------------------------------------------------------------------------- config property filter


@pytest.mark.parametrize(
    "name",
    [
        "follower.replication.throttled.replicas",
        "leader.replication.throttled.replicas",
        "message.timestamp.difference.max.ms",
        "message.timestamp.type",
        "unclean.leader.election.enable",
        "min.insync.replicas",
    ],
)
def test_config_property_filter_mm2_default_exclusions(name: str) -> None:
    assert not ConfigPropertyFilter().should_replicate(name)


@pytest.mark.parametrize("name", ["retention.ms", "cleanup.policy", "compression.type", "max.message.bytes"])
def test_config_property_filter_copies_the_rest(name: str) -> None:
    assert ConfigPropertyFilter().should_replicate(name)


def test_config_property_filter_user_excludes_add_to_defaults() -> None:
    f = ConfigPropertyFilter(user_excludes=("retention\\.ms", "local\\.retention\\..*"))
    assert not f.should_replicate("retention.ms")
    assert not f.should_replicate("local.retention.bytes")
    assert not f.should_replicate("min.insync.replicas")
    assert f.should_replicate("retention.bytes")  # full match, not search
    assert f.should_replicate("cleanup.policy")


def test_config_property_filter_from_config() -> None:
    cfg = config(topics_mirroring={"config_exclude": ["segment\\..*"]})
    f = ConfigPropertyFilter(cfg.groups[0].topics_mirroring.config_exclude)
    assert not f.should_replicate("segment.bytes")
    assert f.should_replicate("retention.ms")
    assert len(DEFAULT_CONFIG_EXCLUDES) == 8  # MM2's six + Kafka 4's message.timestamp.before/after.max.ms
