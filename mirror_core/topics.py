"""Topic planning: what the destination needs for a group's mirrors, then applying it.

:func:`plan_topics` is pure: it takes both clusters' state (read by
:func:`read_state`) and returns a :class:`TopicPlan` of actions, each with its
reason. :func:`apply_topic_plan` carries a plan out, topic by topic: a change the
destination refuses is reported with the others done (:class:`AppliedPlan`).
Applying the same plan twice is harmless and re-planning afterwards yields only
``unchanged``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
)

from mirror_core.config import GroupConfig, ResolvedMirror, resolve_mirrors
from mirror_core.errors import KafkaOperationError
from mirror_core.policy import ConfigPropertyFilter, ReplicationPolicy, TopicFilter, build_replication_policy

log = logging.getLogger(__name__)

ActionKind = Literal["create", "grow", "alter_configs", "create_acls", "unchanged", "error"]
#: what the principal may do with a cluster's ACLs: ``manage`` (list and create: Describe and Alter on the
#: cluster; also when not asked), ``list`` (Describe only), ``denied`` (neither), or ``no_authorizer`` (the
#: cluster keeps no ACLs)
AclAccess = Literal["manage", "list", "denied", "no_authorizer"]


@dataclass(frozen=True)
class AclEntry:
    """A literal topic ACL: principal, host, operation name, permission name."""

    principal: str
    host: str
    operation: str
    permission: str


MIN_ISR = "min.insync.replicas"


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str] = field(default_factory=dict)  # explicitly set (non-default) configs only
    acls: tuple[AclEntry, ...] = ()
    #: the configs that have Kafka's own default here (set neither on the topic nor on the brokers)
    defaults: frozenset[str] = frozenset()
    #: the ``min.insync.replicas`` in effect (the topic's override or the brokers' setting); None when not read
    min_insync_replicas: int | None = None

    @property
    def min_isr(self) -> tuple[int, str] | None:
        """The ``min.insync.replicas`` in effect and whose it is (``the topic's`` / ``the brokers'``), if known."""
        own = self.configs.get(MIN_ISR)
        if own is not None and own.isdigit():
            return int(own), "the topic's"
        if self.min_insync_replicas is not None:
            return self.min_insync_replicas, "the brokers'"
        return None


@dataclass(frozen=True)
class ClusterState:
    topics: dict[str, TopicInfo]
    broker_count: int
    acl_access: AclAccess = "manage"


@dataclass(frozen=True)
class TopicAction:
    kind: ActionKind
    topic: str
    mirror: str
    reason: str
    source_topic: str | None = None
    partitions: int | None = None
    replication_factor: int | None = None
    configs: dict[str, str] = field(default_factory=dict)
    #: ``alter_configs``: destination overrides to delete (back to the broker default): the source does not set them
    deletes: tuple[str, ...] = ()
    acls: tuple[AclEntry, ...] = ()
    warnings: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if v not in (None, (), {})}
        if self.acls:
            d["acls"] = [a.__dict__ for a in self.acls]
        return d


@dataclass(frozen=True)
class TopicPlan:
    group: str
    actions: tuple[TopicAction, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (source topic, reason)
    notes: tuple[str, ...] = ()

    @property
    def errors(self) -> list[TopicAction]:
        return [a for a in self.actions if a.kind == "error"]

    @property
    def blocking(self) -> list[TopicAction]:
        """The errors that keep the group from being provisioned or streamed: all but a missing permission to
        copy ACLs (:func:`acl_sync_problems`), which stops only the ACL copy. MirrorMaker 2 also goes on mirroring
        then; here ``plan`` and ``provision`` still fail on it, and the stream logs it."""
        return [a for a in self.errors if a.topic != ACL_SYNC]

    @property
    def changes(self) -> list[TopicAction]:
        return [a for a in self.actions if a.kind not in ("unchanged", "error")]

    @property
    def warnings(self) -> list[str]:
        return [w for a in self.actions for w in a.warnings]


# --------------------------------------------------------------------------- pure planning


def acl_for_destination(acl: AclEntry) -> AclEntry | None:
    """MM2's rule: an ALLOW WRITE is not copied (only the mirror writes a destination topic) and an ALLOW ALL
    becomes ALLOW READ; everything else is copied as it is, DENY entries included (without them the
    destination would let read whom the source refuses)."""
    if acl.permission == "ALLOW" and acl.operation == "WRITE":
        return None
    if acl.permission == "ALLOW" and acl.operation == "ALL":
        return AclEntry(acl.principal, acl.host, "READ", acl.permission)
    return acl


def _deny_write_warnings(topic: str, acls: tuple[AclEntry, ...]) -> tuple[str, ...]:
    """A copied DENY WRITE / ALL also refuses the mirror if its principal matches the mirror's own."""
    return tuple(f"{topic}: copies DENY {a.operation} for {a.principal}: if that covers the destination principal, "
                 f"the mirror can no longer write {topic}" for a in acls
                 if a.permission == "DENY" and a.operation in ("WRITE", "ALL"))


