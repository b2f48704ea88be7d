"""The partition writer: mirror one source partition's records to the destination.

Pure Python over confluent-kafka, so it runs (and is tested) without Spark; the
Spark job feeds it from ``mapInArrow``. Per record it keeps key, value, headers,
CreateTime timestamp and, when the destination has at least as many
partitions, the partition number (else the Java-compatible murmur2 key hash).
Tombstones stay tombstones; order within a partition is kept.

Delivery:

* ``exactly_once`` — one transactional producer per source partition with a
  stable ``transactional.id``. Each chunk's records, its dead letters and its
  offset syncs commit in one destination transaction. Before writing, the
  writer looks up the last committed sync for its partition and skips every
  record below that upstream position: Spark replays, task retries and zombie
  tasks (fenced by ``init_transactions``) never duplicate.
* ``at_least_once`` — idempotent producer, ``acks=all``; offset syncs are
  produced only after the records were acknowledged.

A record that cannot be mirrored is never dropped and never blocks the
partition: it goes to the dead-letter topic with its reason and source
coordinates in headers (``on_error: dead_letter``) or fails the task
(``on_error: fail``).
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import itertools
import logging
import operator
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

from mirror_core import native, wire
from mirror_core.clients import fatal_unmasked, latest_offsets, no_answer
from mirror_core.config import (
    WRITER_PRODUCERS_DEFAULT,
    WRITER_PRODUCERS_MAX,
    WRITER_SLOTS,
    transactional_id,
    writer_transactional_id,
)
from mirror_core.errors import MirrorError
from mirror_core.logs import LIBRDKAFKA_LOG, LibrdkafkaLog
from mirror_core.offsets import UNMAPPED, OffsetSync, syncs_for_batch
from mirror_core.partitioner import java_partition
from mirror_core.positions import (
    LegacySync,
    committed_end_offset,
    high_watermarks,
    last_committed_position,
    last_committed_sync,
    last_committed_syncs,
    source_end_offset,
    sync_headers,
)
from mirror_core.redaction import ClientConfig, client_config

__all__ = ["committed_end_offset", "last_committed_position", "last_committed_sync"]  # moved to positions.py

log = logging.getLogger(__name__)

PROVENANCE_HEADER = "mirrorflow.provenance"
DLQ_HEADERS = ("mirrorflow.error.reason", "mirrorflow.error.detail", "mirrorflow.source.topic",
               "mirrorflow.source.partition", "mirrorflow.source.offset", "mirrorflow.mirror",
               "mirrorflow.error.payload_omitted")
SCHEMA_SERDES = ("avro", "protobuf", "json_schema")

Header = tuple[str, bytes | None]


class WriterError(MirrorError):
    """The writer could not complete a chunk (the task fails and Spark retries it)."""


class NotAcknowledged(WriterError):
    """Records of a chunk were neither acknowledged nor reported failed within the writer's wait."""


class DestinationTopicError(WriterError):
    """A mirror's destination topic was deleted (or deleted and re-created) while it mirrored: writing on
    would lose records or scatter them over a topic with other offsets, so the mirror stops."""


#: produce errors that mean the destination topic (or one of its partitions) is not there
_TOPIC_GONE = (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION)


def destination_deleted(s: WriterSettings) -> str:
    """The one line that stops a mirror whose destination topic is gone."""
    return (f"{s.mirror}: destination topic {s.destination_topic} was deleted on cluster {s.destination_alias} "
            f"while mirroring; nothing more is written or committed. Re-create it (mirrorflow provision) and "
            f"start the mirror again; records mirrored before went with the topic (see README, Faults)")


@dataclass(frozen=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int


@dataclass(slots=True)
class Columns:
    """One source partition's records column by column, in offset order: what the Spark job hands the
    writer (built straight from Arrow columns, no object per record). ``headers`` is None when no record
    in it has headers."""

    offsets: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    timestamps: list[int]
    headers: list[tuple[Header, ...]] | None = None

    def __len__(self) -> int:
        return len(self.offsets)

    def slice(self, start: int, stop: int) -> Columns:
        return Columns(self.offsets[start:stop], self.keys[start:stop], self.values[start:stop],
                       self.timestamps[start:stop], None if self.headers is None else self.headers[start:stop])

    def record(self, topic: str, partition: int, i: int) -> SourceRecord:
        return SourceRecord(topic, partition, self.offsets[i], self.keys[i], self.values[i],
                            self.headers[i] if self.headers is not None else (), self.timestamps[i])

    @classmethod
    def concat(cls, parts: list[Columns]) -> Columns:
        """The records of ``parts`` (consecutive pieces of one partition) as one."""
        if len(parts) == 1:
            return parts[0]
        out = cls([], [], [], [], None)
        if any(p.headers is not None for p in parts):
            out.headers = []
        for p in parts:
            out.offsets += p.offsets
            out.keys += p.keys
            out.values += p.values
            out.timestamps += p.timestamps
            if out.headers is not None:
                out.headers += p.headers if p.headers is not None else [()] * len(p)
        return out

    @classmethod
    def from_records(cls, records: Iterable[SourceRecord]) -> Columns:
        recs = list(records)
        headers = [r.headers for r in recs]
        return cls([r.offset for r in recs], [r.key for r in recs], [r.value for r in recs],
                   [r.timestamp_ms for r in recs], headers if any(headers) else None)


@dataclass(frozen=True)
class WriterSettings:
    """Everything a writer needs, picklable so Spark can ship it to executors."""

    group: str
    mirror: str
    source_alias: str
    destination_alias: str
    source_topic: str
    destination_topic: str
    source_partitions: int
    destination_partitions: int
    delivery: Literal["exactly_once", "at_least_once"]
    key_serde: str
    value_serde: str
    on_error: Literal["dead_letter", "fail"]
    dlq_topic: str
    offset_syncs_topic: str
    provenance: bool
    #: the destination's librdkafka config: it holds secrets, so it is a ClientConfig (printed redacted,
    #: as is this object's repr); a plain mapping given here is turned into one
    producer_config: ClientConfig
    #: the destination topic's ``max.message.bytes`` override, when it has one: records whose
    #: single-record batch is larger are dead-lettered before producing (the broker would reject them)
    destination_max_message_bytes: int | None = None
    #: source librdkafka config (contains secrets: never log): lets the writer check a committed position
    #: against the source partition's end (a re-created topic starts again from 0)
    source_consumer_config: ClientConfig | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "producer_config", client_config(self.producer_config))
        if self.source_consumer_config is not None:
            object.__setattr__(self, "source_consumer_config", client_config(self.source_consumer_config))

    @property
    def transactional_id(self) -> str:
        """The stem of this mirror's transactional ids: unambiguous (see :func:`config.transactional_id`)."""
        return transactional_id(self.group, self.source_alias, self.source_topic, self.destination_topic)

    def transactional_id_for(self, partition: int) -> str:
        return f"{self.transactional_id}:{partition}"

    def legacy_transactional_id_for(self, partition: int) -> str:
        """The dotted id releases before issue 11 used (ambiguous): fenced once when a partition's
        newest sync was written by such a release, so an old writer still running cannot commit again."""
        return f"mirrorflow.{self.group}.{self.source_alias}.{self.source_topic}.{self.destination_topic}.{partition}"


@dataclass(frozen=True)
class DeadLetter:
    reason: str  # machine-readable code
    detail: str


@dataclass
class BatchResult:
    topic: str
    partition: int
    records_in: int = 0
    mirrored: int = 0
    bytes_out: int = 0
    replayed_skipped: int = 0
    provenance_skipped: int = 0
    dead_lettered: int = 0
    cache_misses: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    upstream_end: int | None = None
    last_downstream: int | None = None
    latency_ms: list[float] = field(default_factory=list)
    #: where the time went: producer start / position lookup, producing until every ack, committing
    setup_ms: float = 0.0
    produce_ms: float = 0.0
    commit_ms: float = 0.0
    #: records produced by the C loop (:mod:`mirror_core.native`), without a delivery report each
    native_records: int = 0

    def absorb(self, later: BatchResult) -> None:
        """Add the result of the same partition's next piece (written after this one's records)."""
        for name in ("mirrored", "bytes_out", "replayed_skipped", "provenance_skipped", "dead_lettered",
                     "cache_misses", "setup_ms", "produce_ms", "commit_ms", "native_records"):
            setattr(self, name, getattr(self, name) + getattr(later, name))
        if later.last_downstream is not None:
            self.last_downstream = later.last_downstream
        self.latency_ms = (self.latency_ms + later.latency_ms)[-400:]


class SchemaIdTranslator:
    """Source schema id -> destination id, and source GUID -> destination GUID; a miss asks ``resolver``
    (which registers under the mapped subject; its ``guid`` method resolves GUIDs) and extends the cache.
    Either returns None when the reference cannot be resolved, or the resolver's
    :class:`~mirror_core.wire.WireError` when the destination registry refused the schema: the record is
    dead-lettered (a GUID too: passing it through unchanged would leave destination consumers unable to
    decode the record). Only resolved references are cached here; the resolver remembers the others."""

    def __init__(self, id_map: dict[int, int], resolver: Callable[[int], int | wire.WireError | None] | None = None):
        self.id_map = dict(id_map)
        self.resolver = resolver
        self.guid_map: dict[bytes, bytes] = {}
        self.misses = 0  # in all threads
        self._lock = threading.Lock()  # the driver writes a topic's partitions from several threads
        self._local = threading.local()

    def lookup(self, source_id: int) -> int | wire.WireError | None:
        dst = self.id_map.get(source_id)
        if dst is None and self.resolver is not None:
            with self._lock:
                dst = self.id_map.get(source_id)
                if dst is None:
                    self.misses += 1
                    self._local.misses = self.thread_misses() + 1
                    got = self.resolver(source_id)
                    if not isinstance(got, int):
                        return got
                    dst = self.id_map[source_id] = got
        return dst

    def lookup_guid(self, source_guid: bytes) -> bytes | wire.WireError | None:
        dst = self.guid_map.get(source_guid)
        resolve_guid = getattr(self.resolver, "guid", None)
        if dst is None and resolve_guid is not None:
            with self._lock:
                dst = self.guid_map.get(source_guid)
                if dst is None:
                    self.misses += 1
                    self._local.misses = self.thread_misses() + 1
                    got = resolve_guid(source_guid)
                    if not isinstance(got, bytes):
                        return got  # type: ignore[no-any-return]
                    dst = self.guid_map[source_guid] = got
        return dst

    def thread_misses(self) -> int:
        """Misses counted in the calling thread (what one partition's writer caused)."""
        return int(getattr(self._local, "misses", 0))

    def snapshot(self) -> list[tuple[int, int]]:
        with self._lock:
            return list(self.id_map.items())


# --------------------------------------------------------------------------- pure record decisions


@dataclass(frozen=True)
class OutRecord:
    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int


Decision = OutRecord | DeadLetter | Literal["skip_provenance"]


def decide(rec: SourceRecord, s: WriterSettings, translator: SchemaIdTranslator) -> Decision:
    """What to do with one record. Pure apart from the translator's cache."""
    prov = provenance_of(rec.headers)
    if s.provenance and (s.destination_alias in prov or s.source_alias in prov):
        # it came from the destination, or left this source cluster before and was brought back by a
        # reverse flow that adds no header of its own (MirrorMaker 2 copies ours as it is)
        return "skip_provenance"
    key, value = rec.key, rec.value
    headers = rec.headers
    for field_name, serde in (("key", s.key_serde), ("value", s.value_serde)):
        if serde not in SCHEMA_SERDES:
            continue
        data = key if field_name == "key" else value
        if data is None:
            continue
        header_name = f"__{field_name}_schema_id"
        if any(h == header_name and v is not None for h, v in headers):
            # the id travels in a header; the payload is not framed
            new_headers, err = wire.rewrite_header_ids(headers, translator.lookup, only=header_name,
                                                       guid_map=translator.lookup_guid)
            if err is not None:
                return DeadLetter(err.reason, f"{field_name}: {err.detail}")
            headers = new_headers
            continue
        out = wire.translate_payload(data, translator.lookup, translator.lookup_guid)
        if isinstance(out, wire.WireError):
            return DeadLetter(out.reason, f"{field_name}: {out.detail}")
        if field_name == "key":
            key = out
        else:
            value = out
    if s.provenance:
        headers = tuple(h for h in headers if h[0] != PROVENANCE_HEADER) + (
            (PROVENANCE_HEADER, ",".join([*prov, s.source_alias]).encode()),
        )
    if s.destination_partitions >= s.source_partitions:
        partition = rec.partition
    elif key is not None:
        partition = java_partition(key, s.destination_partitions)
    else:
        partition = rec.partition % s.destination_partitions
    limit = s.destination_max_message_bytes
    if limit is not None and not _compressed(s.producer_config):
        size = record_batch_size(key, value, headers)
        if size > limit:
            return DeadLetter("record_too_large",
                              f"{size} bytes as a record batch; {s.destination_topic} accepts {limit} "
                              f"(max.message.bytes)")
    return OutRecord(partition, key, value, headers, rec.timestamp_ms)


def _varint_len(n: int) -> int:
    z = (n << 1) ^ (n >> 63)  # zigzag, as Kafka's record format encodes varints
    length = 1
    while z >= 0x80:
        z >>= 7
        length += 1
    return length


def _bytes_field_len(b: bytes | str | None) -> int:
    if b is None:
        return _varint_len(-1)
    n = len(b.encode() if isinstance(b, str) else b)
    return _varint_len(n) + n


RECORD_BATCH_OVERHEAD = 61  # v2 batch header, including the 12-byte log overhead


