"""MirrorMaker 2 dedicated-mode ``mm2.properties`` -> mirrorflow groups (one per enabled ``A->B`` flow).

What maps (MM2 name -> mirrorflow):
- ``clusters``, ``<alias>.bootstrap.servers`` and client settings -> ``clusters.<alias>.kafka``
  (librdkafka names; secrets become ``${ENV}`` placeholders); ``<alias>.consumer.*`` tuning ->
  ``spark.source_options`` of the groups reading from that cluster;
- ``A->B.enabled`` -> a group ``A-to-B``; ``A->B.<setting>`` overrides the file-wide setting;
- ``topics`` / ``topics.exclude`` -> the group's regex flow; ``groups`` / ``groups.exclude`` ->
  ``offsets.groups`` (MM2's defaults are written out when unset);
- ``replication.policy.class`` (+ ``.separator``) -> ``replication_policy`` (MM2's default is the prefix
  policy ``<alias>.<topic>``, mirrorflow's is identity, so it is always written);
- sync / emit settings, ``replication.factor``, ``offset-syncs.topic.location``,
  ``exactly.once.source.support`` -> their counterparts (see :data:`CONNECTOR_KEYS`); EOS also as
  ``<target>.exactly.once.source.support``, the way the Kafka docs enable it.

Checkpoints land in ``<source-alias>.checkpoints.internal`` on the target, the topic MM2 used with the
default separator (another ``replication.policy.separator`` changed MM2's name: reported).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import javaproperties

from mirror_core.config import ALIAS_RE
from mirror_core.importers import common
from mirror_core.importers.draft import Draft, Path
from mirror_core.importers.javaclient import ClientMapping, holds_private_key, is_secret, safe_text, shown, translate

_FLOW_RE = re.compile(r"^([^.\s]+?)->([^.\s]+?)\.(.+)$")
_ROLE_RE = re.compile(r"^(consumer|producer|admin)\.(.+)$")

DEFAULT_POLICY = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
IDENTITY_POLICY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"
#: class names that keep topic names: Kafka's, and the one Strimzi shipped before Kafka had it
IDENTITY_POLICIES = (IDENTITY_POLICY, "IdentityReplicationPolicy", "io.strimzi.kafka.connect.mirror.IdentityReplicationPolicy")

#: a Connect worker setting: MM2's worker for ``A->B`` reads it file-wide or as ``B.exactly.once.source.support``
#: (the target cluster's settings, as the Kafka docs write it); ``A->B.`` per flow wins over both
EOS = "exactly.once.source.support"

#: Connector settings this importer reads (file-wide or per flow); everything else becomes a finding.
CONNECTOR_KEYS = frozenset({
    "enabled", "topics", "topics.exclude", "topics.blacklist", "groups", "groups.exclude", "groups.blacklist",
    "replication.policy.class", "replication.policy.separator", "sync.topic.configs.enabled",
    "sync.topic.acls.enabled", "sync.group.offsets.enabled", "sync.group.offsets.interval.seconds",
    "emit.checkpoints.enabled", "emit.checkpoints.interval.seconds", "emit.heartbeats.enabled",
    "emit.heartbeats.interval.seconds", "replication.factor", "offset-syncs.topic.location",
    "exactly.once.source.support", "config.properties.exclude", "config.properties.blacklist",
})

#: Connector settings with no mirrorflow equivalent, and why.
NO_EQUIVALENT = {
    "tasks.max": "parallelism follows the host: spark.direct_processes writer processes, one per core by default, on the direct read path; a Spark task per source partition on Spark's",
    "refresh.topics.enabled": "a regex flow picks up new topics at every trigger",
    "refresh.topics.interval.seconds": "a regex flow picks up new topics at every trigger",
    "refresh.groups.enabled": "consumer groups are listed at every checkpoint round",
    "refresh.groups.interval.seconds": "consumer groups are listed at every checkpoint round",
    "sync.topic.configs.interval.seconds": "topic configs are synced when the group is provisioned",
    "sync.topic.acls.interval.seconds": "ACLs are synced when the group is provisioned",
    "offset.lag.max": "mirrorflow's offset syncs translate exactly; there is no lag allowance",
    "heartbeats.topic.replication.factor": "mirrorflow creates its internal topics itself",
    "checkpoints.topic.replication.factor": "mirrorflow creates its internal topics itself",
    "offset-syncs.topic.replication.factor": "mirrorflow creates its internal topics itself",
    "topic.filter.class": "use topics include/exclude regexes",
    "group.filter.class": "use offsets.groups include/exclude regexes",
    "config.property.filter.class": "use topics_mirroring.config_exclude regexes",
    "replication.policy.internal.topic.separator.enabled": "mirrorflow names its internal topics itself",
    "emit.offset-syncs.enabled": "mirrorflow always writes offset syncs (exact translation needs them)",
    "admin.timeout.ms": "mirrorflow's admin calls have their own timeouts",
    "consumer.poll.timeout.ms": "Spark's source polls with its own timeouts",
}


@dataclass
class Setting:
    value: str
    where: str  # the input key, or "line N"


@dataclass
class FlowSettings:
    """The connector settings of one flow: per-flow values over file-wide ones."""

    values: dict[str, Setting] = field(default_factory=dict)

    def get(self, key: str) -> Setting | None:
        return self.values.get(key)


def parse_properties(draft: Draft, text: str) -> dict[str, Setting]:
    """``key -> Setting`` with the line each key is on (the last one wins, as in Java)."""
    out: dict[str, Setting] = {}
    line = 1
    try:
        for entry in javaproperties.parse(text):
            if isinstance(entry, javaproperties.KeyValue):
                key = entry.key.strip()
                if not key:
                    raise draft.error(f"line {line}", "a value with no key")
                out[key] = Setting(entry.value, key)
            line += entry.source.count("\n")
    except javaproperties.InvalidUEscapeError as exc:
        before = text[: text.find(exc.escape)] if exc.escape in text else ""
        raise draft.error(f"line {before.count(chr(10)) + 1}", f"invalid \\u escape {exc.escape!r}") from None
    return out


def import_mm2(text: str, source: str) -> Draft:
    draft = Draft(source)
    props = parse_properties(draft, text)
    consumed: set[str] = set()

    clusters_setting = props.get("clusters")
    if clusters_setting is None:
        raise draft.error("clusters", "missing: name the cluster aliases (clusters = A, B)")
    aliases = common.regex_list(clusters_setting.value)
    consumed.add("clusters")
    if not aliases:
        raise draft.error("clusters", "lists no cluster alias")
    for a in aliases:
        if not re.match(ALIAS_RE, a):
            raise draft.error("clusters", f"alias {a!r} cannot be used: mirrorflow aliases are letters, digits, '_' and '-'")
    if len(set(aliases)) != len(aliases):
        raise draft.error("clusters", "lists an alias twice")

    # flows first, so that a flow naming an undefined cluster is reported as such
    flows: dict[tuple[str, str], dict[str, Setting]] = {}
    for key, s in props.items():
        m = _FLOW_RE.match(key)
        if m:
            src, dst, rest = m.groups()
            for side in (src, dst):
                if side not in aliases:
                    raise draft.error(key, f"flow names undefined cluster {side!r} (clusters = {', '.join(aliases)})")
            if src == dst:
                raise draft.error(key, "a flow from a cluster to itself")
            flows.setdefault((src, dst), {})[rest] = Setting(s.value, key)
            consumed.add(key)

    top_client = {k: s.value for k, s in props.items() if _is_client_key(k)}
    consumer_opts: dict[str, dict[str, str]] = {}
    worker_eos: dict[str, Setting] = {}  # alias -> its <alias>.exactly.once.source.support
    for alias in aliases:
        own = {k[len(alias) + 1:]: s for k, s in props.items() if k.startswith(alias + ".") and not _FLOW_RE.match(k)}
        consumed.update(f"{alias}.{k}" for k in own)
        if "bootstrap.servers" not in own:
            raise draft.error(f"{alias}.bootstrap.servers", f"missing: cluster {alias!r} has no bootstrap servers")
        if not own["bootstrap.servers"].value.strip():
            raise draft.error(f"{alias}.bootstrap.servers", "is empty")
        if EOS in own:
            worker_eos[alias] = own[EOS]
        plain = {k: s.value for k, s in own.items()
                 if not _ROLE_RE.match(k) and not common.CONNECT_WORKER_RE.match(k) and k != EOS}
        inherited = {k: v for k, v in top_client.items() if k not in plain}
        cm = translate(plain | inherited, alias, f"{alias}.")
        common.put_cluster(draft, alias, cm)
        common.report(draft, cm, ("clusters", alias))
        for k, s in sorted(own.items()):
            if common.CONNECT_WORKER_RE.match(k):
                draft.unmapped(s.where, "Kafka Connect worker setting: mirrorflow runs no Connect worker", ("clusters", alias))
                continue
            role = _ROLE_RE.match(k)
            if role:
                consumer_opts.setdefault(alias, {}).update(
                    role_setting(draft, alias, role.group(1), role.group(2), s, cm))
        consumer_opts.setdefault(alias, {}).update(cm.source_options)
    consumed.update(top_client)

    file_wide = {k: s for k, s in props.items() if k not in consumed}
    groups: list[dict[str, Any]] = []
    draft.tree["groups"] = groups
    for (src, dst) in sorted(flows):
        flow = flows[(src, dst)]
        settings = {k: s for k, s in file_wide.items() if k in CONNECTOR_KEYS or k in NO_EQUIVALENT}
        if dst in worker_eos:  # the flow's worker takes its target cluster's settings
            settings[EOS] = worker_eos[dst]
        settings |= flow
        enabled = settings.get("enabled")
        if enabled is None or "enabled" not in flow:
            is_on = False
        else:
            is_on = common.parse_bool(draft, enabled.where, enabled.value)
        gi = len(groups)
        group = flow_group(draft, gi, src, dst, settings, consumer_opts.get(src, {}))
        group["enabled"] = is_on
        if "enabled" not in flow:
            draft.note(("groups", gi, "enabled"), f"{src}->{dst}.enabled is not set: MM2 runs no such flow by default")
        groups.append(order_group(group))
    if not groups:
        raise draft.error("clusters", "no flow: enable one with A->B.enabled = true")

    for key, s in sorted(file_wide.items()):
        if key in CONNECTOR_KEYS:
            continue
        if key in NO_EQUIVALENT:
            draft.unmapped(key, f"{shown(key, s.value)}: no equivalent ({NO_EQUIVALENT[key]})", ("groups",))
        elif common.CONNECT_WORKER_RE.match(key):
            draft.unmapped(key, "Kafka Connect worker setting: mirrorflow runs no Connect worker", ("groups",))
        else:
            draft.unmapped(key, f"{shown(key, s.value)}: not a MirrorMaker 2 setting mirrorflow maps", ("groups",))
    return draft


def _is_client_key(key: str) -> bool:
    """File-wide client settings MM2 applies to every cluster that does not set its own."""
    return key.startswith(("security.", "sasl.", "ssl.")) and not _FLOW_RE.match(key)


def role_setting(draft: Draft, alias: str, role: str, key: str, s: Setting, cluster: ClientMapping) -> dict[str, str]:
    """``A.consumer.X`` / ``A.producer.X`` / ``A.admin.X`` (``s``; ``key`` is ``X``): mirrorflow has one client config per cluster,
    and Spark's source options for its consumers."""
    single = translate({key: s.value}, alias, s.where.removesuffix(key))  # as the input spells it
    anchor: Path = ("clusters", alias)
    if role == "consumer" and single.source_options:
        return single.source_options
    if single.cluster and not single.secrets and role == "producer":
        for k, v in single.cluster.items():
            if cluster.cluster.get(k, v) != v:
                draft.unmapped(s.where, f"{shown(key, s.value)}: differs from the cluster-wide {k}; kept the cluster's", anchor)
            else:
                draft.tree["clusters"][alias]["kafka"].setdefault(k, v)
                draft.note(("clusters", alias, "kafka", k), f"from {s.where} (every client of {alias} uses it)")
        return {}
    if single.findings:
        common.report(draft, single, anchor)
        return {}
    what = "secret, not copied" if is_secret(key) or holds_private_key(s.value) else f"= {safe_text(s.value)}"
    draft.unmapped(s.where, f"{what}: mirrorflow has one client config per cluster; set it in clusters.{alias}.kafka "
                            "if every client should use it", anchor)
    return {}