#: the ``topic`` of a plan error about the permission to copy topic ACLs (see :attr:`TopicPlan.blocking`)
ACL_SYNC = "sync_acls"


def acl_sync_problems(group: GroupConfig, mirrors: Iterable[ResolvedMirror], source: ClusterState,
                      destination: ClusterState) -> tuple[list[str], list[str]]:
    """(errors, notes) of a group that syncs topic ACLs, from what listing them on each side gave.

    A side that may not list them is an error, not "no ACLs": the source's entries (its DENYs too) would
    silently not reach the mirrors, or, the destination's unknown, every run would plan them again and fail
    creating them; so is a destination that may not create them. A side without an authorizer is a note, as
    in MM2."""
    if not any(m.settings.topics_mirroring.sync_acls for m in mirrors):
        return [], []
    errors, notes = [], []
    fix = "(`mirrorflow acls` prints the grants), or set topics_mirroring.sync_acls: false"
    if source.acl_access == "denied":
        errors.append(f"cannot list the topic ACLs of source cluster {group.source!r} (CLUSTER_AUTHORIZATION_FAILED): "
                      f"its principal needs Describe on the cluster {fix}")
    if destination.acl_access in ("denied", "list"):
        what = "list" if destination.acl_access == "denied" else "create"
        errors.append(f"cannot {what} the topic ACLs of destination cluster {group.destination!r} "
                      "(CLUSTER_AUTHORIZATION_FAILED): its principal needs Describe (to list) and Alter (to create) "
                      f"on the cluster {fix}")
    if source.acl_access == "no_authorizer":
        notes.append(f"sync_acls: source cluster {group.source!r} has no authorizer, so no topic ACLs to copy")
    if destination.acl_access == "no_authorizer":
        notes.append(f"sync_acls: destination cluster {group.destination!r} has no authorizer: no topic ACL can be "
                     "created there, none is copied")
    return errors, notes


def internal_topics(group: GroupConfig, destination: ClusterState) -> list[tuple[str, int, dict[str, str], str]]:
    """Topics the data path and offset handling need on the destination: (name, partitions, configs, why)."""
    out = [
        (group.offset_syncs, 1, {"cleanup.policy": "delete", "retention.ms": str(7 * 24 * 3600 * 1000)},
         "offset-sync history (kept, not compacted, for exact translation)"),
        (group.checkpoints_topic, 1, {"cleanup.policy": "compact"}, "MM2-format checkpoints"),
        (group.stops, 1, {"cleanup.policy": "compact"}, "a failover's stop of the group's stream"),
    ]
    if any(m.settings.on_error == "dead_letter" for m in resolve_mirrors(group)):
        out.append((group.dlq_topic, 1, {}, "dead letters (records that could not be mirrored)"))
    return out


def compacted(policy: str) -> bool:
    """Does a topic with this ``cleanup.policy`` keep a key's last record for good (``compact`` alone: with
    ``compact,delete`` the retention deletes it too)?"""
    return cleanup_policies(policy) == {"compact"}


def cleanup_policies(policy: str) -> set[str]:
    """The policies a ``cleanup.policy`` value names (``"compact, delete"`` -> ``{"compact", "delete"}``)."""
    return {p.strip() for p in policy.split(",")}


