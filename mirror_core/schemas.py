"""Schema subject mirroring: which subjects, what to do with them, and doing it.

:func:`subject_pairs` maps a mirrored topic's subjects (``TopicNameStrategy``:
``<topic>-key`` / ``<topic>-value``) to the destination topic's.
:func:`plan_subjects` reads both registries and decides, without writing;
:func:`apply_subjects` plans and carries the plan out, mirror by mirror.

Rules (the invariants this module keeps):

- strict: the destination subject is an exact copy of the source (same schemas,
  same order). A destination that is a prefix of the source is completed;
  anything else is a conflict naming the first differing version.
- lenient: the destination versions that also exist in the source, in
  destination order, must be a prefix of the source's versions; the rest of the
  source is registered in source order and extra destination versions are
  allowed. When the destination's compatibility is NONE, out-of-order
  destinations are accepted and whatever is missing is simply registered.
- Compatibility: the source subject's level, else the source's global level,
  unless forced; set on the destination subject only when it differs. Missing
  versions are copied with the destination subject at NONE (the source took
  each under the level it had then, maybe looser than today's or a forced one),
  and the level is set after the last one (also when the copy stops half-way).
  Forcing applies to the mirror's own subjects; referenced subjects always get
  their source level.
- References are mirrored first, recursively, keeping their subject names (the
  whole referenced subject, under the same mode); versions in the references
  are translated to the destination's version numbers.
- Schemas are compared by content, not bytes: registries normalise the text
  (Apicurio stores compact JSON with reordered keys). Ids differ per registry,
  so ids never take part in comparisons; ``id_map`` records source id ->
  destination id for every mirrored version, including referenced ones.
- A conflict or registry failure stops that mirror only; errors are returned
  as ``(mirror_name, message)`` data, never raised. Applying twice is harmless:
  the second run registers nothing and returns the same ``id_map``.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar

from mirror_core.config import SchemaRegistryConfig
from mirror_core.errors import SchemaMirrorError
from mirror_core.registry import (
    RegisteredSchema,
    RegistryClient,
    RegistryError,
    RegistryUnavailableError,
    Schema,
    SchemaReference,
    is_not_found,
    is_outage,
)
from mirror_core.wire import SCHEMA_REGISTRATION_REFUSED, WireError

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: Serde name (YAML) -> registry schema type, for the serdes whose payloads carry a schema id.
SCHEMA_SERDES = {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}

Mode = Literal["strict", "lenient"]
Action = Literal["set_compatibility", "register", "unchanged", "conflict", "missing_source"]

ID_PRESERVATION_UNSUPPORTED = (
    "destination schema registry {url} does not preserve schema ids in IMPORT mode (it assigns its own ids), "
    "so id-preserving mirroring is impossible there; turn off schemas.id_preserving and use in-flight "
    "schema-id rewriting instead"
)


class Registry(Protocol):
    """What mirroring needs from a registry (:class:`~mirror_core.registry.RegistryClient` has it)."""

    @property
    def url(self) -> str: ...

    def versions(self, subject: str) -> list[int]: ...

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema: ...

    def register(self, subject: str, schema_str: str, schema_type: str = "AVRO",
                 references: Sequence[SchemaReference] = (), normalize: bool = False, *,
                 schema_id: int | None = None, version: int | None = None) -> int: ...

    def lookup(self, subject: str, schema_str: str, schema_type: str = "AVRO",
               references: Sequence[SchemaReference] = (), normalize: bool = False, *,
               deleted: bool = False) -> RegisteredSchema | None: ...

    def delete_version(self, subject: str, version: int) -> None: ...

    def subject_versions_for_id(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]: ...

    def schema_by_id(self, schema_id: int) -> Schema: ...

    def schema_by_guid(self, guid: str) -> Schema | None: ...

    def ids_for_guid(self, guid: str) -> list[int]: ...

    def subject_compatibility(self, subject: str) -> str | None: ...

    def global_compatibility(self) -> str: ...

    def set_compatibility(self, subject: str | None, level: str) -> None: ...

    def mode(self, subject: str | None = None) -> str: ...

    def set_mode(self, mode: str, subject: str | None = None, force: bool = False) -> None: ...

    def probe_id_preservation(self) -> bool: ...


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class SubjectPair:
    """A source subject and the destination subject it is mirrored to, for one mirror."""

    source_subject: str
    destination_subject: str
    mirror_name: str


@dataclass(frozen=True)
class SchemaStep:
    """One decision about a destination subject. ``subject`` is the destination subject.

    register / unchanged steps name the source version they are about;
    ``destination_version`` is predicted for a planned registration and actual
    once applied. ``level`` is the compatibility level a set_compatibility step sets.
    """

    mirror_name: str
    subject: str
    action: Action
    detail: str
    source_subject: str | None = None
    source_version: int | None = None
    source_id: int | None = None
    destination_version: int | None = None
    destination_id: int | None = None
    level: str | None = None


@dataclass(frozen=True)
class SchemaPlan:
    steps: list[SchemaStep]
    errors: list[tuple[str, str]]  # (mirror_name, message)
    #: one line per registry that could not be reached or could not serve while planning (connection refused, a
    #: timeout, 5xx): its mirrors are in ``errors`` too, but the plan is incomplete for a runtime reason
    outages: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SchemaResult:
    steps_applied: list[SchemaStep]
    id_map: dict[int, int]  # source schema id -> destination schema id
    errors: list[tuple[str, str]]  # (mirror_name, message)


def subject_pairs(
    source_topic: str, destination_topic: str, mirror_name: str, key_serde: str, value_serde: str
) -> list[SubjectPair]:
    """The TopicNameStrategy subjects of a topic mirror, for the sides whose serde carries a schema."""
    return [
        SubjectPair(f"{source_topic}-{side}", f"{destination_topic}-{side}", mirror_name)
        for side, serde in (("key", key_serde), ("value", value_serde))
        if serde in SCHEMA_SERDES
    ]


# --------------------------------------------------------------------------- comparing schemas

_AVRO_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_PROTO_COMMENT_RE = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_PROTO_PUNCT_RE = re.compile(r"\s*([{}()\[\]<>=;,])\s*")


def _avro_normal(node: Any) -> Any:
    if isinstance(node, list):
        return [_avro_normal(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k == "default" else _avro_normal(v)) for k, v in node.items()}
    if set(out) == {"type"} and out["type"] in _AVRO_PRIMITIVES:
        return out["type"]  # {"type": "string"} is "string"
    return out


def canonical_schema(schema_type: str, schema_str: str) -> str:
    """A normal form for comparing schema text across registries.

    Avro and JSON Schema: parsed JSON with sorted keys, compact (Avro also folds
    ``{"type": "string"}`` into ``"string"``). Protobuf: comments dropped and
    whitespace normalised. Text that does not parse is compared as is.
    """
    kind = schema_type.upper()
    if kind in ("AVRO", "JSON"):
        try:
            obj = json.loads(schema_str)
        except ValueError:
            return schema_str.strip()
        if kind == "AVRO":
            obj = _avro_normal(obj)
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))
    text = _PROTO_COMMENT_RE.sub(" ", schema_str)
    text = _PROTO_PUNCT_RE.sub(r"\1", text)
    return " ".join(text.split())


_Key = tuple[str, str, tuple[tuple[str, str, int], ...]]


def _key(schema_type: str, schema_str: str, refs: Iterable[SchemaReference]) -> _Key:
    return (schema_type.upper(), canonical_schema(schema_type, schema_str),
            tuple(sorted((r.name, r.subject, r.version) for r in refs)))


def _difference(dst: _Key, src: _Key) -> str:
    if dst[0] != src[0]:
        return f"schema type {dst[0]} vs {src[0]}"
    if dst[1] != src[1]:
        a, b = dst[1], src[1]
        i = next((n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        start = max(0, i - 40)

        def window(s: str) -> str:
            return ("..." if start else "") + s[start:i + 60] + ("..." if len(s) > i + 60 else "")

        return f"destination has {window(a)!r} where source has {window(b)!r}"
    return f"references {list(dst[2])} vs {list(src[2])}"


# --------------------------------------------------------------------------- planning


class _Stop(Exception):
    """A subject cannot be mirrored; stops the current mirror."""

    def __init__(self, subject: str, message: str):
        self.subject = subject
        self.message = message
        super().__init__(message)


@dataclass
class _Outcome:
    """What was decided for one (source subject, destination subject), shared across mirrors."""

    version_map: dict[int, int] = field(default_factory=dict)  # source version -> destination version
    error: str | None = None


class _Planner:
    """Reads both registries and decides per subject; caches what it read for the apply phase."""

    def __init__(self, src: Registry, dst: Registry, mode: Mode, force_compatibility: str | None):
        if mode not in ("strict", "lenient"):
            raise SchemaMirrorError(f"unknown subject mirror mode {mode!r} (strict | lenient)")
        self.src, self.dst, self.mode = src, dst, mode
        self.force = force_compatibility.upper() if force_compatibility else None
        self.sources: dict[tuple[str, int], RegisteredSchema] = {}
        self.outcomes: dict[tuple[str, str], _Outcome] = {}
        self._src_global: str | None = None
        #: registry URL (or the message, for an error not tied to one) -> the first outage seen there
        self.outages: dict[str, str] = {}

    def plan_mirror(self, mirror_name: str, pairs: Sequence[SubjectPair]) -> tuple[list[SchemaStep], str | None]:
        steps: list[SchemaStep] = []
        try:
            for p in pairs:
                steps += self.plan_pair(p)
        except _Stop as stop:
            steps.append(SchemaStep(mirror_name, stop.subject, "conflict", stop.message))
            return steps, stop.message
        except RegistryError as exc:
            if is_outage(exc):
                self.outages.setdefault(exc.url or str(exc), str(exc))
            return steps, str(exc)
        return steps, None

    def plan_pair(self, pair: SubjectPair) -> list[SchemaStep]:
        """The steps of one pair (its referenced subjects first). Raises _Stop or RegistryError."""
        steps: list[SchemaStep] = []
        self._subject(pair.source_subject, pair.destination_subject, pair.mirror_name, self.force, steps, ())
        return steps

    def source_level(self, subject: str) -> str:
        level = self.src.subject_compatibility(subject)
        if level:
            return level.upper()
        if self._src_global is None:
            self._src_global = self.src.global_compatibility().upper()
        return self._src_global

    def _subject(self, s_subj: str, d_subj: str, mirror: str, force: str | None, out: list[SchemaStep],
                 stack: tuple[str, ...], is_ref: bool = False) -> dict[int, int]:
        key = (s_subj, d_subj)
        done = self.outcomes.get(key)
        if done is not None:
            if done.error:
                raise _Stop(d_subj, done.error)
            return done.version_map
        if s_subj in stack:
            raise _Stop(d_subj, f"subject {s_subj!r}: circular schema references via {' -> '.join(stack)}")
        outcome = _Outcome()
        try:
            self._decide(s_subj, d_subj, mirror, force, out, stack, is_ref, outcome)
        except _Stop as stop:
            outcome.error = stop.message
            self.outcomes[key] = outcome
            raise
        self.outcomes[key] = outcome
        return outcome.version_map

    def _decide(self, s_subj: str, d_subj: str, mirror: str, force: str | None, out: list[SchemaStep],
                stack: tuple[str, ...], is_ref: bool, outcome: _Outcome) -> None:
        src_versions = [self._source(s_subj, v) for v in self.src.versions(s_subj)]
        if not src_versions:
            if is_ref:
                raise _Stop(d_subj, f"referenced subject {s_subj!r} has no versions on the source registry")
            out.append(SchemaStep(mirror, d_subj, "missing_source",
                                  f"source subject {s_subj!r} has no schemas yet", source_subject=s_subj))
            return

        # referenced subjects first, so their destination versions are known
        ref_maps: dict[str, dict[int, int]] = {}
        for sv in src_versions:
            for r in sv.references:
                if r.subject not in ref_maps:
                    ref_maps[r.subject] = self._subject(r.subject, r.subject, mirror, None, out,
                                                        (*stack, s_subj), is_ref=True)

        def translated(sv: RegisteredSchema) -> tuple[SchemaReference, ...]:
            try:
                return tuple(SchemaReference(r.name, r.subject, ref_maps[r.subject][r.version])
                             for r in sv.references)
            except KeyError as exc:
                raise _Stop(d_subj, f"subject {s_subj!r} version {sv.version} references a version that "
                                    f"is not mirrored: {exc}") from None

        src_keys = [_key(sv.schema_type, sv.schema_str, translated(sv)) for sv in src_versions]
        dst_versions = [self.dst.version(d_subj, v) for v in self.dst.versions(d_subj)]
        dst_keys = [_key(dv.schema_type, dv.schema_str, dv.references) for dv in dst_versions]
        level = force or self.source_level(s_subj)

        matched, to_register = self._match(d_subj, src_versions, src_keys, dst_versions, dst_keys, level)

        # the history is copied at NONE: the source accepted each version under the level it had then,
        # which may be looser than today's (or than a forced one); the wanted level is set afterwards
        current = (self.dst.subject_compatibility(d_subj) or "").upper() or None
        if to_register and current != "NONE":
            out.append(SchemaStep(mirror, d_subj, "set_compatibility",
                                  f"compatibility {current or 'not set'} -> NONE while source versions are copied",
                                  source_subject=s_subj, level="NONE"))
            current = "NONE"
        next_version = max((dv.version for dv in dst_versions), default=0) + 1
        for j, sv in enumerate(src_versions):
            if j in matched:
                dv = matched[j]
                outcome.version_map[sv.version] = dv.version
                out.append(SchemaStep(mirror, d_subj, "unchanged",
                                      f"source version {sv.version} is destination version {dv.version}",
                                      s_subj, sv.version, sv.schema_id, dv.version, dv.schema_id))
        for sv in to_register:
            outcome.version_map[sv.version] = next_version
            out.append(SchemaStep(mirror, d_subj, "register",
                                  f"source version {sv.version} (id {sv.schema_id}) as version {next_version}",
                                  s_subj, sv.version, sv.schema_id, next_version))
            next_version += 1
        if current != level:
            out.append(SchemaStep(mirror, d_subj, "set_compatibility", f"compatibility {current or 'not set'} -> {level}",
                                  source_subject=s_subj, level=level))

    def _match(self, d_subj: str, src: list[RegisteredSchema], src_keys: list[_Key],
               dst: list[RegisteredSchema], dst_keys: list[_Key], level: str
               ) -> tuple[dict[int, RegisteredSchema], list[RegisteredSchema]]:
        """Source index -> matching destination version, and the source versions to register (in order)."""
        if self.mode == "strict":
            for i, (dv, dk) in enumerate(zip(dst, dst_keys, strict=True)):
                if i >= len(src):
                    raise _Stop(d_subj, f"subject {d_subj!r}: destination version {dv.version} has no "
                                        f"counterpart: the source has only {len(src)} version(s) (strict mode)")
                if dk != src_keys[i]:
                    raise _Stop(d_subj, f"subject {d_subj!r}: destination version {dv.version} differs from "
                                        f"source version {src[i].version}: {_difference(dk, src_keys[i])} "
                                        f"(strict mode)")
            return {i: dst[i] for i in range(len(dst))}, src[len(dst):]

        found: list[tuple[int, RegisteredSchema]] = []
        for dv, dk in zip(dst, dst_keys, strict=True):
            j = next((j for j, sk in enumerate(src_keys) if sk == dk), None)
            if j is not None:
                found.append((j, dv))
        matched = {j: dv for j, dv in reversed(found)}
        if [j for j, _ in found] == list(range(len(found))):
            return matched, src[len(found):]
        if level == "NONE":
            return matched, [sv for j, sv in enumerate(src) if j not in matched]
        p = next(p for p, (j, _) in enumerate(found) if j != p)
        j, dv = found[p]
        raise _Stop(d_subj, f"subject {d_subj!r}: destination version {dv.version} holds source version "
                            f"{src[j].version} where source version {src[p].version} was expected; source "
                            f"versions must appear in the destination in source order (lenient mode, "
                            f"compatibility {level})")

    def _source(self, subject: str, version: int) -> RegisteredSchema:
        key = (subject, version)
        if key not in self.sources:
            self.sources[key] = self.src.version(subject, version)
        return self.sources[key]


def _by_mirror(pairs: Iterable[SubjectPair]) -> dict[str, list[SubjectPair]]:
    out: dict[str, list[SubjectPair]] = {}
    for p in pairs:
        out.setdefault(p.mirror_name, []).append(p)
    return out


def plan_subjects(
    src: Registry, dst: Registry, pairs: Iterable[SubjectPair], mode: Mode, force_compatibility: str | None
) -> SchemaPlan:
    """Decide what the destination needs for each pair (reads only). A mirror's conflict is in ``errors``."""
    planner = _Planner(src, dst, mode, force_compatibility)
    steps: list[SchemaStep] = []
    errors: list[tuple[str, str]] = []
    for mirror_name, mirror_pairs in _by_mirror(pairs).items():
        mirror_steps, err = planner.plan_mirror(mirror_name, mirror_pairs)
        steps += mirror_steps
        if err:
            errors.append((mirror_name, err))
    return SchemaPlan(steps, errors, list(planner.outages.values()))


