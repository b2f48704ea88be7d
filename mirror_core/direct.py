"""The direct read path (``spark.read_path: direct``): Spark plans, the writer reads.

Spark's Kafka source moves every record through the JVM consumer, UnsafeRow and Arrow before the
writer sees it, and that read caps a drain (see README, The data path). On this path Spark keeps what it
is good at here -- micro-batch planning, its offset log and the exactly-once replay of a batch after a
crash -- but the micro-batch DataFrame is never evaluated. The driver takes each partition's range
[start, end) from the offset log (the same ranges Spark would read: a replayed batch has the same ones),
reads it with one librdkafka consumer (``read_committed``, assigned, never committing) and hands the
records to the partition writers as :class:`~mirror_core.replicate.Columns`, through the same
:class:`~mirror_core.stream.BatchWriter` as Spark's path: transactions, skip-by-position on replay, dead
letters and offset syncs are the same code.

A range ends when the consumer has passed ``end`` (a record at or past ``end - 1``, or the partition's end
reached at or past ``end``), not when a record count is reached: transaction markers and aborted records
occupy offsets a read_committed consumer never returns. Records deleted from the source before they are
read (retention, ``DeleteRecords``) are skipped, as Spark does with ``failOnDataLoss=false``; the runtime
logs and counts them (``report_expired``).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from mirror_core import clients, native
from mirror_core.config import ClusterConfig
from mirror_core.errors import KafkaOperationError
from mirror_core.replicate import CHUNK_BYTES, Columns, quiet_gc

log = logging.getLogger(__name__)

#: records handed to a partition's writer at once (it writes what it finds queued together: stream.COALESCE_RECORDS)
CHUNK_RECORDS = 20000
#: ... or this many bytes of keys and values, whichever comes first (20,000 records of 100 KB would be 2 GB)
CHUNK_READ_BYTES = 32 * 1024 * 1024
#: a range that makes no progress for this long fails the batch (brokers gone); Spark retries nothing here
STALL_TIMEOUT = 60.0
#: ``consume()`` waits for its full count or this long, whichever comes first
POLL_SECONDS = 0.02
#: records of a partition kept past its range's end (for its next range) before the partition is paused
#: until then: a pause and resume costs the partition a fetch restart (up to a second)
AHEAD_RECORDS = 10000
#: ... and bytes of keys and values kept past their ranges' ends by one reader, all partitions together: over
#: this, a partition that gets more is paused until its next range (what the consumer holds of it still comes)
AHEAD_BYTES = 32 * 1024 * 1024
#: overrides :data:`AHEAD_BYTES`, for an A/B (the bench's ``-aheadall`` variants: 0, no bound but the records)
AHEAD_BYTES_ENV = "MIRRORFLOW_DIRECT_AHEAD_BYTES"
#: what a fetch brings of one partition at most (``max.partition.fetch.bytes``, a batch larger than it still
#: comes whole) is this divided among the partitions a reader starts with, from librdkafka's default of 1 MiB
#: (up to 128 partitions) down to :data:`PARTITION_FETCH_BYTES_MIN`. Whatever a fetch brings past a range's end
#: is kept for the next range, so at 1 MiB a backlog of 8,000 records of 100 B a partition at 1,000 partitions
#: came whole in the first micro-batch: each writer process kept 3,000,000 records past its ranges (about 1 GB
#: as Python objects) and the job peaked at 3.2 GB, against 1.5 GB for a backlog of 2,000 records a partition
#: (one micro-batch). With 256 KiB a partition and :data:`AHEAD_BYTES` it peaked at 2.0 GB (docs/benchmarks.md,
#: 5 December)
READER_FETCH_BYTES = 128 * 1024 * 1024
PARTITION_FETCH_BYTES_MIN = 64 * 1024
#: overrides what :func:`partition_fetch_bytes` gives, for an A/B (the bench's ``-aheadall`` variants: 1 MiB)
PARTITION_FETCH_BYTES_ENV = "MIRRORFLOW_DIRECT_PARTITION_FETCH_BYTES"
#: :meth:`DirectReader.arrived` takes at most this many further chunks of what the consumer holds at once
ARRIVED_ROUNDS = 10
#: the consumer's prefetch across all partitions (librdkafka's default is 64 MiB)
QUEUED_KBYTES = 32768
#: the consumer's fetches wait on the broker for this many bytes or its 10 ms (``fetch.wait.max.ms``), whichever
#: comes first. With librdkafka's default of 1 byte a running mirror's consumer fetched again the moment anything
#: had arrived, and at 10,000 records/s over 24 partitions that cost the source broker 0.1-0.3 of a core more
#: (0.65-0.83 against 0.43-0.59; docs/benchmarks.md); a backlog fills it at once, so drains do not wait
FETCH_MIN_BYTES = 65536
#: overrides :data:`FETCH_MIN_BYTES`, for an A/B (the bench's ``-fetch1`` variants: librdkafka's default)
FETCH_MIN_BYTES_ENV = "MIRRORFLOW_DIRECT_FETCH_MIN_BYTES"
#: keys and values of one partition read and not yet written, at most, while that partition is being written:
#: the reader waits for its writer above it, so a worker's memory does not grow with the batch size (a
#: partition whose writer has not started yet keeps what is read for it: waiting there could wait forever).
#: Up to :data:`QUEUED_BYTES_PER_PARTITION_MAX`, the chunk being written and two more may be held whatever
#: their bytes: a chunk of 1 KB records is larger than this, and a reader that waited at each one stopped
#: reading every other partition for the length of one chunk's write
QUEUED_BYTES_PER_PARTITION = 16 * 1024 * 1024
QUEUED_CHUNKS_PER_PARTITION = 3
QUEUED_BYTES_PER_PARTITION_MAX = 64 * 1024 * 1024
#: ``read_path: executors`` with ``transactions: per_writer``: while a task's share is made ready (its producers
#: started, its positions read: :func:`_prepare_share`), its reader goes on up to this many times a transaction's
#: records and bytes before it waits (the first transaction then holds that much)
PREPARING_HOLD = 2
#: ``transactions: per_writer``: a writer transaction holds at most about this many records (and
#: ``replicate.CHUNK_BYTES`` of keys and values) ...
WRITER_TXN_RECORDS = 100000
#: ... or, when it spans many partitions, this many a partition (still within ``CHUNK_BYTES``): librdkafka
#: sends each partition's records in a produce request of its own, and the broker answers one request of a
#: connection at a time, so at 500 partitions a transaction of 100,000 records went out as 500 requests of 200
#: records each (see :func:`writer_txn_records`)
WRITER_TXN_RECORDS_PER_PARTITION = 4000
#: overrides :data:`WRITER_TXN_RECORDS_PER_PARTITION`, for an A/B (the bench's ``-txnflat`` variants: 0, a
#: transaction of at most ``WRITER_TXN_RECORDS`` whatever its partitions)
WRITER_TXN_PER_PARTITION_ENV = "MIRRORFLOW_WRITER_TXN_PER_PARTITION"
#: ... and at most ``replicate.CHUNK_BYTES`` of keys and values, or this many a partition when that is more (from
#: 128 partitions a writer process; see :func:`writer_txn_bytes`). At 1,000 partitions (500 a writer process) a
#: transaction of 32 MiB could hold no more than some 600 records of 100 B a partition (and a micro-batch of
#: 500,000 records gave each 500): every partition got a produce request, a batch and a commit marker per 500
#: records, where MirrorMaker 2 wrote batches of 2,000. With 256 KiB a
#: partition and micro-batches of 2,000 records a partition (``stream.DIRECT_BATCH_RECORDS_PER_PARTITION``) an
#: 8,000,000-record drain went from 267,030-314,854 records/s to 427,612-454,383 (the tuned MirrorMaker 2:
#: 287,437-315,007), the mirror's CPU from 2.5-2.6 µs a record to 1.0-1.2 (docs/benchmarks.md, 4 December)
WRITER_TXN_BYTES_PER_PARTITION = 256 * 1024
#: overrides :data:`WRITER_TXN_BYTES_PER_PARTITION`, for an A/B (the bench's ``-flat`` variants: 0)
WRITER_TXN_BYTES_PER_PARTITION_ENV = "MIRRORFLOW_WRITER_TXN_BYTES_PER_PARTITION"
#: ``transactions: per_writer``: threads that fence the partitions' own transactional ids and read their
#: positions when a writer starts
WARM_THREADS_PER_WRITER = 64
#: ``spark.keep_writing_for``: how long a batch that keeps writing waits before it asks the source again when
#: nothing new had arrived (a record's latency grows by up to this; each ask is one request per source broker).
#: A writer process does not ask the source: it waits up to this long for its consumer's next fetch
#: (:meth:`DirectReader.arrived`), which brings records as they arrive
KEEP_WRITING_POLL = 0.01
#: ... and how long that ask may take before the batch returns to Spark
KEEP_WRITING_TIMEOUT = 10.0


@dataclass(frozen=True)
class Range:
    """One partition's share of a micro-batch: offsets [start, end); ``start`` None means the partition's
    first offset (a partition new to the query: Spark reads it from ``earliest``)."""

    topic: str
    partition: int
    start: int | None
    end: int


def batch_ranges(starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]],
                 skip: Iterable[str] = ()) -> list[Range]:
    """The ranges of a micro-batch from Spark's offset log: ``starts`` (the batch before's ends, or the
    query's initial offsets) and ``ends`` (this batch's). A partition missing from ``starts`` (or with a
    negative, symbolic start) is read from its first offset; a partition whose end did not move, or moved
    back (Spark drops that range; the runtime writes it from the start), has no range. Topics in ``skip``
    (looked at and not mirrored) are left out. Pure."""
    skipped = set(skip)
    out = []
    for topic, parts in sorted(ends.items()):
        if topic in skipped:
            continue
        for part, end in sorted(parts.items()):
            start: int | None = starts.get(topic, {}).get(part, -1)
            if start is not None and start < 0:
                start = None
            if end <= 0 or (start is not None and end <= start):
                continue
            out.append(Range(topic, part, start, end))
    return out


class DirectReader:
    """One long-lived read_committed consumer on the source, assigned to the partitions the batches touch.

    A range that continues the partition's last one (the usual case) goes on where the consumer stands:
    records fetched past the last range's end were kept for it (a partition that got more than
    :data:`AHEAD_RECORDS` ahead is paused until its next range). A range that does not continue (the first
    batch, a replay, an end that moved back) seeks to its start."""

    def __init__(self, cluster: ClusterConfig, group: str, stall_timeout: float = STALL_TIMEOUT,
                 consumer_group: str | None = None):
        self.cluster = cluster
        self.group = group
        #: the consumer's ``group.id``: a formality (it never joins or commits), so one the source principal
        #: already has an ACL for (a mirror's consumer group) keeps a least-privilege setup free of denials
        self.consumer_group = consumer_group or f"{group}.mirrorflow-direct-read"
        self.stall_timeout = stall_timeout
        self._consumer: Any = None
        #: (topic, partition) -> the offset the next range must start at to continue without a seek
        self._next: dict[tuple[str, int], int] = {}
        #: records fetched past the last range's end, by partition, for the next range
        self._ahead = _Kept()
        #: partitions paused for what is kept of them (resumed by their next range)
        self._paused: set[tuple[str, int]] = set()
        #: :data:`AHEAD_BYTES` (0: no bound but :data:`AHEAD_RECORDS`)
        self.ahead_bytes = whole_number_env(AHEAD_BYTES_ENV, AHEAD_BYTES, "bytes")
        #: (topic, partition) -> the highest end of partition the consumer reported (everything below it
        #: has been handed over); reported once, so kept for the ranges after the one that was open then
        self._eof: dict[tuple[str, int], int] = {}

    def _client(self, partitions: int) -> Any:
        """The consumer; a new one is made for ``partitions`` partitions (see :func:`partition_fetch_bytes`)."""
        if self._consumer is None:
            # assigned, never subscribed: the group id is a formality (no join, no commits)
            conf = {"isolation.level": "read_committed", "enable.partition.eof": True,
                    "enable.auto.offset.store": False, "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 10,
                    "fetch.min.bytes": fetch_min_bytes(), "queued.max.messages.kbytes": QUEUED_KBYTES,
                    "max.partition.fetch.bytes": partition_fetch_bytes(partitions)}
            if native.reads():
                # the C read loop: records as columns, from a consumer of its own (native.Reader)
                self._consumer = clients.native_reader(self.cluster, self.consumer_group, **conf)
            else:
                self._consumer = _Consumer(clients.consumer(self.cluster, self.consumer_group, **conf))
            self._next.clear()
            self._ahead.clear()
            self._paused.clear()
            self._eof.clear()
        return self._consumer

    def close(self) -> None:
        """Close the consumer; the next batch starts a new one (and seeks every partition)."""
        if self._consumer is not None:
            c, self._consumer = self._consumer, None
            try:
                c.close()
            except Exception as exc:  # noqa: BLE001 - closing after a failure: the failure is what matters
                log.debug("closing the direct reader: %s", exc)

    def _position(self, ranges: list[Range]) -> None:
        """Assign new partitions, seek those that do not continue, resume the rest."""
        from confluent_kafka import OFFSET_BEGINNING

        c = self._client(len(ranges))
        assigned = set(c.assignment())
        fresh, moved = [], []
        for r in ranges:
            key = (r.topic, r.partition)
            offset = OFFSET_BEGINNING if r.start is None else r.start
            if key not in assigned:
                fresh.append((r.topic, r.partition, offset))
            elif r.start is None or self._next.get(key) != r.start:
                moved.append((r.topic, r.partition, offset))
            else:
                continue
            self._ahead.pop(key)
            self._next.pop(key, None)
            self._eof.pop(key, None)
        if moved:  # a new assignment drops what was fetched for it: the seek starts clean
            c.unassign([(t, p) for t, p, _ in moved])
        if fresh or moved:
            c.assign(fresh + moved)
        # a partition keeps its pause across a new assignment: resume every partition of the batch
        c.resume([(r.topic, r.partition) for r in ranges])
        self._paused.difference_update((r.topic, r.partition) for r in ranges)

    def read(self, ranges: list[Range], deliver: Any) -> float:
        """Read every range, calling ``deliver(range, columns, size)`` with each partition's records in offset
        order (chunks of about :data:`CHUNK_RECORDS` or :data:`CHUNK_READ_BYTES`; ``size``: their bytes of keys
        and values), and ``deliver(range, None)`` when a range is complete. Returns the seconds spent reading
        (consume and splitting, not in ``deliver``). On any error the consumer is closed (the next batch
        starts clean) and the error raised."""
        if not ranges:
            return 0.0
        try:
            self._position(ranges)
            c = self._consumer
            by_key = {(r.topic, r.partition): r for r in ranges}
            #: each open range's records not handed over yet (runs or parts of runs), and how many
            bufs: dict[tuple[str, int], list[Columns]] = {k: [] for k in by_key}
            held: dict[tuple[str, int], int] = dict.fromkeys(by_key, 0)
            held_bytes: dict[tuple[str, int], int] = dict.fromkeys(by_key, 0)
            last: dict[tuple[str, int], int] = {}
            open_ = set(by_key)
            spent = 0.0

            def flush(key: tuple[str, int], done: bool) -> None:
                if bufs[key]:
                    deliver(by_key[key], Columns.concat(bufs[key]), held_bytes[key])
                    bufs[key], held[key], held_bytes[key] = [], 0, 0
                if done:
                    open_.discard(key)
                    deliver(by_key[key], None)

            def take(key: tuple[str, int], run: Columns) -> bool:
                """The records of ``run`` in ``key``'s open range; True when they complete it (records past
                its end are kept for the partition's next range)."""
                r = by_key[key]
                offs = run.offsets
                # records at or below the last one handed over were fetched again after a resume (never
                # handed over twice); those before the range's start belong to no range
                low = max(last.get(key, -1), -1 if r.start is None else r.start - 1)
                i = bisect_right(offs, low)
                j = bisect_left(offs, r.end, i)
                if j > i:
                    piece = run if i == 0 and j == len(offs) else run.slice(i, j)
                    bufs[key].append(piece)
                    held[key] += j - i
                    held_bytes[key] += _size(piece)
                    last[key] = offs[j - 1]
                if j < len(offs):
                    self._keep_ahead(c, key, run.slice(j, len(offs)))
                    return True
                return last.get(key, -1) >= r.end - 1

            def finish(key: tuple[str, int]) -> None:
                self._next[key] = by_key[key].end
                flush(key, done=True)

            # records fetched past the last range's end, first
            for key in list(open_):
                early = self._ahead.pop(key)
                for i, run in enumerate(early):
                    if take(key, run):
                        for rest in early[i + 1:]:
                            self._keep_ahead(c, key, rest)
                        finish(key)
                        break
                else:
                    if self._eof.get(key, -1) >= by_key[key].end:
                        finish(key)  # the partition's end, reported earlier, is at or past the range's end
            deadline = time.monotonic() + self.stall_timeout
            while open_:
                t0 = time.monotonic()
                # ask for no more than the open ranges can still hold: consume() returns as soon as that
                # many are in, instead of waiting out its timeout for a full chunk (a small batch of a live
                # stream would wait POLL_SECONDS on every call)
                items = c.consume(max(1, min(CHUNK_RECORDS, _left(open_, by_key, last))), POLL_SECONDS)
                touched: set[tuple[str, int]] = set()
                completed: dict[tuple[str, int], None] = {}  # in the order completed
                for item in items:
                    if item[0] == native.EVENT:
                        ended = self._event(item)
                        if ended is not None and ended in open_ and ended not in completed and \
                                self._eof[ended] >= by_key[ended].end:
                            completed[ended] = None  # the partition's end is at or past the range's end
                        continue
                    run = Columns(*item[3:])
                    key = (item[1], item[2])
                    if key in open_ and key not in completed:
                        touched.add(key)
                        if take(key, run):
                            completed[key] = None
                        continue
                    # a partition done (or not in this batch): kept for its next range
                    self._keep_ahead(c, key, run)
                for key in touched:
                    if key not in completed and (held[key] >= CHUNK_RECORDS
                                                 or held_bytes[key] >= CHUNK_READ_BYTES):
                        flush(key, done=False)
                spent += time.monotonic() - t0
                for key in completed:
                    finish(key)
                if items:
                    deadline = time.monotonic() + self.stall_timeout
                elif time.monotonic() > deadline:
                    stuck = ", ".join(f"{t}[{p}] up to {by_key[(t, p)].end}" for t, p in sorted(open_))
                    raise KafkaOperationError(f"reading {stuck}: no progress in {self.stall_timeout:.0f}s")
            return spent
        except BaseException:
            self.close()
            raise

    def _event(self, item: tuple[Any, ...]) -> tuple[str, int] | None:
        """A consumer event: the partition whose end it reports (kept in :attr:`_eof`), None for one the
        client retries by itself; anything else is raised."""
        from confluent_kafka import KafkaError

        _, topic, part, offset, code, name, text = item
        if code == KafkaError._PARTITION_EOF:
            key = (topic, part)
            self._eof[key] = max(self._eof.get(key, -1), offset)
            return key
        if code == KafkaError.GROUP_AUTHORIZATION_FAILED or topic is None:
            log.debug("%s: direct read: %s", self.group, text)  # retried by the client
            return None
        raise KafkaOperationError(f"reading {topic}[{part}]: {text}", name)

    def _keep_ahead(self, c: Any, key: tuple[str, int], run: Columns) -> None:
        """Records of a partition past its range's end: kept for its next range, never dropped (that range
        continues from them); the partition is paused when :data:`AHEAD_RECORDS` of it, or
        :data:`AHEAD_BYTES` of all partitions, are kept (what the consumer had already fetched for it still
        comes, and is kept too)."""
        records = self._ahead.add(key, run)
        if key not in self._paused and (records >= AHEAD_RECORDS or 0 < self.ahead_bytes <= self._ahead.bytes):
            c.pause([key])
            self._paused.add(key)

    def arrived(self, at: dict[tuple[str, int], int], wait: float) -> dict[tuple[str, int], int]:
        """``spark.keep_writing_for`` in a writer process: how far each partition of ``at`` (where it stands)
        can be read from what the consumer has fetched, without asking the source: past the last record
        held for it, or the partition's end when the consumer reported one further (trailing transaction
        markers); where it stands when nothing new came. Takes what librdkafka has fetched and, when none of
        the partitions has anything new, waits up to ``wait`` seconds for the next fetch. A partition the
        reader does not stand at ``at`` on (no range of it read here, or read elsewhere since) is assigned or
        sought there first. What is taken is kept for the ranges that follow (:meth:`read` hands them over),
        so a range up to these ends reads nothing again; a read_committed consumer never returns a record
        above the last stable offset, so the ends are stable offsets, as the source's own answer would be.
        A partition moved back on the source (re-created, truncated) is not seen here but by Spark's next
        batch, at the end of the span. On any error the consumer is closed and the error raised."""
        try:
            c = self._client(len(at))
            elsewhere = [Range(t, p, o, o) for (t, p), o in at.items() if self._next.get((t, p)) != o]
            if elsewhere:
                self._position(elsewhere)
                self._next.update({(r.topic, r.partition): r.end for r in elsewhere})
            deadline = time.monotonic() + wait
            count, timeout = CHUNK_RECORDS, 0.0  # first what is there, without waiting
            while True:
                items = c.consume(count, timeout)
                # then the rest of what was fetched: of the fetch the first item came with, or all a full
                # chunk leaves (a backlog shows in the ends, up to what the consumer holds; see AHEAD_RECORDS)
                more, rounds = bool(items) if count == 1 else _messages(items) >= count, 0
                while more and rounds < ARRIVED_ROUNDS:
                    got = c.consume(CHUNK_RECORDS, 0.0)
                    items += got
                    more, rounds = _messages(got) >= CHUNK_RECORDS, rounds + 1
                for item in items:
                    if item[0] == native.EVENT:
                        self._event(item)
                    else:
                        self._keep_ahead(c, (item[1], item[2]), Columns(*item[3:]))
                ends = {key: max(o, self._eof.get(key, -1), *(run.offsets[-1] + 1 for run in self._ahead.runs(key)
                                                               if run.offsets)) for key, o in at.items()}
                left = deadline - time.monotonic()
                if left <= 0 or any(ends[key] > o for key, o in at.items()):
                    return ends
                # the next fetch: librdkafka's batch consume waits for its full count, so one item first
                count, timeout = 1, left
        except BaseException:
            self.close()
            raise