def flow_group(draft: Draft, gi: int, src: str, dst: str, settings: dict[str, Setting],
               source_options: dict[str, str]) -> dict[str, Any]:
    """One mirrorflow group from a flow's MM2 connector ``settings`` (also used by the Strimzi importer)."""
    g: dict[str, Any] = {"name": f"{src}-to-{dst}", "source": src, "destination": dst}
    at: Path = ("groups", gi)

    def get(key: str, default: str | None = None) -> str | None:
        s = settings.get(key)
        return s.value if s is not None else default

    def where(key: str) -> str:
        s = settings.get(key)
        return s.where if s is not None else f"{key} (MM2's default)"

    def flag(key: str, default: bool) -> bool:
        s = settings.get(key)
        return default if s is None else common.parse_bool(draft, s.where, s.value)

    # replication policy
    policy = get("replication.policy.class", DEFAULT_POLICY) or DEFAULT_POLICY
    sep = get("replication.policy.separator")
    if policy in IDENTITY_POLICIES:
        g["replication_policy"] = "identity"
        if sep is not None:
            draft.note(at + ("replication_policy",), f"{where('replication.policy.separator')}: topic names are "
                       "kept; MM2 used the separator only in its internal topics' names (see offsets)")
    else:
        g["replication_policy"] = "prefix"
        if policy not in (DEFAULT_POLICY, "DefaultReplicationPolicy"):
            draft.unmapped(where("replication.policy.class"),
                           f"custom policy {policy}: no equivalent; used the prefix policy (write a Python class with "
                           "format_remote_topic / topic_source / upstream_topic and name it here)", at + ("replication_policy",))
        else:
            draft.note(at + ("replication_policy",), "MM2's DefaultReplicationPolicy: <source-alias><separator><topic>")
        if sep is not None and sep != ".":
            if not sep or not re.fullmatch(r"[A-Za-z0-9._-]+", sep):
                draft.unmapped(where("replication.policy.separator"),
                               f"separator {sep!r} cannot be part of a topic name; kept '.'", at + ("replication_policy",))
            else:
                g["replication_policy_separator"] = sep

    eos = (get("exactly.once.source.support", "disabled") or "").strip().lower()
    if eos not in ("enabled", "preparing", "disabled"):
        raise draft.error(where("exactly.once.source.support"), f"expected enabled, preparing or disabled, got {eos!r}")
    g["delivery"] = "exactly_once" if eos == "enabled" else "at_least_once"
    eos_at = settings.get(EOS)
    draft.note(at + ("delivery",), f"{eos_at.where if eos_at else EOS} = {eos}" + (
        "" if eos == "enabled" else " (MM2's default); mirrorflow can deliver exactly_once"))

    tm: dict[str, Any] = {"auto_create_topics": True, "partition_count": {"type": "mirror_source"}}
    rf = get("replication.factor", "2")
    rf_n = common.parse_int(draft, where("replication.factor"), rf or "2", minimum=-1)
    if rf_n in (0,):
        raise draft.error(where("replication.factor"), "must be -1 (broker default) or at least 1")
    if rf_n == -1:
        tm["replication_factor"] = {"type": "mirror_source"}
        draft.unmapped(where("replication.factor"), "-1 (the broker's default): no equivalent; used the source "
                       "topic's replication factor", at + ("topics_mirroring",))
    else:
        tm["replication_factor"] = {"type": "fix", "value": rf_n}
        if "replication.factor" not in settings:
            draft.note(at + ("topics_mirroring",), "replication_factor 2 is MM2's default replication.factor")
    tm["sync_configs"] = flag("sync.topic.configs.enabled", True)
    excl = get("config.properties.exclude", get("config.properties.blacklist"))
    if excl is not None:
        key = "config.properties.exclude" if "config.properties.exclude" in settings else "config.properties.blacklist"
        tm["config_exclude"] = [common.check_regex(draft, where(key), p) for p in common.regex_list(excl)]
        draft.note(at + ("topics_mirroring",), f"config_exclude from {where(key)}: added to MM2's default exclusions, "
                   "which mirrorflow always applies")
    tm["sync_acls"] = flag("sync.topic.acls.enabled", True)
    g["topics_mirroring"] = tm

    # offsets: checkpoints and group offset sync share one interval in mirrorflow
    emit = flag("emit.checkpoints.enabled", True)
    sync = flag("sync.group.offsets.enabled", False)
    ci = common.parse_int(draft, where("emit.checkpoints.interval.seconds"),
                          get("emit.checkpoints.interval.seconds", "60") or "60", minimum=1)
    si = common.parse_int(draft, where("sync.group.offsets.interval.seconds"),
                          get("sync.group.offsets.interval.seconds", "60") or "60", minimum=1)
    interval = min(ci, si) if sync else ci
    gex_key = "groups.exclude" if "groups.exclude" in settings else "groups.blacklist"
    gex = get(gex_key)
    ex_list = common.regex_list(gex) if gex is not None else list(common.MM2_GROUPS_EXCLUDE)
    g["offsets"] = {
        "sync_group_offsets": sync,
        "emit_checkpoints": emit,
        "groups": {
            "include": common.alternation(draft, where("groups"), _include_list(draft, settings, "groups", at + ("offsets",))),
            "exclude": common.alternation(draft, where(gex_key), ex_list + [common.OWN_GROUPS]),
        },
        "interval": common.seconds(interval),
    }
    if sync and ci != si:
        text = f"checkpoints every {ci}s and offset sync every {si}s: mirrorflow does both in one round; used {interval}s"
        if "sync.group.offsets.interval.seconds" in settings:
            draft.unmapped(where("sync.group.offsets.interval.seconds"), text, at + ("offsets", "interval"))
        else:
            draft.note(at + ("offsets", "interval"), text + " (MM2's default offset sync interval)")
    _checkpoints_topic(draft, at, src, dst, policy, sep, flag("replication.policy.internal.topic.separator.enabled", True),
                       where("replication.policy.separator"))

    g["heartbeats"] = {
        "enabled": flag("emit.heartbeats.enabled", True),
        "interval": common.seconds(common.parse_int(
            draft, where("emit.heartbeats.interval.seconds"), get("emit.heartbeats.interval.seconds", "1") or "1", minimum=1)),
    }

    loc = (get("offset-syncs.topic.location", "source") or "").strip().lower()
    if loc not in ("source", "target"):
        raise draft.error(where("offset-syncs.topic.location"), f"expected source or target, got {loc!r}")
    if loc == "source":
        text = (f"mirrorflow writes offset syncs on the destination (mirrorflow-offset-syncs.{src}.internal), in the "
                "same transaction as the records")
        if "offset-syncs.topic.location" in settings:
            draft.unmapped(where("offset-syncs.topic.location"), f"source: {text}", at + ("delivery",))
        else:
            draft.note(at + ("delivery",), f"MM2 kept offset syncs on the source by default; {text}")
    if source_options:
        g["spark"] = {"source_options": dict(sorted(source_options.items()))}
        draft.note(at + ("spark",), f"consumer settings of {src} (Spark's Kafka source is the consumer)")

    t_inc = _include_list(draft, settings, "topics", at + ("mirrors",))
    tex_key = "topics.exclude" if "topics.exclude" in settings else "topics.blacklist"
    tex = get(tex_key)
    t_ex = common.regex_list(tex) if tex is not None else list(common.MM2_TOPICS_EXCLUDE)
    topics: dict[str, str] = {"include": common.alternation(draft, where("topics"), t_inc)}
    if t_ex:
        topics["exclude"] = common.alternation(draft, where(tex_key), t_ex)
    g["mirrors"] = [{"topics": topics}]
    if tex is None:
        draft.note(at + ("mirrors",), "topics exclude is MM2's default topics.exclude")

    for key, s in sorted(settings.items()):
        if key in NO_EQUIVALENT and s.where != key:  # per-flow ones; file-wide ones are reported once
            draft.unmapped(s.where, f"{shown(key, s.value)}: no equivalent ({NO_EQUIVALENT[key]})", at)
        elif key not in CONNECTOR_KEYS and key not in NO_EQUIVALENT:
            draft.unmapped(s.where, f"{shown(key, s.value)}: not a MirrorMaker 2 setting mirrorflow maps", at)
    return g


def _checkpoints_topic(draft: Draft, at: Path, src: str, dst: str, policy: str, sep: str | None,
                       internal_sep: bool, sep_where: str) -> None:
    """Where checkpoints go. mirrorflow writes ``<src>.checkpoints.internal``; MM2's Default (and Identity)
    policy wrote ``<src><sep>checkpoints<sep>internal``, so with another separator the consumers of
    checkpoints (RemoteClusterUtils.translateOffsets, failover tools) must read a new topic."""
    ours = f"{src}.checkpoints.internal"
    known = policy in IDENTITY_POLICIES or policy in (DEFAULT_POLICY, "DefaultReplicationPolicy")
    theirs = f"{src}{sep}checkpoints{sep}internal" if known and sep and internal_sep else ours
    if theirs == ours:
        draft.note(at + ("offsets",), f"checkpoints go to {ours} on {dst}, as MM2's did; "
                   "groups.exclude also skips mirrorflow's own groups")
    else:
        draft.unmapped(sep_where, f"MM2 wrote checkpoints to {theirs} on {dst}; mirrorflow writes them to {ours}: "
                       "point what reads checkpoints (translateOffsets, failover tooling) at the new topic",
                       at + ("offsets",))


def _include_list(draft: Draft, settings: dict[str, Setting], key: str, anchor: Path) -> list[str]:
    """``topics`` / ``groups``: unset means every name, but a blank list means none (MirrorUtils compiles
    no pattern for it and MM2's default filters then match nothing), so it must not become '.*'."""
    s = settings.get(key)
    if s is None:
        return [".*"]
    items = common.regex_list(s.value)
    if items:
        return items
    what = "no topic was mirrored" if key == "topics" else "no consumer group was checkpointed"
    draft.note(anchor, f"{s.where} is blank: MM2 matched nothing ({what}), so the include matches nothing")
    return [common.MATCH_NOTHING]


