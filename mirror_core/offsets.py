"""MirrorMaker 2 record formats and exact offset translation.

Wire formats (Kafka protocol types, big-endian, STRING = int16 length + UTF-8), byte-compatible with
MM2's ``OffsetSync``, ``Checkpoint`` and ``Heartbeat`` so MM2's client tools read what we write.

Offset-sync semantics — the invariant the writer keeps and the store relies on
-----------------------------------------------------------------------------
A sync ``(u, d)`` for a source partition is a *position* mapping: a consumer positioned at upstream
offset ``u`` (the next record it would read) must be positioned at downstream offset ``d``.
The writer emits syncs at every point where the upstream -> downstream map stops being linear (the
first and last record of every contiguous run of mirrored records, so around compaction gaps, aborted
transactions and control markers on either side) plus one at the end of each batch
(``u_end`` = next upstream offset to read, ``d_end`` = last downstream offset + 1). Hence, for two
consecutive retained syncs ``a``, ``b`` (``a.u < b.u``), one of these holds:

1. ``b.u - a.u == b.d - a.d`` and every position in between maps linearly (exact), or
2. no upstream record in ``(a.u, b.u)`` was mirrored and the downstream range ``(a.d, b.d)`` holds no
   committed record of ours, so every position ``U`` in between maps to ``b.d`` (never skips, never
   re-reads).

(If 2 holds with equal deltas, interpolation lands on transaction markers or aborted records, which a
read_committed consumer skips to ``b``'s record: still exact in what is consumed.)

A position above the newest sync means the group is ahead of what was mirrored: we answer the newest
sync's ``d`` flagged inexact (a consumer re-reads, never skips). A position older than the retained
history is reported untranslatable, never guessed. A sync whose ``u`` is not above the partition's
newest sync (an at-least-once replay after a restart, or a rewind) rewrites history from there.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from mirror_core.errors import MirrorError


class OffsetFormatError(MirrorError):
    """Bytes that are not a valid MM2 record of the expected kind."""


# --------------------------------------------------------------------------- Kafka protocol types


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


class _Reader:
    def __init__(self, data: bytes | None, what: str):
        if data is None:
            raise OffsetFormatError(f"{what}: missing bytes")
        self.data, self.pos, self.what = data, 0, what

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise OffsetFormatError(f"{self.what}: truncated at byte {self.pos} (needs {n} more)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        return int(struct.unpack(">h", self.take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack(">i", self.take(4))[0])

    def int64(self) -> int:
        return int(struct.unpack(">q", self.take(8))[0])

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise OffsetFormatError(f"{self.what}: null string")
        try:
            return self.take(n).decode()
        except UnicodeDecodeError as exc:
            raise OffsetFormatError(f"{self.what}: invalid UTF-8: {exc}") from None


@dataclass(frozen=True, order=True)
class OffsetSync:
    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int

    def key_bytes(self) -> bytes:
        return _str(self.topic) + struct.pack(">i", self.partition)

    def value_bytes(self) -> bytes:
        return struct.pack(">qq", self.upstream_offset, self.downstream_offset)

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> OffsetSync:
        k, v = _Reader(key, "offset sync key"), _Reader(value, "offset sync value")
        return cls(k.string(), k.int32(), v.int64(), v.int64())


@dataclass(frozen=True)
class Checkpoint:
    group: str
    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""
    VERSION = 0

    def key_bytes(self) -> bytes:
        return _str(self.group) + _str(self.topic) + struct.pack(">i", self.partition)

    def value_bytes(self) -> bytes:
        return struct.pack(">hqq", self.VERSION, self.upstream_offset, self.downstream_offset) + _str(self.metadata)

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Checkpoint:
        k, v = _Reader(key, "checkpoint key"), _Reader(value, "checkpoint value")
        group, topic, partition = k.string(), k.string(), k.int32()
        version = v.int16()
        if version != 0:
            raise OffsetFormatError(f"checkpoint value: unsupported version {version}")
        return cls(group, topic, partition, v.int64(), v.int64(), v.string())


@dataclass(frozen=True)
class Heartbeat:
    source_cluster_alias: str
    target_cluster_alias: str
    timestamp_ms: int
    VERSION = 0

    def key_bytes(self) -> bytes:
        return _str(self.source_cluster_alias) + _str(self.target_cluster_alias)

    def value_bytes(self) -> bytes:
        return struct.pack(">hq", self.VERSION, self.timestamp_ms)

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Heartbeat:
        k, v = _Reader(key, "heartbeat key"), _Reader(value, "heartbeat value")
        src, dst = k.string(), k.string()
        version = v.int16()
        if version != 0:
            raise OffsetFormatError(f"heartbeat value: unsupported version {version}")
        return cls(src, dst, v.int64())


# --------------------------------------------------------------------------- writer side


def syncs_for_batch(topic: str, partition: int, pairs: list[tuple[int, int]], upstream_end: int) -> list[OffsetSync]:
    """The syncs a writer emits for one committed chunk (see the module invariant).

    ``pairs`` are (upstream offset, downstream offset) of each mirrored record in order;
    ``upstream_end`` is the next upstream offset to read after the chunk.
    """
    # keep run starts and ends: drop the middle point of three collinear, consecutive records
    kept: list[tuple[int, int]] = []
    for pt in pairs:
        while len(kept) >= 2 and _collinear(kept[-2], kept[-1], pt):
            kept.pop()
        kept.append(pt)
    if pairs:
        # the batch end is kept apart from the last record: the next batch's first sync may share its
        # upstream position (and supersede it), and the last record's point must survive that
        last_u, last_d = pairs[-1]
        kept.append((max(upstream_end, last_u + 1), last_d + 1))
    return [OffsetSync(topic, partition, u, d) for u, d in kept]


def _collinear(a: tuple[int, int], b: tuple[int, int], c: tuple[int, int]) -> bool:
    return b[0] - a[0] == b[1] - a[1] and c[0] - b[0] == c[1] - b[1]


# --------------------------------------------------------------------------- translation


@dataclass(frozen=True)
class Translation:
    downstream_offset: int | None
    exact: bool
    reason: str


@dataclass
class _PartitionSyncs:
    us: list[int] = field(default_factory=list)
    ds: list[int] = field(default_factory=list)


class OffsetSyncStore:
    """Offset-sync history per source partition, and translation under the module invariant."""

    def __init__(self, max_per_partition: int | None = None):
        self._parts: dict[tuple[str, int], _PartitionSyncs] = {}
        self.max_per_partition = max_per_partition

    def add(self, sync: OffsetSync) -> None:
        ps = self._parts.setdefault((sync.topic, sync.partition), _PartitionSyncs())
        if ps.us and sync.upstream_offset <= ps.us[-1]:
            new_u = sync.upstream_offset
            cut = bisect.bisect_left(ps.us, new_u)
            keep: tuple[int, int] | None = None
            if 0 < cut < len(ps.us) and ps.us[cut - 1] < new_u - 1 and \
                    ps.us[cut] - ps.us[cut - 1] == ps.ds[cut] - ps.ds[cut - 1]:
                # the cut falls inside a linear run: keep the run up to just before the new history
                keep = (new_u - 1, ps.ds[cut - 1] + (new_u - 1 - ps.us[cut - 1]))
            del ps.us[cut:], ps.ds[cut:]
            if keep:
                ps.us.append(keep[0])
                ps.ds.append(keep[1])
        ps.us.append(sync.upstream_offset)
        ps.ds.append(sync.downstream_offset)
        if self.max_per_partition and len(ps.us) > self.max_per_partition:
            drop = len(ps.us) - self.max_per_partition
            del ps.us[:drop], ps.ds[:drop]

    def add_all(self, syncs: Iterable[OffsetSync]) -> None:
        for s in syncs:
            self.add(s)

    def latest(self, topic: str, partition: int) -> OffsetSync | None:
        ps = self._parts.get((topic, partition))
        if not ps or not ps.us:
            return None
        return OffsetSync(topic, partition, ps.us[-1], ps.ds[-1])

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self._parts)

    def translate(self, topic: str, partition: int, upstream_offset: int) -> Translation:
        ps = self._parts.get((topic, partition))
        if not ps or not ps.us:
            return Translation(None, False, "no offset syncs for this partition")
        us, ds = ps.us, ps.ds
        if upstream_offset < us[0]:
            return Translation(None, False, "older than retained offset-sync history")
        i = bisect.bisect_right(us, upstream_offset) - 1
        if us[i] == upstream_offset:
            return Translation(ds[i], True, "exact sync")
        if i == len(us) - 1:
            return Translation(ds[i], False, "ahead of mirror")
        du, dd = us[i + 1] - us[i], ds[i + 1] - ds[i]
        if du == dd:
            return Translation(ds[i] + (upstream_offset - us[i]), True, "interpolated within a run")
        return Translation(ds[i + 1], True, "in an upstream gap: next mirrored record")


def checkpoint_for(group: str, topic: str, partition: int, upstream_committed: int, translation: Translation,
                   previous: Checkpoint | None, source_rewound: bool = False) -> Checkpoint | None:
    """The checkpoint to emit, or None: never untranslatable, never backwards unless the group rewound."""
    if translation.downstream_offset is None:
        return None
    cp = Checkpoint(group, topic, partition, upstream_committed, translation.downstream_offset)
    if previous is not None:
        if (previous.upstream_offset, previous.downstream_offset) == (cp.upstream_offset, cp.downstream_offset):
            return None
        if cp.downstream_offset < previous.downstream_offset and not source_rewound:
            return None
    return cp