def writer_txn_records(partitions: int) -> int:
    """How many records a writer transaction over ``partitions`` partitions holds at most:
    :data:`WRITER_TXN_RECORDS`, or :data:`WRITER_TXN_RECORDS_PER_PARTITION` (:data:`WRITER_TXN_PER_PARTITION_ENV`
    when set, a whole number) times ``partitions`` when that is more."""
    per = whole_number_env(WRITER_TXN_PER_PARTITION_ENV, WRITER_TXN_RECORDS_PER_PARTITION, "records")
    return max(WRITER_TXN_RECORDS, per * partitions)


def writer_txn_bytes(partitions: int) -> int:
    """How many bytes of keys and values a writer transaction over ``partitions`` partitions holds at most:
    ``replicate.CHUNK_BYTES``, or :data:`WRITER_TXN_BYTES_PER_PARTITION`
    (:data:`WRITER_TXN_BYTES_PER_PARTITION_ENV` when set) times ``partitions`` when that is more."""
    per = whole_number_env(WRITER_TXN_BYTES_PER_PARTITION_ENV, WRITER_TXN_BYTES_PER_PARTITION, "bytes")
    return max(CHUNK_BYTES, per * partitions)


def whole_number_env(name: str, default: int, unit: str) -> int:
    """The environment variable ``name`` as a whole number of ``unit``, or ``default`` when it is unset."""
    raw = os.environ.get(name, "").strip()
    if raw and not raw.isdigit():
        raise ValueError(f"{name}={raw!r}: must be a whole number of {unit}")
    return int(raw) if raw else default