def connectors_off(draft: Draft, at: Path, group: dict[str, Any], off: dict[str, str]) -> None:
    """``off``: the connectors of a flow that ran nothing (class name -> why: not deployed, paused,
    stopped, disabled). The group keeps only what ran: no MirrorSourceConnector -> the group is
    disabled, no MirrorCheckpointConnector -> no checkpoints or group offset sync, no
    MirrorHeartbeatConnector -> no heartbeats."""
    if "MirrorSourceConnector" in off:
        group["enabled"] = False
        draft.note(at + ("enabled",), f"{off['MirrorSourceConnector']} (no topic was mirrored), so the group is disabled; "
                   "enable it to start mirroring")
    if "MirrorCheckpointConnector" in off:
        group["offsets"]["emit_checkpoints"] = False
        group["offsets"]["sync_group_offsets"] = False
        draft.note(at + ("offsets",), f"{off['MirrorCheckpointConnector']} (no checkpoints or group offset sync), "
                   "so both are off")
    if "MirrorHeartbeatConnector" in off:
        group["heartbeats"]["enabled"] = False
        draft.note(at + ("heartbeats",), f"{off['MirrorHeartbeatConnector']} (no heartbeats), so they are off")


_ORDER = ("name", "source", "destination", "enabled", "replication_policy", "replication_policy_separator",
          "delivery", "topics_mirroring", "offsets", "heartbeats", "spark", "mirrors")


def order_group(group: dict[str, Any]) -> dict[str, Any]:
    return {k: group[k] for k in _ORDER if k in group} | {k: v for k, v in group.items() if k not in _ORDER}
