"""Small in-memory fakes of mirrorflow's own interfaces, for tests that run without clusters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from mirror_core import stops
from mirror_core.registry import RegisteredSchema, RegistryError, Schema, SchemaReference
from mirror_core.schemas import canonical_schema


class FakeBoard:
    """An in-memory :class:`mirror_core.stops.Board`: one per destination cluster alias, kept across calls as the
    topic would be. ``down`` makes it answer like a cluster that does not."""

    def __init__(self) -> None:
        self.stops: dict[str, str] = {}
        self.down = False
        self.writes = 0

    def read(self) -> dict[str, str]:
        if self.down:
            raise stops.StopSignalError("cannot read the failover stops from topic mirrorflow-stops.internal on b: "
                                        "Local: All broker connections are down")
        return dict(self.stops)

    def put(self, key: str, reason: str | None) -> None:
        if self.down:
            raise stops.StopSignalError("cannot write to topic mirrorflow-stops.internal on a: Local: Broker "
                                        "transport failure")
        self.writes += 1
        if reason is None:
            self.stops.pop(key, None)
        else:
            self.stops[key] = reason

    def close(self) -> None:
        pass


def fake_boards(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeBoard]:
    """The clusters' stops topics, by alias (``stops.board`` answers with these)."""
    by_alias: dict[str, FakeBoard] = {}
    monkeypatch.setattr(stops, "board", lambda cfg, group: by_alias.setdefault(group.destination, FakeBoard()))
    return by_alias


@dataclass
class FakeRegistry:
    """In-memory :class:`mirror_core.schemas.Registry` with Confluent semantics: global ids by content, a
    subject never holds the same schema twice (among its live versions), 40401-style "not found" as
    None/[], soft-deleted versions hidden unless asked for and still readable by id. Every write is
    recorded, so tests can check what happened and in which order."""

    url: str = "http://fake"
    honours_import: bool = False
    global_level: str = "BACKWARD"
    subjects_: dict[str, list[RegisteredSchema]] = field(default_factory=dict)
    levels: dict[str, str] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)
    writes: list[tuple] = field(default_factory=list)
    deleted: set[tuple[str, int]] = field(default_factory=set)  # soft-deleted (subject, version)
    _ids: dict[tuple, int] = field(default_factory=dict)
    next_id: int = 100

    def _content(self, schema_type: str, schema_str: str, refs: Sequence[SchemaReference]) -> tuple:
        return (schema_type, canonical_schema(schema_type, schema_str), tuple(refs))

    def _live(self, subject: str, deleted: bool = False) -> list[RegisteredSchema]:
        return [v for v in self.subjects_.get(subject, []) if deleted or (subject, v.version) not in self.deleted]

    # the interface
    def versions(self, subject: str) -> list[int]:
        return [v.version for v in self._live(subject)]

    def version(self, subject: str, version: int | str = "latest") -> RegisteredSchema:
        vs = self._live(subject)
        for v in vs:
            if v.version == version:
                return v
        if version == "latest" and vs:
            return vs[-1]
        raise RegistryError("not found", subject=subject, http_status=404, error_code=40402)

    def register(self, subject: str, schema_str: str, schema_type: str = "AVRO",
                 references: Sequence[SchemaReference] = (), normalize: bool = False, *,
                 schema_id: int | None = None, version: int | None = None) -> int:
        for r in references:
            self.version(r.subject, r.version)  # a reference must exist
        existing = self.lookup(subject, schema_str, schema_type, references)
        if existing is not None:
            return existing.schema_id
        self.writes.append(("register", subject, schema_str, tuple(references)))
        content = self._content(schema_type, schema_str, references)
        if content not in self._ids:
            honour = schema_id is not None and self.honours_import and self.modes.get(subject) == "IMPORT"
            self._ids[content] = schema_id if honour else self._new_id()
        vs = self.subjects_.setdefault(subject, [])
        new_version = (vs[-1].version + 1) if vs else 1
        vs.append(RegisteredSchema(subject, new_version, self._ids[content], schema_type, schema_str,
                                   tuple(references)))
        return self._ids[content]

    def lookup(self, subject: str, schema_str: str, schema_type: str = "AVRO",
               references: Sequence[SchemaReference] = (), normalize: bool = False, *,
               deleted: bool = False) -> RegisteredSchema | None:
        want = self._content(schema_type, schema_str, references)
        for v in self._live(subject, deleted):
            if self._content(v.schema_type, v.schema_str, v.references) == want:
                return v
        return None

    def delete_version(self, subject: str, version: int) -> None:
        self.writes.append(("delete_version", subject, version))
        self.deleted.add((subject, version))

    def subject_versions_for_id(self, schema_id: int, deleted: bool = False) -> list[tuple[str, int]]:
        return [(s, v.version) for s in self.subjects_ for v in self._live(s, deleted) if v.schema_id == schema_id]

    def schema_by_guid(self, guid: str) -> Schema | None:
        return None  # like Apicurio: no GUID API

    def ids_for_guid(self, guid: str) -> list[int]:
        return []

    def schema_by_id(self, schema_id: int) -> Schema:
        for vs in self.subjects_.values():
            for v in vs:
                if v.schema_id == schema_id:
                    return v.schema
        raise RegistryError("not found", http_status=404, error_code=40403)

    def subject_compatibility(self, subject: str) -> str | None:
        return self.levels.get(subject)

    def global_compatibility(self) -> str:
        return self.global_level

    def set_compatibility(self, subject: str | None, level: str) -> None:
        self.writes.append(("set_compatibility", subject, level))
        if subject is None:
            self.global_level = level
        else:
            self.levels[subject] = level

    def mode(self, subject: str | None = None) -> str:
        return self.modes.get(subject or "", "READWRITE")

    def set_mode(self, mode: str, subject: str | None = None, force: bool = False) -> None:
        self.modes[subject or ""] = mode

    def probe_id_preservation(self) -> bool:
        return self.honours_import

    # test helpers
    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def add(self, subject: str, *schemas: str, refs: Sequence[SchemaReference] = ()) -> list[int]:
        return [self.register(subject, s, "AVRO", refs) for s in schemas]

    def registrations(self) -> list[tuple]:
        return [w for w in self.writes if w[0] == "register"]

    def live_schemas(self, subject: str) -> list[str]:
        """The canonical text of the subject's live versions, in order."""
        return [canonical_schema(v.schema_type, v.schema_str) for v in self._live(subject)]


@dataclass
class RefusingRegistry(FakeRegistry):
    """A FakeRegistry that refuses to register the schema text ``refuse``, answering HTTP ``status`` (error
    code ``status * 100 + 1``), as a registry refuses an incompatible (409) or invalid (422) schema, or a
    principal without the right (401 / 403)."""

    refuse: str = ""
    status: int = 422

    def register(self, subject: str, schema_str: str, schema_type: str = "AVRO",
                 references: Sequence[SchemaReference] = (), normalize: bool = False, *,
                 schema_id: int | None = None, version: int | None = None) -> int:
        if schema_str == self.refuse:
            raise RegistryError(f"schema registry {self.url}: POST /subjects/{subject}/versions failed: refused",
                                subject=subject, http_status=self.status, error_code=self.status * 100 + 1)
        return super().register(subject, schema_str, schema_type, references, normalize, schema_id=schema_id,
                                version=version)