def partition_fetch_bytes(partitions: int) -> int:
    """``max.partition.fetch.bytes`` of a reader that starts with ``partitions`` partitions:
    :data:`READER_FETCH_BYTES` among them, from 1 MiB down to :data:`PARTITION_FETCH_BYTES_MIN`, or
    :data:`PARTITION_FETCH_BYTES_ENV` when set (0: as unset)."""
    share = min(1024 * 1024, max(PARTITION_FETCH_BYTES_MIN, READER_FETCH_BYTES // max(1, partitions)))
    return whole_number_env(PARTITION_FETCH_BYTES_ENV, share, "bytes") or share


def fetch_min_bytes() -> int:
    """:data:`FETCH_MIN_BYTES`, or :data:`FETCH_MIN_BYTES_ENV` when set (a whole number of bytes, 1 to 1 MiB)."""
    raw = os.environ.get(FETCH_MIN_BYTES_ENV, "").strip()
    if not raw:
        return FETCH_MIN_BYTES
    if not raw.isdigit() or not 1 <= int(raw) <= 1024 * 1024:
        raise ValueError(f"{FETCH_MIN_BYTES_ENV}={raw!r}: must be a whole number of bytes from 1 to 1048576")
    return int(raw)


class _Kept:
    """What a :class:`DirectReader` keeps of partitions past their ranges' ends: runs by partition, and their
    bytes of keys and values, each partition's and all together (:attr:`bytes`)."""

    def __init__(self) -> None:
        self._runs: dict[tuple[str, int], list[Columns]] = {}
        self._records: dict[tuple[str, int], int] = {}
        self._bytes: dict[tuple[str, int], int] = {}
        self.bytes = 0

    def add(self, key: tuple[str, int], run: Columns) -> int:
        """Keep ``run`` after what is kept of ``key``; the records now kept of it."""
        size = _size(run)
        self._runs.setdefault(key, []).append(run)
        self._records[key] = records = self._records.get(key, 0) + len(run)
        self._bytes[key] = self._bytes.get(key, 0) + size
        self.bytes += size
        return records

    def pop(self, key: tuple[str, int]) -> list[Columns]:
        """What is kept of ``key``, in offset order, no longer kept."""
        self._records.pop(key, None)
        self.bytes -= self._bytes.pop(key, 0)
        return self._runs.pop(key, [])

    def runs(self, key: tuple[str, int]) -> list[Columns]:
        return self._runs.get(key, [])

    def records(self, key: tuple[str, int]) -> int:
        return self._records.get(key, 0)

    def clear(self) -> None:
        self._runs.clear()
        self._records.clear()
        self._bytes.clear()
        self.bytes = 0


def _messages(items: list[tuple[Any, ...]]) -> int:
    """The messages (records and events) in what the consumer returned, as its ``count`` counts them."""
    return sum(1 if item[0] == native.EVENT else len(item[3]) for item in items)


def _size(cols: Columns) -> int:
    """Bytes of keys and values in ``cols``."""
    return sum(map(len, filter(None, cols.values))) + sum(map(len, filter(None, cols.keys)))


def _left(open_: set[tuple[str, int]], by_key: dict[tuple[str, int], Range], last: dict[tuple[str, int], int]) -> int:
    """Offsets the open ranges still cover (records, transaction markers and aborted records): an upper
    bound of the records still to come; a range read from its partition's first offset counts in full."""
    n = 0
    for key in open_:
        r = by_key[key]
        if r.start is None and key not in last:
            return CHUNK_RECORDS
        n += r.end - max(last.get(key, -1) + 1, r.start or 0)
    return n


class _Consumer:
    """A confluent_kafka ``Consumer`` with :class:`mirror_core.native.Reader`'s methods (the reader's
    consumer when the C read loop is not there)."""

    def __init__(self, consumer: Any):
        self._c = consumer

    def assign(self, parts: list[tuple[str, int, int]]) -> None:
        self._c.incremental_assign(_partitions(parts))

    def unassign(self, parts: list[tuple[str, int]]) -> None:
        self._c.incremental_unassign(_partitions(parts))

    def pause(self, parts: list[tuple[str, int]]) -> None:
        self._c.pause(_partitions(parts))

    def resume(self, parts: list[tuple[str, int]]) -> None:
        self._c.resume(_partitions(parts))

    def assignment(self) -> list[tuple[str, int]]:
        return [(tp.topic, tp.partition) for tp in self._c.assignment()]

    def consume(self, count: int, timeout: float) -> list[tuple[Any, ...]]:
        return _runs(self._c.consume(count, timeout))

    def close(self) -> None:
        self._c.close()


def _partitions(parts: Iterable[tuple[Any, ...]]) -> list[Any]:
    from confluent_kafka import TopicPartition

    return [TopicPartition(*p) for p in parts]


def _runs(msgs: list[Any]) -> list[tuple[Any, ...]]:
    """``Consumer.consume()``'s messages in the shape of :meth:`mirror_core.native.Reader.consume` (the
    reader's path when the C loop is not there)."""
    out: list[tuple[Any, ...]] = []
    cur: tuple[str, int] | None = None
    run: Columns | None = None
    for m in msgs:
        err = m.error()
        if err is not None:
            cur = None
            out.append((native.EVENT, m.topic(), m.partition(), m.offset(), err.code(), err.name(), err.str()))
            continue
        key = (m.topic(), m.partition())
        if key != cur:
            cur, run = key, Columns([], [], [], [], None)
            out.append((native.RUN, *key, run.offsets, run.keys, run.values, run.timestamps, None))
        assert run is not None
        h = m.headers()
        if h and run.headers is None:
            run.headers = [()] * len(run.offsets)
            out[-1] = out[-1][:7] + (run.headers,)
        run.offsets.append(m.offset())
        run.keys.append(m.key())
        run.values.append(m.value())
        run.timestamps.append(m.timestamp()[1])
        if run.headers is not None:
            run.headers.append(tuple(h) if h else ())
    return out


def write_ranges(plan: Any, ranges: list[Range], reader: DirectReader, threads: int = 8, slot: int = 0,
                 slots_used: int = 1, in_task: bool = False, retry: bool = False) -> list[dict[str, Any]]:
    """Read a micro-batch's ranges with ``reader`` and write them with one :class:`BatchWriter` (the
    ``plan`` is the batch's :class:`~mirror_core.stream.WriterPlan`): each partition by one thread at a
    time, in offset order, up to ``threads`` partitions at once; the read goes on while they write.
    Returns the writer's result rows; the first writer error is raised once every partition has stopped.
    With ``transactions: per_writer``, see :func:`write_ranges_per_writer` (``slot``: this writer's; ``in_task``:
    a Spark task's share, ``read_path: executors``; ``retry``: not the task's first attempt)."""
    from mirror_core.stream import BatchWriter, coalesce_records, coalesced

    if plan.transactions == "per_writer":
        return write_ranges_per_writer(plan, ranges, reader, slot, slots_used, in_task, retry)

    bw = BatchWriter(plan)
    ready: Future[None] | None = None
    if in_task:
        # the share's producers, then its positions in one lookup a topic, while the reader starts; each
        # partition's writer waits for it before its first write (counted as that partition's setup)
        prep = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirrorflow-share")
        ready = prep.submit(_prepare_partitions, bw, sorted({(r.topic, r.partition) for r in ranges}),
                            WARM_THREADS_PER_WRITER)
        prep.shutdown(wait=False)
    failed: list[BaseException] = []
    queues: dict[tuple[str, int], queue.SimpleQueue[tuple[Columns, int] | None]] = {}
    runs: dict[tuple[str, int], Future[None]] = {}
    held: dict[tuple[str, int], int] = {}  # bytes queued per partition (QUEUED_BYTES_PER_PARTITION)
    pending: dict[tuple[str, int], int] = {}  # chunks queued or being written per partition
    written = threading.Condition()
    waited = [0.0]  # seconds the reader waited for writers (not reading: taken out of the read time)
    stop = threading.Event()

    def over(key: tuple[str, int]) -> bool:
        return held[key] > QUEUED_BYTES_PER_PARTITION and (pending[key] > QUEUED_CHUNKS_PER_PARTITION
                                                           or held[key] > QUEUED_BYTES_PER_PARTITION_MAX)

    complete: set[tuple[str, int]] = set()  # ranges the reader read to their end

    most = coalesce_records()

    def run(r: Range, q: queue.SimpleQueue[tuple[Columns, int] | None]) -> None:
        key = (r.topic, r.partition)
        prepared_ms = 0.0
        if ready is not None:
            t0 = time.monotonic()
            try:
                ready.result()  # a failure to prepare is only logged there: this is not expected to raise
            except BaseException as exc:
                failed.append(exc)  # but if it does, the write fails (and this partition's queue is drained)
                stop.set()
            prepared_ms = (time.monotonic() - t0) * 1000
        # what the reader queued while the last write went on goes with the next one (see COALESCE_RECORDS)
        for taken in coalesced(q, lambda it: (len(it[0]), it[1]), most, CHUNK_BYTES):
            size = sum(it[1] for it in taken)
            try:
                if not stop.is_set():  # else another partition failed: only drain
                    bw.feed(r.topic, r.partition, Columns.concat([it[0] for it in taken]),
                            chunk_records=max(most, CHUNK_RECORDS))
            except BaseException as exc:
                failed.append(exc)
                stop.set()
            finally:
                with written:
                    held[key] -= size
                    pending[key] -= len(taken)
                    written.notify_all()
        # trailing markers / aborted records: the position to the range's end, once the reader reached it (not
        # when the read failed part way: the records it did not read are still to be written)
        if not stop.is_set() and key in complete:
            try:
                bw.finish(r.topic, r.partition, r.start)
            except BaseException as exc:
                failed.append(exc)
                stop.set()
        if prepared_ms:
            bw.add_setup(r.topic, r.partition, prepared_ms)

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(ranges))),
                            thread_name_prefix="mirrorflow-direct") as pool:

        def deliver(r: Range, cols: Columns | None, size: int | None = None) -> None:
            if stop.is_set():
                raise _Stopped
            key = (r.topic, r.partition)
            q = queues.get(key)
            if q is None:
                q = queues[key] = queue.SimpleQueue()
                held[key] = pending[key] = 0
                runs[key] = pool.submit(run, r, q)
            if cols is None:
                complete.add(key)
                q.put(None)
                return
            if size is None:
                size = _size(cols)
            with written:
                held[key] += size
                pending[key] += 1
            q.put((cols, size))
            with written:
                # a partition being written holds at most QUEUED_BYTES_PER_PARTITION, or its chunk being written
                # and two more up to QUEUED_BYTES_PER_PARTITION_MAX: its writer takes from the queue whatever the
                # reader does, so waiting for it always ends
                if over(key):
                    t0 = time.monotonic()
                    while over(key) and runs[key].running() and not stop.is_set():
                        written.wait(0.5)
                    waited[0] += time.monotonic() - t0

        read_s = 0.0
        try:
            read_s = reader.read(ranges, deliver)
        except _Stopped:
            pass
        finally:
            for q in queues.values():
                q.put(None)  # a run ends at the first None; a second is harmless
            for f in runs.values():
                f.exception()  # wait: no partition is left mid-write
    if failed:
        raise failed[0]
    return bw.rows(max(0.0, read_s - waited[0]) * 1000)