#: topic configs Kafka 4 removed: a 4.x broker refuses a CreateTopics or IncrementalAlterConfigs that names one
#: (INVALID_CONFIG "Unknown topic config name", as 4.1.1 does), and 3.x brokers ignore the first two (inter-broker
#: protocol 3.0 and newer). A source still on 3.x may carry them as overrides: they are never copied.
REMOVED_IN_KAFKA_4 = ("message.format.version", "message.downconversion.enable",
                      "message.timestamp.difference.max.ms")


def replicable(name: str, cfilter: ConfigPropertyFilter) -> bool:
    """Is topic config ``name`` copied to (and, when the source does not set it, removed from) the destination?"""
    return name not in REMOVED_IN_KAFKA_4 and cfilter.should_replicate(name)


def plan_topics(
    group: GroupConfig,
    source: ClusterState,
    destination: ClusterState,
    policy: ReplicationPolicy | None = None,
    mirrors: Iterable[ResolvedMirror] | None = None,
    dead_letters: Mapping[str, str] | None = None,
) -> TopicPlan:
    """Decide, for every topic the group mirrors, what the destination needs. Pure. ``dead_letters``: the
    dead-letter topics on the source, which no flow selects (:meth:`MirrorsConfig.dead_letter_topics_on`)."""
    policy = policy or build_replication_policy(group)
    resolved = tuple(mirrors if mirrors is not None else resolve_mirrors(group))
    selector = TopicFilter(resolved, policy, group.source, group.destination, dead_letters or {})
    chosen, skipped = selector.select(sorted(source.topics))
    actions: list[TopicAction] = []
    notes: list[str] = []
    acl_errors, acl_notes = acl_sync_problems(group, resolved, source, destination)
    actions += [TopicAction("error", topic=ACL_SYNC, mirror=f"{group.name} (ACLs)", reason=e) for e in acl_errors]
    notes += acl_notes
    acls_copyable = not acl_errors and destination.acl_access == "manage"

    if group.replication_policy == "identity":
        notes.append(
            "identity policy: a topic's name does not tell where it came from; in a two-way setup, loop "
            "prevention relies on the data path's provenance header"
        )

    for sel in chosen:
        src = source.topics[sel.source_topic]
        tm = sel.mirror.settings.topics_mirroring
        want_p = tm.partition_count.resolve(src.partitions)
        want_rf = tm.replication_factor.resolve(src.replication_factor)
        cfilter = ConfigPropertyFilter(tm.config_exclude)
        want_cfg = {k: v for k, v in src.configs.items() if replicable(k, cfilter)} if tm.sync_configs else {}
        want_acls = tuple(a for a in (acl_for_destination(x) for x in src.acls) if a) \
            if tm.sync_acls and acls_copyable else ()
        dst = destination.topics.get(sel.destination_topic)
        base: dict[str, Any] = {"topic": sel.destination_topic, "mirror": sel.mirror.name,
                                "source_topic": sel.source_topic}

        if dst is None:
            if want_rf > destination.broker_count:
                actions.append(TopicAction("error", reason=(
                    f"replication factor {want_rf} is above the destination's {destination.broker_count} "
                    f"broker(s); lower topics_mirroring.replication_factor"), **base))
                continue
            if not tm.auto_create_topics:
                actions.append(TopicAction("error", reason=(
                    "destination topic does not exist and auto_create_topics is false"), **base))
                continue
            warns = _partition_warning(sel.destination_topic, want_p, src.partitions)
            excluded = sorted(set(src.configs) - set(want_cfg)) if tm.sync_configs else []
            why = f"missing on destination; {want_p} partitions ({_rule_text(tm.partition_count, src.partitions)}), " \
                  f"RF {want_rf}" + (f"; configs filtered out: {', '.join(excluded)}" if excluded else "")
            actions.append(TopicAction("create", partitions=want_p, replication_factor=want_rf, configs=want_cfg,
                                       reason=why, warnings=warns, **base))
            if want_acls:
                actions.append(TopicAction("create_acls", acls=want_acls, reason="copy literal topic ACLs",
                                           warnings=_deny_write_warnings(sel.destination_topic, want_acls), **base))
            continue

        first = len(actions)  # the topic's first action carries its replication warnings
        rf_warns = _replication_warnings(sel.destination_topic, dst, want_rf,
                                         f"the rule wants {want_rf} ({_rule_text(tm.replication_factor, src.replication_factor)})")
        changed = False
        if want_p > dst.partitions:
            actions.append(TopicAction(
                "grow", partitions=want_p, reason=f"destination has {dst.partitions} partitions, wants {want_p}",
                warnings=_partition_warning(sel.destination_topic, want_p, src.partitions), **base))
            changed = True
        diff = {k: v for k, v in want_cfg.items() if dst.configs.get(k) != v}
        # as MM2's incremental config sync: an override the destination has where the source has Kafka's own
        # default (removed there) is deleted, or the destination would keep records for another time or compact
        # them. Not where the source's value comes from its brokers' settings (which are not copied): the
        # destination's override may be what matches them (config_exclude keeps a destination's own)
        stale = tuple(sorted(k for k in dst.configs
                             if k not in want_cfg and k in src.defaults and replicable(k, cfilter))) \
            if tm.sync_configs else ()
        if diff or stale:
            whys = (["configs differ: " + ", ".join(sorted(diff))] if diff else []) + (
                [f"Kafka's default on the source, back to the broker default: {', '.join(stale)}"] if stale else [])
            actions.append(TopicAction("alter_configs", configs=diff, deletes=stale, reason="; ".join(whys), **base))
            changed = True
        missing_acls = tuple(a for a in want_acls if a not in dst.acls)
        if missing_acls:
            actions.append(TopicAction("create_acls", acls=missing_acls,
                                       reason=f"{len(missing_acls)} literal topic ACL(s) missing",
                                       warnings=_deny_write_warnings(sel.destination_topic, missing_acls), **base))
            changed = True
        if not changed:
            final_p = max(dst.partitions, want_p)
            actions.append(TopicAction("unchanged", partitions=dst.partitions, replication_factor=dst.replication_factor,
                                       reason="up to date",
                                       warnings=_partition_warning(sel.destination_topic, final_p, src.partitions),
                                       **base))
        if rf_warns:
            actions[first] = replace(actions[first], warnings=actions[first].warnings + rf_warns)

    for name, parts, cfg, why in internal_topics(group, destination):
        rf = min(3, destination.broker_count)
        existing = destination.topics.get(name)
        if existing is None:
            actions.append(TopicAction("create", topic=name, mirror=f"{group.name} (internal)", partitions=parts,
                                       replication_factor=rf, configs=cfg, reason=why))
        elif fix := _internal_policy_fix(group, name, existing.configs.get("cleanup.policy", "delete")):
            actions.append(TopicAction("alter_configs", topic=name, mirror=f"{group.name} (internal)",
                                       configs={"cleanup.policy": fix[0]}, reason=f"{why}: {fix[1]}"))
        else:
            actions.append(TopicAction("unchanged", topic=name, mirror=f"{group.name} (internal)",
                                       partitions=existing.partitions, replication_factor=existing.replication_factor,
                                       reason=why, warnings=_replication_warnings(name, existing, None, "")))
    return TopicPlan(group.name, tuple(actions), tuple((s.source_topic, s.reason) for s in skipped), tuple(notes))


