"""Small pluggable policies, chosen by name in the YAML (as MirrorMaker 2's).

- :class:`ReplicationPolicy`: how a source topic is named on the destination, and back.
- :class:`TopicFilter`: which source topics a group mirrors (never internal ones).
- :class:`GroupFilter`: which consumer groups get checkpoints and offset sync.
- :class:`ConfigPropertyFilter`: which topic configs are copied.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from mirror_core.errors import MirrorError

if TYPE_CHECKING:
    from mirror_core.config import GroupConfig, MirrorsConfig, ResolvedMirror


class PolicyError(MirrorError):
    exit_code = 2


@runtime_checkable
class ReplicationPolicy(Protocol):
    """Names remote topics. Same interface as MM2's ``ReplicationPolicy`` (snake_case)."""

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str: ...

    def topic_source(self, topic: str) -> str | None:
        """The cluster alias a remote topic came from, or None if it is not remote."""
        ...

    def upstream_topic(self, topic: str) -> str | None:
        """The topic name on the cluster it came from, or None if it is not remote."""
        ...


@dataclass(frozen=True)
class IdentityReplicationPolicy:
    """Same name on both sides (viooh-mirror / MM2's IdentityReplicationPolicy).

    A remote topic cannot be told from a local one by its name, so two-way
    setups need the data path's provenance header to avoid loops.
    """

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        return topic

    def topic_source(self, topic: str) -> str | None:
        return None

    def upstream_topic(self, topic: str) -> str | None:
        return None


@dataclass(frozen=True)
class PrefixReplicationPolicy:
    """MM2's DefaultReplicationPolicy: ``<source-alias><separator><topic>``."""

    separator: str = "."

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        return f"{source_cluster_alias}{self.separator}{topic}"

    def topic_source(self, topic: str) -> str | None:
        alias, sep, rest = topic.partition(self.separator)
        return alias if sep and rest and alias else None

    def upstream_topic(self, topic: str) -> str | None:
        alias, sep, rest = topic.partition(self.separator)
        return rest if sep and rest and alias else None


def upstream_clusters(policy: ReplicationPolicy, topic: str) -> list[str]:
    """The cluster aliases a remote topic came through, nearest first (``B.A.orders`` under the prefix
    policy: ``["B", "A"]``); empty for a topic the policy does not see as remote.

    Walks ``topic_source`` / ``upstream_topic`` to the topic's origin, as MM2's cycle check does: with
    three or more clusters in a ring, a topic's first hop names its last cluster, not its origin. Stops at
    a policy that names a topic its own upstream (identity-like) or repeats itself (a cycle in the names).
    """
    hops: list[str] = []
    seen = {topic}
    while True:
        alias = policy.topic_source(topic)
        if alias is None:
            return hops
        hops.append(alias)
        upstream = policy.upstream_topic(topic)
        if upstream is None or upstream in seen:
            return hops
        seen.add(upstream)
        topic = upstream


def build_replication_policy(group: GroupConfig) -> ReplicationPolicy:
    """The policy named by ``group.replication_policy``; a dotted path imports a user class."""
    name = group.replication_policy
    if name == "identity":
        return IdentityReplicationPolicy()
    if name == "prefix":
        return PrefixReplicationPolicy(group.replication_policy_separator)
    module_name, _, cls_name = name.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise PolicyError(f"cannot import replication policy {name!r}: {exc}") from None
    if not isinstance(cls, type):
        raise PolicyError(f"{name!r} is not a class")
    try:
        try:
            instance = cls(separator=group.replication_policy_separator)
        except TypeError:
            instance = cls()
    except Exception as exc:  # a user class failing to build is a config problem, not a crash
        raise PolicyError(f"cannot build replication policy {name!r}: {exc}") from None
    if not isinstance(instance, ReplicationPolicy):
        raise PolicyError(
            f"{name!r} is not a replication policy (needs format_remote_topic, topic_source, upstream_topic)"
        )
    return instance


# Names that are never mirrored: Kafka's own, registries' storage, MM2's and ours. MM2's DefaultTopicFilter
# default (topics.exclude ".*[-.]internal, .*\.replica, __.*") is all in it.
_INTERNAL_RE = re.compile(
    r"^(__.*|_schemas|_confluent.*|kafkasql-journal|.*\.internal|.*[.-]internal|.*\.replica|"
    r"mm2-.*|.*\.mirrorflow\.dlq|heartbeats)$"
)


def is_internal_topic(topic: str) -> bool:
    """Kafka's, registries', MM2's and mirrorflow's own topics (heartbeats are mirrored on purpose
    by the heartbeat feature, never by a user's flow)."""
    return bool(_INTERNAL_RE.match(topic))


@dataclass(frozen=True)
class TopicSelection:
    """A source topic chosen for mirroring, with its destination name."""

    mirror: ResolvedMirror
    source_topic: str
    destination_topic: str


@dataclass(frozen=True)
class Skipped:
    source_topic: str
    reason: str