def record_batch_size(key: bytes | None, value: bytes | None, headers: tuple[Header, ...]) -> int:
    """Bytes of a v2 record batch holding only this (uncompressed) record: what a broker compares
    with ``max.message.bytes``."""
    body = 1 + 1 + 1  # attributes, timestampDelta 0, offsetDelta 0
    body += _bytes_field_len(key) + _bytes_field_len(value) + _varint_len(len(headers))
    for name, val in headers:
        body += _bytes_field_len(name) + _bytes_field_len(val)
    return RECORD_BATCH_OVERHEAD + _varint_len(body) + body


def _compressed(producer_config: dict[str, Any]) -> bool:
    codec = producer_config.get("compression.type", producer_config.get("compression.codec", "none"))
    return str(codec) not in ("none", "")


def provenance_of(headers: tuple[Header, ...] | list[Header] | None) -> list[str]:
    """The clusters a record came through, oldest first (its provenance header), or [] when it has none."""
    for name, val in headers or ():
        if name == PROVENANCE_HEADER and val:
            return val.decode(errors="replace").split(",")
    return []


def dead_letter_headers(rec: SourceRecord, dl: DeadLetter, mirror: str) -> list[Header]:
    return list(rec.headers) + [
        ("mirrorflow.error.reason", dl.reason.encode()),
        ("mirrorflow.error.detail", dl.detail.encode()[:1000]),
        ("mirrorflow.source.topic", rec.topic.encode()),
        ("mirrorflow.source.partition", str(rec.partition).encode()),
        ("mirrorflow.source.offset", str(rec.offset).encode()),
        ("mirrorflow.mirror", mirror.encode()),
    ]


#: a dead letter larger than this (as a record batch) keeps its reason and source coordinates but not its
#: payload: the broker's default limit is 1 MiB, and a dead letter that cannot be written would stop the
#: partition. The record itself stays on the source, where the coordinates point.
DLQ_MAX_BYTES = 1_000_000


def dead_letter_record(rec: SourceRecord, dl: DeadLetter, mirror: str
                       ) -> tuple[bytes | None, bytes | None, list[Header]]:
    """Key, value and headers of ``rec``'s dead letter (see :data:`DLQ_MAX_BYTES`)."""
    headers = dead_letter_headers(rec, dl, mirror)
    if record_batch_size(rec.key, rec.value, tuple(headers)) <= DLQ_MAX_BYTES:
        return rec.key, rec.value, headers
    omitted = (f"key {len(rec.key or b'')} B, value {len(rec.value or b'')} B, {len(rec.headers)} headers: "
               f"too large for the dead-letter topic; read it at the source coordinates").encode()
    return None, None, headers[len(rec.headers):] + [("mirrorflow.error.payload_omitted", omitted)]


# --------------------------------------------------------------------------- producers and positions


@dataclass(frozen=True)
class Position:
    """Where a partition's mirror stands: the next upstream offset to read and, when known, the
    downstream position (next offset) that the newest committed offset sync maps it to."""

    upstream: int
    downstream: int | None = None
    #: ``downstream`` is only where the writer resumes, not a translation (the newest sync is position-only:
    #: it follows records the loop guard skipped with nothing mirrored since; see :func:`loop_marked_syncs`)
    position_only: bool = False


#: the cyclic garbage collector's youngest-generation threshold in a process that reads and writes records
#: (Python's default is 700; see :func:`quiet_gc`)
GC_THRESHOLD = 100_000


def quiet_gc() -> None:
    """Make the cyclic garbage collector run rarely in this process (once; ``MIRRORFLOW_GC=0`` leaves
    Python's defaults, for an A/B).

    Every record read, and every delivery report, is a new container object (confluent-kafka's ``Message``);
    Python runs a collection of its youngest generation every 700 net new containers, moving the survivors
    (the records of a chunk not written yet) into the older generations, which are then traversed again and
    again: in a sampling profile of a 100-byte drain a fifth of a writer process's CPU went to the collector.
    Records are freed by reference counting as soon as their chunk is written; the collector only reclaims
    reference cycles, which the data path does not make per record, so collecting every :data:`GC_THRESHOLD`
    new containers frees the same cycles a little later. What the process holds once started (modules,
    clients) is frozen out of the collections altogether."""
    global _gc_quiet
    if _gc_quiet or os.environ.get("MIRRORFLOW_GC", "1") == "0":
        return
    _gc_quiet = True
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])


_gc_quiet = False


#: what a writer's ``position_lookup`` returns: the newest committed sync, a bare upstream offset, or None
PositionLookup = Callable[[str, int], "OffsetSync | int | None"]
#: the same for several partitions of one topic at once (one pass over the sync topic's tail)
PositionsLookup = Callable[[str, list[int]], "dict[int, OffsetSync | int | None]"]


class _PositionTable(dict[str, "Position"]):
    """The positions this process knows, by transactional id (or at-least-once key). Counts what it forgets
    (``forgotten``): a lookup of many partitions stores what it read only if nothing was forgotten while it
    read (see :meth:`PartitionWriter.read_positions`), since a forgotten position may stand for a commit the
    lookup did not see."""

    forgotten = 0

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self.forgotten += 1
        return super().pop(key, *default)

    def clear(self) -> None:
        if self:
            self.forgotten += 1
        super().clear()


_PRODUCERS: dict[str, Producer] = {}
_POSITIONS = _PositionTable()
#: the size limit (``destination_max_message_bytes``) each cached producer was built for
_PRODUCER_LIMITS: dict[str, int | None] = {}
#: the destination partition count each cached producer was built for: a destination grown while the mirror
#: runs has partitions the producer's metadata does not know yet (librdkafka refuses them as unknown)
_PRODUCER_PARTITIONS: dict[str, int] = {}
#: destination topic -> ``max.message.bytes`` learned from a broker rejection in this process (later
#: batches' writers start from it instead of learning it again)
_LEARNED_LIMITS: dict[str, int] = {}


_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def partition_lock(s: WriterSettings, partition: int) -> threading.RLock:
    """Held while a partition's producer and position are used: the driver writes partitions from
    several threads and warms them up from another, and a position read before a commit must never
    overwrite the one the commit set."""
    key = s.transactional_id_for(partition)
    with _LOCKS_GUARD:
        lock = _LOCKS.get(key)
        if lock is None:
            lock = _LOCKS[key] = threading.RLock()
        return lock


#: librdkafka's own default of ``message.timeout.ms``: how long a producer keeps trying to deliver a record
#: (through leader changes and broker outages) before it reports the record failed
LIBRDKAFKA_MESSAGE_TIMEOUT_S = 300.0
#: exactly_once: a transaction's records must be acknowledged within its timeout (transaction.timeout.ms)
TRANSACTION_ACK_WAIT_S = 60.0
#: a writer waiting on acknowledgements says so this often (a destination outage shows in the job's log)
ACK_WAIT_REPORT_S = 30.0


def delivery_timeout(producer_config: Any) -> float:
    """Seconds a producer of ``producer_config`` keeps trying to deliver a record before it reports it failed
    (``message.timeout.ms``, or the Java client's name ``delivery.timeout.ms``; librdkafka's default 300 s;
    0 means forever, taken here as the default)."""
    for name in ("message.timeout.ms", "delivery.timeout.ms"):
        if name in producer_config:
            ms = int(producer_config[name])
            return ms / 1000 if ms > 0 else LIBRDKAFKA_MESSAGE_TIMEOUT_S
    return LIBRDKAFKA_MESSAGE_TIMEOUT_S


def ack_wait(delivery: str, producer_config: Any) -> float:
    """How long a writer waits for its records' acknowledgements before it gives up on them. at_least_once:
    until the producer has delivered every record or reported it failed (its delivery timeout, plus a few
    seconds for the report), so a destination outage shorter than that stalls the mirror without failing
    it; exactly_once: the transaction's timeout, after which the broker aborts it anyway."""
    if delivery == "exactly_once":
        return TRANSACTION_ACK_WAIT_S
    return delivery_timeout(producer_config) + 5.0


def flush_within(producer: Producer, timeout: float, who: str, check: Callable[[], None] | None = None) -> int:
    """``producer.flush`` up to ``timeout`` seconds, 5 at a time; between them ``check()`` (which may raise),
    and a wait longer than :data:`ACK_WAIT_REPORT_S` is logged once per that many seconds, so a destination
    outage shows in the job's log while the writer rides it out. Returns the records still unacknowledged."""
    t0 = reported = time.monotonic()
    deadline = t0 + timeout
    while True:
        with fatal_unmasked():
            remaining = int(producer.flush(min(5.0, max(0.0, deadline - time.monotonic()))))
        now = time.monotonic()
        if not remaining or now >= deadline:
            return remaining
        if check is not None:
            check()
        if now - reported >= ACK_WAIT_REPORT_S:
            reported = now
            log.warning("%s: %d records have waited %.0f s for the destination to acknowledge them (is it "
                        "reachable?); waiting up to %.0f s", who, remaining, now - t0, timeout)


#: the writer producers' ``linger.ms`` unless the destination cluster's config sets it (or its alias)
WRITER_LINGER_MS = 5


def _base_config(limit: int | None, own: Mapping[str, Any]) -> dict[str, Any]:
    """The writer producers' settings laid over ``own`` (the destination cluster's config), for a destination
    size limit ``limit``. What the guarantees rest on is always set; the tuning a user may give on the
    destination cluster (``linger.ms``, ``batch.size``, as with MirrorMaker 2's ``producer.*``) is kept, a
    ``batch.size`` within the topic's limit."""
    base: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "log_level": 3,
                            "logger": LIBRDKAFKA_LOG,
                            # a deleted destination topic must not come back with the broker's default
                            # partitions when the producer asks for its metadata (auto.create.topics.enable)
                            "allow.auto.create.topics": False}
    if "linger.ms" not in own and "queue.buffering.max.ms" not in own:
        base["linger.ms"] = WRITER_LINGER_MS
    if limit is not None:
        # keep batches of small records under the topic's limit (a single larger record still goes alone)
        cap = max(1, min(1_000_000, limit - 100))
        base["batch.size"] = min(int(own["batch.size"]), cap) if "batch.size" in own else cap
    return base


def _producer(s: WriterSettings, partition: int, gapless: bool = False) -> tuple[Producer, str]:
    """A long-lived producer per (writer, partition) in this process (call with its partition_lock).
    ``gapless`` (at_least_once): the partition's second producer, with ``enable.gapless.guarantee``, for
    chunks written through the C loop (see :meth:`PartitionWriter._write_at_least_once`)."""
    base = _base_config(s.destination_max_message_bytes, s.producer_config)
    if s.delivery == "exactly_once":
        txid = s.transactional_id_for(partition)
        if _built_for_other(txid, s):
            _drop_producer(txid)  # another size limit (its batches would be rejected again) or partition count
        if txid not in _PRODUCERS:
            p = Producer(s.producer_config | base | {"transactional.id": txid, "transaction.timeout.ms": 60000,
                                                     "logger": _TXN_LOG})
            ready_for_transactions(p, s.destination_topic)
            p.init_transactions(60)  # fences any zombie with the same transactional.id
            _PRODUCERS[txid] = p
            _PRODUCER_LIMITS[txid] = s.destination_max_message_bytes
            _PRODUCER_PARTITIONS[txid] = s.destination_partitions
            _POSITIONS.pop(txid, None)  # a zombie may have committed since: re-read
        return _PRODUCERS[txid], txid
    key = _alo_key(s, partition) + (":gapless" if gapless else "")  # per partition: flushes never wait for another's
    if _built_for_other(key, s):
        _drop_producer(key, keep_position=True)
    if key not in _PRODUCERS:
        # gapless: the writer handles the fatal error of a lost record and says so itself (see
        # PartitionWriter._write_at_least_once_in_c); librdkafka's line about it goes to DEBUG
        _PRODUCERS[key] = Producer(_gapless_config(s.producer_config) | base | {
            "enable.gapless.guarantee": True, "logger": _GAPLESS_LOG} if gapless else s.producer_config | base)
        _PRODUCER_LIMITS[key] = s.destination_max_message_bytes
        _PRODUCER_PARTITIONS[key] = s.destination_partitions
    return _PRODUCERS[key], key


#: the gapless producers' librdkafka log: the fatal error of a record lost is expected (see _producer)
_GAPLESS_LOG = LibrdkafkaLog(expected=("gap-less guarantee",))
#: a transactional producer's librdkafka log: a fence by a newer producer with its transactional id is
#: expected (Spark's tasks move partitions between Python workers); the writer says so itself when it writes
#: the chunk or transaction again (see PartitionWriter._write_transactional, BatchWriter.write_shared)
_TXN_LOG = LibrdkafkaLog(expected=("old epoch", "fenced by a newer instance"))


_ADMINS: dict[tuple[tuple[str, str], ...], AdminClient] = {}
_ADMINS_GUARD = threading.Lock()


def markers_admin(config: dict[str, Any]) -> AdminClient:
    """The admin client :func:`markers_pending` asks through, one for each destination config in this process.
    Made before it is first asked (when a writer's producers start, in the warm-up): a new client swaps its
    bootstrap connection for the broker's own within milliseconds, and a request sent in that moment lost its
    leader lookup with the bootstrap connection and was looked up again only after 1 s, or 3 s (librdkafka's
    debug log shows the lost lookup). Made new at a writer process's first commit, the lookup held up the first
    micro-batch of 6 of 19 exactly-once 1 KB drains, with nothing else running: five took 4.0-4.8 s instead of
    1.2-1.8 s, one 2.0 s. In 22 drains since, none took over 1.9 s (docs/benchmarks.md, 5 December)."""
    key = tuple(sorted((k, str(v)) for k, v in config.items()))
    with _ADMINS_GUARD:
        admin = _ADMINS.get(key)
        if admin is None:
            conf = {k: v for k, v in config.items() if k != "log_level"}
            admin = _ADMINS[key] = AdminClient(conf | {"log_level": 3, "logger": LIBRDKAFKA_LOG})
    return admin