def _internal_policy_fix(group: GroupConfig, name: str, policy: str) -> tuple[str, str] | None:
    """The ``cleanup.policy`` an internal topic made by someone else must be given, and why; None when it has the
    right one."""
    if name == group.stops and not compacted(policy):
        # with the default policy a failover's stop would expire with the retention, and a stream DAG start the
        # stopped mirror again
        return "compact", f"must be compacted (has cleanup.policy={policy}), or a stop expires with the retention"
    if name == group.offset_syncs and "compact" in cleanup_policies(policy):
        # compaction keeps each partition's newest sync only (an offset sync's key is its partition): a group's
        # offset committed before it then has no sync at or below it, and cannot be translated exactly
        return "delete", (f"must not be compacted (has cleanup.policy={policy}): compaction keeps each partition's "
                          "newest sync only, and an offset committed before it cannot be translated")
    return None


def _rule_text(rule: Any, source_value: int) -> str:
    if rule.type == "fix":
        return "fixed"
    bounds = []
    if rule.min is not None:
        bounds.append(f"min {rule.min}")
    if rule.max is not None:
        bounds.append(f"max {rule.max}")
    return f"source has {source_value}" + (f", clamped to {' / '.join(bounds)}" if bounds else "")


def _replication_warnings(topic: str, dst: TopicInfo, want_rf: int | None, wanted: str) -> tuple[str, ...]:
    """An existing destination topic whose replication factor is not ``want_rf`` (``wanted`` says why that one;
    None: no rule), or is below its ``min.insync.replicas``. Provisioning changes neither."""
    out = []
    if want_rf is not None and dst.replication_factor != want_rf:
        out.append(f"{topic}: destination topic has replication factor {dst.replication_factor}, {wanted}; "
                   "provisioning does not change an existing topic's replication factor")
    isr = dst.min_isr
    if isr is not None and dst.replication_factor < isr[0]:
        out.append(f"{topic}: destination topic has replication factor {dst.replication_factor}, below {isr[1]} "
                   f"{MIN_ISR} {isr[0]}: every acks=all write to it (the mirror's) fails with NOT_ENOUGH_REPLICAS")
    return tuple(out)


