"""Where a partition writer resumes: the newest committed offset sync of its (source partition, destination).

Two promises, each a defect of the lookup before issue 11:

* **Its own position.** Syncs are MirrorMaker 2 ``OffsetSync`` records keyed by (source topic, partition)
  only, and the sync topic is shared by every group reading one source cluster. Two mirrors of one source
  topic (``orders -> orders`` and ``orders -> orders-archive``) would take each other's position. Every
  sync the writer emits therefore carries the header :data:`DESTINATION_HEADER` (the destination topic);
  MM2's readers ignore headers, so the format stays MM2's. The lookup takes the newest sync whose header
  names its destination. A sync without the header was written by an earlier release: it is a
  :class:`LegacySync`, taken only when nothing newer names the destination (see the writer's
  ``_position`` for how it is checked and the old transactional id fenced).
* **Every transaction that ended before the lookup started.** A read_committed consumer stops at the
  partition's last stable offset (LSO): a transaction still open there (another partition's commit in
  flight, a killed writer's zombie until it times out, another group's job sharing the sync topic) hides
  every sync committed after its first record, and a lookup that stopped there would return an older
  position and write the replayed range again. The lookup reads the high watermark first and waits until
  the LSO has passed it (every transaction with a record below it has ended), up to ``settle_timeout``,
  then fails with one clear line instead of guessing. The writer fences its own partition's earlier
  producers (``init_transactions``) before it looks up, so its own zombie never makes it wait.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from mirror_core import clients
from mirror_core.errors import KafkaOperationError, MirrorError
from mirror_core.logs import LIBRDKAFKA_LOG
from mirror_core.offsets import OffsetFormatError, OffsetSync

log = logging.getLogger(__name__)

#: header of every offset sync the writer emits: the destination topic the sync's positions are in
DESTINATION_HEADER = "mirrorflow.destination"

#: how long a lookup waits for transactions open on the sync partition to end: longer than the writers'
#: 60 s transaction timeout plus the broker's 10 s abort check, so a zombie's transaction always ends first
SETTLE_TIMEOUT_S = 120.0


class PositionLookupError(MirrorError):
    """The committed position cannot be established (missing sync topic, transactions that never end)."""


@dataclass(frozen=True, order=True)
class LegacySync(OffsetSync):
    """A sync without :data:`DESTINATION_HEADER`: written before syncs named their destination, so it may
    belong to another mirror of the same source topic."""


#: header of a sync whose downstream offset is only where its writer resumes, not a translation: the position
#: follows records the loop guard skipped, with nothing mirrored since (:data:`mirror_core.offsets.SYNC_INVARIANT`,
#: case 4). The writer resumes from it as from any sync; translation places it through the reverse flow's syncs.
#: Readers that ignore headers (earlier releases, MM2's) read the sync as before.
POSITION_ONLY_HEADER = "mirrorflow.position_only"


def sync_headers(destination_topic: str, position_only: bool = False) -> list[tuple[str, bytes]]:
    """The headers of a sync the writer of ``destination_topic`` emits (``position_only``: see
    :data:`POSITION_ONLY_HEADER`)."""
    return [(DESTINATION_HEADER, destination_topic.encode())] + ([(POSITION_ONLY_HEADER, b"1")] if position_only
                                                                  else [])


def sync_from_record(key: bytes | None, value: bytes | None,
                     headers: list[tuple[str, bytes | None]] | None) -> OffsetSync:
    """An offset-sync record with what its headers add (:data:`POSITION_ONLY_HEADER`); raises
    :class:`~mirror_core.offsets.OffsetFormatError` on malformed bytes."""
    sync = OffsetSync.from_record(key, value)
    if any(name == POSITION_ONLY_HEADER for name, _ in headers or ()):
        return dataclasses.replace(sync, position_only=True)
    return sync


#: header of a copy of a partition's newest sync, written by the offset round so that an idle partition keeps
#: its position past the sync topic's retention (:func:`mirror_core.checkpoint.refresh_idle_syncs`): a lookup
#: never takes one for a writer's position (a copy can land after a newer sync the writer committed meanwhile)
REFRESH_HEADER = "mirrorflow.refresh"


def is_refresh(headers: list[tuple[str, bytes | None]] | None) -> bool:
    """Whether a sync record is a refresh copy (:data:`REFRESH_HEADER`)."""
    return any(name == REFRESH_HEADER for name, _ in headers or ())


def sync_destination(headers: list[tuple[str, bytes | None]] | None) -> str | None:
    """The destination a sync record names, or None for a sync written before syncs named it."""
    for name, value in headers or ():
        if name == DESTINATION_HEADER and value is not None:
            return value.decode(errors="replace")
    return None


def _consumer(consumer_config: dict[str, Any], isolation: str) -> Consumer:
    return Consumer(consumer_config | {
        "group.id": "mirrorflow-position-lookup", "enable.auto.commit": False,
        "isolation.level": isolation, "log_level": 3, "logger": LIBRDKAFKA_LOG, "enable.partition.eof": True,
        # the scan ends at the partition's end, where a fetch would otherwise wait 500 ms for more data
        "fetch.wait.max.ms": 10,
    })


#: ``MIRRORFLOW_LOOKUP_POOL=0``: every lookup on consumers of its own, as before 7 December (an A/B of the pool)
LOOKUP_POOL_ENV = "MIRRORFLOW_LOOKUP_POOL"
#: idle consumers kept per (cluster config, isolation level) in a process (more lookups may run at once; what
#: they took beyond this is closed afterwards)
LOOKUP_POOL_MAX = 8
#: an idle consumer unused this long is closed rather than used again: it would hold connections, and TLS
#: material read at its start, for as long as the process lives
LOOKUP_IDLE_S = 60.0
_IDLE: dict[tuple[Any, ...], list[tuple[float, Consumer]]] = {}
_IDLE_GUARD = threading.Lock()
#: a forked child's copies of its parent's consumers: never used, and never freed (freeing one waits for
#: librdkafka threads that were not forked)
_FORKED_AWAY: list[object] = []


def _pool_key(consumer_config: dict[str, Any], isolation: str) -> tuple[Any, ...] | None:
    """The pool's key for a config (its values as given, secrets too, in this process's memory only), or None
    when a value is not plain data (a callback, a logger: compared by identity, a new one at each call would
    never find a consumer again): no pooling then."""
    if not all(isinstance(v, (str, int, float, bool)) for v in consumer_config.values()):
        return None
    return (isolation, *sorted(consumer_config.items()))


def _drain(c: Consumer) -> None:
    """What an idle consumer's queue gathered (connection errors while it was idle): taken and dropped, so that
    the next lookup's reads start clean."""
    while c.consume(100, 0):
        pass