def markers_pending(config: dict[str, Any], partitions: list[tuple[str, int]], timeout: float = 10.0
                    ) -> list[tuple[str, int]]:
    """The ``partitions`` whose last stable offset is below their end: a transaction's records there are not
    decided yet, or its markers not written (one request of each kind for all of them, each answered within
    ``timeout`` seconds)."""
    admin = markers_admin(config)
    stable = latest_offsets(admin, partitions, committed=True, timeout=timeout)
    high = latest_offsets(admin, partitions, committed=False, timeout=timeout)
    return [tp for tp in partitions if stable[tp] < high[tp]]


#: a partition's gapless producer (at_least_once, see :func:`_producer`) gives up on a record after this long at
#: most (``message.timeout.ms``), not the producers' delivery timeout: its chunk is then written again on the
#: partition's usual producer, which waits out the whole delivery timeout. A record in flight when the
#: destination broker went down has an unknown fate, and a gapless producer cannot send it again under a new
#: epoch: it waits for the record's timeout. With librdkafka's 300 s, an at-least-once mirror stalled 300 s
#: after a 30 s destination outage (tests/faults, 5 December: 44 records of one partition)
GAPLESS_MESSAGE_TIMEOUT_S = 60.0


def _gapless_config(producer_config: ClientConfig) -> ClientConfig:
    """``producer_config`` for a partition's gapless producer: its delivery timeout at most
    :data:`GAPLESS_MESSAGE_TIMEOUT_S` (under librdkafka's name; the Java name is dropped)."""
    timeout = min(delivery_timeout(producer_config), GAPLESS_MESSAGE_TIMEOUT_S)
    return ClientConfig({k: v for k, v in producer_config.items() if k not in ("message.timeout.ms",
                                                                             "delivery.timeout.ms")}
                        | {"message.timeout.ms": int(timeout * 1000)})


def _alo_key(s: WriterSettings, partition: int) -> str:
    """The key of an at-least-once partition's producer and position in this process."""
    return f"{s.transactional_id}:{partition}:alo"


def _built_for_other(key: str, s: WriterSettings) -> bool:
    """A cached producer built for another size limit or destination partition count than ``s`` has."""
    return key in _PRODUCERS and (_PRODUCER_LIMITS.get(key) != s.destination_max_message_bytes
                                  or _PRODUCER_PARTITIONS.get(key, s.destination_partitions)
                                  != s.destination_partitions)


_FENCED_LEGACY: set[str] = set()


def fence_legacy_writer(s: WriterSettings, partition: int) -> None:
    """Fence the partition's transactional id of releases before issue 11 (once per process): its
    ``init_transactions`` aborts an open transaction of that id and stops a writer still using it."""
    if s.delivery != "exactly_once":
        return
    txid = s.legacy_transactional_id_for(partition)
    if txid in _FENCED_LEGACY:
        return
    fence_transactional_id(dict(s.producer_config), txid, s.destination_topic)
    _FENCED_LEGACY.add(txid)
    log.info("%s: fenced the earlier release's transactional id of partition %d", s.mirror, partition)


def release_producers() -> None:
    """Forget this process's producers and positions: another process (the Spark tasks) takes the
    partitions over and fences them, so the next use would fail and start over anyway."""
    _PRODUCERS.clear()
    _TURNS.clear()
    _PRODUCER_LIMITS.clear()
    _PRODUCER_PARTITIONS.clear()
    _POSITIONS.clear()


def _drop_producer(key: str, keep_position: bool = False) -> None:
    """Forget a producer (and, unless ``keep_position``, the position read with it: a new transactional
    producer fences zombies that may have committed since; at-least-once positions do not depend on it)."""
    _PRODUCERS.pop(key, None)
    _PRODUCER_LIMITS.pop(key, None)
    _PRODUCER_PARTITIONS.pop(key, None)
    if not keep_position:
        _POSITIONS.pop(key, None)


def position_syncs(topic: str, partition: int, first_upstream: int, upstream_end: int, downstream: int,
                   position_only: bool = False) -> list[OffsetSync]:
    """Syncs for a chunk that wrote nothing to the destination topic (every record dead-lettered or
    skipped by provenance): both the chunk's first position and its end map to ``downstream``, the
    next downstream position. Keeps the invariant's case 2 (no record mirrored in between, no
    downstream record in between), so a restart resumes after the chunk and translation stays exact.
    ``position_only``: the position the chunk starts from is (case 4), and so stay those after it."""
    if first_upstream >= upstream_end:
        return [OffsetSync(topic, partition, upstream_end, downstream, position_only)]
    return [OffsetSync(topic, partition, first_upstream, downstream, position_only),
            OffsetSync(topic, partition, upstream_end, downstream, position_only)]


def loop_marked_syncs(syncs: list[OffsetSync], looped: list[int], mirrored: list[tuple[int, int]],
                      first_upstream: int, downstream_after: int) -> list[OffsetSync]:
    """``syncs`` (a chunk's, from :func:`syncs_for_batch` or :func:`position_syncs`) with each run of
    loop-skipped records (``looped``: upstream offsets the loop guard skipped, sorted) made untranslatable: a
    sync ``(start, UNMAPPED)`` opens the run and a real one follows it (the invariant's case 3,
    :data:`mirror_core.offsets.SYNC_INVARIANT`). Without it such records were a gap like a dead letter's, and a
    position among them mapped past their originals on the destination: a failback's consumers skipped them.
    (Such positions are placed through the reverse group's syncs instead: ``checkpoint.SourceTranslator``.)

    A run starts just after the chunk's mirrored record before it (or at ``first_upstream``: a sync the last
    chunk ended with there is superseded, since its records may be copies too) and ends after its last looped
    record. ``mirrored``: the chunk's (upstream, downstream) pairs, of which the ones just before and just after
    each run keep syncs of their own (as collinear middle points they were dropped: the positions before the run
    then went with the marker, and those after it mapped all to the end of their run);
    ``downstream_after``: the downstream position after the chunk.

    A run that ends the chunk (no mirrored record after it) leaves the syncs from its end on position-only (the
    invariant's case 4): ``downstream_after`` is where the writer resumes, not where a consumer that read the
    copies belongs (records the destination's own producers wrote since lie between). Until 7 December they
    passed for exact syncs, and a failback's or second failover's consumers went there and read records again."""
    if not looped:
        return syncs
    topic, partition = syncs[0].topic, syncs[0].partition
    ups = [u for u, _ in mirrored]
    runs: list[tuple[int, int, int]] = []  # (start, resume, index in mirrored of the record after the run)
    for u in looped:
        i = bisect.bisect_left(ups, u)
        start = ups[i - 1] + 1 if i else first_upstream
        if runs and runs[-1][0] == start:
            runs[-1] = (start, u + 1, i)
        else:
            runs.append((start, u + 1, i))
    out = {(x.upstream_offset, x.downstream_offset): x for x in syncs}
    for start, resume, i in runs:
        for x in syncs:
            if start <= x.upstream_offset < resume:
                out.pop((x.upstream_offset, x.downstream_offset), None)
        # the records on either side keep syncs of their own (collinear ones were dropped as middle points)
        for k in (i - 1, i):
            if 0 <= k < len(mirrored):
                own = OffsetSync(topic, partition, *mirrored[k])
                out[(own.upstream_offset, own.downstream_offset)] = own
        out[(start, UNMAPPED)] = OffsetSync(topic, partition, start, UNMAPPED)
        # the next position maps as it did: to its own record if mirrored, else to the next mirrored one
        j = bisect.bisect_left(ups, resume)
        d = mirrored[j][1] if j < len(mirrored) else downstream_after
        if not any(x.upstream_offset == resume for x in out.values()):
            out[(resume, d)] = OffsetSync(topic, partition, resume, d)
        if j == len(mirrored):  # the run ends the chunk: what follows it holds only the writer's position
            out = {k: dataclasses.replace(x, position_only=True) if x.upstream_offset >= resume else x
                   for k, x in out.items()}
    return sorted(out.values(), key=lambda x: x.upstream_offset)


def _resumes_position_only(syncs: list[OffsetSync]) -> bool:
    """The newest of a chunk's syncs (where the writer resumes) is position-only."""
    return bool(syncs) and syncs[-1].position_only


def fence_transactional_id(producer_config: dict[str, Any], txid: str, topic: str | None = None) -> None:
    """``init_transactions`` with ``txid`` on a producer used for nothing else: a transaction open under that
    id is aborted, and a writer still holding it can no longer commit. ``topic``: one that exists, whose
    metadata the producer asks for first (see :func:`ready_for_transactions`)."""
    p = Producer(producer_config | {"transactional.id": txid, "transaction.timeout.ms": 60000, "log_level": 3,
                                    "logger": LIBRDKAFKA_LOG})
    ready_for_transactions(p, topic)
    p.init_transactions(60)


def ready_for_transactions(p: Producer, topic: str | None) -> None:
    """Ask a new transactional producer for ``topic``'s metadata (all topics' when None) before its
    ``init_transactions``: its coordinator lookup otherwise often races the swap of the bootstrap connection for
    the broker's own and waits out a 500 ms retry timer. Fencing a new id took 0.51 s or more in 10 of 16 tries
    on this machine, 0.06-0.08 s in 103 of 106 after the metadata (6 December; docs/benchmarks.md)."""
    p.list_topics(topic, timeout=30)


#: ``transactions: per_writer``: the writer ids a job does not use are fenced this many at a time when a writer
#: process starts (:meth:`WriterTransaction.fence_unused`). Each fence is a producer of its own and a few round
#: trips, about 0.25-0.5 s here, mostly waiting: 60 in a row took 15 s. The 62 ids a job of two writer processes
#: leaves unused took 1.05-2.84 s 8 at a time and 0.60-0.68 s 32 at a time, also with two processes fencing them
#: at once (5 December): at 8 the warm-up of a writer process took 1.5-3.5 s and could run into the first batch
FENCE_THREADS = 32
#: ``transactions: per_writer``: per-partition transactional ids this process has fenced (see
#: :meth:`PartitionWriter.prepare_shared`)
_FENCED_PARTITIONS: set[str] = set()
_FENCE_GUARD = threading.Lock()
_WRITER_GUARD = threading.Lock()


#: ``transactions: per_writer``: whose turn it is in this process, by the writer's first transactional id.
#: A writer process takes turns with its transactional producers (``spark.writer_producers``), a transaction
#: each. After a commit the broker writes a marker into every partition the transaction held, and refuses to
#: add partitions to the same id's next transaction until it has (``CONCURRENT_TRANSACTIONS``): at thousands
#: of partitions that wait took most of a batch. The next transaction goes out on another producer meanwhile.
#: It starts only once the last commit returned, so a partition's records still land in batch order, and a
#: read_committed reader sees them in that order whichever marker lands first.
_TURNS: dict[str, int] = {}
#: writers (by their first transactional id) that ask about every partition of the last commit before each
#: transaction, for the life of the process: another producer's commit markers once landed among a run the C loop
#: produced without reports in a partition whose markers had been seen landed in time before
#: (see :meth:`WriterTransaction.late_markers`)
_ASK_ALWAYS: set[str] = set()
#: writers (by their first transactional id) -> the destination partitions of their last commit whose markers
#: are not known to have landed (see :meth:`WriterTransaction.late_markers`)
_MARKERS_DUE: dict[str, set[tuple[str, int]]] = {}
#: destination partitions where a commit's markers of this process were seen landed before the next
#: transaction: their first markers, the slow ones, are behind them (see :meth:`WriterTransaction.late_markers`)
_MARKERS_SEEN: set[tuple[str, int]] = set()