def write_ranges_per_writer(plan: Any, ranges: list[Range], reader: DirectReader, slot: int,
                            slots_used: int, in_task: bool = False, retry: bool = False) -> list[dict[str, Any]]:
    """``transactions: per_writer``: read the ranges and write the exactly-once partitions' records in
    transactions of this writer's producer (``slot``; see :meth:`~mirror_core.stream.BatchWriter.write_shared`),
    each holding every partition's records read since the last one: at the end of the read, or sooner when
    they reach :func:`writer_txn_records` records or :func:`writer_txn_bytes` of keys and values (memory and
    transaction size stay bounded whatever the batch). At-least-once partitions are written at the same cuts through one
    idempotent producer of the writer (flushed once for all of them, no transaction). What a shared producer
    cannot write (see :meth:`~mirror_core.stream.BatchWriter.write_shared`) is written partition by partition,
    as on the ``per_partition`` path.

    A cut is written inside the reader's callback: the process does not read while it writes (librdkafka
    goes on fetching). Writing each cut on a thread of its own, one at a time, while the reader took the next
    one was measured and is slower: with 24 partitions of 100-byte records the drain fell from 563,087 to
    431,316 records/s (exactly_once, three rounds) at more CPU a record (2.4-3.1 µs against 2.1), and at 1 KB
    it was even (the two threads take turns at the interpreter lock).

    ``in_task`` (``read_path: executors``): a Spark task's share of a large batch, written with the share's
    writer ids (``slot``: the share's place in the batch). A share goes to whichever Python worker is free, and
    another worker or the driver may have written its partitions since this worker last did: their positions
    are read again, after the share's producers are started (a producer this worker starts fences the one
    another worker holds; one it kept from an earlier task, fenced since, fails its first transaction, which is
    then written again on a new producer from positions read after it), on a thread of its own while the reader
    starts; the first cut waits for it (:func:`_prepare_share`). The driver fenced the writer ids before its tasks
    first wrote. A ``retry`` (not the task's first attempt) starts the share's ids anew, also those this worker
    holds, and fences its partitions' own ids again before it reads their positions: what an attempt Spark gave
    up on (its executor lost, the process alive) has open then cannot commit after (docs/architecture.md says
    what such an attempt can still do)."""
    from mirror_core.replicate import Columns, WriterTransaction
    from mirror_core.stream import BatchWriter

    bw = BatchWriter(plan)
    txn = WriterTransaction(plan.settings.values(), slot, slots_used, producers=plan.writer_producers)
    alo = WriterTransaction(plan.settings.values(), slot, slots_used, delivery="at_least_once")
    by_key = {(r.topic, r.partition): r for r in ranges}
    ready: Future[None] | None = None
    if in_task:
        # while the reader starts: the first cut waits for it (a task's first records need not)
        prep = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirrorflow-share")
        ready = prep.submit(_prepare_share, bw, (txn, alo), list(by_key), retry)
        prep.shutdown(wait=False)
    else:
        txn.fence_unused()  # done by the warm-up once; the driver's first batch may run beside it
    pieces: dict[tuple[str, int], list[Columns]] = {}
    complete: set[tuple[str, int]] = set()
    held = [0, 0]  # records, bytes
    most, most_bytes = writer_txn_records(len(ranges)), writer_txn_bytes(len(ranges))

    def cut(advance: dict[tuple[str, int], tuple[Columns, int]] | None = None) -> None:
        if ready is not None:
            ready.result()  # the share's producers and positions (its error is the task's)
        shared: dict[str, dict[tuple[str, int], tuple[Columns, int]]] = {"exactly_once": {}, "at_least_once": {}}
        for key, entry in (advance or {}).items():
            shared[plan.settings[key[0]].delivery][key] = entry
        alone: dict[tuple[str, int], Columns] = {}
        for key, parts in pieces.items():
            cols = Columns.concat(parts)
            s = plan.settings.get(key[0])
            if s is not None:
                # a range read to its end moves the position past its trailing markers; a range cut short, to
                # just after its last record
                shared[s.delivery][key] = (cols, by_key[key].end if key in complete else cols.offsets[-1] + 1)
            else:
                alone[key] = cols
        for writer, todo in ((txn, shared["exactly_once"]), (alo, shared["at_least_once"])):
            left = bw.write_shared(writer, todo) if todo else set()
            alone.update({key: cols for key, (cols, _end) in todo.items() if key in left and len(cols)})
        for (topic, part), cols in sorted(alone.items()):
            bw.feed(topic, part, cols)  # an unknown topic fails here, as on the per-partition path
        pieces.clear()
        held[0] = held[1] = 0

    def deliver(r: Range, cols: Columns | None, size: int | None = None) -> None:
        key = (r.topic, r.partition)
        if cols is None:
            complete.add(key)
            return
        # what is held goes out before more is taken (not as soon as it is over the bounds): a range's last
        # records and its end, which the reader hands over one after the other, then share a transaction
        if (held[0] >= most or held[1] >= most_bytes) and (
                ready is None or ready.done()
                or held[0] >= most * PREPARING_HOLD or held[1] >= most_bytes * PREPARING_HOLD):
            cut()
        pieces.setdefault(key, []).append(cols)
        held[0] += len(cols)
        held[1] += _size(cols) if size is None else size

    try:
        read_s = reader.read(ranges, deliver)
    finally:
        if ready is not None:
            ready.exception()  # never left running past the task's write
    # the last transaction also moves the position of partitions whose records went out in an earlier one
    # and whose range ended after them (trailing transaction markers)
    advance: dict[tuple[str, int], tuple[Columns, int]] = {}
    # and of partitions whose range held no records at all (only markers or aborted records), from where each
    # stands (nothing moves when it stands at the end already, or nothing was mirrored yet)
    for key in complete - pieces.keys():
        r = bw.results.get(key)
        s = plan.settings.get(key[0])
        if s is not None and (r is None or (r.upstream_end is not None and r.upstream_end < by_key[key].end)):
            advance[key] = (Columns([], [], [], []), by_key[key].end)
    cut(advance)
    for topic, part in sorted(complete):
        # what was written partition by partition: past its trailing markers
        bw.finish(topic, part, by_key[(topic, part)].start)
    return bw.rows(read_s * 1000)


