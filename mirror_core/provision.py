"""Provisioning a group: topics (and configs, ACLs) plus schema subjects, planned then applied.

This module only wires: it reads both clusters, asks :mod:`topics` and
:mod:`schemas` for their plans, and applies them. The CLI and the Airflow
provision DAG call :func:`plan_group` and :func:`provision_group`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from mirror_core import clients
from mirror_core.config import GroupConfig, MirrorsConfig, ResolvedMirror, resolve_mirrors
from mirror_core.policy import group_topic_filter
from mirror_core.topics import TopicPlan, apply_topic_plan, plan_topics, read_state

log = logging.getLogger(__name__)

SCHEMA_SERDES = {"avro", "protobuf", "json_schema"}


@dataclass(frozen=True)
class GroupPlan:
    group: str
    topics: TopicPlan
    schemas: Any = None  # schemas.SchemaPlan when the group mirrors schema-framed data
    schema_pairs: tuple[Any, ...] = ()

    @property
    def has_errors(self) -> bool:
        return bool(self.topics.errors) or bool(self.schemas is not None and self.schemas.errors)

    @property
    def registry_outages(self) -> list[str]:
        """One line per schema registry that could not be reached or could not serve while planning (its URL
        without credentials in it): the plan is incomplete for a runtime reason, not a problem of the config."""
        return list(self.schemas.outages) if self.schemas is not None else []

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "group": self.group,
            "topics": [a.as_dict() for a in self.topics.actions],
            "skipped": [{"source_topic": t, "reason": r} for t, r in self.topics.skipped],
            "notes": list(self.topics.notes),
            "warnings": self.topics.warnings,
        }
        if self.schemas is not None:
            d["schemas"] = [s.__dict__ for s in self.schemas.steps]
            d["schema_errors"] = [list(e) if isinstance(e, tuple) else str(e) for e in self.schemas.errors]
        return d


@dataclass
class ProvisionResult:
    group: str
    done: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    id_map: dict[int, int] = field(default_factory=dict)
    #: destination topics a change failed for (the plan's errors too): topic -> why, for whoever must leave them out
    failed_topics: dict[str, str] = field(default_factory=dict)
    #: destination topics whose create or grow failed (or whose partitions were not served in time): nothing may
    #: write to them yet
    unusable: list[str] = field(default_factory=list)


def selected_mirrors(cfg: MirrorsConfig, group: GroupConfig) -> list[ResolvedMirror]:
    """Every concrete (source topic -> destination topic) mirror of the group, flows expanded."""
    # topic names are all the filter needs: no per-topic config reads here (this runs every checkpoint round)
    md = clients.admin(cfg.cluster(group.source)).list_topics(timeout=30)
    chosen, _ = group_topic_filter(cfg, group).select(sorted(t for t, info in md.topics.items() if info.error is None))
    return [c.mirror for c in chosen]


def plan_group(cfg: MirrorsConfig, group: GroupConfig) -> GroupPlan:
    """Read both clusters (and registries) and decide what provisioning would do; changes nothing."""
    src = cfg.cluster(group.source)
    dst = cfg.cluster(group.destination)
    want_acls = any(m.settings.topics_mirroring.sync_acls for m in resolve_mirrors(group))
    with clients.acting_on(group.source, src):
        src_state = read_state(clients.admin(src), with_acls=want_acls)
    with clients.acting_on(group.destination, dst):
        dst_state = read_state(clients.admin(dst), with_acls=want_acls)
    selector = group_topic_filter(cfg, group)
    topic_plan = plan_topics(group, src_state, dst_state, selector.policy, selector.mirrors, selector.dead_letters)
    mirrors = {c.mirror.name: c.mirror for c in selector.select(sorted(src_state.topics))[0]}
    schema_plan, pairs = _plan_schemas(cfg, group, topic_plan, mirrors)
    return GroupPlan(group.name, topic_plan, schema_plan, tuple(pairs))


def _schema_pairs(mirrors: dict[str, ResolvedMirror], topic_plan: TopicPlan) -> list[tuple[Any, Any]]:
    """(SubjectPair, the mirror's settings) for every schema-framed side of every planned topic."""
    from mirror_core import schemas

    out: list[tuple[Any, Any]] = []
    for a in topic_plan.actions:
        if a.source_topic is None or a.kind == "error" or a.mirror not in mirrors:
            continue
        settings = mirrors[a.mirror].settings
        out += [(p, settings) for p in schemas.subject_pairs(a.source_topic, a.topic, a.mirror,
                                                              settings.serdes.key, settings.serdes.value)]
    return out


def _by_rules(pairs: list[tuple[Any, Any]]) -> dict[tuple[Any, str | None], list[Any]]:
    """Pairs grouped by the schema rules of their mirror (mirror_mode, forced compatibility level)."""
    out: dict[tuple[Any, str | None], list[Any]] = {}
    for pair, st in pairs:
        out.setdefault((st.mirror_mode, st.force_subject_compatibility_level), []).append(pair)
    return out


def _registries(cfg: MirrorsConfig, group: GroupConfig) -> tuple[Any, Any]:
    from mirror_core.registry import RegistryClient

    src_reg = cfg.cluster(group.source).schema_registry
    dst_reg = cfg.cluster(group.destination).schema_registry
    assert src_reg and dst_reg  # config validation guarantees registries for schema serdes
    return RegistryClient.from_config(src_reg), RegistryClient.from_config(dst_reg)


def _plan_schemas(cfg: MirrorsConfig, group: GroupConfig, topic_plan: TopicPlan,
                  mirrors: dict[str, ResolvedMirror]) -> tuple[Any, list[tuple[Any, Any]]]:
    if not group.schemas.enabled:
        return None, []
    pairs = _schema_pairs(mirrors, topic_plan)
    if not pairs:
        return None, []
    from mirror_core import schemas

    src, dst = _registries(cfg, group)
    steps: list[Any] = []
    errors: list[Any] = []
    outages: list[str] = []
    for (mode, force), subset in _by_rules(pairs).items():
        part = schemas.plan_subjects(src, dst, subset, mode, force)
        steps += list(part.steps)
        errors += list(part.errors)
        outages += [o for o in part.outages if o not in outages]
    return schemas.SchemaPlan(steps, errors, outages), pairs


def provision_group(cfg: MirrorsConfig, group: GroupConfig, plan: GroupPlan | None = None) -> ProvisionResult:
    """Apply the group's plan: topics first, then schema subjects. Returns what was done and what failed; a
    topic that fails does not keep the others (or the schemas) from being provisioned."""
    plan = plan or plan_group(cfg, group)
    result = apply_topics(cfg, group, plan)
    schemas_done = apply_schemas(cfg, group, plan)
    result.done += schemas_done.done
    result.errors += schemas_done.errors
    result.id_map.update(schemas_done.id_map)
    return result


def apply_topics(cfg: MirrorsConfig, group: GroupConfig, plan: GroupPlan) -> ProvisionResult:
    """The topic part of a plan: create / grow topics, alter configs, create ACLs. Each topic on its own: what
    the destination refused is in ``errors`` (one line per failed change) beside what was ``done``."""
    result = ProvisionResult(group.name)
    for a in plan.topics.errors:
        result.errors.append(f"{a.mirror}: {a.topic}: {a.reason}")
        result.failed_topics[a.topic] = a.reason
    with clients.acting_on(group.destination, cfg.cluster(group.destination)):
        applied = apply_topic_plan(clients.admin(cfg.cluster(group.destination)), plan.topics)
    result.done += applied.done
    mirrors = {a.topic: a.mirror for a in plan.topics.actions}
    dst = cfg.cluster(group.destination)
    refused: dict[str, list[str]] = {}  # a refusal of the destination's principal -> the changes it refused
    for f in applied.failures:
        result.failed_topics.setdefault(f.topic, str(f))
        line = clients.refusal(group.destination, dst, f.code, f.code)  # the code alone: the same for each topic
        if line is None:
            result.errors.append(f"{mirrors.get(f.topic, group.name)}: {f}")
        else:
            refused.setdefault(line, []).append(f"{f.kind.replace('_', ' ')} {f.topic}")
    # one line for each refusal, not one per topic: a missing grant refuses every topic it covers alike
    result.errors += [f"{', '.join(changes)}: {line}" for line, changes in refused.items()]
    result.unusable = sorted({f.topic for f in applied.failures if f.kind in ("create", "grow")})
    return result


def apply_schemas(cfg: MirrorsConfig, group: GroupConfig, plan: GroupPlan) -> ProvisionResult:
    """The schema part of a plan: mirror the subjects (after the topics exist)."""
    result = ProvisionResult(group.name)
    if plan.schema_pairs:
        from mirror_core import schemas

        src, dst = _registries(cfg, group)
        for (mode, force), subset in _by_rules(list(plan.schema_pairs)).items():
            res = schemas.apply_subjects(src, dst, subset, mode, force, id_preserving=group.schemas.id_preserving)
            result.done += [f"{s.subject}: {s.action} {s.detail}".strip() for s in res.steps_applied]
            result.errors += [f"{m}: {msg}" for m, msg in res.errors]
            result.id_map.update(res.id_map)
    return result
