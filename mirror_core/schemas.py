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
  unless forced; set on the destination subject before any version is
  registered, and only when it differs. Forcing applies to the mirror's own
  subjects; referenced subjects always get their source level.
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
from typing import Any, Literal, Protocol

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
)

log = logging.getLogger(__name__)

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
               references: Sequence[SchemaReference] = (), normalize: bool = False) -> RegisteredSchema | None: ...

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

    def plan_mirror(self, mirror_name: str, pairs: Sequence[SubjectPair]) -> tuple[list[SchemaStep], str | None]:
        steps: list[SchemaStep] = []
        try:
            for p in pairs:
                self._subject(p.source_subject, p.destination_subject, mirror_name, self.force, steps, ())
        except _Stop as stop:
            steps.append(SchemaStep(mirror_name, stop.subject, "conflict", stop.message))
            return steps, stop.message
        except RegistryError as exc:
            return steps, str(exc)
        return steps, None

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

        current = self.dst.subject_compatibility(d_subj)
        if (current or "").upper() != level:
            out.append(SchemaStep(mirror, d_subj, "set_compatibility",
                                  f"compatibility {current or 'not set'} -> {level}", source_subject=s_subj,
                                  level=level))
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
    return SchemaPlan(steps, errors)


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
    try:
        for step in steps:
            outcome = planner.outcomes.get((step.source_subject or "", step.subject))
            try:
                if step.action == "set_compatibility":
                    assert step.level is not None
                    dst.set_compatibility(step.subject, step.level)
                    applied.append(step)
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