@contextmanager
def lookup_consumer(consumer_config: dict[str, Any], isolation: str) -> Iterator[Consumer]:
    """A consumer for position lookups (:func:`_consumer`), this thread's alone while in the block: one this
    process kept from an earlier lookup (idle less than :data:`LOOKUP_IDLE_S`), else a new one; kept afterwards,
    unassigned, unless the block failed. A Spark task reads its partitions' positions at every micro-batch
    (``transactions: per_writer``) or when they moved to its Python worker: a lookup of 3 partitions took
    138-146 ms on the local clusters, 57-59 ms of it for each consumer it made, asked metadata of and closed
    (two a lookup, 6 December; bench/lookup.py)."""
    key = _pool_key(consumer_config, isolation) if os.environ.get(LOOKUP_POOL_ENV) != "0" else None
    c: Consumer | None = None
    stale: list[Consumer] = []
    if key is not None:
        now = time.monotonic()
        with _IDLE_GUARD:
            idle = _IDLE.get(key, [])
            stale = [old for since, old in idle if now - since > LOOKUP_IDLE_S]
            idle[:] = [(since, kept) for since, kept in idle if now - since <= LOOKUP_IDLE_S]
            c = idle.pop()[1] if idle else None
    for old in stale:
        old.close()
    if c is not None:
        try:
            _drain(c)
        except Exception:  # noqa: BLE001 - a kept consumer that cannot be used is replaced
            c.close()
            c = None
    if c is None:
        c = _consumer(consumer_config, isolation)
    keep = False
    try:
        yield c
        if key is not None:
            try:
                c.unassign()  # what a scan fetched ahead goes with its assignment
                keep = True
            except Exception:  # noqa: BLE001 - the lookup stands; the consumer is closed, not kept
                keep = False
    finally:
        if keep:
            with _IDLE_GUARD:
                idle = _IDLE.setdefault(key, [])  # type: ignore[arg-type]
                if len(idle) < LOOKUP_POOL_MAX:
                    idle.append((time.monotonic(), c))
                    c = None
        if c is not None:
            c.close()


def close_idle_lookups() -> None:
    """Close this process's idle lookup consumers."""
    with _IDLE_GUARD:
        idle = [c for cs in _IDLE.values() for _since, c in cs]
        _IDLE.clear()
    for c in idle:
        c.close()


def _after_fork() -> None:
    """A forked child must not use its parent's clients (their threads stayed behind): it starts with none, and
    keeps its copies of them referenced, so that nothing frees one there."""
    global _IDLE_GUARD
    _FORKED_AWAY.extend(c for cs in _IDLE.values() for _since, c in cs)
    _IDLE.clear()
    _IDLE_GUARD = threading.Lock()


atexit.register(close_idle_lookups)
os.register_at_fork(after_in_child=_after_fork)


def settled_end(committed: Consumer, uncommitted: Consumer, topic: str, partition: int, timeout: float,
                settle_timeout: float) -> int:
    """:func:`mirror_core.clients.settled_end` for a position lookup: says when it waits, and a transaction
    that never ends is a :class:`PositionLookupError` naming the likely holder."""
    waited = []

    def on_wait(stable: int, high: int) -> None:
        waited.append(True)
        log.info("%s[%d]: waiting for open transactions to end (last stable offset %d, high watermark %d) "
                 "before reading a position", topic, partition, stable, high)

    try:
        stable = clients.settled_end(committed, uncommitted, topic, partition, timeout, settle_timeout, on_wait)
    except clients.TransactionOpenError as exc:
        raise PositionLookupError(
            f"offset-sync topic {topic}[{partition}]: a transaction open below offset {exc.high} (last stable "
            f"offset {exc.stable}) did not end within {settle_timeout:.0f} s, so the newest committed position "
            f"cannot be known; another writer (or a job of another group sharing this sync topic) holds "
            f"a transaction open") from None
    if waited:
        log.info("%s[%d]: open transactions ended (last stable offset %d)", topic, partition, stable)
    return stable


def last_committed_sync(consumer_config: dict[str, Any], syncs_topic: str, topic: str, partition: int,
                        chunk: int = 2000, timeout: float = 30.0, destination: str | None = None,
                        settle_timeout: float = SETTLE_TIMEOUT_S) -> OffsetSync | None:
    """The newest committed offset sync for ``topic``/``partition`` (of ``destination``), or None.

    With ``destination``, only syncs naming it count, and a sync from before syncs named their
    destination comes back as a :class:`LegacySync` when none newer names it. Without, any sync of the
    partition counts (readers that do not care which mirror wrote it). Waits for transactions open on
    the sync topic (:func:`settled_end`), then scans backwards from the end in chunks, so a restart reads
    only the tail in the common case.
    """
    return last_committed_syncs(consumer_config, syncs_topic, topic, [partition], chunk, timeout, destination,
                                settle_timeout)[partition]