class WriterTransaction:
    """``transactions: per_writer``: the ``producers`` transactional producers of a writer process (``slot``),
    which take turns (see :data:`_TURNS`); a transaction holds a micro-batch's records, dead letters and offset
    syncs of every partition the process owns (see :meth:`stream.BatchWriter.write_shared`). Kept for the life
    of the process, like the per-partition producers; built again when a destination's size limit or partition
    count changed.

    With ``delivery="at_least_once"``: the one idempotent producer the process's at-least-once partitions
    share, flushed once per write of all of them (and no transaction). It has ``enable.gapless.guarantee``,
    so runs of records can go through the C loop without reports, as on a partition's gapless producer: a
    record it loses stops it (see :meth:`stream.BatchWriter.write_shared`)."""

    def __init__(self, settings: Iterable[WriterSettings], slot: int, slots_used: int,
                 delivery: str = "exactly_once", producers: int = WRITER_PRODUCERS_DEFAULT):
        mine = [s for s in settings if s.delivery == delivery]
        first = mine[0] if mine else None
        self.slot = slot
        self.slots_used = slots_used
        #: False: the writer's at-least-once mirrors, which share one idempotent producer (no transaction)
        self.transactional = delivery == "exactly_once"
        self._names = ("", "") if first is None else (first.group, first.source_alias)
        #: the transactional ids, one per turn; for the at-least-once producer only its key in this process
        #: (empty: the writer has no partitions of this delivery)
        self.txids: tuple[str, ...] = ("",)
        if first is not None and self.transactional:
            self.txids = tuple(writer_transactional_id(*self._names, slot, turn) for turn in range(producers))
        elif first is not None:
            self.txids = (writer_transactional_id(*self._names, slot) + ":alo",)
        self.producer_config = {} if first is None else dict(first.producer_config)
        #: the offset-sync topic, whose metadata a new producer asks for first (ready_for_transactions)
        self.topic = None if first is None else first.offset_syncs_topic
        limits = [s.destination_max_message_bytes for s in mine if s.destination_max_message_bytes is not None]
        self.limit = min(limits) if limits else None
        self.partitions = sum(s.destination_partitions for s in mine)

    def ask_always(self) -> None:
        """Another producer's commit markers landed among a run of records produced without reports (with
        several producers by turns the broker writes the last transaction's markers while the next one's records
        go out), in a partition :meth:`late_markers` no longer asked about: from now on it asks about every
        partition of the last commit. (Until 6 December the writer reported every record from then on, for the
        life of the process: writers held to that path from the start drained 20-32 % fewer records a second
        on the means of two rounds, 100 B and 1 KB, docs/benchmarks.md.)"""
        _ASK_ALWAYS.add(self.txids[0])

    @property
    def txid(self) -> str:
        """The id (key) of the producer whose turn it is."""
        return self.txids[_TURNS.get(self.txids[0], 0) % len(self.txids)]

    def fence_unused(self, keep: Iterable[int] = ()) -> None:
        """Fence the writer ids this job does not use (slots ``slots_used`` and up but those in ``keep``, and
        the producers of its own slots beyond this job's count): a writer of an earlier job that ran with more
        processes or more producers might still hold one (once per process)."""
        if not self.txids[0] or not self.transactional:
            return
        producers = len(self.txids)
        kept = set(keep)
        with _FENCE_GUARD:
            todo = [writer_transactional_id(*self._names, slot, turn) for slot in range(WRITER_SLOTS)
                    for turn in range(WRITER_PRODUCERS_MAX)
                    if (slot >= self.slots_used and slot not in kept) or turn >= producers]
            todo = [txid for txid in todo if txid not in _FENCED_PARTITIONS]
        if not todo:
            return

        def fence(txid: str) -> None:
            # marked only once done: a caller racing this one fences again (harmless), never goes on before
            fence_transactional_id(self.producer_config, txid, self.topic)
            with _FENCE_GUARD:
                _FENCED_PARTITIONS.add(txid)

        with ThreadPoolExecutor(min(FENCE_THREADS, len(todo)), thread_name_prefix="mirrorflow-fence") as pool:
            list(pool.map(fence, todo))

    def producer(self) -> Producer:
        """The producer whose turn it is. Every turn's producer is started (fencing any zombie of its id, and
        aborting what it left open) when the first is needed, before any position is read."""
        with _WRITER_GUARD:  # the driver's warm-up and its first batch may both ask: one producer, not two
            for key in self.txids:
                self._start(key)
            return _PRODUCERS[self.txid]

    def start(self) -> None:
        """Start every turn's producer at once, each on a thread of its own (an ``init_transactions`` is a round
        trip or several: one after the other they held up a Spark task's share of a batch; see
        :meth:`producer`)."""
        with _WRITER_GUARD:
            todo = [key for key in self.txids if key not in _PRODUCERS]
        if len(todo) > 1:
            with ThreadPoolExecutor(len(todo), thread_name_prefix="mirrorflow-writer-start") as pool:
                list(pool.map(self._start, todo))
        self.producer()

    def took_turn(self, partitions: Iterable[tuple[str, int]] = ()) -> None:
        """The transaction committed: the next one goes out on the next producer. ``partitions``: the
        destination partitions it held (whose commit markers the broker is writing now)."""
        if len(self.txids) > 1:
            with _WRITER_GUARD:
                _TURNS[self.txids[0]] = (_TURNS.get(self.txids[0], 0) + 1) % len(self.txids)
                _MARKERS_DUE[self.txids[0]] = set(partitions)

    def late_markers(self, partitions: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
        """Those of ``partitions`` (the next transaction's) where the last commit's markers have not landed yet
        (their last stable offset is below their end; asked of the destination in one request): the next
        transaction reports each of their records instead of running them through the C loop without reports,
        since a marker may land among them. A partition is asked about until its markers were once seen landed
        in time: a partition's first markers are the slow ones, so a running mirror stops asking (at 6
        partitions a micro-batch can take 200 ms; a question, some 10 ms). Once a marker landed among a run all
        the same (a busy broker is late with any marker; :meth:`ask_always`), the writer asks about every
        partition of the last commit before each transaction.

        On a new destination topic the broker took 3-9 s to write the first markers of a transaction of 500
        partitions (its first index entry in each partition: on this machine's disk, a new page of a sparse
        file costs some 2.7 ms); later markers took 30 ms. The next transaction's records went out among them,
        so their offsets could not be proven, and it was written again with a report a record: 7 s plus 3.6 s
        for a batch of 400,000 records at 1,000 partitions. Waiting for the markers instead took up to 8.8 s.
        Nothing depends on this for correctness: runs among which a marker landed are found and written again."""
        due = _MARKERS_DUE.pop(self.txids[0], None)
        if not due or not self.producer_config.get("bootstrap.servers"):
            return set()
        both = due.intersection(partitions)
        if self.txids[0] not in _ASK_ALWAYS:
            both -= _MARKERS_SEEN
        late = self.still_late(both, 10.0)
        _MARKERS_SEEN.update(both - late)
        return late

    def still_late(self, partitions: Iterable[tuple[str, int]], timeout: float) -> set[tuple[str, int]]:
        """Those of ``partitions`` whose last commit markers have not landed, asked of the destination (one
        request of each kind; all of them, whose records are then reported, when it does not answer within
        ``timeout`` seconds)."""
        parts = sorted(partitions)
        if not parts:
            return set()
        try:
            return set(markers_pending(self.producer_config, parts, timeout))
        except KafkaException as exc:
            log.debug("%s: could not read the last stable offsets (%s): every record of %d partitions is "
                      "reported", self.txid, exc.args[0].str(), len(parts))
            return set(parts)

    def _start(self, key: str) -> None:
        if key in _PRODUCERS and (_PRODUCER_LIMITS.get(key) != self.limit
                                  or _PRODUCER_PARTITIONS.get(key) != self.partitions):
            _drop_producer(key)
        if key not in _PRODUCERS:
            if not self.transactional:
                # gapless: runs go without reports (see the class); the writer says itself when it loses a record
                p = Producer(self.producer_config | _base_config(self.limit, self.producer_config)
                             | {"enable.gapless.guarantee": True, "logger": _GAPLESS_LOG})
            else:
                p = Producer(self.producer_config | _base_config(self.limit, self.producer_config)
                             | {"transactional.id": key, "transaction.timeout.ms": 60000, "logger": _TXN_LOG})
                ready_for_transactions(p, self.topic)
                p.init_transactions(60)
                if len(self.txids) > 1 and self.producer_config.get("bootstrap.servers"):
                    markers_admin(self.producer_config)  # ready before the first commit asks it (late_markers)
            _PRODUCERS[key] = p
            _PRODUCER_LIMITS[key] = self.limit
            _PRODUCER_PARTITIONS[key] = self.partitions

    def start_again(self) -> None:
        """Start every turn's producer anew, also those this process holds (a retry of a Spark task: an attempt
        Spark gave up on may have started the same ids since, which fenced the ones held here)."""
        with _WRITER_GUARD:
            for key in self.txids:
                _drop_producer(key)
        self.start()

    def drop(self) -> None:
        """Replace the producer whose turn it is after a fatal error or an abort that failed: the new one's
        ``init_transactions`` aborts a transaction the old one left open, which would otherwise hold the
        offset-sync topic's last stable offset (and so every position lookup) until it timed out."""
        with _WRITER_GUARD:
            key = self.txid
            _drop_producer(key)
            try:
                self._start(key)
            except KafkaException as exc:
                log.warning("writer %s could not start again: %s; the next batch tries again", key,
                            exc.args[0].str())
                _drop_producer(key)


@dataclass
class Staged:
    """``transactions: per_writer``: one partition's records produced into the writer's open transaction."""

    partition: int
    todo: Columns
    upstream_end: int
    position: Position | None
    result: BatchResult
    #: None: no records, only the position moves (past trailing transaction markers)
    sent: _Sent | None
    downstream: int | None = None
    #: the sync at ``upstream_end`` is position-only (see :class:`Position`)
    position_only: bool = False
    #: at-least-once: the records whose dead letters were acknowledged (see :meth:`PartitionWriter.hand_back`)
    landed: set[int] = field(default_factory=set)


# --------------------------------------------------------------------------- the writer


class FastPath:
    """The common case of :func:`decide`, column-wise and without building a record object.

    Applies when the writer keeps partition numbers; a record takes it when its schema ids (``0x00`` +
    int32 framing) are in the id map, it has no schema-id headers, no provenance header when provenance is
    on (the header is then appended here) and it is clearly under the destination's size limit. Every other record goes through :func:`decide`,
    so the fast path only ever produces what :func:`decide` would (``tests/unit/test_replicate.py``
    checks the two agree record for record).
    """

    def __init__(self, s: WriterSettings, translator: SchemaIdTranslator):
        self.enabled = s.destination_partitions >= s.source_partitions
        #: the provenance header a record without one gets (what :func:`decide` appends), when provenance is on
        self.provenance: Header | None = (PROVENANCE_HEADER, s.source_alias.encode()) if s.provenance else None
        self.key_schema = s.key_serde in SCHEMA_SERDES
        self.value_schema = s.value_serde in SCHEMA_SERDES
        self.any_schema = self.key_schema or self.value_schema
        compressed = _compressed(s.producer_config)
        self.limit = None if compressed or s.destination_max_message_bytes is None else s.destination_max_message_bytes
        #: source framing prefix (0x00 + id) -> destination prefix: the id map as bytes
        self.prefixes: dict[bytes, bytes] = {}
        self.refresh(translator)

    def refresh(self, translator: SchemaIdTranslator) -> None:
        for src, dst in translator.snapshot():
            if _INT32_MIN <= src <= _INT32_MAX and _INT32_MIN <= dst <= _INT32_MAX:
                self.prefixes[_ID_PREFIX.pack(0, src)] = _ID_PREFIX.pack(0, dst)

    def rewrite(self, data: bytes) -> bytes | None:
        """``data`` with its id-framed schema id mapped, or None (not id-framed, or a miss)."""
        new = self.prefixes.get(data[:5])
        return None if new is None else new + data[5:]

    def fits(self, key: bytes | None, value: bytes | None, headers: tuple[Header, ...]) -> bool:
        """Surely within the size limit (the exact batch size is only computed near the limit)."""
        if self.limit is None:
            return True
        rough = (len(key) if key else 0) + (len(value) if value else 0) + 128
        if headers:
            rough += sum(4 * len(n) + (len(v) if v else 0) + 10 for n, v in headers)  # 4: UTF-8 worst case
        return rough <= self.limit or record_batch_size(key, value, headers) <= self.limit


_ID_PREFIX = struct.Struct(">bi")
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@dataclass
class _Sent:
    """A chunk handed to a producer, and the delivery reports coming in for it (see
    :meth:`PartitionWriter._produce_records`)."""

    partition: int
    cols: Columns
    result: BatchResult
    #: every record went to its own partition number: the i-th report is the i-th record's
    ordered: bool
    acks: list[tuple[int, int | None]]
    errors: list[tuple[int, KafkaError]]
    #: dead letters the broker refused
    failed: list[str]
    #: ordered: upstream offsets in produce order, and downstream offsets in report order
    sent: list[int]
    reported: list[int | None]
    #: ordered: the runs of ``sent`` produced by the C loop, without reports: (first position, length)
    runs: list[tuple[int, int]] = field(default_factory=list)


class PartitionWriter:
    """Writes chunks of one source partition's records; see the module docstring for guarantees.

    ``position_lookup`` returns the newest committed sync of a partition (or its upstream offset); the
    default reads the destination's sync topic for this writer's destination (:mod:`positions`).
    ``downstream_end`` returns a destination partition's committed end offset, used to place a position
    sync when no earlier sync is known and to check an earlier release's sync (default: asks the destination).
    """

    def __init__(self, settings: WriterSettings, translator: SchemaIdTranslator,
                 position_lookup: PositionLookup | None = None,
                 downstream_end: Callable[[str, int], int] | None = None,
                 source_end: Callable[[str, int], int] | None = None,
                 destination_high: Callable[[str, int], int] | None = None,
                 positions_lookup: PositionsLookup | None = None,
                 destination_highs: Callable[[str, list[int]], dict[int, int]] | None = None):
        learned = _LEARNED_LIMITS.get(settings.destination_topic)
        if learned is not None and learned != settings.destination_max_message_bytes:
            settings = dataclasses.replace(settings, destination_max_message_bytes=learned)
        self.s = settings
        self.translator = translator
        self.fast = FastPath(settings, translator)
        self.position_lookup = position_lookup or (
            lambda t, p: last_committed_sync(settings.producer_config, settings.offset_syncs_topic, t, p,
                                             destination=settings.destination_topic))
        #: several partitions at once (:meth:`read_positions`); one by one when only ``position_lookup`` is given
        self.positions_lookup = positions_lookup or (
            (lambda t, ps: {p: self.position_lookup(t, p) for p in ps}) if position_lookup is not None else
            (lambda t, ps: dict(last_committed_syncs(settings.producer_config, settings.offset_syncs_topic, t, ps,
                                                     destination=settings.destination_topic))))
        self.downstream_end = downstream_end or (
            lambda t, p: committed_end_offset(settings.producer_config, t, p))
        cc = settings.source_consumer_config
        #: a source partition's end (high watermark); None: not checked
        self.source_end = source_end or (None if cc is None else lambda t, p: source_end_offset(cc, t, p))
        #: a destination partition's high watermark: a committed position mapping beyond it was written into
        #: a destination topic that was deleted since (see :meth:`_position`)
        self.destination_high = destination_high or (
            lambda t, p: source_end_offset(settings.producer_config, t, p))
        self.destination_highs = destination_highs or (
            (lambda t, ps: {p: self.destination_high(t, p) for p in ps}) if destination_high is not None else
            (lambda t, ps: high_watermarks(settings.producer_config, t, ps)))
        #: at-least-once partitions handed back by a shared write: the records whose dead letters landed there
        self._landed: dict[int, set[int]] = {}
        #: per partition: upstream offsets the loop guard skipped in the chunk being written (see _syncs)
        self._looped: dict[int, set[int]] = {}

    def write(self, partition: int, records: Iterable[SourceRecord] | Columns,
              upstream_end: int | None = None) -> BatchResult:
        """Mirror one chunk of records of ``partition`` (in offset order).

        A chunk larger than :data:`CHUNK_BYTES` is written as several transactions (or flushes), each
        under the cap, in order. ``result.last_downstream + 1`` is the partition's downstream position
        after the chunk (set also when nothing was written to the destination topic but a position sync was).
        """
        cols = records if isinstance(records, Columns) else Columns.from_records(records)
        result = BatchResult(self.s.source_topic, partition, records_in=len(cols))
        if not len(cols):
            return result
        result.first_offset, result.last_offset = cols.offsets[0], cols.offsets[-1]
        result.upstream_end = upstream_end if upstream_end is not None else cols.offsets[-1] + 1
        pieces = byte_bounded(cols, CHUNK_BYTES)
        if len(pieces) == 1:
            with partition_lock(self.s, partition):
                self._write_piece(partition, cols, result)
            return result
        for i, piece in enumerate(pieces):
            part = BatchResult(self.s.source_topic, partition, records_in=len(piece),
                               first_offset=piece.offsets[0], last_offset=piece.offsets[-1],
                               upstream_end=result.upstream_end if i == len(pieces) - 1 else piece.offsets[-1] + 1)
            with partition_lock(self.s, partition):
                self._write_piece(partition, piece, part)
            result.absorb(part)
        return result

    def _write_piece(self, partition: int, cols: Columns, result: BatchResult) -> None:
        try:
            if self.s.delivery == "exactly_once":
                self._write_transactional(partition, cols, result)
            else:
                self._write_at_least_once(partition, cols, result)
        except (KafkaException, WriterError) as exc:
            # a chunk that failed for any reason (unknown topic, acks that never came, commits that kept
            # failing) while the destination topic is gone: say that, not the symptom
            if not isinstance(exc, DestinationTopicError) and self._destination_missing():
                raise DestinationTopicError(destination_deleted(self.s)) from None
            raise

    def _destination_missing(self) -> bool:
        """The destination topic is absent from the destination's metadata (asked without creating it)."""
        conf = {k: v for k, v in self.s.producer_config.items() if k != "log_level"}
        try:
            admin = AdminClient(conf | {"allow.auto.create.topics": False, "log_level": 3, "logger": LIBRDKAFKA_LOG})
            md = admin.list_topics(self.s.destination_topic, timeout=15).topics.get(self.s.destination_topic)
        except KafkaException:
            return False  # the destination cannot be asked: report the failure as it is
        return md is None or (md.error is not None and md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)

    def prepare(self, partition: int) -> None:
        """Start the partition's producer and read its position now, so the first write finds them."""
        with partition_lock(self.s, partition):
            # at_least_once through the C loop writes on the gapless producer: start that one, not the usual
            # one, which is then only made if a chunk falls back (one producer per partition, not two)
            key = _producer(self.s, partition, gapless=self._gapless())[1]
            if self.s.delivery == "exactly_once":
                self._position(key, partition)

    def _gapless(self) -> bool:
        """at_least_once chunks of this writer go through the C loop on the gapless producer (see
        :meth:`_write_at_least_once_in_c`; one the loop hands back goes on the usual producer)."""
        return (self.s.delivery != "exactly_once" and self.fast.enabled and self.fast.provenance is None
                and native.available())

    def advance(self, partition: int, upstream_end: int, last_downstream: int) -> None:
        """Record that the partition's position moved to ``upstream_end`` past records that are not data
        (transaction markers, aborted records) after the last mirrored record at ``last_downstream``."""
        with partition_lock(self.s, partition):
            # whether the position it moves from is position-only: the write before set it (read before a new
            # producer would drop it); forgotten since, with the loop guard on, it is read back (exactly_once)
            position = _POSITIONS.get(self._shared_key(partition))
            if position is None and self.s.provenance and self.s.delivery == "exactly_once":
                self.prepare(partition)
                position = _POSITIONS.get(self._shared_key(partition))
            self._advance(partition, upstream_end, last_downstream,
                          position is not None and position.position_only and position.downstream == last_downstream + 1)

    def advance_idle(self, partition: int, upstream_end: int, start: int | None = None) -> int | None:
        """A range of the partition ``[start, upstream_end)`` read to its end that held no records (transaction
        markers, aborted records): move the position there from where it stands, so the mirror's lag reaches 0
        on a source whose last offsets are markers. Returns the last downstream offset the new sync maps to, or
        None when nothing moved: nothing mirrored yet, or the position already at or past ``upstream_end``.

        exactly_once: from the committed position. at_least_once: from where this process's last write of the
        partition left it (kept in memory, not read back), and only when that write reached the range's
        ``start``: nothing short of it was left to another process or a write that failed. After a restart, an
        at-least-once position moves with the partition's next record."""
        with partition_lock(self.s, partition):  # reentrant: prepare takes it too
            if self.s.delivery == "exactly_once":
                return self._advance_idle_exactly(partition, upstream_end)
            position = _POSITIONS.get(_alo_key(self.s, partition))
            if start is None or (position is not None and position.upstream < start):
                return None
            if position is None or position.downstream is None or position.upstream >= upstream_end:
                return None
            self._advance(partition, upstream_end, position.downstream - 1, position.position_only)
            return position.downstream - 1

    def _advance_idle_exactly(self, partition: int, upstream_end: int) -> int | None:
        """:meth:`advance_idle` of an exactly-once partition, from the committed position. A producer this
        process kept may have been fenced since its last write (the partition went to another Python worker or
        to the driver, which wrote it): its commit fails; the position is then moved once more on a new
        producer, from the position read after it (which may already be past ``upstream_end``)."""
        key = self.s.transactional_id_for(partition)
        for attempt in range(2):
            self.prepare(partition)  # the producer first (it fences any zombie), then the committed position
            position = _POSITIONS.get(key)
            if position is None or position.downstream is None or position.upstream >= upstream_end:
                return None
            try:
                self._advance(partition, upstream_end, position.downstream - 1, position.position_only)
            except KafkaException as exc:
                err = exc.args[0]
                _drop_producer(key)  # and the position read with it
                if attempt or not (another_took_over(err) or err.txn_requires_abort()):
                    raise
                log.info("%s[%d]: moving the position past markers again on a new producer; the one before "
                         "stopped (%s)", self.s.source_topic, partition, err.str())
                continue
            return position.downstream - 1
        return None  # not reached: the second attempt returns or raises

    def _advance(self, partition: int, upstream_end: int, last_downstream: int, position_only: bool = False) -> None:
        """The sync that moves the position past records that are not data (``position_only``: the position it
        moves from is, see :class:`Position`, and so is the one it moves to)."""
        sync = OffsetSync(self.s.source_topic, partition, upstream_end, last_downstream + 1, position_only)
        producer, key = _producer(self.s, partition, gapless=self._gapless())
        if self.s.delivery == "exactly_once":
            producer.begin_transaction()
            self._emit_sync(producer, sync)
            with fatal_unmasked():
                producer.commit_transaction(60)
            _POSITIONS[key] = Position(upstream_end, last_downstream + 1, position_only)
        else:
            self._emit_sync(producer, sync)
            if self._flush(producer, self._ack_wait()):
                raise WriterError(f"{self.s.mirror}: offset sync not acknowledged within {self._ack_wait():.0f} s")
            _POSITIONS[_alo_key(self.s, partition)] = Position(upstream_end, last_downstream + 1, position_only)

    def _emit_sync(self, producer: Producer, sync: OffsetSync) -> None:
        """An offset sync in MM2's format (all on the sync topic's partition 0), naming our destination in
        a header so another mirror of the same source topic never takes it for its own position."""
        producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0,
                         headers=sync_headers(self.s.destination_topic,  # type: ignore[arg-type]
                                              sync.position_only))

    # -- positions

    def _dst_partition(self, partition: int) -> int:
        if self.s.destination_partitions >= self.s.source_partitions:
            return partition
        return partition % self.s.destination_partitions

    def _lookup(self, partition: int) -> OffsetSync | int | None:
        """The committed position, moving over from an earlier release's syncs and transactional id once."""
        found = self.position_lookup(self.s.source_topic, partition)
        if not isinstance(found, LegacySync):
            return found
        # The newest sync predates syncs naming their destination: an earlier release wrote it, under the
        # dotted transactional id. Fence that id (a writer of that release still running could commit
        # after this lookup), then look again: what it committed before being fenced is visible now.
        fence_legacy_writer(self.s, partition)
        found = self.position_lookup(self.s.source_topic, partition)
        if not isinstance(found, LegacySync):
            return found
        # Such a sync may be another mirror's of the same source topic (the defect it replaces): take it
        # only if our destination holds at least as many records as it says were written there.
        end = self.downstream_end(self.s.destination_topic, self._dst_partition(partition))
        if found.downstream_offset > end:
            log.warning("%s: %s[%d]: the sync of an earlier release (upstream %d -> downstream %d) is beyond "
                        "%s[%d]'s end %d: another mirror's; not taken as this mirror's position",
                        self.s.mirror, found.topic, partition, found.upstream_offset, found.downstream_offset,
                        self.s.destination_topic, self._dst_partition(partition), end)
            return None
        return OffsetSync(found.topic, found.partition, found.upstream_offset, found.downstream_offset)

    def _position(self, key: str, partition: int) -> Position | None:
        if key not in _POSITIONS:
            self._store_position(key, partition, self._lookup(partition))
        return _POSITIONS.get(key)

    def _store_position(self, key: str, partition: int, found: OffsetSync | int | None,
                        high: int | None = None) -> None:
        """Keep the position ``found`` by a lookup (``high``: the destination partition's high watermark, when
        read already)."""
        if isinstance(found, OffsetSync) and self._beyond_destination_end(found, partition, high):
            _POSITIONS[key] = Position(0)  # the records it covers went with the deleted topic
        elif isinstance(found, OffsetSync):
            _POSITIONS[key] = Position(found.upstream_offset, found.downstream_offset, found.position_only)
        elif found is not None:
            _POSITIONS[key] = Position(int(found))
        else:
            # nothing committed yet: known too (a warm-up's lookup is not repeated by the first write);
            # the producer fenced every zombie before this lookup, so only this writer can commit now
            _POSITIONS[key] = Position(0)

    def _beyond_destination_end(self, sync: OffsetSync, partition: int, high: int | None = None) -> bool:
        """The committed sync maps to a destination offset beyond the destination partition's end (high
        watermark): it was written into a destination topic deleted since (and re-created by an operator or
        ``provision``), whose records are gone. The partition is then mirrored from the batch's start, so a
        fresh Spark checkpoint re-mirrors the source. Checked only where records keep their partition (with
        key hashing a sync's downstream offset is not in one known partition)."""
        if self.s.destination_partitions < self.s.source_partitions:
            return False
        end = self.destination_high(self.s.destination_topic, partition) if high is None else high
        if sync.downstream_offset <= end:
            return False
        log.warning("%s: %s[%d]: the committed position (upstream %d -> downstream %d) is beyond %s[%d]'s end %d: "
                    "the destination topic was re-created since; mirroring the partition from the batch's start",
                    self.s.mirror, self.s.source_topic, partition, sync.upstream_offset, sync.downstream_offset,
                    self.s.destination_topic, partition, end)
        return True

    def _beyond_source_end(self, key: str, partition: int, position: Position) -> bool:
        """The committed position lies beyond the source partition's end: it was written for an earlier
        incarnation of the topic (deleted and re-created) or a log that was truncated since, and the records
        below it are new. Asked only when records would be skipped as already mirrored (a replay)."""
        if self.source_end is None:
            return False
        end = self.source_end(self.s.source_topic, partition)
        if end >= position.upstream:
            return False
        log.warning("%s: %s[%d]: the committed position %d is beyond the source's end %d (topic re-created or "
                    "log truncated): mirroring the partition from its start", self.s.mirror, self.s.source_topic,
                    partition, position.upstream, end)
        return True

    def _syncs(self, partition: int, first_upstream: int, pairs: list[tuple[int, int]], upstream_end: int,
               position: Position | None) -> tuple[list[OffsetSync], int | None]:
        """The chunk's offset syncs and the downstream position after it (None: nothing to record)."""
        looped = sorted(u for u in self._looped.pop(partition, ()) if first_upstream <= u < upstream_end)
        if pairs:
            syncs = syncs_for_batch(self.s.source_topic, partition, pairs, upstream_end)
            if first_upstream < pairs[0][0]:
                # the chunk starts with records that reached no destination partition (dead-lettered): positions
                # from its start map to its first mirrored record (the invariant's case 2), so they stay
                # translatable even when nothing was synced before them
                syncs.insert(0, OffsetSync(self.s.source_topic, partition, first_upstream, pairs[0][1]))
            downstream = pairs[-1][1] + 1
            return loop_marked_syncs(syncs, looped, pairs, first_upstream, downstream), downstream
        if position is not None and position.downstream is not None:
            downstream, position_only = position.downstream, position.position_only
        else:
            downstream = self.downstream_end(self.s.destination_topic, self._dst_partition(partition))
            position_only = False
        syncs = position_syncs(self.s.source_topic, partition, first_upstream, upstream_end, downstream, position_only)
        return loop_marked_syncs(syncs, looped, [], first_upstream, downstream), downstream

    # -- exactly once, transactions per writer

    def prepare_shared(self, partition: int) -> Position | None:
        """``transactions: per_writer``: fence the partition's own transactional id (a per-partition writer of
        an earlier job may still hold it) once in this process, then read its committed position."""
        with partition_lock(self.s, partition):
            self.fence_shared(partition)
            return self._position(self.s.transactional_id_for(partition), partition)

    def fence_shared(self, partition: int) -> None:
        """``transactions: per_writer``: the fence of :meth:`prepare_shared`, alone (once in this process)."""
        key = self.s.transactional_id_for(partition)
        with partition_lock(self.s, partition):
            with _FENCE_GUARD:
                fenced = key in _FENCED_PARTITIONS
            if not fenced:
                if key not in _PRODUCERS:  # a producer of this process holding the id fenced it already
                    fence_transactional_id(dict(self.s.producer_config), key, self.s.destination_topic)
                    _POSITIONS.pop(key, None)  # a zombie may have committed before the fence: read again
                with _FENCE_GUARD:
                    _FENCED_PARTITIONS.add(key)

    def fence_again(self, partition: int) -> None:
        """``transactions: per_writer``, a retry of a Spark task: the partition's own id is to be fenced again
        (the attempt Spark gave up on may hold it, writing the partition alone) and its position read after
        that: forget this process's producer of the id, its fence and its position."""
        key = self.s.transactional_id_for(partition)
        with partition_lock(self.s, partition):
            _drop_producer(key)
            with _FENCE_GUARD:
                _FENCED_PARTITIONS.discard(key)

    def fenced_by_the_driver(self, partition: int) -> None:
        """``read_path: executors`` with ``transactions: per_writer``: the job's driver fenced the partition's own
        id before its tasks first wrote (:meth:`fence_shared` need not, in this Spark task's process)."""
        with _FENCE_GUARD:
            _FENCED_PARTITIONS.add(self.s.transactional_id_for(partition))

    def start(self, partition: int) -> None:
        """A transaction per partition: start the partition's producer alone (its start fences a zombie of its
        id), so that :meth:`read_positions` with ``started`` reads its position together with others'
        (:meth:`stream.BatchWriter.prepare_many`)."""
        with partition_lock(self.s, partition):
            _producer(self.s, partition, gapless=self._gapless())

    def read_positions(self, partitions: list[int], started: bool = False) -> int:
        """``transactions: per_writer``: read the committed positions of those of ``partitions`` that are
        fenced (:meth:`fence_shared`; with ``started``, a transaction per partition: those whose producer this
        process holds, :meth:`start`) and not known yet, in one lookup, and keep them; returns how many it
        kept. A partition whose newest sync an earlier release wrote is left to its own lookup. Nothing is
        kept if this process forgot a position while the lookup ran (it may stand for a commit the lookup
        missed): each partition's next write reads its own again (:meth:`prepare_shared`, :meth:`prepare`)."""
        with _FENCE_GUARD:
            fenced = set(_FENCED_PARTITIONS)
        keys = {p: self.s.transactional_id_for(p) for p in partitions}
        todo = [p for p, k in keys.items() if (k in fenced or (started and k in _PRODUCERS)) and k not in _POSITIONS]
        if not todo:
            return 0
        forgotten = _POSITIONS.forgotten
        found = self.positions_lookup(self.s.source_topic, todo)
        # an earlier release's sync is left to the partition's own lookup (:meth:`_lookup`), which fences that
        # release's writer and looks again
        todo = [p for p in todo if not isinstance(found.get(p), LegacySync)]
        synced = [p for p in todo if isinstance(found.get(p), OffsetSync)]
        highs = (self.destination_highs(self.s.destination_topic, synced)
                 if synced and self.s.destination_partitions >= self.s.source_partitions else {})
        kept = 0
        for p in todo:
            with partition_lock(self.s, p):
                if keys[p] in _POSITIONS or _POSITIONS.forgotten != forgotten:
                    continue
                self._store_position(keys[p], p, found.get(p), highs.get(p))
                kept += 1
        return kept

    def position_known(self, partition: int) -> bool:
        """``transactions: per_writer``: the partition's committed position is known in this process (read by
        the warm-up or an earlier write, and not forgotten since)."""
        return self.s.transactional_id_for(partition) in _POSITIONS

    def stage(self, partition: int, cols: Columns, upstream_end: int, producer: Producer, in_c: bool = False
              ) -> tuple[BatchResult, Staged | None]:
        """Produce the records of ``cols`` past the partition's committed position into ``producer``'s open
        transaction (at-least-once: all of them, into the shared idempotent producer). Returns the partition's
        result and what :meth:`settle_staged` needs (None when every record was committed before: a replay).

        ``in_c``: runs of records may go through the C loop without reports (:mod:`mirror_core.native`)."""
        t0 = time.monotonic()
        key = self.s.transactional_id_for(partition)
        exactly = self.s.delivery == "exactly_once"
        if not len(cols):
            # no records: the partition's records went out in an earlier transaction and its range ended later
            # (trailing transaction markers): only its position moves, by a sync in this transaction
            result = BatchResult(self.s.source_topic, partition, records_in=0, upstream_end=upstream_end)
            position = self.prepare_shared(partition) if exactly else _POSITIONS.get(self._shared_key(partition))
            if position is None or position.downstream is None or position.upstream >= upstream_end:
                return result, None
            return result, Staged(partition, cols, upstream_end, position, result, None, position.downstream)
        result = BatchResult(self.s.source_topic, partition, records_in=len(cols), first_offset=cols.offsets[0],
                             last_offset=cols.offsets[-1], upstream_end=upstream_end)
        if not exactly:
            # at-least-once writes every record of the batch again on a replay, as its per-partition writer does;
            # the shared producer is gapless (see WriterTransaction), so runs may go through the C loop
            landed: set[int] = set()
            sent = self._produce_records(producer, partition, cols, result, {}, in_c=in_c, gapless=True,
                                         landed=landed)
            result.produce_ms += (time.monotonic() - t0) * 1000
            return result, Staged(partition, cols, upstream_end, _POSITIONS.get(self._shared_key(partition)),
                                  result, sent, landed=landed)
        position = self.prepare_shared(partition)
        start = 0 if position is None else bisect.bisect_left(cols.offsets, position.upstream)
        if start and position is not None and self._beyond_source_end(key, partition, position):
            position = _POSITIONS[key] = Position(0)  # the topic was re-created: its records are new
            start = 0
        result.replayed_skipped = start
        t1 = time.monotonic()
        result.setup_ms += (t1 - t0) * 1000
        if start == len(cols):
            if position is not None and position.downstream is not None:
                result.last_downstream = position.downstream - 1
            return result, None
        todo = cols.slice(start, len(cols)) if start else cols
        sent = self._produce_records(producer, partition, todo, result, {}, in_c=in_c)
        result.produce_ms += (time.monotonic() - t1) * 1000
        return result, Staged(partition, todo, upstream_end, position, result, sent)

    def settle_staged(self, producer: Producer, staged: Staged) -> None:
        """Once every report is in: the partition's offset syncs into the same transaction. Raises
        :class:`_Unmapped` when the reports cannot be tied to records or the broker rejected a record as too
        large: the caller aborts and writes the batch partition by partition (which handles both)."""
        if staged.sent is None:
            assert staged.downstream is not None
            staged.position_only = staged.position is not None and staged.position.position_only
            self._emit_sync(producer, OffsetSync(self.s.source_topic, staged.partition, staged.upstream_end,
                                                 staged.downstream, staged.position_only))
            return
        acks, too_large = self._settle(producer, staged.sent)
        if too_large:
            raise _Unmapped()
        syncs, staged.downstream = self._syncs(staged.partition, staged.todo.offsets[0], acks, staged.upstream_end,
                                               staged.position)
        staged.position_only = _resumes_position_only(syncs)
        for sync in syncs:
            self._emit_sync(producer, sync)

    def hand_back(self, staged: Staged) -> None:
        """At-least-once: the writer's shared write hands ``staged``'s partition to this writer to write again;
        the dead letters that write got acknowledged are not sent a second time."""
        if staged.landed:
            self._landed.setdefault(staged.partition, set()).update(staged.landed)

    def committed_staged(self, staged: Staged) -> None:
        """The transaction holding ``staged`` committed (at-least-once: its records and offset syncs were
        acknowledged): its position moves."""
        with partition_lock(self.s, staged.partition):
            _POSITIONS[self._shared_key(staged.partition)] = Position(staged.upstream_end, staged.downstream,
                                                                      staged.position_only)
        result = staged.result
        result.last_downstream = None if staged.downstream is None else staged.downstream - 1
        if len(staged.todo):
            _note_latency(result, staged.todo.timestamps)

    def _shared_key(self, partition: int) -> str:
        """Where the partition's position is kept in this process: its transactional id (exactly_once) or its
        at-least-once key, the same as its per-partition writer uses."""
        return self.s.transactional_id_for(partition) if self.s.delivery == "exactly_once" \
            else _alo_key(self.s, partition)

    def forget_position(self, partition: int) -> None:
        """A writer transaction holding the partition failed: its outcome is not known here (a commit that
        reported an error may have gone through), so the next write reads the committed position again.
        (At-least-once positions are not read back: its per-partition writer writes the batch again.)"""
        if self.s.delivery != "exactly_once":
            return
        with partition_lock(self.s, partition):
            _POSITIONS.pop(self.s.transactional_id_for(partition), None)

    def forget_written_elsewhere(self, partition: int) -> None:
        """``read_path: executors`` with ``transactions: per_writer``: another process (a task on another Python
        worker, the driver) may have written the partition since this one last did, so the position kept here
        may be behind: the next write reads the committed one again (at_least_once: its position moves with
        the partition's next record, as after a restart)."""
        with partition_lock(self.s, partition):
            _POSITIONS.pop(self._shared_key(partition), None)

    def resolve_ids(self, cols: Columns) -> None:
        """Resolve the schema ids of ``cols`` not cached yet, before a transaction opens (see
        :meth:`_write_transactional`)."""
        self._resolve_ids(cols)

    # -- exactly once

    def _write_transactional(self, partition: int, chunk: Columns, result: BatchResult) -> None:
        forced_dead: dict[int, DeadLetter] = {}
        exact = False
        outage = _Outage(self.s, partition)
        failed = 0  # attempts that count: 3, and one more after a fall back to exact delivery reports (a
        # destination that does not answer is waited out, not counted)
        while failed < 4:
            t0 = time.monotonic()
            try:
                producer, key = _producer(self.s, partition)
                position = self._position(key, partition)
            except KafkaException as exc:
                if not (no_answer(exc.args[0]) and outage.wait(exc.args[0].str())):
                    raise
                continue
            start = 0 if position is None else bisect.bisect_left(chunk.offsets, position.upstream)
            if start and position is not None and self._beyond_source_end(key, partition, position):
                position = _POSITIONS[key] = Position(0)  # the topic was re-created: its records are new
                start = 0
            todo = chunk.slice(start, len(chunk)) if start else chunk
            result.replayed_skipped = start
            t1 = time.monotonic()
            result.setup_ms += (t1 - t0) * 1000
            if not len(todo):
                # all of it was committed before (a replay, or a commit that reported an error but went
                # through): the downstream position is the committed one
                if position is not None and position.downstream is not None:
                    result.last_downstream = position.downstream - 1
                return
            upstream_end = result.upstream_end or 0
            # ids not cached yet are resolved before the transaction opens: a registry outage is then
            # waited out (schemas.SchemaResolver) without holding a transaction past its timeout
            self._resolve_ids(todo)
            try:
                producer.begin_transaction()
                try:
                    acks, too_large = self._produce_all(producer, partition, todo, result, forced_dead, exact)
                except _Unmapped:
                    # nothing of it may commit: write the chunk again with one callback per record
                    with fatal_unmasked():
                        producer.abort_transaction(30)
                    _reset_counts(result)
                    exact = True
                    failed += 1
                    continue
                except KafkaException:
                    raise  # handled below: the producer is dropped and its successor fences the transaction
                except NotAcknowledged as exc:
                    # the destination did not answer within the transaction's time: the transaction is lost
                    # (an abort would wait for the destination too); the producer is dropped, and its
                    # successor, made once the destination answers, fences it and writes the chunk again
                    _drop_producer(key)
                    if not outage.wait(str(exc)):
                        raise
                    _reset_counts(result)
                    continue
                except DestinationTopicError:
                    # records wait for partitions that are gone: an abort would wait for them; the producer is
                    # dropped instead (its transaction is fenced at the next start, or times out)
                    _drop_producer(key)
                    raise
                except BaseException:
                    # on_error=fail, unacknowledged records or undelivered dead letters, a registry failure
                    # on an id miss: nothing of this chunk may commit, and the transaction must not stay
                    # open (it would hold the sync partition's LSO and wedge this cached producer)
                    if not _abort_quietly(producer):
                        _drop_producer(key)
                    raise
                if too_large:
                    # the broker rejected whole batches: learn the topic's limit, then the records above
                    # it are dead-lettered up front and batches of small ones stay under it
                    with fatal_unmasked():
                        producer.abort_transaction(30)
                    if not self._learn_size_limit():
                        for off in too_large:
                            forced_dead[off] = DeadLetter("record_too_large",
                                                          "the destination rejected the record size")
                    _drop_producer(key)
                    _reset_counts(result)
                    failed += 1
                    continue
                syncs, downstream = self._syncs(partition, todo.offsets[0], acks, upstream_end, position)
                for sync in syncs:
                    self._emit_sync(producer, sync)
                t2 = time.monotonic()
                with fatal_unmasked():
                    producer.commit_transaction(60)
                result.commit_ms += (time.monotonic() - t2) * 1000
            except KafkaException as exc:
                err = _fatal_reason(producer, exc.args[0])
                _drop_producer(key)
                # fenced (another Python worker took over this partition's transactional.id) or otherwise
                # fatal: a fresh producer re-fences, re-reads the committed position and retries the chunk
                fatal = err.fatal() or err.code() == KafkaError._FATAL
                if fatal:
                    why = ("fenced by a newer producer with the partition's transactional id: the partition moved to "
                           "another Python worker and back, or another job writes this mirror"
                           if err.code() in _FENCES else err.str())
                    log.info("%s[%d]: writing the chunk again on a new producer; the one before stopped (%s)",
                             self.s.source_topic, partition, why)
                if err.code() in _TOPIC_GONE and self._destination_missing():
                    raise DestinationTopicError(destination_deleted(self.s)) from None
                if no_answer(err) and outage.wait(err.str()):
                    exact = exact or bool(result.native_records)
                    _reset_counts(result)
                    continue  # waited out, not counted
                if fatal or err.txn_requires_abort() or err.retriable() or _is_too_large(err):
                    if result.native_records:
                        exact = True  # what failed may be a record without a report: the retry reports each
                    _reset_counts(result)
                    failed += 1
                    continue
                raise WriterError(f"{self.s.mirror} partition {partition}: transaction failed: {err.str()}") from None
            _note_latency(result, todo.timestamps)
            _POSITIONS[key] = Position(upstream_end, downstream, _resumes_position_only(syncs))
            result.last_downstream = None if downstream is None else downstream - 1
            return
        raise WriterError(f"{self.s.mirror} partition {partition}: could not commit after 3 attempts")

    def _learn_size_limit(self) -> bool:
        """Read the destination topic's effective ``max.message.bytes``; True if it is new to us."""
        try:
            res = ConfigResource(ResourceType.TOPIC, self.s.destination_topic)
            admin = AdminClient({k: v for k, v in self.s.producer_config.items() if k != "log_level"})
            entries = admin.describe_configs([res], request_timeout=30)[res].result(30)
            limit = int(entries["max.message.bytes"].value)
        except (KafkaException, KeyError, ValueError, TypeError) as exc:
            log.warning("%s: cannot read max.message.bytes of %s: %s", self.s.mirror, self.s.destination_topic, exc)
            return False
        _LEARNED_LIMITS[self.s.destination_topic] = limit
        if limit == self.s.destination_max_message_bytes:
            return False
        log.info("%s: %s accepts %d-byte batches; re-splitting", self.s.mirror, self.s.destination_topic, limit)
        self.s = dataclasses.replace(self.s, destination_max_message_bytes=limit)
        self.fast = FastPath(self.s, self.translator)
        return True

    def _resolve_ids(self, cols: Columns) -> None:
        """Look up (and so resolve and cache) every ``0x00``-framed schema id of ``cols`` the translator
        does not know yet. Records whose ids stay unknown are dead-lettered later by the usual path."""
        if self.translator.resolver is None:
            return
        columns = [c for c, schema in ((cols.keys, self.fast.key_schema), (cols.values, self.fast.value_schema))
                   if schema]
        known = self.fast.prefixes
        before = len(self.translator.id_map)
        for col in columns:
            # the distinct framing prefixes first (one set built at C speed), then each looked at once
            for head in {data[:5] for data in col if data}:
                if len(head) < 5 or head[0] != 0 or head in known:
                    continue
                sid = int.from_bytes(head[1:5], "big")
                if sid not in self.translator.id_map:
                    self.translator.lookup(sid)
        if len(self.translator.id_map) != before:
            self.fast.refresh(self.translator)  # the chunk's records take the inline path with the new ids

    def _produce_all(self, producer: Producer, partition: int, cols: Columns, result: BatchResult,
                     forced_dead: dict[int, DeadLetter], exact: bool = False, gapless: bool = False,
                     landed: set[int] | None = None) -> tuple[list[tuple[int, int]], list[int]]:
        """Produce ``cols`` (records to the destination topic, dead letters to the DLQ) and wait for every
        acknowledgement. Returns (upstream, downstream) per acknowledged record, sorted, and the upstream
        offsets of records the broker rejected as too large.

        Unless ``exact``, records that keep their partition number share one delivery callback and the
        i-th report is taken for the i-th record produced (see :func:`ordered_acks`); when that cannot be
        proven (or a record was rejected as too large, whose offset must be known) it raises
        :class:`_Unmapped` and the caller writes the chunk again with ``exact``: one callback per record.
        ``gapless``: ``producer`` is an at-least-once one with ``enable.gapless.guarantee`` (see
        :meth:`_produce_records`). ``landed``: see :meth:`_dead_letter`."""
        t0 = time.monotonic()
        sent = self._produce_records(producer, partition, cols, result, forced_dead, exact, gapless=gapless,
                                     landed=landed)
        remaining = self._flush(producer, self._ack_wait())
        result.produce_ms += (time.monotonic() - t0) * 1000
        if remaining:
            raise NotAcknowledged(f"{self.s.mirror}: {remaining} records not acknowledged within "
                                  f"{self._ack_wait():.0f} s")
        return self._settle(producer, sent)

    def _produce_records(self, producer: Producer, partition: int, cols: Columns, result: BatchResult,
                         forced_dead: dict[int, DeadLetter], exact: bool = False, in_c: bool = True,
                         gapless: bool = False, landed: set[int] | None = None) -> _Sent:
        """The producing half of :meth:`_produce_all`: every record of ``cols`` handed to ``producer``, whose
        reports land in the returned :class:`_Sent` (settled by :meth:`_settle` once they are all in).

        With ``in_c``, on a transactional producer (or, ``gapless``, an idempotent one that stops at the first
        record it loses), runs of records between the chunk's first and last go through the C loop
        (:mod:`mirror_core.native`) without delivery reports; their offsets follow from the reports around
        them (:func:`native.fill_runs`)."""
        acks: list[tuple[int, int | None]] = []
        errors: list[tuple[int, KafkaError]] = []
        failed: list[str] = []  # dead letters the broker refused
        # ordered mode: every record goes to ``partition`` of one idempotent producer
        ordered = not exact and self.s.destination_partitions >= self.s.source_partitions
        sent: list[int] = []  # ordered: upstream offsets, in produce order
        reported: list[int | None] = []  # ordered: downstream offsets, in report order

        def report(err: KafkaError | None, msg: Any) -> None:
            if err is not None:
                errors.append((-1, err))
            else:
                reported.append(msg.offset())

        def on_delivery(upstream: int) -> Callable[[KafkaError | None, Any], None]:
            if ordered:
                sent.append(upstream)  # called just before the produce; undone if the produce raises
                return report

            def cb(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    errors.append((upstream, err))
                else:
                    acks.append((upstream, msg.offset()))
            return cb

        s, fast = self.s, self.fast
        topic = s.destination_topic
        produce = producer.produce
        offsets, keys, values, stamps, headers = cols.offsets, cols.keys, cols.values, cols.timestamps, cols.headers
        fast_ok = fast.enabled and not forced_dead
        key_schema, value_schema = fast.key_schema, fast.value_schema
        prov = fast.provenance
        # FastPath.rewrite and .fits, inlined for the records that need no more (a call per record costs):
        # the id map as framing prefixes (refreshed in place), and the size bound without headers
        mapped = fast.prefixes.get
        limit = fast.limit
        mirrored = bytes_out = 0
        misses_before = self.translator.thread_misses()
        known = len(self.translator.id_map)
        last = len(offsets) - 1
        runs: list[tuple[int, int]] = []  # C-produced runs: (position in ``sent``, length)
        in_c = (in_c and ordered and fast_ok and prov is None and (s.delivery == "exactly_once" or gapless)
                and last >= 2 and native.usable(producer))
        value_map = fast.prefixes if value_schema else None
        key_map = fast.prefixes if key_schema else None
        skip = 0  # records before this one went through the C loop
        hold = -1  # the C loop handed this record back: it goes the Python way
        for i in range(len(offsets)):
            if i < skip:
                continue
            if in_c and 0 < i < last and i != hold:
                j, status, nbytes = native.produce(producer, topic, partition, values, keys, stamps, headers, i,
                                                   last, value_map, key_map, limit)
                while status == native.QUEUE_FULL:
                    with fatal_unmasked():
                        producer.poll(0.1)
                    j, status, more = native.produce(producer, topic, partition, values, keys, stamps, headers, j,
                                                     last, value_map, key_map, limit)
                    nbytes += more
                if j > i:
                    runs.append((len(sent), j - i))
                    sent.extend(offsets[i:j])
                    mirrored += j - i
                    bytes_out += nbytes
                    result.native_records += j - i
                    skip = hold = j  # the last record, or one the C loop handed back
                    continue
            k, v = keys[i], values[i]
            hs = headers[i] if headers is not None else ()
            if fast_ok and not (hs and ((fast.any_schema and _has_id_header(hs))
                                        or (prov is not None and _has_provenance(hs)))):
                # the common case, inline: map the framed ids, keep the partition (add the provenance header)
                nk, nv = k, v
                if value_schema and v is not None:
                    head = mapped(v[:5])
                    nv = None if head is None else head + v[5:]
                if prov is not None:
                    hs = (*hs, prov)
                if key_schema and k is not None:
                    head = mapped(k[:5])
                    nk = None if head is None else head + k[5:]
                if (nv is not None or v is None) and (nk is not None or k is None) and (
                        limit is None
                        or (not hs and (len(nk) if nk else 0) + (len(nv) if nv else 0) + 128 <= limit)
                        or fast.fits(nk, nv, hs)):
                    try:
                        produce(topic, nv, nk, partition, on_delivery=on_delivery(offsets[i]), timestamp=stamps[i],
                                headers=list(hs) if hs else None)  # confluent-kafka takes a list, not a tuple
                    except BufferError:
                        if ordered:
                            sent.pop()
                        with fatal_unmasked():
                            producer.poll(0.1)
                        self._produce(producer, topic, partition, nk, nv, list(hs), stamps[i],
                                      on_delivery(offsets[i]))
                    except KafkaException as exc:
                        if ordered:
                            sent.pop()
                        if exc.args[0].code() != KafkaError.MSG_SIZE_TOO_LARGE:
                            raise
                        self._dead_letter(producer, cols.record(s.source_topic, partition, i),
                                          DeadLetter("record_too_large", exc.args[0].str()), result, failed, landed)
                        continue
                    mirrored += 1
                    bytes_out += (len(nv) if nv else 0) + (len(nk) if nk else 0)
                    continue
            # everything else: the full decision (misses, framing errors, provenance, hashing, sizes)
            rec = cols.record(s.source_topic, partition, i)
            decision = forced_dead.get(rec.offset) or decide(rec, s, self.translator)
            if decision == "skip_provenance":
                result.provenance_skipped += 1
                # its original is on the destination: the chunk's syncs make its position untranslatable
                self._looped.setdefault(partition, set()).add(rec.offset)
                continue
            if isinstance(decision, DeadLetter):
                self._dead_letter(producer, rec, decision, result, failed, landed)
                continue
            assert isinstance(decision, OutRecord)
            if len(self.translator.id_map) != known:  # a miss (here or in another partition's thread)
                fast.refresh(self.translator)     # extended the id map
                known = len(self.translator.id_map)
            try:
                self._produce(producer, topic, decision.partition, decision.key, decision.value,
                              list(decision.headers), decision.timestamp_ms, on_delivery(rec.offset))
            except KafkaException as exc:
                if ordered:
                    sent.pop()
                if exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    self._dead_letter(producer, rec, DeadLetter("record_too_large", exc.args[0].str()), result,
                                      failed, landed)
                    continue
                raise
            mirrored += 1
            bytes_out += len(decision.value or b"") + len(decision.key or b"")
        result.mirrored += mirrored
        result.bytes_out += bytes_out
        result.cache_misses += self.translator.thread_misses() - misses_before
        return _Sent(partition, cols, result, ordered, acks, errors, failed, sent, reported, runs)

    def _settle(self, producer: Producer, sent: _Sent) -> tuple[list[tuple[int, int]], list[int]]:
        """The settling half of :meth:`_produce_all`, once every report of ``sent`` is in."""
        self._check_dead_letters(sent.failed)
        fatal = [e for _, e in sent.errors if not _is_too_large(e)]
        if fatal:
            raise KafkaException(fatal[0])
        if sent.ordered:
            if sent.errors:
                pairs = None
            elif sent.runs:
                offs = native.fill_runs(len(sent.sent), sent.reported, sent.runs)
                if offs is None:
                    raise _RunsUnproven()
                pairs = list(zip(sent.sent, offs, strict=True))
            else:
                pairs = ordered_acks(sent.sent, sent.reported)
            if pairs is None:
                raise _Unmapped()
            return pairs, []
        too_large = sorted(u for u, e in sent.errors if _is_too_large(e))
        if too_large and self.s.on_error == "fail":
            i = bisect.bisect_left(sent.cols.offsets, too_large[0])
            self._dead_letter(producer, sent.cols.record(self.s.source_topic, sent.partition, i),
                              DeadLetter("record_too_large", "the destination rejected the record size"),
                              sent.result, sent.failed)
        acks = sorted(sent.acks)
        return [(u, d) for u, d in acks if d is not None], too_large

    def _ack_wait(self) -> float:
        return ack_wait(self.s.delivery, self.s.producer_config)

    def _flush(self, producer: Producer, timeout: float) -> int:
        """:func:`flush_within` ``timeout``; records still unacknowledged after each few seconds make it ask
        whether the destination topic is still there (a producer retries a deleted topic's partitions until
        its messages time out): if not, :class:`DestinationTopicError` at once."""
        return flush_within(producer, timeout, self.s.mirror, self._raise_if_destination_missing)

    def _raise_if_destination_missing(self) -> None:
        if self._destination_missing():
            raise DestinationTopicError(destination_deleted(self.s))

    def _check_dead_letters(self, failed: list[str]) -> None:
        """A record whose dead letter was not delivered is neither mirrored nor set aside: the chunk fails
        (the exactly-once caller aborts it), so no offset sync moves past the record and Spark retries it."""
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            raise WriterError(f"{self.s.mirror}: {failed[0]}{more}")

    def _produce(self, producer: Producer, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 headers: list[Header], ts: int, cb: Callable[..., None] | None) -> None:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 headers=list(headers) or None,  # type: ignore[arg-type]  # None values are fine
                                 timestamp=ts, on_delivery=cb)
                return
            except BufferError:
                with fatal_unmasked():
                    producer.poll(0.1)

    def _dead_letter(self, producer: Producer, rec: SourceRecord, dl: DeadLetter, result: BatchResult,
                     failed: list[str], landed: set[int] | None = None) -> None:
        """Produce ``rec``'s dead letter; a delivery failure lands in ``failed`` (see :meth:`_check_dead_letters`).

        ``landed`` (at_least_once, a chunk that may be written twice): the offsets of records whose dead letter
        was acknowledged; one already there is counted, not produced again (a chunk written again after its
        first attempt stopped sets aside each record once)."""
        if self.s.on_error == "fail":
            raise WriterError(
                f"{self.s.mirror}: cannot mirror {rec.topic}[{rec.partition}]@{rec.offset}: {dl.reason}: {dl.detail}"
            )
        if landed is not None and rec.offset in landed:
            result.dead_lettered += 1
            return
        key, value, headers = dead_letter_record(rec, dl, self.s.mirror)
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is not None:
                failed.append(f"dead letter of {where} ({dl.reason}) not delivered to {self.s.dlq_topic}: {err.str()}")
            elif landed is not None:
                landed.add(rec.offset)

        self._produce(producer, self.s.dlq_topic, 0, key, value, headers, rec.timestamp_ms, delivered)
        result.dead_lettered += 1
        log.warning("%s: dead-lettered %s[%d]@%d: %s", self.s.mirror, rec.topic, rec.partition, rec.offset, dl.reason)

    # -- at least once

    def _write_at_least_once(self, partition: int, chunk: Columns, result: BatchResult) -> None:
        # records whose dead letter is on the DLQ (here or in a shared write that handed the partition back):
        # not set aside twice
        landed = self._landed.pop(partition, set())
        written = self._write_at_least_once_in_c(partition, chunk, result, landed)
        if written is not None:
            # the offset syncs go on the producer that wrote the records; the position is the partition's
            acks, too_large, producer = written
            key = _alo_key(self.s, partition)
        else:
            t0 = time.monotonic()
            producer, key = _producer(self.s, partition)
            result.setup_ms += (time.monotonic() - t0) * 1000
            try:
                acks, too_large = self._produce_all(producer, partition, chunk, result, {}, landed=landed)
            except _Unmapped:
                # the reports cannot be tied to records (or one was rejected as too large): write the chunk
                # again with one callback per record (what landed the first time is written twice)
                _reset_counts(result)
                acks, too_large = self._produce_all(producer, partition, chunk, result, {}, exact=True,
                                                    landed=landed)
        if too_large and self._learn_size_limit():
            # whole batches were rejected: write again from the first rejected record with batches that
            # fit (records after it that did land are written twice: at-least-once; their dead letters not)
            first = too_large[0]
            result.mirrored -= len(too_large) + sum(1 for u, _ in acks if u >= first)
            result.dead_lettered -= sum(1 for u in landed if u >= first)  # counted again below, not sent
            acks = [(u, d) for u, d in acks if u < first]
            _drop_producer(key, keep_position=True)
            producer, key = _producer(self.s, partition)
            rest = chunk.slice(bisect.bisect_left(chunk.offsets, first), len(chunk))
            more, too_large = self._produce_all(producer, partition, rest, result, {}, exact=True, landed=landed)
            acks += more
        if too_large:
            failed: list[str] = []
            for off in too_large:
                i = bisect.bisect_left(chunk.offsets, off)
                self._dead_letter(producer, chunk.record(self.s.source_topic, partition, i),
                                  DeadLetter("record_too_large", "rejected by broker"), result, failed)
                result.mirrored -= 1
            if self._flush(producer, self._ack_wait()):
                raise WriterError(f"{self.s.mirror}: dead letters not acknowledged within {self._ack_wait():.0f} s")
            self._check_dead_letters(failed)
        upstream_end = result.upstream_end or 0
        syncs, downstream = self._syncs(partition, chunk.offsets[0], acks, upstream_end, _POSITIONS.get(key))
        t1 = time.monotonic()
        for sync in syncs:
            self._emit_sync(producer, sync)
        if self._flush(producer, self._ack_wait()):
            raise WriterError(f"{self.s.mirror}: offset syncs not acknowledged within {self._ack_wait():.0f} s")
        result.commit_ms += (time.monotonic() - t1) * 1000
        _POSITIONS[key] = Position(upstream_end, downstream, _resumes_position_only(syncs))
        _note_latency(result, chunk.timestamps)
        result.last_downstream = None if downstream is None else downstream - 1

    def _write_at_least_once_in_c(self, partition: int, chunk: Columns, result: BatchResult, landed: set[int]
                                  ) -> tuple[list[tuple[int, int]], list[int], Producer] | None:
        """``chunk`` through the C loop, on the partition's second producer: the records between its first and
        last go without delivery reports. Without a transaction nothing would show a record among them that
        the destination lost; this producer has ``enable.gapless.guarantee``, so it stops at the first record
        it loses (a fatal error) and every record produced after it, the chunk's last among them, is reported
        failed. Offsets then follow from the reports around each run, as on the exactly-once path. Returns
        the acknowledgements as :meth:`_produce_all` does and the producer, or None when the chunk was not
        written so (a record reported failed, reports that do not prove the runs' offsets): the caller then
        writes it the Python way on the usual producer, with a report per record; what landed is written
        twice, as at-least-once allows. A chunk of fewer than 3 records has no run between its first and last:
        it goes with a report per record, on this producer too, so a partition of a slow stream (chunks of a
        record or two) keeps one producer, not two. ``landed`` gathers the records whose dead letters were
        acknowledged (the chunk written again does not set them aside twice)."""
        # what the C loop needs (see _produce_records): records that keep their partition, no provenance header
        if not self._gapless():
            return None
        t0 = time.monotonic()
        producer, key = _producer(self.s, partition, gapless=True)
        result.setup_ms += (time.monotonic() - t0) * 1000
        if not native.usable(producer):
            return None
        try:
            return (*self._produce_all(producer, partition, chunk, result, {}, gapless=True, landed=landed),
                    producer)
        except (KafkaException, _Unmapped) as exc:
            # a fatal error (a record lost) comes out of the flush as itself (see clients.fatal_unmasked)
            why = exc.args[0].str() if isinstance(exc, KafkaException) else "reports that do not prove its offsets"
            log.info("%s[%d]: a chunk written again with a report per record (%s)", self.s.source_topic, partition,
                     why)
            if isinstance(exc, KafkaException):
                _drop_producer(key, keep_position=True)  # its fatal error leaves the producer unusable
            _reset_counts(result)
            return None