def _prepare_partitions(bw: Any, keys: list[tuple[str, int]], threads: int) -> None:
    """A Spark task's share with a transaction per partition: start its partitions' producers, up to ``threads``
    at once (a start is round trips: waiting, not work), then read the exactly-once ones' positions in one
    lookup a topic
    (:meth:`~mirror_core.stream.BatchWriter.prepare_many`). A failure is only a lost head start: that
    partition's first write starts it again and says what is wrong."""
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(threads, len(keys))), thread_name_prefix="mirrorflow-share") \
                as pool:
            failed = bw.prepare_many(keys, pool)
    except Exception as exc:  # noqa: BLE001 - see above
        log.debug("%s: the share's partitions were not started ahead: %s", bw.plan.group, exc)
        return
    for (topic, part), why in failed:
        log.debug("%s: %s[%d] not started ahead: %s", bw.plan.group, topic, part, why)
    log.debug("%s: %d partitions' producers and positions ready in %.2fs", bw.plan.group, len(keys),
              time.monotonic() - t0)


def _prepare_share(bw: Any, writers: tuple[Any, ...], keys: list[tuple[str, int]], retry: bool = False) -> None:
    """A task's share (``transactions: per_writer``): start the share's producers (those this worker does not
    hold yet; a new one fences whoever held its id), then read the partitions' positions again, all at once
    (another worker or the driver may have written them since this worker last did). A ``retry`` starts
    the transactional ones anew, also those this worker holds (the attempt before may have started the ids since,
    fencing these), and fences the exactly-once partitions' own ids again (that attempt may have written one
    alone), before the positions are read."""
    if retry:
        log.info("%s: a retry of a Spark task (writer %d): its writer ids are started anew and its %d partitions' "
                 "own ids fenced again before their positions are read (the attempt before may still run)",
                 bw.plan.group, writers[0].slot, len(keys))
    for writer in writers:
        if writer.txid:
            if retry and writer.transactional:
                writer.start_again()
            else:
                writer.start()
    bw.read_positions_again(keys, fence_again=retry)