# --------------------------------------------------------------------------- applying


def apply_subjects(
    src: Registry,
    dst: Registry,
    pairs: Iterable[SubjectPair],
    mode: Mode,
    force_compatibility: str | None,
    id_preserving: bool = False,
) -> SchemaResult:
    """Plan and apply, mirror by mirror; a failing mirror is reported and the others go on.

    With ``id_preserving``, versions are registered in IMPORT mode under their
    source ids; a destination that does not honour that is reported for every
    mirror before anything is written. Raises only if ``mode`` is unknown.
    """
    planner = _Planner(src, dst, mode, force_compatibility)
    applied: list[SchemaStep] = []
    id_map: dict[int, int] = {}
    errors: list[tuple[str, str]] = []
    by_mirror = _by_mirror(pairs)
    if id_preserving and by_mirror:
        try:
            supported = dst.probe_id_preservation()
        except RegistryError as exc:
            return SchemaResult([], {}, [(m, str(exc)) for m in by_mirror])
        if not supported:
            msg = ID_PRESERVATION_UNSUPPORTED.format(url=dst.url)
            return SchemaResult([], {}, [(m, msg) for m in by_mirror])
    for mirror_name, mirror_pairs in by_mirror.items():
        steps, err = planner.plan_mirror(mirror_name, mirror_pairs)
        if err:
            errors.append((mirror_name, err))
            continue
        try:
            _execute(planner, steps, id_preserving, applied, id_map)
        except _Stop as stop:
            errors.append((mirror_name, stop.message))
        except RegistryError as exc:
            errors.append((mirror_name, str(exc)))
    return SchemaResult(applied, id_map, errors)


