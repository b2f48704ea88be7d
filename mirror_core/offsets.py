"""MirrorMaker 2 record formats and exact offset translation.

Wire formats (Kafka protocol types, big-endian; STRING = int16 length + UTF-8), byte-compatible with
MM2's ``OffsetSync``, ``Checkpoint`` and ``Heartbeat`` (``connect-mirror`` / ``connect-mirror-client``)
so MM2's client tools (``RemoteClusterUtils.translateOffsets``, ``MirrorClient``) read what we write:

* OffsetSync  key ``topic STRING, partition INT32``; value ``upstreamOffset INT64, offset INT64``.
* Checkpoint  key ``group STRING, topic STRING, partition INT32``; value ``version INT16 (0),
  upstreamOffset INT64, offset INT64, metadata STRING``; topic ``<source-alias>.checkpoints.internal``
  on the destination, one partition (MM2's client reads partition 0 only).
* Heartbeat   key ``sourceClusterAlias STRING, targetClusterAlias STRING``; value ``version INT16 (0),
  timestamp INT64``.

The offset-sync invariant the writer keeps (:func:`syncs_for_batch`) and the translation relies on
(:class:`OffsetSyncStore`) is written down next to the store.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from mirror_core.errors import MirrorError


class OffsetFormatError(MirrorError):
    """Bytes that are not a valid MM2 record of the expected kind, or values that cannot be encoded."""


# --------------------------------------------------------------------------- Kafka protocol types

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")
_MAX_STRING = 2**15 - 1  # STRING length is an int16


def _str(s: str, what: str) -> bytes:
    b = s.encode()
    if len(b) > _MAX_STRING:
        raise OffsetFormatError(f"{what}: {len(b)} UTF-8 bytes, a Kafka STRING holds at most {_MAX_STRING}")
    return _INT16.pack(len(b)) + b


def _int(fmt: struct.Struct, value: int, what: str) -> bytes:
    try:
        return fmt.pack(value)
    except struct.error:
        raise OffsetFormatError(f"{what}: {value!r} does not fit in a {fmt.size * 8}-bit signed integer") from None


class _Reader:
    """Reads Kafka protocol types from one record key or value; every failure names the field."""

    def __init__(self, data: bytes | None, what: str):
        if data is None:
            raise OffsetFormatError(f"{what}: null (a {what} is never null)")
        self.data, self.pos, self.what = bytes(data), 0, what

    def _take(self, n: int, field_name: str) -> bytes:
        if self.pos + n > len(self.data):
            raise OffsetFormatError(
                f"{self.what}: truncated reading {field_name} at byte {self.pos} "
                f"(needs {n}, {len(self.data) - self.pos} left)")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def int16(self, name: str) -> int:
        return int(_INT16.unpack(self._take(2, name))[0])

    def int32(self, name: str) -> int:
        return int(_INT32.unpack(self._take(4, name))[0])

    def int64(self, name: str) -> int:
        return int(_INT64.unpack(self._take(8, name))[0])

    def string(self, name: str) -> str:
        n = self.int16(name)
        if n < 0:
            raise OffsetFormatError(f"{self.what}: {name} is a null STRING (length {n})")
        try:
            return self._take(n, name).decode()
        except UnicodeDecodeError as exc:
            raise OffsetFormatError(f"{self.what}: {name} is not valid UTF-8: {exc}") from None

    def version(self, supported: int) -> None:
        v = self.int16("version")
        if v != supported:
            raise OffsetFormatError(f"{self.what}: unsupported version {v} (expected {supported})")

    def done(self) -> None:
        if self.pos != len(self.data):
            raise OffsetFormatError(f"{self.what}: {len(self.data) - self.pos} unexpected trailing bytes")


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, order=True)
class OffsetSync:
    """A position mapping for one source partition: upstream ``upstream_offset`` -> downstream ``downstream_offset``.

    ``position_only``: the downstream offset is only where the writer resumes, not a translation (the
    invariant's case 4); carried by a header of the sync record, not by MM2's format (see
    :data:`mirror_core.positions.POSITION_ONLY_HEADER`)."""

    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    position_only: bool = False

    def key_bytes(self) -> bytes:
        return _str(self.topic, "offset sync topic") + _int(_INT32, self.partition, "offset sync partition")

    def value_bytes(self) -> bytes:
        return (_int(_INT64, self.upstream_offset, "offset sync upstreamOffset")
                + _int(_INT64, self.downstream_offset, "offset sync offset"))

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> OffsetSync:
        """Decode an offset-sync record; raises :class:`OffsetFormatError` on malformed bytes."""
        k, v = _Reader(key, "offset sync key"), _Reader(value, "offset sync value")
        topic, partition = k.string("topic"), k.int32("partition")
        upstream, downstream = v.int64("upstreamOffset"), v.int64("offset")
        k.done()
        v.done()
        return cls(topic, partition, upstream, downstream)


@dataclass(frozen=True)
class Checkpoint:
    """A consumer group's committed position on one partition, upstream and translated downstream.

    As in MM2, ``topic`` is the *destination* topic name: ``RemoteClusterUtils.translateOffsets``
    returns ``TopicPartition(topic, partition) -> downstream_offset`` for consumers on the destination.
    """

    group: str
    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""
    VERSION: ClassVar[int] = 0

    def key_bytes(self) -> bytes:
        return (_str(self.group, "checkpoint group") + _str(self.topic, "checkpoint topic")
                + _int(_INT32, self.partition, "checkpoint partition"))

    def value_bytes(self) -> bytes:
        return (_INT16.pack(self.VERSION)
                + _int(_INT64, self.upstream_offset, "checkpoint upstreamOffset")
                + _int(_INT64, self.downstream_offset, "checkpoint offset")
                + _str(self.metadata, "checkpoint metadata"))

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Checkpoint:
        """Decode a checkpoint record; raises :class:`OffsetFormatError` on malformed bytes."""
        k, v = _Reader(key, "checkpoint key"), _Reader(value, "checkpoint value")
        group, topic, partition = k.string("group"), k.string("topic"), k.int32("partition")
        v.version(cls.VERSION)
        upstream, downstream, metadata = v.int64("upstreamOffset"), v.int64("offset"), v.string("metadata")
        k.done()
        v.done()
        return cls(group, topic, partition, upstream, downstream, metadata)


@dataclass(frozen=True)
class Heartbeat:
    """Proof of life of the ``source -> target`` flow: emitted on the source, mirrored to the target."""

    source_cluster_alias: str
    target_cluster_alias: str
    timestamp_ms: int
    VERSION: ClassVar[int] = 0

    def key_bytes(self) -> bytes:
        return (_str(self.source_cluster_alias, "heartbeat sourceClusterAlias")
                + _str(self.target_cluster_alias, "heartbeat targetClusterAlias"))

    def value_bytes(self) -> bytes:
        return _INT16.pack(self.VERSION) + _int(_INT64, self.timestamp_ms, "heartbeat timestamp")

    @classmethod
    def from_record(cls, key: bytes | None, value: bytes | None) -> Heartbeat:
        """Decode a heartbeat record; raises :class:`OffsetFormatError` on malformed bytes."""
        k, v = _Reader(key, "heartbeat key"), _Reader(value, "heartbeat value")
        src, dst = k.string("sourceClusterAlias"), k.string("targetClusterAlias")
        v.version(cls.VERSION)
        ts = v.int64("timestamp")
        k.done()
        v.done()
        return cls(src, dst, ts)


# --------------------------------------------------------------------------- the sync invariant

SYNC_INVARIANT = """\
A sync ``(u, d)`` for a source partition is a POSITION mapping: a consumer positioned at upstream
offset ``u`` (the next record it would read) must be positioned at downstream offset ``d``.

Writer (``syncs_for_batch``): emits a sync at every point where the upstream -> downstream map stops
being linear -- the first and the last record of every contiguous run of mirrored records, so around
upstream gaps (compaction, aborted transactions, transaction markers) and downstream gaps (the
commit marker of each destination transaction) -- plus one at the end of each batch
(``u_end`` = next upstream offset to read, ``d_end`` = last downstream offset + 1). The middle points
of collinear runs are dropped, so a batch of N contiguous records costs 3 syncs, not N.

Invariant between two consecutive retained syncs ``a``, ``b`` (``a.u < b.u``), one of:

1. ``b.u - a.u == b.d - a.d`` and positions in between interpolate linearly (exact); or
2. no upstream record in ``(a.u, b.u)`` was mirrored and the downstream range ``(a.d, b.d)`` holds no
   committed record, so every position ``U`` in ``(a.u, b.u)`` maps to ``b.d`` (exact: never skips,
   never re-reads).

If 2 holds with equal deltas, interpolation lands on markers or aborted records, which a
read_committed consumer passes over to ``b.d``: still exact in what it consumes.

3. ``a.d`` is :data:`UNMAPPED` (-1): from ``a.u`` up to ``b.u`` the source held records the writer did
   not mirror because they came from the destination (the loop guard: a reverse flow's copies, see
   ``replicate.decide``). Their originals are on the destination, but not at a position the syncs
   give (before ``b.d``, perhaps among other records): every position in ``[a.u, b.u)`` is
   untranslatable (None, "came back from the destination"), never mapped to ``b.d``, which would skip
   the originals a consumer there has not read. Such a sync is never a partition's newest.

4. ``a`` is POSITION-ONLY (``position_only``): nothing was mirrored from the end of such a run up to
   ``a.u`` (the run ended its chunk; markers, dead letters or empty ranges may follow it). ``a.d`` is
   only where the writer resumes (after its own last write, or the destination's end at its first
   lookup), not where a consumer at ``a.u`` belongs: the originals of the copies it read may lie beyond
   ``a.d`` (records the destination's own producers wrote since) or below it (an end that held records
   not copied yet). A consumer anywhere from the first of a row of position-only syncs up to the next
   sync that is not one has read what a consumer at the run's end has (nothing mirrored, nothing copied
   in between): it is placed like a position in the run, through the reverse flow's syncs at the run's
   end (:meth:`OffsetSyncStore.run_end`), and is untranslatable by these syncs alone. Positions after
   the last of the row and before a sync that is not position-only map to that sync's ``d`` (case 2).

