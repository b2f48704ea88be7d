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

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from mirror_core import wire
from mirror_core.errors import MirrorError
from mirror_core.offsets import OffsetSync, syncs_for_batch
from mirror_core.partitioner import java_partition

log = logging.getLogger(__name__)

PROVENANCE_HEADER = "mirrorflow.provenance"
DLQ_HEADERS = ("mirrorflow.error.reason", "mirrorflow.error.detail", "mirrorflow.source.topic",
               "mirrorflow.source.partition", "mirrorflow.source.offset", "mirrorflow.mirror")
SCHEMA_SERDES = ("avro", "protobuf", "json_schema")

Header = tuple[str, bytes | None]


class WriterError(MirrorError):
    """The writer could not complete a chunk (the task fails and Spark retries it)."""


@dataclass(frozen=True)
class SourceRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...]
    timestamp_ms: int


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
    producer_config: dict[str, Any]  # destination librdkafka config (contains secrets: never log)

    @property
    def transactional_id(self) -> str:
        return f"mirrorflow.{self.group}.{self.source_alias}.{self.source_topic}.{self.destination_topic}"

    def transactional_id_for(self, partition: int) -> str:
        return f"{self.transactional_id}.{partition}"


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


class SchemaIdTranslator:
    """Source schema id -> destination id; a miss asks ``resolver`` (which registers under the mapped
    subject) and extends the cache. ``resolver`` returns None when the id is unknown at the source."""

    def __init__(self, id_map: dict[int, int], resolver: Callable[[int], int | None] | None = None):
        self.id_map = dict(id_map)
        self.resolver = resolver
        self.misses = 0

    def lookup(self, source_id: int) -> int | None:
        dst = self.id_map.get(source_id)
        if dst is None and self.resolver is not None:
            self.misses += 1
            dst = self.resolver(source_id)
            if dst is not None:
                self.id_map[source_id] = dst
        return dst


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
    prov = _provenance(rec.headers)
    if s.provenance and s.destination_alias in prov:
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
        if any(h == header_name for h, _ in headers):
            # the id travels in a header; the payload is not framed
            new_headers, err = wire.rewrite_header_ids(headers, translator.lookup, only=header_name)
            if err is not None:
                return DeadLetter(err.reason, f"{field_name}: {err.detail}")
            headers = new_headers
            continue
        out = wire.translate_payload(data, translator.lookup)
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
    return OutRecord(partition, key, value, headers, rec.timestamp_ms)


def _provenance(headers: tuple[Header, ...]) -> list[str]:
    for name, val in headers:
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


# --------------------------------------------------------------------------- producers and positions


_PRODUCERS: dict[str, Producer] = {}
_POSITIONS: dict[str, int] = {}


def _producer(s: WriterSettings, partition: int) -> tuple[Producer, str]:
    """A long-lived producer per (writer, partition) in this Python worker."""
    if s.delivery == "exactly_once":
        txid = s.transactional_id_for(partition)
        if txid not in _PRODUCERS:
            p = Producer(s.producer_config | {
                "transactional.id": txid, "enable.idempotence": True, "acks": "all",
                "transaction.timeout.ms": 60000, "linger.ms": 5, "log_level": 3,
            })
            p.init_transactions(60)  # fences any zombie with the same transactional.id
            _PRODUCERS[txid] = p
            _POSITIONS.pop(txid, None)  # a zombie may have committed since: re-read
        return _PRODUCERS[txid], txid
    key = f"{s.transactional_id}.alo"
    if key not in _PRODUCERS:
        _PRODUCERS[key] = Producer(s.producer_config | {
            "enable.idempotence": True, "acks": "all", "linger.ms": 5, "log_level": 3,
        })
    return _PRODUCERS[key], key


def _drop_producer(key: str) -> None:
    _PRODUCERS.pop(key, None)
    _POSITIONS.pop(key, None)


def last_committed_position(consumer_config: dict[str, Any], syncs_topic: str, topic: str, partition: int,
                            chunk: int = 2000, timeout: float = 30.0) -> int | None:
    """The upstream position of the newest committed offset sync for ``topic``/``partition``.

    Scans the offset-sync topic backwards from its end (read_committed) in chunks, so a restart reads
    only the tail in the common case.
    """
    c = Consumer(consumer_config | {
        "group.id": "mirrorflow-position-lookup", "enable.auto.commit": False,
        "isolation.level": "read_committed", "log_level": 3, "enable.partition.eof": True,
    })
    try:
        md = c.list_topics(syncs_topic, timeout=timeout)
        tmd = md.topics.get(syncs_topic)
        if tmd is None or tmd.error is not None:
            raise WriterError(f"offset-sync topic {syncs_topic!r} is missing on the destination; run provision")
        best: int | None = None
        for p in tmd.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(syncs_topic, p), timeout=timeout)
            end = high
            while end > low and best is None:
                start = max(low, end - chunk)
                found = _scan(c, syncs_topic, p, start, end, topic, partition, timeout)
                if found is not None:
                    best = found if best is None else max(best, found)
                end = start
        return best
    finally:
        c.close()