@dataclass(frozen=True)
class TopicFilter:
    """Chooses source topics for a group's mirrors: explicit pairs, then regex flows.

    ``dead_letters``: the dead-letter topics on the source cluster (topic -> the group writing them,
    :meth:`MirrorsConfig.dead_letter_topics_on`): a flow never selects one, an explicit mirror may."""

    mirrors: tuple[ResolvedMirror, ...]
    policy: ReplicationPolicy
    source_alias: str
    destination_alias: str
    dead_letters: Mapping[str, str] = field(default_factory=dict)

    def select(self, source_topics: list[str]) -> tuple[list[TopicSelection], list[Skipped]]:
        """Pure: decide, for the listed source topics, which are mirrored and where to."""
        from mirror_core.config import mirror_name

        chosen: list[TopicSelection] = []
        skipped: list[Skipped] = []
        taken: set[str] = set()
        written: dict[str, str] = {}  # destination topic -> the source topic mirrored into it
        existing = set(source_topics)
        for m in self.mirrors:
            if m.is_flow:
                continue
            assert m.source_topic is not None and m.destination_topic is not None
            if m.source_topic not in existing:
                skipped.append(Skipped(m.source_topic, f"{m.name}: source topic does not exist"))
                continue
            if is_internal_topic(m.source_topic):
                skipped.append(Skipped(m.source_topic, f"{m.name}: internal topic, never mirrored"))
                continue
            chosen.append(TopicSelection(m, m.source_topic, m.destination_topic))
            taken.add(m.source_topic)
            written[m.destination_topic] = m.source_topic
        for topic in sorted(existing - taken):
            flows = [m for m in self.mirrors if m.is_flow and m.topics and m.topics.matches(topic)]
            if not flows:
                continue
            if is_internal_topic(topic):
                skipped.append(Skipped(topic, "internal topic, never mirrored"))
                continue
            if topic in self.dead_letters:
                skipped.append(Skipped(topic, f"dead-letter topic of group {self.dead_letters[topic]!r}, "
                                              "never mirrored by a flow"))
                continue
            hops = upstream_clusters(self.policy, topic)
            if self.destination_alias in hops:
                skipped.append(Skipped(topic, _cycle_reason(hops, self.destination_alias)))
                continue
            flow = flows[0]
            dst = self.policy.format_remote_topic(self.source_alias, topic)
            if dst in written:
                skipped.append(Skipped(topic, f"destination {dst!r} is already written from {written[dst]!r}"))
                continue
            written[dst] = topic
            resolved = flow.model_copy(update={
                "source_topic": topic,
                "destination_topic": dst,
                "name": mirror_name(flow.group, topic, dst),
            })
            chosen.append(TopicSelection(resolved, topic, dst))
        return chosen, skipped


def group_topic_filter(cfg: MirrorsConfig, group: GroupConfig, mirrors: tuple[ResolvedMirror, ...] | None = None,
                       policy: ReplicationPolicy | None = None) -> TopicFilter:
    """The :class:`TopicFilter` of ``group`` in ``cfg``, which knows the file's dead-letter topics on its source."""
    from mirror_core.config import resolve_mirrors

    return TopicFilter(mirrors if mirrors is not None else tuple(resolve_mirrors(group)),
                       policy or build_replication_policy(group), group.source, group.destination,
                       cfg.dead_letter_topics_on(group.source))


def _cycle_reason(hops: list[str], destination: str) -> str:
    between = hops[:hops.index(destination)]
    via = f" through {', '.join(repr(h) for h in reversed(between))}" if between else ""
    return f"came from {destination!r}{via}; not mirrored back (cycle)"


@dataclass(frozen=True)
class GroupFilter:
    include: str = ".*"
    exclude: str | None = None

    def matches(self, group_id: str) -> bool:
        if not re.fullmatch(self.include, group_id):
            return False
        return not (self.exclude and re.fullmatch(self.exclude, group_id))


#: MM2's DefaultConfigPropertyFilter exclusions, plus Kafka 4's timestamp limits.
DEFAULT_CONFIG_EXCLUDES = (
    r"follower\.replication\.throttled\.replicas",
    r"leader\.replication\.throttled\.replicas",
    r"message\.timestamp\.difference\.max\.ms",
    r"message\.timestamp\.type",
    r"unclean\.leader\.election\.enable",
    r"min\.insync\.replicas",
    # Kafka 4's replacements of message.timestamp.difference.max.ms: copied, they would make the
    # destination reject back-filled (old) or clock-skewed records
    r"message\.timestamp\.before\.max\.ms",
    r"message\.timestamp\.after\.max\.ms",
)


@dataclass(frozen=True)
class ConfigPropertyFilter:
    """Which topic config properties are copied to the destination."""

    user_excludes: tuple[str, ...] = ()

    def should_replicate(self, name: str) -> bool:
        return not any(re.fullmatch(p, name) for p in DEFAULT_CONFIG_EXCLUDES + self.user_excludes)