def _partition_warning(topic: str, dst_partitions: int, src_partitions: int) -> tuple[str, ...]:
    if dst_partitions < src_partitions:
        return (f"{topic}: destination has {dst_partitions} < {src_partitions} source partitions; partition numbers "
                f"cannot be preserved (records are placed by the Java-compatible murmur2 key hash)",)
    return ()


# --------------------------------------------------------------------------- reading and applying


def read_state(admin: AdminClient, topics: Iterable[str] | None = None, with_acls: bool = False,
               timeout: float = 30.0) -> ClusterState:
    """Topics (partitions, RF, explicitly-set configs) and broker count of one cluster."""
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise KafkaOperationError(f"cannot read cluster metadata: {exc.args[0].str()}", exc.args[0].name()) from None
    wanted = set(topics) if topics is not None else None
    infos: dict[str, TopicInfo] = {}
    names = [t for t in md.topics if (wanted is None or t in wanted) and not md.topics[t].error]
    configs, defaults, min_isr = _describe_configs(admin, names, timeout) if names else ({}, {}, {})
    acl_access: AclAccess = "manage"
    acls: dict[str, list[AclEntry]] = {}
    if with_acls:
        acls, acl_access = _describe_acls(admin, timeout)
    for name in names:
        t = md.topics[name]
        parts = t.partitions
        rf = len(next(iter(parts.values())).replicas) if parts else 0
        infos[name] = TopicInfo(name, len(parts), rf, configs.get(name, {}), tuple(acls.get(name, ())),
                                defaults.get(name, frozenset()), min_isr.get(name))
    return ClusterState(infos, len(md.brokers), acl_access)


def _describe_configs(admin: AdminClient, names: list[str], timeout: float
                      ) -> tuple[dict[str, dict[str, str]], dict[str, frozenset[str]], dict[str, int]]:
    """Per topic: its own overrides (:func:`_is_topic_override`), the configs that have Kafka's default, and the
    ``min.insync.replicas`` in effect."""
    futures = admin.describe_configs([ConfigResource(ResourceType.TOPIC, n) for n in names], request_timeout=timeout)
    out: dict[str, dict[str, str]] = {}
    defaults: dict[str, frozenset[str]] = {}
    min_isr: dict[str, int] = {}
    for res, fut in futures.items():
        try:
            entries = fut.result(timeout)
        except FutureTimeout:
            raise KafkaOperationError(f"cannot read the configs of topic {res.name}: no answer within {timeout:.0f}s",
                                      "_TIMED_OUT") from None
        except KafkaException as exc:
            raise KafkaOperationError(f"cannot read the configs of topic {res.name}: {exc.args[0].str()}",
                                      exc.args[0].name()) from None
        out[res.name] = {k: e.value for k, e in entries.items() if _is_topic_override(e)}
        defaults[res.name] = frozenset(k for k, e in entries.items() if _source(e) == ConfigSource.DEFAULT_CONFIG)
        isr = entries.get(MIN_ISR)
        if isr is not None and isr.value is not None and str(isr.value).isdigit():
            min_isr[res.name] = int(isr.value)
    return out, defaults, min_isr


def _source(entry: ConfigEntry) -> ConfigSource:
    source = entry.source
    if isinstance(source, int) and not isinstance(source, ConfigSource):
        source = ConfigSource(source)  # describe_configs reports the raw protocol value
    return source  # type: ignore[no-any-return]


def _is_topic_override(entry: ConfigEntry) -> bool:
    return _source(entry) == ConfigSource.DYNAMIC_TOPIC_CONFIG and entry.value is not None and not entry.is_sensitive


def _describe_acls(admin: AdminClient, timeout: float) -> tuple[dict[str, list[AclEntry]], AclAccess]:
    """The literal topic ACLs of the cluster, by topic, and what the principal may do with ACLs there.

    Asks first which cluster operations the principal is authorized for: librdkafka (2.16) reports a refused
    DescribeAcls (CLUSTER_AUTHORIZATION_FAILED, even SECURITY_DISABLED) as an empty list, which is not "no
    ACLs"."""
    access = _cluster_acl_access(admin, timeout)
    if access == "denied":
        return {}, access
    # None matches any name / principal / host (the stubs type these as str)
    flt = AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.LITERAL, None, None,  # type: ignore[arg-type]
                           AclOperation.ANY, AclPermissionType.ANY)
    try:
        bindings = admin.describe_acls(flt, request_timeout=timeout).result(timeout)
    except KafkaException as exc:
        code = exc.args[0].name()
        if code == "SECURITY_DISABLED":
            return {}, "no_authorizer"
        if code == "CLUSTER_AUTHORIZATION_FAILED":
            return {}, "denied"
        raise KafkaOperationError(f"cannot list ACLs: {exc.args[0].str()}", exc.args[0].name()) from None
    out: dict[str, list[AclEntry]] = {}
    for b in bindings:
        out.setdefault(b.name, []).append(AclEntry(b.principal, b.host, b.operation.name, b.permission_type.name))
    return out, access


def _cluster_acl_access(admin: AdminClient, timeout: float) -> AclAccess:
    """``manage`` with Alter on the cluster (it implies Describe), ``list`` with Describe, else ``denied``."""
    try:
        cluster = admin.describe_cluster(include_authorized_operations=True, request_timeout=timeout).result(timeout)
    except FutureTimeout:
        raise KafkaOperationError(f"cannot describe the cluster: no answer within {timeout:.0f}s", "_TIMED_OUT") from None
    except KafkaException as exc:
        raise KafkaOperationError(f"cannot describe the cluster: {exc.args[0].str()}", exc.args[0].name()) from None
    ops = {op.name for op in cluster.authorized_operations or ()}  # None: not even Describe
    return "manage" if "ALTER" in ops else "list" if "DESCRIBE" in ops else "denied"


@dataclass(frozen=True)
class ActionFailure:
    """A planned change the destination did not make: its kind, its topic, and why (Kafka's message and code)."""

    kind: ActionKind
    topic: str
    message: str
    code: str

    def __str__(self) -> str:
        return f"{self.message} ({self.code})"


@dataclass(frozen=True)
class AppliedPlan:
    """What :func:`apply_topic_plan` did (one line per change) and what failed (one failure per action)."""

    done: tuple[str, ...] = ()
    failures: tuple[ActionFailure, ...] = ()

    @property
    def failed_topics(self) -> frozenset[str]:
        return frozenset(f.topic for f in self.failures)


def apply_topic_plan(admin: AdminClient, plan: TopicPlan, timeout: float = 60.0) -> AppliedPlan:
    """Carry out the plan's changes, each topic on its own: a change the destination refuses is reported and the
    others go on (a topic whose create or grow failed gets none of its later changes). Never raises for a
    refused change; errors in the plan are not applied (the caller reports them)."""
    done: list[str] = []
    failures: list[ActionFailure] = []

    def failed(a: TopicAction, what: str, fut: Any, ok_codes: tuple[str, ...] = ()) -> bool:
        f = _failure(fut, a.kind, a.topic, what, timeout, ok_codes)
        if f is not None:
            failures.append(f)
        return f is not None

    creates = [a for a in plan.actions if a.kind == "create"]
    served: list[TopicAction] = []  # created or grown: wait for their leaders before anything writes to them
    if creates:
        new = [NewTopic(a.topic, a.partitions or 1, a.replication_factor or 1, config=dict(a.configs)) for a in creates]
        futs = admin.create_topics(new, request_timeout=timeout)
        for a in creates:
            if not failed(a, f"create topic {a.topic}", futs[a.topic], ok_codes=("TOPIC_ALREADY_EXISTS",)):
                done.append(f"created {a.topic} ({a.partitions} partitions, RF {a.replication_factor})")
                served.append(a)
    grows = [a for a in plan.actions if a.kind == "grow"]
    if grows:
        futs = admin.create_partitions([NewPartitions(a.topic, a.partitions or 1) for a in grows],
                                       request_timeout=timeout)
        for a in grows:
            if not failed(a, f"grow {a.topic}", futs[a.topic]):
                done.append(f"grew {a.topic} to {a.partitions} partitions")
                served.append(a)
    # a grown topic's old partitions answer at once
    new_partitions = [TopicPartition(a.topic, p) for a in served for p in range(a.partitions or 1)]
    if new_partitions:
        waiting = wait_for_leaders(admin, new_partitions, timeout)
        for a in served:
            mine = [tp.partition for tp in waiting if tp.topic == a.topic]
            if mine:
                failures.append(ActionFailure(a.kind, a.topic, _not_served(a.topic, mine, a.partitions or 1, timeout),
                                              "NOT_SERVED"))
    broken = {f.topic for f in failures}
    for a in plan.actions:
        if a.topic in broken:
            continue  # the topic is not there (or not served): its configs and ACLs wait for the next run
        if a.kind == "alter_configs":
            res = ConfigResource(ResourceType.TOPIC, a.topic, incremental_configs=[
                ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sorted(a.configs.items())
            ] + [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in a.deletes])
            altered = admin.incremental_alter_configs([res], request_timeout=timeout)
            if not any([failed(a, f"alter configs of {a.topic}", fut) for fut in altered.values()]):
                if a.configs:
                    done.append(f"set {', '.join(f'{k}={v}' for k, v in sorted(a.configs.items()))} on {a.topic}")
                if a.deletes:
                    done.append(f"deleted {', '.join(a.deletes)} on {a.topic} (Kafka's default on the source)")
        elif a.kind == "create_acls":
            bindings = [
                AclBinding(ResourceType.TOPIC, a.topic, ResourcePatternType.LITERAL, x.principal, x.host,
                           AclOperation[x.operation], AclPermissionType[x.permission])
                for x in a.acls
            ]
            created = admin.create_acls(bindings, request_timeout=timeout)
            if not any([failed(a, f"create ACLs on {a.topic}", fut) for fut in created.values()]):
                done.append(f"created {len(bindings)} ACL(s) on {a.topic}")
    return AppliedPlan(tuple(done), tuple(failures))


#: how a partition answers while its leader does not serve it yet (a topic just created or grown): for a
#: moment after CreateTopics returns, the metadata names a leader that still answers NOT_LEADER_FOR_PARTITION
#: (some 3 s for 1,000 partitions on one local broker)
_NOT_SERVED_YET = frozenset({"_NOENT", "_UNKNOWN_TOPIC", "_UNKNOWN_PARTITION", "UNKNOWN_TOPIC_OR_PART",
                             "NOT_LEADER_FOR_PARTITION", "LEADER_NOT_AVAILABLE"})


def create_topics(admin: AdminClient, topics: list[NewTopic], timeout: float = 60.0, exist_ok: bool = False
                  ) -> None:
    """Create ``topics`` and return once every partition's leader serves it (:func:`wait_for_leaders`): what
    anything that creates a topic and then writes to it at once must call instead of ``admin.create_topics``.
    Raises :class:`KafkaOperationError` naming the topic that could not be created (unless it exists and
    ``exist_ok``) or the partitions still not served at ``timeout``."""
    for name, fut in admin.create_topics(topics, request_timeout=timeout).items():
        _result(fut, f"create topic {name}", timeout, ok_codes=("TOPIC_ALREADY_EXISTS",) if exist_ok else ())
    parts = [TopicPartition(t.topic, p) for t in topics for p in range(max(1, t.num_partitions))]
    _check_served(wait_for_leaders(admin, parts, timeout), len(parts), timeout)