#: a producer fenced by a newer instance with its transactional id (librdkafka's and the broker's codes)
_FENCES = (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH)


def another_took_over(err: KafkaError) -> bool:
    """The error says the producer is done for good: fenced by a newer instance with its transactional id,
    or another fatal error. Another writer may have committed with that id since this one read its positions."""
    return err.fatal() or err.code() in (*_FENCES, KafkaError._FATAL)


class _Unmapped(Exception):  # noqa: N818  # internal signal, never leaves the writer
    """The delivery reports of a chunk written with one shared callback cannot be tied to its records:
    the caller writes the chunk again with one callback per record."""


class _RunsUnproven(_Unmapped):  # noqa: N818
    """Something else landed among the records the C loop produced without reports (see
    :func:`native.fill_runs`): their offsets are not known."""


def ordered_acks(sent: list[int], reported: list[int | None]) -> list[tuple[int, int]] | None:
    """(upstream, downstream) of each record produced to one partition with a shared delivery callback,
    or None when the reports do not prove the mapping.

    ``sent`` holds the upstream offsets in produce order, ``reported`` the downstream offsets in report
    order. An idempotent or transactional producer appends one partition's records in produce order, so
    the downstream offsets in produce order are strictly increasing. When the reports are exactly as many
    and strictly increasing, report order is produce order and the i-th report belongs to the i-th record;
    anything else (a report missing or without an offset, reports out of order) gives None.
    """
    n = len(sent)
    if len(reported) != n:
        return None
    if not n:
        return []
    if None in reported:
        return None
    offs: list[int] = reported  # type: ignore[assignment]  # no None (checked above)
    first = offs[0]
    if offs[-1] - first != n - 1 or offs != list(range(first, first + n)):
        # not one contiguous run (other producers' records or transaction markers in between): still
        # exact if strictly increasing
        if not all(map(operator.lt, offs, itertools.islice(offs, 1, None))):
            return None
    return list(zip(sent, offs, strict=True))