def task_shares(ranges: list[Range], tasks: int) -> list[list[Range]]:
    """``read_path: executors``: a micro-batch's ranges as the shares of at most ``tasks`` Spark tasks, each read
    by one consumer: every ``tasks``-th range of the batch's order (topic, partition), so a share's partitions
    are the same from one batch to the next. Pure."""
    n = max(1, min(tasks, len(ranges)))
    return [share for share in (ranges[i::n] for i in range(n)) if share]


#: ``read_path: executors``: each Python worker's reader, kept between the tasks it runs (Spark reuses its Python
#: workers, ``spark.python.worker.reuse``): its consumer's connections stay up, and a partition whose next range
#: comes to the same worker continues where it stood. A range that does not continue seeks (DirectReader).
_TASK_READERS: dict[tuple[str, str | None], DirectReader] = {}


def task_reader(cluster: ClusterConfig, group: str, consumer_group: str | None) -> DirectReader:
    """This Python worker's reader of ``group``'s source (a new one when the source's settings changed)."""
    key = (group, consumer_group)
    reader = _TASK_READERS.get(key)
    if reader is not None and reader.cluster != cluster:
        reader.close()
        reader = None
    if reader is None:
        reader = _TASK_READERS[key] = DirectReader(cluster, group, consumer_group=consumer_group)
    return reader


def task_writer(plan: Any, cluster: ClusterConfig, group: str, consumer_group: str | None = None,
                slots_used: int = 1, attempt: Callable[[], int] | None = None
                ) -> Callable[[Iterable[tuple[int, list[Range]]]], Iterable[dict[str, Any]]]:
    """``read_path: executors``: the function a Spark task runs on its share of a micro-batch's ranges (``(slot,
    ranges)``, :func:`task_shares` numbered): read them from the source with this Python worker's reader and
    write them as the driver's :func:`write_ranges` does: a transaction per partition, or with ``transactions:
    per_writer`` a transaction per share (the share's writer ids follow its ``slot``, of ``slots_used``).
    Yields the writer's result rows. A task that fails is run again by Spark; its exactly_once writers skip
    what is already on the destination (their committed positions), as Spark's read path's tasks do.
    ``attempt()``, called in the task, says which attempt of it this is (0: the first; a retry writes as
    :func:`write_ranges_per_writer` says)."""

    def run(shares: Iterable[tuple[int, list[Range]]]) -> Iterable[dict[str, Any]]:
        quiet_gc()
        reader = task_reader(cluster, group, consumer_group)
        retry = attempt is not None and attempt() > 0
        for slot, ranges in shares:
            yield from write_ranges(plan, ranges, reader, slot=slot, slots_used=slots_used, in_task=True,
                                    retry=retry)

    return run


@dataclass
class Kept:
    """What :func:`keep_on` wrote after a batch's own ranges: its rows (one per partition written, merged over
    the writes), where each partition stands (``at``: where the next batch is to read from), the number of
    writes, the writes whose rows show a partition read from past its range's start or not at all (``gaps``:
    ``(starts, ends, rows)`` of those partitions, for
    :meth:`~mirror_core.stream.MirrorRuntime.report_expired`) and why it ended (``span``, ``stop``, or, when
    the rest is left to Spark's batches, ``backlog``, ``moved back`` or ``no answer``)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    at: dict[tuple[str, int], int] = field(default_factory=dict)
    writes: int = 0
    gaps: list[tuple[dict[str, dict[int, int]], dict[str, dict[int, int]], list[dict[str, Any]]]] = field(
        default_factory=list)
    ended: str = "span"

    def absorb(self, other: Kept) -> None:
        """Add another writer process's (its partitions are not this one's); an early end is kept."""
        self.rows += other.rows
        self.at.update(other.at)
        self.writes += other.writes
        self.gaps += other.gaps
        if other.ended not in ("span", "stop") or self.ended == "span":
            self.ended = other.ended


def keep_on(plan: Any, at: dict[tuple[str, int], int], span: float,
            stable_ends: Callable[[dict[tuple[str, int], int]], dict[tuple[str, int], int] | None],
            write: Callable[[Any, list[Range]], list[dict[str, Any]]], stopped: Callable[[], bool],
            limit: int, poll: float | None = None) -> Kept:
    """``spark.keep_writing_for``: write what arrives on the partitions of ``at`` (where each stands), a range
    per partition from there to its last stable offset (``stable_ends(where each stands)``: None when the
    source did not answer) through ``write`` with a plan whose ends are that write's, for ``span`` seconds or
    until ``stopped()``; ask again after ``poll`` seconds (:data:`KEEP_WRITING_POLL`; 0 for a
    ``stable_ends`` that waits for records itself, :meth:`DirectReader.arrived`) when nothing arrived. Ends
    early, leaving the rest to Spark's batches, when more than ``limit`` offsets arrived at once (a backlog),
    an end moved back (topic re-created, log truncated) or the source did not answer. Run by the driver, or by
    each writer process for its own partitions (:meth:`WriterPool.keep`), so that one process's write never
    waits for another's."""
    kept = Kept(at=dict(at))
    deadline = time.monotonic() + span
    while kept.at:
        if stopped():
            kept.ended = "stop"
            break
        left = deadline - time.monotonic()
        if left <= 0:
            break
        stable = stable_ends(dict(kept.at))
        if stable is None:
            kept.ended = "no answer"
            break
        if any(end < kept.at[k] for k, end in stable.items()):
            kept.ended = "moved back"
            break
        new = {k: end for k, end in stable.items() if end > kept.at[k]}
        if sum(end - kept.at[k] for k, end in new.items()) > limit:
            kept.ended = "backlog"
            break
        if not new:
            pause = KEEP_WRITING_POLL if poll is None else poll
            if pause > 0:
                time.sleep(min(pause, left))
            continue
        starts, ends = _by_topic({k: kept.at[k] for k in new}), _by_topic(new)
        got = write(replace(plan, end_offsets=ends, rewound={}), batch_ranges(starts, ends))
        _note_gaps(kept, starts, ends, got)
        kept.rows = merge_rows(kept.rows, got)
        kept.at.update(new)
        kept.writes += 1
    return kept


def _note_gaps(kept: Kept, starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]],
               rows: list[dict[str, Any]]) -> None:
    """Keep for the expired-record check the partitions of a write read from past their start or not at all."""
    first: dict[tuple[str, int], int | None] = {(r["topic"], r["partition"]): r.get("first_offset") for r in rows}
    gap = [(t, p) for t, parts in starts.items() for p, start in parts.items()
           if (read := first.get((t, p))) is None or read > start]
    if gap:
        keys = set(gap)
        kept.gaps.append((_by_topic({k: starts[k[0]][k[1]] for k in gap}),
                          _by_topic({k: ends[k[0]][k[1]] for k in gap}),
                          [r for r in rows if (r["topic"], r["partition"]) in keys]))