def _execute(planner: _Planner, steps: list[SchemaStep], id_preserving: bool, applied: list[SchemaStep],
             id_map: dict[int, int]) -> None:
    dst = planner.dst
    imported: dict[str, str] = {}  # subject -> mode to restore
    wanted = {s.subject: s.level for s in steps if s.action == "set_compatibility"}  # the last one wins
    relaxed: dict[str, str] = {}  # subject -> the level to set should the copy stop before its last step
    try:
        for step in steps:
            outcome = planner.outcomes.get((step.source_subject or "", step.subject))
            try:
                if step.action == "set_compatibility":
                    assert step.level is not None
                    dst.set_compatibility(step.subject, step.level)
                    applied.append(step)
                    level = wanted[step.subject]
                    if step.level != level and level is not None:
                        relaxed[step.subject] = level
                    else:
                        relaxed.pop(step.subject, None)
                elif step.action == "unchanged" and step.source_id is not None:
                    assert step.destination_id is not None
                    if id_preserving and step.destination_id != step.source_id:
                        raise _Stop(step.subject, f"subject {step.subject!r}: destination version "
                                                  f"{step.destination_version} already has id {step.destination_id}, "
                                                  f"not the source id {step.source_id}: ids cannot be preserved")
                    id_map[step.source_id] = step.destination_id
                elif step.action == "register":
                    if id_preserving and step.subject not in imported:
                        imported[step.subject] = dst.mode(step.subject)
                        dst.set_mode("IMPORT", step.subject, force=True)
                    applied.append(_register(planner, step, id_preserving, id_map))
            except (_Stop, RegistryError) as exc:
                if outcome is not None:
                    outcome.error = str(exc)
                raise
    finally:
        for subject, previous in imported.items():
            try:
                dst.set_mode(previous, subject, force=True)
            except RegistryError as exc:
                log.warning("could not restore mode %s on %s: %s", previous, subject, exc)
        for subject, level in relaxed.items():
            try:
                dst.set_compatibility(subject, level)
            except RegistryError as exc:
                log.warning("%s stays at compatibility NONE after an incomplete copy (setting %s failed: %s); the "
                            "next provisioning sets it", subject, level, exc)


def _register(planner: _Planner, step: SchemaStep, id_preserving: bool, id_map: dict[int, int]) -> SchemaStep:
    assert step.source_subject is not None and step.source_version is not None
    sv = planner.sources[(step.source_subject, step.source_version)]
    refs = []
    for r in sv.references:
        ref_outcome = planner.outcomes.get((r.subject, r.subject))
        if ref_outcome is None or ref_outcome.error or r.version not in ref_outcome.version_map:
            raise _Stop(step.subject, f"subject {step.subject!r}: referenced subject {r.subject!r} version "
                                      f"{r.version} was not mirrored")
        refs.append(SchemaReference(r.name, r.subject, ref_outcome.version_map[r.version]))
    new_id = planner.dst.register(
        step.subject, sv.schema_str, sv.schema_type, refs,
        schema_id=sv.schema_id if id_preserving else None, version=sv.version if id_preserving else None,
    )
    if id_preserving and new_id != sv.schema_id:
        raise _Stop(step.subject, ID_PRESERVATION_UNSUPPORTED.format(url=planner.dst.url)
                    + f" (asked for id {sv.schema_id}, got {new_id})")
    found = planner.dst.lookup(step.subject, sv.schema_str, sv.schema_type, refs)
    version = found.version if found is not None else step.destination_version
    assert version is not None
    planner.outcomes.setdefault((step.source_subject, step.subject), _Outcome()).version_map[sv.version] = version
    id_map[sv.schema_id] = new_id
    log.info("registered %s version %s as %s version %s (id %s -> %s)", step.source_subject, sv.version,
             step.subject, version, sv.schema_id, new_id)
    return replace(step, destination_version=version, destination_id=new_id,
                   detail=f"source version {sv.version} (id {sv.schema_id}) as version {version} (id {new_id})")