def _scan(c: Consumer, syncs_topic: str, p: int, start: int, end: int, topic: str, partition: int,
          timeout: float) -> int | None:
    c.assign([TopicPartition(syncs_topic, p, start)])
    found: int | None = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = c.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                break
            raise WriterError(f"reading {syncs_topic}: {msg.error().str()}")
        if msg.offset() >= end:
            break
        sync = OffsetSync.from_record(msg.key(), msg.value())
        if sync.topic == topic and sync.partition == partition:
            found = sync.upstream_offset  # later records in the log supersede earlier ones
        if msg.offset() >= end - 1:
            break
    else:
        raise WriterError(f"timed out reading {syncs_topic} partition {p}")
    return found


# --------------------------------------------------------------------------- the writer


class PartitionWriter:
    """Writes chunks of one source partition's records; see the module docstring for guarantees."""

    def __init__(self, settings: WriterSettings, translator: SchemaIdTranslator,
                 position_lookup: Callable[[str, int], int | None]):
        self.s = settings
        self.translator = translator
        self.position_lookup = position_lookup

    def write(self, partition: int, records: Iterable[SourceRecord], upstream_end: int | None = None) -> BatchResult:
        """Mirror one chunk of records of ``partition`` (in offset order)."""
        chunk = list(records)
        result = BatchResult(self.s.source_topic, partition, records_in=len(chunk))
        if not chunk:
            return result
        result.first_offset, result.last_offset = chunk[0].offset, chunk[-1].offset
        result.upstream_end = upstream_end if upstream_end is not None else chunk[-1].offset + 1
        if self.s.delivery == "exactly_once":
            self._write_transactional(partition, chunk, result)
        else:
            self._write_at_least_once(partition, chunk, result)
        return result

    def advance(self, partition: int, upstream_end: int, last_downstream: int) -> None:
        """Record that the partition's position moved to ``upstream_end`` past records that are not data
        (transaction markers, aborted records) after the last mirrored record at ``last_downstream``."""
        sync = OffsetSync(self.s.source_topic, partition, upstream_end, last_downstream + 1)
        producer, key = _producer(self.s, partition)
        if self.s.delivery == "exactly_once":
            producer.begin_transaction()
            producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0)
            producer.commit_transaction(60)
            _POSITIONS[key] = upstream_end
        else:
            producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0)
            if producer.flush(60):
                raise WriterError(f"{self.s.mirror}: offset sync not acknowledged within 60 s")

    # -- exactly once

    def _write_transactional(self, partition: int, chunk: list[SourceRecord], result: BatchResult) -> None:
        forced_dead: dict[int, DeadLetter] = {}
        for _attempt in range(3):
            producer, key = _producer(self.s, partition)
            if key not in _POSITIONS:
                pos = self.position_lookup(self.s.source_topic, partition)
                if pos is not None:
                    _POSITIONS[key] = pos
            position = _POSITIONS.get(key)
            todo = [r for r in chunk if position is None or r.offset >= position]
            result.replayed_skipped = len(chunk) - len(todo)
            if not todo:
                return
            try:
                producer.begin_transaction()
                acks, too_large = self._produce_all(producer, todo, result, forced_dead)
                if too_large:
                    producer.abort_transaction(30)
                    for off in too_large:
                        forced_dead[off] = DeadLetter("record_too_large", "the destination rejected the record size")
                    _reset_counts(result)
                    continue
                pairs = [(u, d) for u, d in acks if d is not None]
                syncs = syncs_for_batch(self.s.source_topic, partition, pairs, result.upstream_end or 0)
                for sync in syncs:
                    producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(),
                                     partition=0)
                producer.commit_transaction(60)
            except KafkaException as exc:
                err = exc.args[0]
                _drop_producer(key)
                if err.txn_requires_abort() or err.retriable():
                    _reset_counts(result)
                    continue
                raise WriterError(f"{self.s.mirror} partition {partition}: transaction failed: {err.str()}") from None
            now = time.time() * 1000
            result.latency_ms = [now - r.timestamp_ms for r in todo[:: max(1, len(todo) // 200)]]
            _POSITIONS[key] = result.upstream_end or 0
            result.last_downstream = max((d for _, d in acks if d is not None), default=None)
            return
        raise WriterError(f"{self.s.mirror} partition {partition}: could not commit after 3 attempts")

    def _produce_all(self, producer: Producer, todo: list[SourceRecord], result: BatchResult,
                     forced_dead: dict[int, DeadLetter]) -> tuple[list[tuple[int, int | None]], list[int]]:
        acks: list[tuple[int, int | None]] = []
        errors: list[tuple[int, KafkaError]] = []

        def on_delivery(upstream: int) -> Callable[[KafkaError | None, Any], None]:
            def cb(err: KafkaError | None, msg: Any) -> None:
                if err is not None:
                    errors.append((upstream, err))
                else:
                    acks.append((upstream, msg.offset()))
            return cb

        for rec in todo:
            decision = forced_dead.get(rec.offset) or decide(rec, self.s, self.translator)
            if decision == "skip_provenance":
                result.provenance_skipped += 1
                continue
            if isinstance(decision, DeadLetter):
                self._dead_letter(producer, rec, decision, result)
                continue
            assert isinstance(decision, OutRecord)
            try:
                self._produce(producer, self.s.destination_topic, decision.partition, decision.key, decision.value,
                              list(decision.headers), decision.timestamp_ms, on_delivery(rec.offset))
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    self._dead_letter(producer, rec, DeadLetter("record_too_large", exc.args[0].str()), result)
                    continue
                raise
            result.mirrored += 1
            result.bytes_out += len(decision.value or b"") + len(decision.key or b"")
        remaining = producer.flush(60)
        if remaining:
            raise WriterError(f"{self.s.mirror}: {remaining} records not acknowledged within 60 s")
        result.cache_misses = self.translator.misses
        too_large = [u for u, e in errors if e.code() == KafkaError.MSG_SIZE_TOO_LARGE]
        fatal = [e for _, e in errors if e.code() != KafkaError.MSG_SIZE_TOO_LARGE]
        if fatal:
            raise KafkaException(fatal[0])
        acks.sort()
        return acks, too_large

    def _produce(self, producer: Producer, topic: str, partition: int, key: bytes | None, value: bytes | None,
                 headers: list[Header], ts: int, cb: Callable[..., None] | None) -> None:
        while True:
            try:
                producer.produce(topic, value=value, key=key, partition=partition, headers=headers or None,
                                 timestamp=ts, on_delivery=cb)
                return
            except BufferError:
                producer.poll(0.1)

    def _dead_letter(self, producer: Producer, rec: SourceRecord, dl: DeadLetter, result: BatchResult) -> None:
        if self.s.on_error == "fail":
            raise WriterError(
                f"{self.s.mirror}: cannot mirror {rec.topic}[{rec.partition}]@{rec.offset}: {dl.reason}: {dl.detail}"
            )
        self._produce(producer, self.s.dlq_topic, 0, rec.key, rec.value,
                      dead_letter_headers(rec, dl, self.s.mirror), rec.timestamp_ms, None)
        result.dead_lettered += 1
        log.warning("%s: dead-lettered %s[%d]@%d: %s", self.s.mirror, rec.topic, rec.partition, rec.offset, dl.reason)

    # -- at least once

    def _write_at_least_once(self, partition: int, chunk: list[SourceRecord], result: BatchResult) -> None:
        producer, _ = _producer(self.s, partition)
        acks, too_large = self._produce_all(producer, chunk, result, {})
        if too_large:
            by_offset = {r.offset: r for r in chunk}
            for off in too_large:
                self._dead_letter(producer, by_offset[off], DeadLetter("record_too_large", "rejected by broker"),
                                  result)
                result.mirrored -= 1
            producer.flush(60)
        pairs = [(u, d) for u, d in acks if d is not None]
        for sync in syncs_for_batch(self.s.source_topic, partition, pairs, result.upstream_end or 0):
            producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0)
        if producer.flush(60):
            raise WriterError(f"{self.s.mirror}: offset syncs not acknowledged within 60 s")
        now = time.time() * 1000
        result.latency_ms = [now - r.timestamp_ms for r in chunk[:: max(1, len(chunk) // 200)]]
        result.last_downstream = max((d for _, d in acks if d is not None), default=None)


def _reset_counts(result: BatchResult) -> None:
    result.mirrored = result.bytes_out = result.dead_lettered = result.provenance_skipped = 0


def chunks(records: Iterable[SourceRecord], size: int) -> Iterator[list[SourceRecord]]:
    buf: list[SourceRecord] = []
    for r in records:
        buf.append(r)
        if len(buf) >= size:
            yield buf
            buf = []
    if buf:
        yield buf