def _by_topic(offsets: dict[tuple[str, int], int]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for (t, p), o in offsets.items():
        out.setdefault(t, {})[p] = o
    return out


def stable_ends(admin: Any, keys: list[tuple[str, int]], group: str,
                timeout: float = KEEP_WRITING_TIMEOUT) -> dict[tuple[str, int], int] | None:
    """The source's last stable offsets of ``keys`` (one ListOffsets per leader, read_committed), or None when
    it did not answer within ``timeout`` (logged at debug: the batch returns to Spark, which asks again)."""
    from confluent_kafka import KafkaException

    try:
        return clients.latest_offsets(admin, keys, committed=True, timeout=timeout)
    except KafkaException as exc:
        log.debug("%s: the source's offsets: %s", group, exc)
        return None

#: fields of a written range's row (``BatchResult``) taken from the first piece of a partition / the last one
_FIRST_FIELDS = ("first_offset",)
_LAST_FIELDS = ("last_offset", "upstream_end", "last_downstream")


def merge_rows(rows: list[dict[str, Any]], later: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of two writes of the same batch, one per partition: counts and times added, the first offset
    from the earlier write, positions from the later one, latencies joined (the last 400). Pure."""
    out = {(r["topic"], r["partition"]): dict(r) for r in rows}
    for r in later:
        key = (r["topic"], r["partition"])
        have = out.get(key)
        if have is None:
            out[key] = dict(r)
            continue
        for k, v in r.items():
            if k in ("topic", "partition"):
                continue
            if k in _FIRST_FIELDS:
                have[k] = have.get(k) if have.get(k) is not None else v
            elif k in _LAST_FIELDS:
                have[k] = v if v is not None else have.get(k)
            elif isinstance(v, list):
                have[k] = ((have.get(k) or []) + v)[-400:]
            elif isinstance(v, (int, float)) and not isinstance(v, bool) and isinstance(have.get(k), (int, float)):
                have[k] = have[k] + v
            else:
                have[k] = v
    return list(out.values())


class _Stopped(Exception):
    """A writer failed: the read stops (the writer's error is raised)."""


#: a worker process checks this often whether the job that started it is still there
PARENT_CHECK_SECONDS = 0.5


class WriterPool:
    """The direct path on more than one core: ``processes`` long-lived writer processes, each with its own
    source consumer, producers and positions (its own GIL), and each owning a fixed share of the partitions.

    One Python process reads and writes about 110,000 100-byte records a second here, bound by its GIL
    (consume and produce cost some 3 and 2 us a record in confluent-kafka); the brokers and Spark's
    planning use little of a second core. A partition always goes to the same process while the job runs,
    so its transactional producer, position and consumer fetch stay warm; a partition new to the job goes to
    the process with the fewest. A batch is written when every process has written its share: a failure in
    one is raised once all have stopped (the others' partitions are committed, and a replay skips them by
    position, as when a partition writer fails in one process).

    The workers are started with this interpreter (``python -m mirror_core.direct``); their configuration,
    which holds the cluster's secrets, goes over a private socket, never the command line. A worker whose
    job is gone (even a SIGKILL) exits within :data:`PARENT_CHECK_SECONDS`; its open transactions are
    aborted when the next job's producers fence them."""

    def __init__(self, cluster: ClusterConfig, group: str, processes: int, threads: int = 8,
                 consumer_group: str | None = None):
        self.cluster = cluster
        self.group = group
        self.processes = processes
        self.threads = threads
        self.consumer_group = consumer_group
        self._workers: list[_Worker] = []
        self._owner: dict[tuple[str, int], int] = {}
        #: the processes' keep left running by :meth:`keep` (``leave_running``)
        self._keeping: _Keeping | None = None

    def _start(self) -> list[_Worker]:
        if not self._workers:
            verbose = logging.getLogger("mirror_core").isEnabledFor(logging.DEBUG)
            self._workers = [_Worker.start(i, (self.cluster, self.group, self.consumer_group, self.threads, verbose,
                                               i, self.processes))
                             for i in range(self.processes)]
        return self._workers

    def _idle(self) -> list[_Worker]:
        """The started processes, for a new request: none may be left keeping on (see :meth:`end_keep`)."""
        if self._keeping is not None:
            raise RuntimeError("the writer processes are still keeping on: end_keep() first")
        return self._start()

    def _share(self, keys: Iterable[tuple[str, int]]) -> list[list[tuple[str, int]]]:
        """Each worker's partitions of ``keys``; a partition not seen before goes to the worker with fewest."""
        load = [0] * self.processes
        for w in self._owner.values():
            load[w] += 1
        out: list[list[tuple[str, int]]] = [[] for _ in range(self.processes)]
        for key in sorted(set(keys)):
            owner = self._owner.get(key)
            if owner is None:
                owner = self._owner[key] = min(range(self.processes), key=lambda i: (load[i], i))
                load[owner] += 1
            out[owner].append(key)
        return out

    def warm(self, plan: Any) -> None:
        """Start every process and have each start its partitions' producers and read their positions, in the
        background of the driver (it does not wait): the first batch finds them ready."""
        keys = [(s.source_topic, p) for s in plan.settings.values() for p in range(s.source_partitions)]
        for w, share in zip(self._start(), self._share(keys), strict=True):
            w.send(("warm", plan, share))

    def write(self, plan: Any, ranges: list[Range]) -> list[dict[str, Any]]:
        """Write a micro-batch's ranges, each by the process that owns its partition; the rows of all."""
        workers = self._idle()
        shares = self._share((r.topic, r.partition) for r in ranges)
        by_key = {(r.topic, r.partition): r for r in ranges}
        busy = []
        for w, share in zip(workers, shares, strict=True):
            if share:
                w.send(("write", plan, [by_key[k] for k in share]))
                busy.append(w)
        rows: list[dict[str, Any]] = []
        failure: BaseException | None = None
        for w in busy:
            try:
                rows += w.result()
            except BaseException as exc:  # noqa: BLE001 - the others finish first: nothing is left mid-write
                failure = failure or exc
        if failure is not None:
            raise failure
        return rows

    def keep(self, plan: Any, at: dict[tuple[str, int], int], span: float, limit: int,
             stopped: Callable[[], bool], leave_running: bool = False) -> Kept | None:
        """:func:`keep_on` in each process for the partitions of ``at`` it owns (``limit`` shared out), the
        processes writing independently; once one ends early (a backlog, a move back, no answer, a failure) or
        ``stopped()``, the others are asked to stop after their write. What all wrote; a failure is raised
        once all have stopped. ``leave_running``: when the span is over and none ended early, the processes
        are left writing (None is returned) until :meth:`end_keep`, which every other request waits for."""
        import math

        workers = self._idle()
        shares = [(w, share) for w, share in zip(workers, self._share(at), strict=True) if share]
        keeping = _Keeping(Kept(at=dict(at)))
        for w, share in shares:
            w.send(("keep", plan, ({k: at[k] for k in share}, math.inf if leave_running else span,
                                   max(1, limit // len(shares)))))
            keeping.busy[w.conn] = w
        deadline = time.monotonic() + span
        while keeping.busy:
            keeping.take(KEEP_WRITING_POLL * 5)
            if keeping.busy and not keeping.asked and (keeping.early or stopped()):
                keeping.ask_all()
            if keeping.busy and not keeping.asked and leave_running and time.monotonic() >= deadline:
                self._keeping = keeping
                return None
        return keeping.result()

    def end_keep(self) -> Kept | None:
        """Ask the processes left writing by :meth:`keep` to stop after their write; what all wrote since that
        keep began (None when none was left writing). A failure is raised once all have stopped."""
        keeping, self._keeping = self._keeping, None
        if keeping is None:
            return None
        keeping.ask_all()
        while keeping.busy:
            keeping.take(KEEP_WRITING_POLL * 5)
        return keeping.result()

    def close(self) -> None:
        """Ask every process to end (one still keeping on stops after its write; what it wrote is not
        reported), and wait a little for them (a stuck one is killed)."""
        if self._keeping is not None:
            try:
                self.end_keep()
            except Exception as exc:  # noqa: BLE001 - closing: what failed is already written or fenced
                log.warning("%s: a writer process failed while keeping on: %s", self.group, exc)
        workers, self._workers = self._workers, []
        self._owner.clear()
        for w in workers:
            w.close()


class _Keeping:
    """The driver's side of a :meth:`WriterPool.keep`: the processes still writing (by their pipe), what those
    that answered wrote, the first failure, whether one ended early and whether all were asked to stop."""

    def __init__(self, kept: Kept):
        self.kept = kept
        self.busy: dict[Any, _Worker] = {}
        self.failure: BaseException | None = None
        self.early = False
        self.asked = False

    def take(self, timeout: float) -> None:
        """Take the answers that come within ``timeout``."""
        from multiprocessing.connection import wait

        for conn in wait(list(self.busy), timeout=timeout):
            w = self.busy[conn]
            if w.pending > 1:
                w.settle_one()  # a warm-up's answer, before the keep's
                continue
            del self.busy[conn]
            try:
                got = w.result()
                self.kept.absorb(got)
                self.early = self.early or got.ended not in ("span", "stop")
            except BaseException as exc:  # noqa: BLE001 - the others stop first: nothing is left mid-write
                self.failure, self.early = self.failure or exc, True

    def ask_all(self) -> None:
        """Ask the processes still writing to stop after their write."""
        if not self.asked:
            self.asked = True
            for w in self.busy.values():
                w.ask_to_stop()

    def result(self) -> Kept:
        if self.failure is not None:
            raise self.failure
        return self.kept


class _Worker:
    """The driver's end of one writer process: requests go out in order, each answered once."""

    def __init__(self, index: int, proc: Any, conn: Any):
        self.index = index
        self.proc = proc
        self.conn = conn
        #: requests sent and not answered yet (the answer of a "warm" is read before the next result)
        self.pending = 0

    @classmethod
    def start(cls, index: int, setup: tuple[Any, ...]) -> _Worker:
        import socket
        import subprocess
        import sys
        from multiprocessing.connection import Connection

        ours, theirs = socket.socketpair()
        proc = subprocess.Popen([sys.executable, "-m", "mirror_core.direct", str(theirs.fileno())],
                                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        theirs.close()
        conn = Connection(ours.detach())
        conn.send(("setup", *setup))  # not answered
        return cls(index, proc, conn)

    def send(self, request: tuple[Any, ...]) -> None:
        try:
            self.conn.send(request)
        except OSError as exc:
            raise KafkaOperationError(f"direct writer process {self.index} is gone "
                                      f"(exit code {self.proc.poll()}): {exc}") from None
        self.pending += 1

    def _answer(self) -> Any:
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            code = self.proc.wait(10)
            raise KafkaOperationError(f"direct writer process {self.index} ended (exit code {code}) "
                                      f"before answering; see its lines above") from None
        finally:
            self.pending -= 1
        if status == "ok":
            return payload
        raise payload

    def settle_one(self) -> None:
        """Read the answer to an earlier request (a warm-up: a failure is only a lost head start)."""
        try:
            self._answer()
        except Exception as exc:  # noqa: BLE001 - a failed warm-up is only a lost head start
            log.warning("direct writer process %d: warm-up failed: %s", self.index, exc)

    def result(self) -> Any:
        """The answer to the last request (answers to earlier ones, such as a warm-up, are waited for first)."""
        while self.pending > 1:
            self.settle_one()
        return self._answer()

    def ask_to_stop(self) -> None:
        """Ask a process that keeps writing (a "keep" request) to stop after its write; not answered (a process
        that has already answered finds the request before its next one and passes over it)."""
        try:
            self.conn.send(("stop", None, None))
        except OSError:
            pass  # gone: its answer says so

    def close(self) -> None:
        import subprocess

        try:
            self.conn.send(None)
        except OSError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.conn.close()


def _transportable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (so the driver raises the same type and text), else a plain
    :class:`KafkaOperationError` with its type and text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc.with_traceback(None)
    except Exception:  # noqa: BLE001 - anything that does not pickle travels as text
        return KafkaOperationError(f"{type(exc).__name__}: {exc}")


def _warm(bw: Any, keys: list[tuple[str, int]], threads: int, slot: int = 0, slots_used: int = 1,
          stop: threading.Event | None = None) -> None:
    """Start each partition's producer and read its position (a failure is logged: only a head start). With
    ``transactions: per_writer``: fence the writer ids the job does not use and each partition's own id, read
    the positions, and start this writer's (``slot``) producers."""
    from mirror_core.replicate import WriterTransaction

    shared = bw.plan.transactions == "per_writer"
    failed: list[tuple[tuple[str, int], BaseException]] = []

    def one(key: tuple[str, int]) -> None:
        if stop is not None and stop.is_set():
            return
        try:
            bw.prepare(*key)
        except Exception as exc:  # noqa: BLE001 - the first write tries again
            failed.append((key, exc))

    t0 = time.monotonic()
    if shared:
        # a fence per partition is a round trip on a producer of its own: 64 threads fence 500 partitions in
        # about 2 s on this machine (the positions are then read in one lookup a topic)
        threads = max(threads, min(WARM_THREADS_PER_WRITER, len(keys)))
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="mirrorflow-warm-up") as pool:
        if shared:
            txn = WriterTransaction(bw.plan.settings.values(), slot, slots_used,
                                    producers=bw.plan.writer_producers)
            alo = WriterTransaction(bw.plan.settings.values(), slot, slots_used, delivery="at_least_once")
            try:
                txn.fence_unused()
                for writer in (txn, alo):
                    if writer.txid:
                        writer.producer()
            except Exception as exc:  # noqa: BLE001 - the first write tries again
                log.warning("%s: warm-up of writer %d failed: %s", bw.plan.group, slot, exc)
            failed.extend(bw.prepare_shared_many(keys, pool, stop))
        else:
            list(pool.map(one, keys))
    warm_failures(bw.plan.group, failed, len(keys))
    log.debug("%s: %d partition writers ready in %.1fs", bw.plan.group, len(keys), time.monotonic() - t0)


def warm_failures(group: str, failed: list[tuple[tuple[str, int], BaseException]], total: int) -> None:
    """One warning for the partitions a warm-up could not start (not one per partition: with thousands of
    partitions on a topic whose leaders are not ready yet, that was thousands of lines)."""
    if not failed:
        return
    (topic, part), exc = min(failed, key=lambda f: f[0])
    kinds = sorted({type(e).__name__ for _, e in failed})
    log.warning("%s: warm-up could not start %d of %d partitions (first %s[%d]: %s; %s); their first write "
                "tries again", group, len(failed), total, topic, part, exc, ", ".join(kinds))


def _watch_parent(parent: int) -> None:
    import os

    while True:
        time.sleep(PARENT_CHECK_SECONDS)
        if os.getppid() != parent:
            os._exit(70)  # the job is gone: its open transactions are fenced by the next job


def serve(fd: int) -> int:
    """A writer process of :class:`WriterPool`: answer requests on the socket ``fd`` until told to end."""
    import signal
    from multiprocessing.connection import Connection

    from mirror_core.logs import setup_logging

    # a stop is the job's to handle (it lets the running batch finish, then ends its workers); a Ctrl-C or a
    # signal to the whole process group must not end a worker mid-batch
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="mirrorflow-parent-watch", daemon=True).start()
    conn = Connection(fd)
    _, cluster, group, consumer_group, threads, verbose, slot, slots_used = conn.recv()
    setup_logging(verbose)
    quiet_gc()
    answer(conn, cluster, group, consumer_group, threads, slot, slots_used)
    return 0


def answer(conn: Any, cluster: ClusterConfig, group: str, consumer_group: str | None, threads: int, slot: int,
           slots_used: int) -> None:
    """A writer process's requests on ``conn``, each answered once (a "stop" never: see
    :meth:`_Worker.ask_to_stop`), until told to end or the driver is gone."""
    from mirror_core.stream import BatchWriter

    reader = DirectReader(cluster, group, consumer_group=consumer_group)

    def stopped() -> bool:
        try:
            if not conn.poll(0):
                return False
            conn.recv()  # the driver sends nothing else while this process keeps writing
        except EOFError:
            pass  # the driver is gone: stop after this write (the answer then finds no one to read it)
        return True

    try:
        while (request := conn.recv()) is not None:
            kind, plan, work = request
            if kind == "stop":
                continue  # asked to stop a "keep" that had already ended
            try:
                if kind == "warm":
                    _warm(BatchWriter(plan), work, threads, slot, slots_used)
                    conn.send(("ok", None))
                elif kind == "keep":
                    at, span, limit = work
                    # what arrived is what the reader's consumer fetched: no request to the source per write
                    conn.send(("ok", keep_on(plan, at, span, lambda at: reader.arrived(at, KEEP_WRITING_POLL),
                                             lambda p, r: write_ranges(p, r, reader, threads, slot, slots_used),
                                             stopped, limit, poll=0)))
                else:
                    conn.send(("ok", write_ranges(plan, work, reader, threads, slot, slots_used)))
            except BaseException as exc:  # noqa: BLE001 - every failure goes back to the driver
                conn.send(("err", _transportable(exc)))
    except (EOFError, ConnectionError):
        pass  # the driver is gone (while this process waited for a request, or when it answered)
    finally:
        reader.close()

if __name__ == "__main__":
    import sys

    # run from the module itself, not this __main__ copy: what a worker sends (Kept, exceptions of its own) is
    # pickled by its class's module, and the driver knows it as mirror_core.direct
    from mirror_core.direct import serve as _serve

    raise SystemExit(_serve(int(sys.argv[1])))