# --------------------------------------------------------------------------- in-flight misses


#: how long an id the source registry does not know stays "unknown" (its records are dead-lettered
#: without asking again): a garbage id in a hot partition must not cost the retries on every record
UNKNOWN_TTL = 60.0
DEFAULT_NOT_FOUND_RETRIES = 4
DEFAULT_NOT_FOUND_BACKOFF = 0.5
#: seconds a schema id waits for an unreachable registry (SchemaRegistryConfig.outage_deadline)
DEFAULT_OUTAGE_DEADLINE = 300.0
#: how often a waiting id asks again
OUTAGE_POLL = 2.0


#: the registry answers that refuse one schema (409 incompatible, 422 invalid or not allowed): its records
#: are dead-lettered, and the others flow
REFUSED_STATUSES = frozenset({409, 422})
#: the answers that refuse the mirror's credentials: every new schema would fail alike, so the job stops
DENIED_STATUSES = frozenset({401, 403})
#: the mirror name on the steps the resolver plans (they are never reported)
IN_FLIGHT = "in-flight"


class SchemaResolver:
    """The partition writer's resolver: source schema id -> destination id (``resolver(id)``) and source
    GUID -> destination GUID (``resolver.guid(guid)``), registering on a miss.

    The id's subject is found on the source (soft-deleted versions included: a record written before
    its subject was soft-deleted still decodes there; preferring the topic's own ``-key`` / ``-value``
    subjects, mapped to the destination topic's; other subjects keep their names). Invariant: the
    destination subject keeps the source's order. So a miss registers every source version the
    destination lacks, up to the one needed, in source order (planned as lenient provisioning plans,
    referenced subjects first), under the destination's compatibility level as it is (provisioning
    copies history at NONE; a writer never changes a level). A soft-deleted source version is
    registered and then soft-deleted on the destination too: its id decodes there, and the subject's
    live versions stay the source's. A destination that already conflicts with the source gets only
    the needed schema (with a warning; provisioning reports the conflict).

    A "not found" answer is asked again ``not_found_retries`` times with exponential back-off from
    ``not_found_backoff`` seconds (a registry replica may lag behind the one the producer registered
    with) before the id is called unknown: then ``__call__`` returns None (the record is
    dead-lettered) and the id stays unknown for :data:`UNKNOWN_TTL` seconds.

    A registry that refuses a schema (:data:`REFUSED_STATUSES`) makes ``__call__`` return a
    ``schema_registration_refused`` :class:`~mirror_core.wire.WireError` naming the version, status and
    code: the record is dead-lettered (or fails the job, per ``on_error``), and the id is not asked
    about again for :data:`UNKNOWN_TTL` seconds. A registry that refuses the credentials
    (:data:`DENIED_STATUSES`) raises RegistryError naming the registry and the call.

    A registry that cannot be reached (connection failures, timeouts, 5xx, 429, an open circuit
    breaker) is waited for, up to ``outage_deadline`` seconds per id, asking again every few seconds;
    then RegistryError says which registry and for how long. Such a record waits, and fails the batch
    at worst: it is never dead-lettered for an outage. Other registry failures raise RegistryError at
    once. GUIDs are resolved the same way.
    """

    def __init__(self, src: Registry | SchemaRegistryConfig, dst: Registry | SchemaRegistryConfig,
                 source_topic: str, destination_topic: str, *, not_found_retries: int | None = None,
                 not_found_backoff: float | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, outage_deadline: float | None = None):
        if isinstance(src, SchemaRegistryConfig):
            not_found_retries = src.not_found_retries if not_found_retries is None else not_found_retries
            not_found_backoff = src.not_found_backoff if not_found_backoff is None else not_found_backoff
            outage_deadline = src.outage_deadline if outage_deadline is None else outage_deadline
        self.outage_deadline = DEFAULT_OUTAGE_DEADLINE if outage_deadline is None else outage_deadline
        self.src: Registry = RegistryClient.from_config(src) if isinstance(src, SchemaRegistryConfig) else src
        self.dst: Registry = RegistryClient.from_config(dst) if isinstance(dst, SchemaRegistryConfig) else dst
        self.retries = DEFAULT_NOT_FOUND_RETRIES if not_found_retries is None else not_found_retries
        self.backoff = DEFAULT_NOT_FOUND_BACKOFF if not_found_backoff is None else not_found_backoff
        self.own = {f"{source_topic}-{side}": f"{destination_topic}-{side}" for side in ("key", "value")}
        self._sleep, self._clock = sleep, clock
        self._ids: dict[int, int] = {}
        self._unknown_ids: dict[int, float] = {}  # id -> when it was found unknown
        self._guids: dict[bytes, bytes] = {}
        self._unknown_guids: dict[bytes, float] = {}
        self._refused_at: dict[int | bytes, float] = {}  # id or GUID -> when the destination refused it
        self._refusals: dict[int | bytes, WireError] = {}
        self._lock = threading.Lock()

    # -- ids

    def __call__(self, source_id: int) -> int | WireError | None:
        with self._lock:
            if source_id in self._ids:
                return self._ids[source_id]
            if self._still_unknown(self._unknown_ids, source_id):
                return None
            if self._still_unknown(self._refused_at, source_id):
                return self._refusals[source_id]
            return self._through_outages(f"schema id {source_id}", lambda: self._resolve(source_id))

    def _through_outages(self, what: str, resolve: Callable[[], _T]) -> _T:
        """``resolve()``, waiting out an unreachable registry up to ``outage_deadline`` seconds."""
        deadline = self._clock() + self.outage_deadline
        waited = False
        while True:
            try:
                got = resolve()
                if waited:
                    log.warning("%s resolved after a registry outage", what)
                return got
            except RegistryError as exc:
                if not (exc.transient or isinstance(exc, RegistryUnavailableError)):
                    raise
                now = self._clock()
                if now >= deadline:
                    raise RegistryError(
                        f"{what}: the schema registry stayed unavailable for "
                        f"{self.outage_deadline:g}s (outage_deadline): {exc}", subject=exc.subject) from None
                if not waited:
                    log.warning("%s: registry unavailable (%s); waiting up to %gs", what, exc.reason,
                                self.outage_deadline)
                waited = True
                self._sleep(min(OUTAGE_POLL, max(0.0, deadline - now)))

    def _resolve(self, source_id: int) -> int | WireError | None:
        """Find the id's subject on the source, mirror it to the destination; None when unknown."""
        uses = self._patiently(lambda: self.src.subject_versions_for_id(source_id, deleted=True))
        if not uses:
            self._unknown_ids[source_id] = self._clock()
            log.warning("schema id %d is unknown to the source registry %s (asked %d times)", source_id,
                        self.src.url, self.retries + 1)
            return None
        subject = next((su for su, _ in uses if su in self.own), uses[0][0])
        got = self._unless_refused(source_id, f"schema id {source_id}", lambda: self._mirror(
            subject, [v for su, v in uses if su == subject], source_id))
        if isinstance(got, WireError):
            return got
        self._ids[source_id] = got.schema_id
        return got.schema_id

    # -- GUIDs

    def guid(self, source_guid: bytes) -> bytes | WireError | None:
        """Source schema GUID (16 bytes) -> the destination's GUID of the same schema, mirrored like an id
        on a miss; None when it cannot be resolved (the record is dead-lettered): the source does not
        know the GUID (after the not-found retries) or has no GUID API, no source subject uses the
        schema, or the destination reports no GUIDs (Apicurio: ids only). A refusal is a WireError."""
        with self._lock:
            if source_guid in self._guids:
                return self._guids[source_guid]
            if self._still_unknown(self._unknown_guids, source_guid):
                return None
            if self._still_unknown(self._refused_at, source_guid):
                return self._refusals[source_guid]
            text = str(uuid.UUID(bytes=bytes(source_guid)))
            got = self._through_outages(f"schema GUID {text}", lambda: self._resolve_guid(source_guid, text))
            if got is None:
                self._unknown_guids[source_guid] = self._clock()
            elif isinstance(got, bytes):
                self._guids[source_guid] = got
            return got

    def _resolve_guid(self, source_guid: bytes, text: str) -> bytes | WireError | None:
        schema = self._patiently(lambda: self.src.schema_by_guid(text))
        if schema is None:
            log.warning("schema GUID %s is unknown to the source registry %s (or it has no GUID API)", text,
                        self.src.url)
            return None
        use = self._source_use_of(schema, text)
        if use is None:
            log.warning("no subject on the source registry %s uses schema GUID %s", self.src.url, text)
            return None
        subject, version, source_id = use
        registered = self._unless_refused(source_guid, f"schema GUID {text}",
                                          lambda: self._mirror(subject, [version], source_id))
        if isinstance(registered, WireError):
            return registered
        dst_subject = self.own.get(subject, subject)
        dst_guid = registered.guid
        if dst_guid is None:
            try:
                dst_guid = self.dst.version(dst_subject, registered.version).guid
            except RegistryError as exc:
                if not is_not_found(exc):  # a version soft-deleted as it is on the source
                    raise
        if dst_guid is None:
            log.warning("destination registry %s reports no schema GUIDs: records framed with GUID %s cannot be "
                        "mirrored (registered as %s version %d, id %d)", self.dst.url, text, dst_subject,
                        registered.version, registered.schema_id)
            return None
        return uuid.UUID(dst_guid).bytes

    def _source_use_of(self, schema: Schema, guid_text: str) -> tuple[str, int, int] | None:
        """(subject, version, id) of this schema on the source: the topic's own subjects first, else any
        subject using one of the GUID's ids (soft-deleted versions included)."""
        for subject in sorted(self.own, key=lambda su: not su.endswith("-value")):
            found = self.src.lookup(subject, schema.schema_str, schema.schema_type, schema.references)
            if found is not None:
                return subject, found.version, found.schema_id
        for schema_id in self.src.ids_for_guid(guid_text):
            uses = self.src.subject_versions_for_id(schema_id, deleted=True)
            if uses:
                subject, version = next(((su, v) for su, v in uses if su in self.own), uses[0])
                return subject, version, schema_id
        return None

    # -- mirroring one version

    def _unless_refused(self, key: int | bytes, what: str, mirror: Callable[[], RegisteredSchema]
                        ) -> RegisteredSchema | WireError:
        """``mirror()``, or the WireError its refusal by a registry becomes (remembered for UNKNOWN_TTL)."""
        try:
            return mirror()
        except RegistryError as exc:
            if exc.transient or isinstance(exc, RegistryUnavailableError):
                raise
            if exc.http_status in DENIED_STATUSES:
                raise RegistryError(
                    f"{what}: {exc.reason}: the registry refused the mirror's credentials (HTTP {exc.http_status}); "
                    f"check its basic.auth.user.info and what that principal may do: every record with a schema "
                    f"not mirrored yet fails the same way", subject=exc.subject, http_status=exc.http_status,
                    error_code=exc.error_code) from None
            if exc.http_status not in REFUSED_STATUSES:
                raise
            refusal = WireError(SCHEMA_REGISTRATION_REFUSED, f"{what}: {exc}")
            self._refused_at[key], self._refusals[key] = self._clock(), refusal
            log.warning("%s: %s; its records are dead-lettered (asked again after %gs)", what, exc, UNKNOWN_TTL)
            return refusal

    def _mirror(self, subject: str, versions: list[int], source_id: int) -> RegisteredSchema:
        """The destination's version of ``subject`` version (one of ``versions``, a live one first), with
        the source versions before it: see the class notes."""
        d_subj = self.own.get(subject, subject)
        live = self.src.versions(subject)
        version = next((v for v in versions if v in live), None)
        if version is not None:
            return self._with_history(subject, d_subj, version)
        version = versions[0]
        before = [v for v in live if v < version]
        if before:
            self._with_history(subject, d_subj, before[-1])
        return self._soft_deleted(self._source_content(subject, version, source_id), subject, d_subj, version)

    def _with_history(self, s_subj: str, d_subj: str, version: int) -> RegisteredSchema:
        """Register the source versions of ``s_subj`` up to ``version`` that ``d_subj`` lacks, in order."""
        planner = _Planner(self.src, self.dst, "lenient", None)
        try:
            steps = planner.plan_pair(SubjectPair(s_subj, d_subj, IN_FLIGHT))
        except _Stop as stop:
            log.warning("%s: %s; registering only the version records need (provisioning reports the conflict)",
                        d_subj, stop.message)
            return self._register(self.src.version(s_subj, version).schema, d_subj, s_subj)
        for step in steps:
            if step.action != "register" or (
                    (step.source_subject, step.subject) == (s_subj, d_subj) and (step.source_version or 0) > version):
                continue
            try:
                _execute(planner, [step], False, [], {})
            except RegistryError as exc:
                raise _in_context(exc, f"registering {step.source_subject} version {step.source_version} as "
                                       f"{step.subject}") from None
            except _Stop as stop:
                raise SchemaMirrorError(stop.message, subject=stop.subject) from None
        dv = planner.outcomes[(s_subj, d_subj)].version_map.get(version)
        if dv is None:
            raise SchemaMirrorError(f"source version {version} of {s_subj} was not mirrored", subject=d_subj)
        return self.dst.version(d_subj, dv)

    def _soft_deleted(self, schema: Schema, s_subj: str, d_subj: str, version: int) -> RegisteredSchema:
        """A version soft-deleted on the source: registered, then soft-deleted, on the destination (unless
        the destination subject holds it already, live or soft-deleted)."""
        refs = self._dst_refs(schema, s_subj, 0)
        for deleted in (False, True):
            found = self.dst.lookup(d_subj, schema.schema_str, schema.schema_type, refs, deleted=deleted)
            if found is not None:
                return found
        try:
            registered = self._register(schema, d_subj, s_subj)
        except RegistryError as exc:
            raise _in_context(exc, f"registering {s_subj} version {version} (soft-deleted) as {d_subj}") from None
        try:
            self.dst.delete_version(d_subj, registered.version)
        except RegistryError as exc:
            log.warning("%s version %d (source %s version %d, soft-deleted there) stays live: %s", d_subj,
                        registered.version, s_subj, version, exc)
        else:
            log.info("registered %s version %d (soft-deleted) as %s version %d, then soft-deleted it", s_subj,
                     version, d_subj, registered.version)
        return registered

    # -- helpers

    def _still_unknown(self, unknown: dict[Any, float], key: Any) -> bool:
        since = unknown.get(key)
        if since is None:
            return False
        if self._clock() - since < UNKNOWN_TTL:
            return True
        del unknown[key]
        return False

    def _patiently(self, ask: Callable[[], Any]) -> Any:
        """``ask()`` until it returns something truthy, at most 1 + retries times, backing off."""
        for attempt in range(self.retries + 1):
            got = ask()
            if got:
                return got
            if attempt < self.retries:
                self._sleep(self.backoff * 2 ** attempt)
        return None

    def _source_content(self, subject: str, version: int, source_id: int) -> Schema:
        """The schema of ``subject`` ``version`` (id ``source_id``); a soft-deleted version is read by id."""
        try:
            return self.src.version(subject, version).schema
        except RegistryError as exc:
            if not is_not_found(exc):
                raise
        return self.src.schema_by_id(source_id)

    def _dst_refs(self, schema: Schema, src_subject: str, depth: int) -> list[SchemaReference]:
        """``schema``'s references with destination versions, registering the referenced schemas."""
        if depth > 32:
            raise SchemaMirrorError("schema references nested too deep (circular?)", subject=src_subject)
        return [SchemaReference(r.name, r.subject,
                                self._register(self.src.version(r.subject, r.version).schema, r.subject, r.subject,
                                               depth + 1).version)
                for r in schema.references]

    def _register(self, schema: Schema, dst_subject: str, src_subject: str, depth: int = 0) -> RegisteredSchema:
        """Register ``schema`` under ``dst_subject`` as it is (no history): where the history cannot be kept."""
        refs = self._dst_refs(schema, src_subject, depth)
        new_id = self.dst.register(dst_subject, schema.schema_str, schema.schema_type, refs)
        found = self.dst.lookup(dst_subject, schema.schema_str, schema.schema_type, refs)
        if found is None:
            raise SchemaMirrorError(f"registered id {new_id} but cannot find it again", subject=dst_subject)
        return found


def _in_context(exc: RegistryError, context: str) -> RegistryError:
    """``exc`` (same class, status, code and transience) with ``context`` before its message."""
    return type(exc)(f"{context}: {exc.reason}", subject=exc.subject, http_status=exc.http_status,
                     error_code=exc.error_code, transient=exc.transient, reason=exc.reason,
                     retry_after=exc.retry_after)


def make_id_resolver(
    src: Registry | SchemaRegistryConfig,
    dst: Registry | SchemaRegistryConfig,
    source_topic: str,
    destination_topic: str,
    **options: Any,
) -> SchemaResolver:
    """A :class:`SchemaResolver` (``options``: ``not_found_retries``, ``not_found_backoff``, ``sleep``)."""
    return SchemaResolver(src, dst, source_topic, destination_topic, **options)