class SchemaResolver:
    """The partition writer's resolver: source schema id -> destination id (``resolver(id)``) and source
    GUID -> destination GUID (``resolver.guid(guid)``), registering on a miss.

    The id's subject is found on the source (soft-deleted versions included: a record written before
    its subject was soft-deleted still decodes there; preferring the topic's own ``-key`` / ``-value``
    subjects, mapped to the destination topic's; other subjects keep their names), its references are
    registered first, and the schema is registered on the destination under the registry's own
    compatibility rules.

    A "not found" answer is asked again ``not_found_retries`` times with exponential back-off from
    ``not_found_backoff`` seconds (a registry replica may lag behind the one the producer registered
    with) before the id is called unknown: then ``__call__`` returns None (the record is
    dead-lettered) and the id stays unknown for :data:`UNKNOWN_TTL` seconds.

    A registry that cannot be reached (connection failures, timeouts, 5xx, an open circuit breaker) is
    waited for, up to ``outage_deadline`` seconds per id, asking again every few seconds; then
    RegistryError says which registry and for how long. Such a record waits, and fails the batch at
    worst: it is never dead-lettered for an outage. Other registry failures raise RegistryError at once.
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
        self._lock = threading.Lock()

    # -- ids

    def __call__(self, source_id: int) -> int | None:
        with self._lock:
            if source_id in self._ids:
                return self._ids[source_id]
            if self._still_unknown(self._unknown_ids, source_id):
                return None
            return self._through_outages(source_id)

    def _through_outages(self, source_id: int) -> int | None:
        """:meth:`_resolve`, waiting out an unreachable registry up to ``outage_deadline`` seconds."""
        deadline = self._clock() + self.outage_deadline
        waited = False
        while True:
            try:
                got = self._resolve(source_id)
                if waited:
                    log.warning("schema id %d resolved after a registry outage", source_id)
                return got
            except RegistryError as exc:
                if not (exc.transient or isinstance(exc, RegistryUnavailableError)):
                    raise
                now = self._clock()
                if now >= deadline:
                    raise RegistryError(
                        f"schema id {source_id}: the schema registry stayed unavailable for "
                        f"{self.outage_deadline:g}s (outage_deadline): {exc}", subject=exc.subject) from None
                if not waited:
                    log.warning("schema id %d: registry unavailable (%s); waiting up to %gs", source_id,
                                exc.reason, self.outage_deadline)
                waited = True
                self._sleep(min(OUTAGE_POLL, max(0.0, deadline - now)))

    def _resolve(self, source_id: int) -> int | None:
        """Find the id's subject on the source, register it on the destination; None when unknown."""
        uses = self._patiently(lambda: self.src.subject_versions_for_id(source_id, deleted=True))
        if not uses:
            self._unknown_ids[source_id] = self._clock()
            log.warning("schema id %d is unknown to the source registry %s (asked %d times)", source_id,
                        self.src.url, self.retries + 1)
            return None
        subject, version = next(((su, v) for su, v in uses if su in self.own), uses[0])
        content = self._source_content(subject, version, source_id)
        got = self._register(content, self.own.get(subject, subject), subject).schema_id
        self._ids[source_id] = got
        return got

    # -- GUIDs

    def guid(self, source_guid: bytes) -> bytes | None:
        """Source schema GUID (16 bytes) -> the destination's GUID of the same schema, registered under
        the mapped subject on a miss; None when it cannot be resolved (the record is dead-lettered): the
        source does not know the GUID (after the not-found retries) or has no GUID API, no source
        subject uses the schema, or the destination reports no GUIDs (Apicurio: ids only)."""
        with self._lock:
            if source_guid in self._guids:
                return self._guids[source_guid]
            if self._still_unknown(self._unknown_guids, source_guid):
                return None
            text = str(uuid.UUID(bytes=bytes(source_guid)))
            got = self._resolve_guid(text)
            if got is None:
                self._unknown_guids[source_guid] = self._clock()
                return None
            self._guids[source_guid] = got
            return got

    def _resolve_guid(self, text: str) -> bytes | None:
        schema = self._patiently(lambda: self.src.schema_by_guid(text))
        if schema is None:
            log.warning("schema GUID %s is unknown to the source registry %s (or it has no GUID API)", text,
                        self.src.url)
            return None
        subject = self._source_subject_of(schema, text)
        if subject is None:
            log.warning("no subject on the source registry %s uses schema GUID %s", self.src.url, text)
            return None
        dst_subject = self.own.get(subject, subject)
        registered = self._register(schema, dst_subject, subject)
        dst_guid = registered.guid or self.dst.version(dst_subject, registered.version).guid
        if dst_guid is None:
            log.warning("destination registry %s reports no schema GUIDs: records framed with GUID %s cannot be "
                        "mirrored (registered as %s version %d, id %d)", self.dst.url, text, dst_subject,
                        registered.version, registered.schema_id)
            return None
        return uuid.UUID(dst_guid).bytes

    def _source_subject_of(self, schema: Schema, guid_text: str) -> str | None:
        """The source subject holding this schema: the topic's own subjects first, else any subject
        using one of the GUID's ids (soft-deleted versions included)."""
        for subject in sorted(self.own, key=lambda su: not su.endswith("-value")):
            if self.src.lookup(subject, schema.schema_str, schema.schema_type, schema.references) is not None:
                return subject
        for schema_id in self.src.ids_for_guid(guid_text):
            uses = self.src.subject_versions_for_id(schema_id, deleted=True)
            if uses:
                return next((su for su, _ in uses if su in self.own), uses[0][0])
        return None

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

    def _register(self, schema: Schema, dst_subject: str, src_subject: str, depth: int = 0) -> RegisteredSchema:
        if depth > 32:
            raise SchemaMirrorError("schema references nested too deep (circular?)", subject=src_subject)
        refs = [SchemaReference(r.name, r.subject,
                                self._register(self.src.version(r.subject, r.version).schema, r.subject, r.subject,
                                               depth + 1).version)
                for r in schema.references]
        new_id = self.dst.register(dst_subject, schema.schema_str, schema.schema_type, refs)
        found = self.dst.lookup(dst_subject, schema.schema_str, schema.schema_type, refs)
        if found is None:
            raise SchemaMirrorError(f"registered id {new_id} but cannot find it again", subject=dst_subject)
        return found


def make_id_resolver(
    src: Registry | SchemaRegistryConfig,
    dst: Registry | SchemaRegistryConfig,
    source_topic: str,
    destination_topic: str,
    **options: Any,
) -> SchemaResolver:
    """A :class:`SchemaResolver` (``options``: ``not_found_retries``, ``not_found_backoff``, ``sleep``)."""
    return SchemaResolver(src, dst, source_topic, destination_topic, **options)