def _check_served(waiting: list[TopicPartition], of: int, timeout: float) -> None:
    if waiting:
        raise KafkaOperationError(
            f"{len(waiting)} of {of} partitions created or grown are still not served by their leader after "
            f"{timeout:.0f}s (first: {waiting[0].topic}[{waiting[0].partition}]); nothing is written to them "
            f"before they are (records written while a partition comes online can be lost)", "NOT_SERVED")


def wait_for_leaders(admin: AdminClient, partitions: list[TopicPartition], timeout: float = 60.0,
                     interval: float = 0.2) -> list[TopicPartition]:
    """Wait until each partition's leader serves it (answers a ListOffsets request). Returns the partitions
    still not served at ``timeout``; a partition that answers with another error (one the writers will report
    themselves, such as a missing ACL) is not waited for.

    Not only so that the writers' first requests do not fail by the thousand: a producer that writes to a
    partition while its leader brings it online can lose records it was told were written. Its first request
    fails (the partition is not served yet); the next one, sent before that answer came back, lands, and the
    broker, which has no state for the producer on an empty partition, takes it whatever its sequence number;
    the retried first request no longer fits the sequence, and the idempotent producer reports its records as
    written although they are not. Brokers without the fix of KAFKA-15591 do this: with 4.1.1 and librdkafka
    2.x here, a test writing 150 records/s from the moment its topic was created lost its first 2 or 3 records
    in two runs of three."""
    deadline = time.monotonic() + timeout
    pending = list(partitions)
    while pending:
        futs = admin.list_offsets({tp: OffsetSpec.latest() for tp in pending},
                                  request_timeout=max(1.0, min(10.0, deadline - time.monotonic())))
        waiting = []
        for tp, fut in futs.items():
            try:
                fut.result()
            except KafkaException as exc:
                if exc.args[0].name() in _NOT_SERVED_YET:
                    waiting.append(tp)
        pending = sorted(waiting, key=lambda tp: (tp.topic, tp.partition))
        if not pending or time.monotonic() + interval > deadline:
            break
        time.sleep(interval)
        # librdkafka answers ListOffsets from its metadata cache, which keeps a topic this client asked for
        # before it existed as missing: ask the brokers for the pending topics again (DescribeTopics updates the
        # cache and, unlike a metadata request of the client's own, never asks a broker to auto-create a topic)
        topics = sorted({tp.topic for tp in pending})
        wait = max(1.0, min(10.0, deadline - time.monotonic()))
        for fut in admin.describe_topics(TopicCollection(topics), request_timeout=wait).values():
            try:
                fut.result()
            except KafkaException:
                pass  # the next ListOffsets round says what is wrong
    return pending


def _result(fut: Any, what: str, timeout: float, ok_codes: tuple[str, ...] = ()) -> None:
    try:
        fut.result(timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if err.name() in ok_codes:
            return
        raise KafkaOperationError(f"{what} failed: {err.str()}", err.name()) from None


def _failure(fut: Any, kind: ActionKind, topic: str, what: str, timeout: float, ok_codes: tuple[str, ...] = ()
             ) -> ActionFailure | None:
    """The failure of one admin request's future, None when it succeeded (or failed with one of ``ok_codes``)."""
    try:
        fut.result(timeout)
    except FutureTimeout:
        return ActionFailure(kind, topic, f"{what} failed: no answer within {timeout:.0f}s", "_TIMED_OUT")
    except KafkaException as exc:
        err = exc.args[0]
        if err.name() in ok_codes:
            return None
        return ActionFailure(kind, topic, f"{what} failed: {err.str()}", err.name())
    return None


def _not_served(topic: str, partitions: list[int], of: int, timeout: float) -> str:
    return (f"{len(partitions)} of the {of} partitions of {topic} (first: {partitions[0]}) are still not served by "
            f"their leader after {timeout:.0f}s; nothing is written to them before they are (records written while a "
            f"partition comes online can be lost)")