Translation of an upstream position ``U``:

* ``U`` equal to a sync's ``u`` -> that sync's ``d`` (exact);
* between ``a`` and ``b`` -> interpolated if the deltas are equal, else ``b.d`` (exact);
* above the newest sync -> the group is ahead of what was mirrored: the newest ``d``, flagged inexact
  ("ahead of mirror"); a consumer there re-reads, never skips (untranslatable when that sync is
  position-only: its ``d`` may lie past records the consumer has not read);
* below the oldest retained sync -> untranslatable (None, "older than retained offset-sync
  history"): never guessed.

History: a sync whose ``u`` is <= the partition's newest ``u`` (an at-least-once replay after a
restart, or a rewind) supersedes every retained sync with ``u`` >= its ``u``; history is rewritten from
there. When the cut falls inside a linear run, the run is kept up to ``u - 1`` so older positions stay
exact. A sync whose ``d`` is below a retained one's (the writer mirrors into a re-created destination
topic, from offset 0 again) ends the history before it: those syncs point into the deleted topic. Memory is bounded by an optional cap per partition that drops the oldest syncs (which makes
very old positions untranslatable, reported as such).
"""


#: the downstream offset of a sync that opens a run of loop-skipped records (the invariant's case 3)
UNMAPPED = -1


def syncs_for_batch(topic: str, partition: int, pairs: list[tuple[int, int]], upstream_end: int) -> list[OffsetSync]:
    """The minimal syncs a writer emits for one committed batch, in emission order.

    ``pairs`` are (upstream offset, downstream offset) of each mirrored record, in order;
    ``upstream_end`` is the next upstream offset to read after the batch (past any trailing markers or
    aborted records). Keeps run starts, run ends and the batch end; see :data:`SYNC_INVARIANT`.
    An empty batch yields no syncs (the writer's ``advance`` covers a batch of markers only).
    """
    kept: list[tuple[int, int]] = []
    if pairs and _one_run(pairs):
        kept = [pairs[0], pairs[-1]] if len(pairs) > 1 else [pairs[0]]  # the usual batch: no gaps at all
    else:
        for pt in pairs:
            while len(kept) >= 2 and _collinear(kept[-2], kept[-1], pt):
                kept.pop()
            kept.append(pt)
    if pairs:
        # the batch end stays apart from the last record's point: the next batch's first sync shares
        # its upstream position (and supersedes it), and the last record's point must survive that
        last_u, last_d = pairs[-1]
        kept.append((max(upstream_end, last_u + 1), last_d + 1))
    return [OffsetSync(topic, partition, u, d) for u, d in kept]


def _one_run(pairs: list[tuple[int, int]]) -> bool:
    """Every step moves upstream and downstream alike (one collinear run): the loop below would keep only
    the two ends. A cheap pass instead of the general one."""
    c = pairs[0][1] - pairs[0][0]
    return all(d - u == c for u, d in pairs)


def _collinear(a: tuple[int, int], b: tuple[int, int], c: tuple[int, int]) -> bool:
    return b[0] - a[0] == b[1] - a[1] and c[0] - b[0] == c[1] - b[1]


# --------------------------------------------------------------------------- translation

EXACT_SYNC = "exact sync"
INTERPOLATED = "interpolated within a run"
IN_GAP = "in an upstream gap: next mirrored record"
AHEAD = "ahead of mirror"
TOO_OLD = "older than retained offset-sync history"
THROUGH_ORIGINALS = "came back from the destination: its originals' position there, from the reverse flow's syncs"
LOOPED = ("the records from here came back from the destination (loop guard): their originals are there, at "
          "positions no sync gives")
AFTER_LOOPED = ("past records that came back from the destination (loop guard), nothing mirrored since: the "
                "sync gives only the writer's position there, not where their originals end")
NO_SYNCS = "no offset syncs for this partition"


@dataclass(frozen=True)
class Translation:
    """Where a consumer at some upstream position must be positioned downstream.

    ``downstream_offset`` is None when the position cannot be translated (never guessed); ``exact``
    is False when the answer is conservative (re-reads, never skips); ``reason`` says which case.
    """

    downstream_offset: int | None
    exact: bool
    reason: str


@dataclass
class _PartitionSyncs:
    us: list[int] = field(default_factory=list)
    ds: list[int] = field(default_factory=list)
    #: per sync: position-only (the invariant's case 4)
    po: list[bool] = field(default_factory=list)


class OffsetSyncStore:
    __doc__ = ("Offset-sync history per source partition, and exact translation.\n\n"
               "Feed it the offset-sync records in emission order with :meth:`add`.\n\n" + SYNC_INVARIANT)

    def __init__(self, max_per_partition: int | None = None):
        if max_per_partition is not None and max_per_partition < 2:
            raise ValueError("max_per_partition must be at least 2 (or None for unbounded)")
        self._parts: dict[tuple[str, int], _PartitionSyncs] = {}
        self.max_per_partition = max_per_partition

    def add(self, sync: OffsetSync) -> None:
        """Add the next sync in emission order; a replay or rewind rewrites history from its ``u``."""
        ps = self._parts.setdefault((sync.topic, sync.partition), _PartitionSyncs())
        us, ds, po = ps.us, ps.ds, ps.po
        new_u = sync.upstream_offset
        if us and new_u <= us[-1]:
            cut = bisect.bisect_left(us, new_u)
            keep: tuple[int, int] | None = None
            if 0 < cut < len(us) and us[cut - 1] < new_u - 1 and min(ds[cut - 1], ds[cut]) >= 0 and \
                    not (po[cut - 1] or po[cut]) and us[cut] - us[cut - 1] == ds[cut] - ds[cut - 1]:
                # the cut falls inside a linear run: keep the run up to just before the new history
                keep = (new_u - 1, ds[cut - 1] + (new_u - 1 - us[cut - 1]))
            del us[cut:], ds[cut:], po[cut:]
            if keep:
                us.append(keep[0])
                ds.append(keep[1])
                po.append(False)
        if sync.downstream_offset >= 0 and sync.downstream_offset < max(ds, default=-1):
            # the destination went back: the writer mirrors into a re-created destination topic (the records the
            # older syncs point at went with the deleted one). Positions before this sync are untranslatable now.
            del us[:], ds[:], po[:]
        us.append(new_u)
        ds.append(sync.downstream_offset)
        po.append(sync.position_only)
        if self.max_per_partition and len(us) > self.max_per_partition:
            drop = len(us) - self.max_per_partition
            del us[:drop], ds[:drop], po[:drop]

    def add_all(self, syncs: Iterable[OffsetSync]) -> None:
        for s in syncs:
            self.add(s)

    def latest(self, topic: str, partition: int) -> OffsetSync | None:
        """The newest retained sync of a partition that maps somewhere (not :data:`UNMAPPED`: an at-least-once
        writer that died between the two may have left one newest), or None."""
        ps = self._parts.get((topic, partition))
        i = len(ps.us) - 1 if ps else -1
        while i >= 0 and ps is not None and ps.ds[i] < 0:
            i -= 1
        return None if ps is None or i < 0 else OffsetSync(topic, partition, ps.us[i], ps.ds[i], ps.po[i])

    def oldest(self, topic: str, partition: int) -> OffsetSync | None:
        """The oldest retained sync of a partition (positions below it are untranslatable), or None."""
        ps = self._parts.get((topic, partition))
        if not ps or not ps.us:
            return None
        return OffsetSync(topic, partition, ps.us[0], ps.ds[0], ps.po[0])

    def size(self, topic: str, partition: int) -> int:
        ps = self._parts.get((topic, partition))
        return len(ps.us) if ps else 0

    def syncs(self, topic: str, partition: int) -> list[OffsetSync]:
        """The retained syncs of a partition, oldest first (what translation reads)."""
        ps = self._parts.get((topic, partition))
        return [OffsetSync(topic, partition, u, d, o) for u, d, o in zip(ps.us, ps.ds, ps.po, strict=True)] \
            if ps else []

    def upstream_for(self, topic: str, partition: int, downstream: int) -> int | None:
        """The smallest upstream position whose translation is exactly ``downstream`` (a position in a downstream
        gap, where no committed record lies, counts as the next record's), or None when no two syncs hold it
        between them. What a consumer at ``downstream`` of the destination has read of the source, for
        positions among records this history's writer copied there (a reverse flow's loop guard skips them).
        A position-only sync says nothing here (its downstream offset is no translation)."""
        ps = self._parts.get((topic, partition))
        if not ps:
            return None
        us, ds, po = ps.us, ps.ds, ps.po
        for i, (u, d) in enumerate(zip(us, ds, strict=True)):
            if d < 0 or po[i] or d > downstream:
                continue
            if d == downstream:
                return u
            if i + 1 == len(us) or ds[i + 1] < 0 or po[i + 1]:
                continue
            nu, nd = us[i + 1], ds[i + 1]
            if nu - u == nd - d:
                if downstream < nd:
                    return u + (downstream - d)
            elif downstream <= nd:
                return u + 1  # positions (u, nu) map to nd, as nu does
        return None

    def run_end(self, topic: str, partition: int, upstream_offset: int) -> int:
        """For a position :meth:`translate` answers with :data:`AFTER_LOOPED`: the first of the row of
        position-only syncs at or below it, just after the run of loop-skipped records, where a consumer has
        read the same records (the invariant's case 4); the position itself otherwise."""
        ps = self._parts.get((topic, partition))
        if not ps:
            return upstream_offset
        i = bisect.bisect_right(ps.us, upstream_offset) - 1
        if i < 0 or not ps.po[i]:
            return upstream_offset
        while i > 0 and ps.po[i - 1]:
            i -= 1
        return ps.us[i]

    def partitions(self) -> list[tuple[str, int]]:
        return sorted(self._parts)

    def translate(self, topic: str, partition: int, upstream_offset: int) -> Translation:
        """Translate an upstream position (a committed offset: the next record to read)."""
        ps = self._parts.get((topic, partition))
        if not ps or not ps.us:
            return Translation(None, False, NO_SYNCS)
        us, ds, po = ps.us, ps.ds, ps.po
        if upstream_offset < us[0]:
            return Translation(None, False, TOO_OLD)
        i = bisect.bisect_right(us, upstream_offset) - 1
        if ds[i] < 0 or (i + 1 < len(us) and ds[i + 1] < 0 and us[i] != upstream_offset):
            return Translation(None, False, LOOPED)
        if po[i]:
            if us[i] == upstream_offset or (i + 1 < len(us) and po[i + 1]):
                return Translation(None, False, AFTER_LOOPED)
            if i == len(us) - 1:
                return Translation(None, False, AHEAD)
            return Translation(ds[i + 1], True, IN_GAP)  # nothing mirrored up to the next sync (case 2)
        if us[i] == upstream_offset:
            return Translation(ds[i], True, EXACT_SYNC)
        if i == len(us) - 1:
            return Translation(ds[i], False, AHEAD)
        if po[i + 1]:
            # a position-only sync follows a run (its opening sync cut from the history): as inside the run
            return Translation(None, False, LOOPED)
        if us[i + 1] - us[i] == ds[i + 1] - ds[i]:
            return Translation(ds[i] + (upstream_offset - us[i]), True, INTERPOLATED)
        return Translation(ds[i + 1], True, IN_GAP)


# --------------------------------------------------------------------------- checkpoints


def checkpoint_for(group: str, topic: str, partition: int, upstream_committed: int, translation: Translation,
                   previous: Checkpoint | None, source_rewound: bool = False, metadata: str = "") -> Checkpoint | None:
    """The checkpoint to emit for a group's committed ``upstream_committed``, or None when there is none.

    None when the position is untranslatable, when nothing changed since ``previous``, or when the new
    checkpoint would move backwards (downstream or upstream) while the source group was not rewound
    (``source_rewound``: the caller saw the group's source offset go back, e.g. a reset). ``topic`` is
    the destination topic name, as MM2 writes it. An inexact ("ahead of mirror") translation is
    emitted: it is conservative, and a later exact one moves the checkpoint forward.
    """
    if translation.downstream_offset is None:
        return None
    cp = Checkpoint(group, topic, partition, upstream_committed, translation.downstream_offset, metadata)
    if previous is None:
        return cp
    if (previous.upstream_offset, previous.downstream_offset, previous.metadata) == \
            (cp.upstream_offset, cp.downstream_offset, cp.metadata):
        return None
    backwards = cp.downstream_offset < previous.downstream_offset or cp.upstream_offset < previous.upstream_offset
    if backwards and not source_rewound:
        return None
    return cp