def last_committed_syncs(consumer_config: dict[str, Any], syncs_topic: str, topic: str, partitions: list[int],
                         chunk: int = 2000, timeout: float = 30.0, destination: str | None = None,
                         settle_timeout: float = SETTLE_TIMEOUT_S) -> dict[int, OffsetSync | None]:
    """:func:`last_committed_sync` of each of ``topic``'s ``partitions``, in one pass over the sync topic's
    tail: it waits for open transactions once and reads each chunk once, going further back only while a
    partition's sync is still missing. One partition at a time, a writer starting 1,000 partitions read
    the same tail 1,000 times on two new consumers each: 15.6 s for 500 partitions with 64 threads."""
    wanted = set(partitions)
    best: dict[int, OffsetSync | None] = dict.fromkeys(wanted)
    if not wanted:
        return best
    with lookup_consumer(consumer_config, "read_committed") as c, \
            lookup_consumer(consumer_config, "read_uncommitted") as u:
        md = c.list_topics(syncs_topic, timeout=timeout)
        tmd = md.topics.get(syncs_topic)
        if tmd is None or tmd.error is not None:
            raise PositionLookupError(f"offset-sync topic {syncs_topic!r} is missing on the destination; "
                                      f"run provision")
        for p in tmd.partitions:
            low = int(c.get_watermark_offsets(TopicPartition(syncs_topic, p), timeout=timeout)[0])
            end = settled_end(c, u, syncs_topic, p, timeout, settle_timeout)
            found: dict[int, OffsetSync] = {}
            while end > low and len(found) < len(wanted):
                start = max(low, end - chunk)
                for part, sync in _scan(c, syncs_topic, p, start, end, topic, wanted - found.keys(), destination,
                                        timeout).items():
                    found[part] = sync
                end = start
            for part, sync in found.items():
                prev = best[part]
                if prev is None or sync.upstream_offset > prev.upstream_offset:
                    best[part] = sync
        return best


def last_committed_position(consumer_config: dict[str, Any], syncs_topic: str, topic: str, partition: int,
                            chunk: int = 2000, timeout: float = 30.0, destination: str | None = None) -> int | None:
    """The upstream position of the newest committed offset sync for ``topic``/``partition``."""
    sync = last_committed_sync(consumer_config, syncs_topic, topic, partition, chunk, timeout, destination)
    return None if sync is None else sync.upstream_offset


def _scan(c: Consumer, syncs_topic: str, p: int, start: int, end: int, topic: str, partitions: set[int],
          destination: str | None, timeout: float) -> dict[int, OffsetSync]:
    """The last sync of each of ``topic``'s ``partitions`` (of ``destination``) in [start, end) of the sync
    topic's partition ``p``; a partition without one is left out."""
    found: dict[int, OffsetSync] = {}
    try:
        for msg in clients.scan(c, syncs_topic, p, start, end, timeout):
            try:
                sync = sync_from_record(msg.key(), msg.value(), msg.headers())
            except OffsetFormatError as exc:
                # not ours to judge: something else wrote to the topic; it never stops the mirror
                log.warning("%s[%d]@%d is not an offset sync, skipped: %s", syncs_topic, p, msg.offset(), exc)
                continue
            if sync.topic != topic or sync.partition not in partitions or is_refresh(msg.headers()) or \
                    sync.downstream_offset < 0:
                continue  # a run of loop-skipped records opens with one (offsets.UNMAPPED): never a position
            if destination is None:
                found[sync.partition] = sync  # later records in the log supersede earlier ones
                continue
            named = sync_destination(msg.headers())
            if named == destination:
                found[sync.partition] = sync
            elif named is None:
                found[sync.partition] = LegacySync(sync.topic, sync.partition, sync.upstream_offset,
                                                   sync.downstream_offset)
    except KafkaOperationError as exc:
        raise PositionLookupError(str(exc)) from None
    return found


def committed_end_offset(consumer_config: dict[str, Any], topic: str, partition: int,
                         timeout: float = 30.0) -> int:
    """The destination partition's last stable offset (read_committed end): where the next record
    written there lands at the earliest."""
    with lookup_consumer(consumer_config, "read_committed") as c:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)[1])


def high_watermarks(consumer_config: dict[str, Any], topic: str, partitions: list[int],
                    timeout: float = 30.0) -> dict[int, int]:
    """:func:`source_end_offset` of each of ``topic``'s ``partitions``, on one consumer. Read uncommitted: the
    high watermark itself. A read_committed consumer (librdkafka's default) answers with the last stable
    offset, which another producer's open transaction holds back below committed records: a committed position
    then looked past the destination's end, and a replay wrote its batch again (until 7 December)."""
    with lookup_consumer(consumer_config, "read_uncommitted") as c:
        return {p: int(c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]) for p in partitions}


def source_end_offset(consumer_config: dict[str, Any], topic: str, partition: int, timeout: float = 30.0) -> int:
    """A source partition's high watermark (where its next record will be written): a committed position
    beyond it belongs to an earlier incarnation of the topic."""
    return high_watermarks(consumer_config, topic, [partition], timeout)[partition]