def _has_provenance(headers: tuple[Header, ...]) -> bool:
    return any(name == PROVENANCE_HEADER for name, _ in headers)


def _has_id_header(headers: tuple[Header, ...]) -> bool:
    return any(name in wire.SCHEMA_ID_HEADERS for name, _ in headers)


def _note_latency(result: BatchResult, timestamps: list[int]) -> None:
    """Replication latency (now, just after the commit/acknowledgement, minus CreateTime) of up to 200
    records spread over the chunk."""
    now = time.time() * 1000
    result.latency_ms = [now - ts for ts in timestamps[:: max(1, len(timestamps) // 200)]]


def _is_too_large(err: KafkaError) -> bool:
    return bool(err.code() == KafkaError.MSG_SIZE_TOO_LARGE)


def _abort_quietly(producer: Producer) -> bool:
    """Abort the open transaction; False (logged) when that failed and the producer must be dropped."""
    try:
        with fatal_unmasked():
            producer.abort_transaction(30)
    except KafkaException as exc:
        log.warning("abort after a failed chunk: %s", exc.args[0].str())
        return False
    return True


class _Outage:
    """An exactly_once writer's wait for a destination that does not answer: the transaction's 60 s are
    not the limit; the chunk is tried again on a new producer for as long as an at_least_once producer
    would keep trying (its delivery timeout, from the first such failure), with a line each time."""

    def __init__(self, s: WriterSettings, partition: int) -> None:
        self.s, self.partition = s, partition
        self.since: float | None = None

    def wait(self, why: str) -> bool:
        """True to try again (after a short pause), False once the wait is over."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        limit = delivery_timeout(self.s.producer_config)
        if now - self.since >= limit:
            return False
        log.warning("%s[%d]: the destination did not answer (%s); the chunk is written again on a new producer "
                    "once it does (waited %.0f s of up to %.0f s)", self.s.source_topic, self.partition,
                    why.splitlines()[0][:200], now - self.since, limit)
        time.sleep(1.0)
        return True


def _fatal_reason(producer: Producer, err: KafkaError) -> KafkaError:
    """``err``, or, when it is a produce refused as ``_FATAL`` (which says only "Fatal error"), the producer's
    fatal error itself (a fence, ...), raised by the next ``poll`` if it was not served yet."""
    if err.code() != KafkaError._FATAL:
        return err
    try:
        with fatal_unmasked():
            producer.poll(0)
    except KafkaException as exc:
        return exc.args[0]  # type: ignore[no-any-return]
    return err


def _reset_counts(result: BatchResult) -> None:
    result.mirrored = result.bytes_out = result.dead_lettered = result.provenance_skipped = result.native_records = 0


#: at most this many key + value bytes in one transaction (exactly_once) or flush (at_least_once), next to
#: the Spark job's 20,000-record chunks: a chunk of large records must commit well within the 60 s
#: transaction timeout and flush deadline, even on a slow link (32 MiB at 1 MB/s is ~34 s)
CHUNK_BYTES = 32 * 1024 * 1024


def byte_bounded(cols: Columns, limit: int) -> list[Columns]:
    """``cols`` cut into consecutive pieces of at most ``limit`` key + value bytes each (a single larger
    record is a piece of its own). One piece, ``cols`` itself, in the usual case."""
    if sum(map(len, filter(None, cols.keys))) + sum(map(len, filter(None, cols.values))) <= limit:
        return [cols]  # the usual case, summed without a Python step per record
    sizes = [(len(k) if k else 0) + (len(v) if v else 0) for k, v in zip(cols.keys, cols.values, strict=True)]
    pieces: list[Columns] = []
    start, acc = 0, 0
    for i, n in enumerate(sizes):
        if acc + n > limit and i > start:
            pieces.append(cols.slice(start, i))
            start, acc = i, 0
        acc += n
    pieces.append(cols.slice(start, len(cols)))
    return pieces


def chunks(records: Iterable[SourceRecord], size: int) -> Iterator[list[SourceRecord]]:
    buf: list[SourceRecord] = []
    for r in records:
        buf.append(r)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf
