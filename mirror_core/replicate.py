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

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

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
    #: the destination topic's ``max.message.bytes`` override, when it has one: records whose
    #: single-record batch is larger are dead-lettered before producing (the broker would reject them)
    destination_max_message_bytes: int | None = None

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
        if any(h == header_name and v is not None for h, v in headers):
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


@dataclass(frozen=True)
class Position:
    """Where a partition's mirror stands: the next upstream offset to read and, when known, the
    downstream position (next offset) that the newest committed offset sync maps it to."""

    upstream: int
    downstream: int | None = None


#: what a writer's ``position_lookup`` returns: the newest committed sync, a bare upstream offset, or None
PositionLookup = Callable[[str, int], "OffsetSync | int | None"]

_PRODUCERS: dict[str, Producer] = {}
_POSITIONS: dict[str, Position] = {}


def _producer(s: WriterSettings, partition: int) -> tuple[Producer, str]:
    """A long-lived producer per (writer, partition) in this Python worker."""
    base: dict[str, Any] = {"enable.idempotence": True, "acks": "all", "linger.ms": 5, "log_level": 3}
    if s.destination_max_message_bytes is not None:
        # keep batches of small records under the topic's limit (a single larger record still goes alone)
        base["batch.size"] = max(1, min(1_000_000, s.destination_max_message_bytes - 100))
    if s.delivery == "exactly_once":
        txid = s.transactional_id_for(partition)
        if txid not in _PRODUCERS:
            p = Producer(s.producer_config | base | {"transactional.id": txid, "transaction.timeout.ms": 60000})
            p.init_transactions(60)  # fences any zombie with the same transactional.id
            _PRODUCERS[txid] = p
            _POSITIONS.pop(txid, None)  # a zombie may have committed since: re-read
        return _PRODUCERS[txid], txid
    key = f"{s.transactional_id}.alo"
    if key not in _PRODUCERS:
        _PRODUCERS[key] = Producer(s.producer_config | base)
    return _PRODUCERS[key], key


def _drop_producer(key: str) -> None:
    _PRODUCERS.pop(key, None)
    _POSITIONS.pop(key, None)


def last_committed_sync(consumer_config: dict[str, Any], syncs_topic: str, topic: str, partition: int,
                        chunk: int = 2000, timeout: float = 30.0) -> OffsetSync | None:
    """The newest committed offset sync for ``topic``/``partition``, or None.

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
        best: OffsetSync | None = None
        for p in tmd.partitions:
            low, high = c.get_watermark_offsets(TopicPartition(syncs_topic, p), timeout=timeout)
            end = high
            found: OffsetSync | None = None
            while end > low and found is None:
                start = max(low, end - chunk)
                found = _scan(c, syncs_topic, p, start, end, topic, partition, timeout)
                end = start
            if found is not None and (best is None or found.upstream_offset > best.upstream_offset):
                best = found
        return best
    finally:
        c.close()


def last_committed_position(consumer_config: dict[str, Any], syncs_topic: str, topic: str, partition: int,
                            chunk: int = 2000, timeout: float = 30.0) -> int | None:
    """The upstream position of the newest committed offset sync for ``topic``/``partition``."""
    sync = last_committed_sync(consumer_config, syncs_topic, topic, partition, chunk, timeout)
    return None if sync is None else sync.upstream_offset


def _scan(c: Consumer, syncs_topic: str, p: int, start: int, end: int, topic: str, partition: int,
          timeout: float) -> OffsetSync | None:
    c.assign([TopicPartition(syncs_topic, p, start)])
    found: OffsetSync | None = None
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
            found = sync  # later records in the log supersede earlier ones
        if msg.offset() >= end - 1:
            break
    else:
        raise WriterError(f"timed out reading {syncs_topic} partition {p}")
    return found


def committed_end_offset(consumer_config: dict[str, Any], topic: str, partition: int,
                         timeout: float = 30.0) -> int:
    """The destination partition's last stable offset (read_committed end): where the next record
    written there lands at the earliest."""
    c = Consumer(consumer_config | {"group.id": "mirrorflow-position-lookup", "enable.auto.commit": False,
                                    "isolation.level": "read_committed", "log_level": 3})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout)[1])
    finally:
        c.close()


def position_syncs(topic: str, partition: int, first_upstream: int, upstream_end: int, downstream: int
                   ) -> list[OffsetSync]:
    """Syncs for a chunk that wrote nothing to the destination topic (every record dead-lettered or
    skipped by provenance): both the chunk's first position and its end map to ``downstream``, the
    next downstream position. Keeps the invariant's case 2 (no record mirrored in between, no
    downstream record in between), so a restart resumes after the chunk and translation stays exact."""
    if first_upstream >= upstream_end:
        return [OffsetSync(topic, partition, upstream_end, downstream)]
    return [OffsetSync(topic, partition, first_upstream, downstream),
            OffsetSync(topic, partition, upstream_end, downstream)]


# --------------------------------------------------------------------------- the writer


class PartitionWriter:
    """Writes chunks of one source partition's records; see the module docstring for guarantees.

    ``position_lookup`` returns the newest committed sync of a partition (or its upstream offset);
    ``downstream_end`` returns a destination partition's committed end offset, used only to place a
    position sync when no earlier sync is known (default: asks the destination).
    """

    def __init__(self, settings: WriterSettings, translator: SchemaIdTranslator,
                 position_lookup: PositionLookup,
                 downstream_end: Callable[[str, int], int] | None = None):
        self.s = settings
        self.translator = translator
        self.position_lookup = position_lookup
        self.downstream_end = downstream_end or (
            lambda t, p: committed_end_offset(settings.producer_config, t, p))

    def write(self, partition: int, records: Iterable[SourceRecord], upstream_end: int | None = None) -> BatchResult:
        """Mirror one chunk of records of ``partition`` (in offset order).

        ``result.last_downstream + 1`` is the partition's downstream position after the chunk (set also
        when nothing was written to the destination topic but a position sync was).
        """
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
            _POSITIONS[key] = Position(upstream_end, last_downstream + 1)
        else:
            producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0)
            if producer.flush(60):
                raise WriterError(f"{self.s.mirror}: offset sync not acknowledged within 60 s")

    # -- positions

    def _position(self, key: str, partition: int) -> Position | None:
        if key not in _POSITIONS:
            found = self.position_lookup(self.s.source_topic, partition)
            if isinstance(found, OffsetSync):
                _POSITIONS[key] = Position(found.upstream_offset, found.downstream_offset)
            elif found is not None:
                _POSITIONS[key] = Position(int(found))
        return _POSITIONS.get(key)

    def _syncs(self, partition: int, todo: list[SourceRecord], pairs: list[tuple[int, int]], upstream_end: int,
               position: Position | None) -> tuple[list[OffsetSync], int | None]:
        """The chunk's offset syncs and the downstream position after it (None: nothing to record)."""
        if pairs:
            return syncs_for_batch(self.s.source_topic, partition, pairs, upstream_end), pairs[-1][1] + 1
        if position is not None and position.downstream is not None:
            downstream = position.downstream
        else:
            dst_partition = partition if self.s.destination_partitions >= self.s.source_partitions \
                else partition % self.s.destination_partitions
            downstream = self.downstream_end(self.s.destination_topic, dst_partition)
        return position_syncs(self.s.source_topic, partition, todo[0].offset, upstream_end, downstream), downstream

    # -- exactly once

    def _write_transactional(self, partition: int, chunk: list[SourceRecord], result: BatchResult) -> None:
        forced_dead: dict[int, DeadLetter] = {}
        for _attempt in range(3):
            producer, key = _producer(self.s, partition)
            position = self._position(key, partition)
            todo = [r for r in chunk if position is None or r.offset >= position.upstream]
            result.replayed_skipped = len(chunk) - len(todo)
            if not todo:
                return
            upstream_end = result.upstream_end or 0
            try:
                producer.begin_transaction()
                try:
                    acks, too_large = self._produce_all(producer, todo, result, forced_dead)
                except WriterError:
                    # on_error=fail (or unacknowledged records): nothing of this chunk may commit
                    _abort_quietly(producer)
                    raise
                if too_large:
                    # the broker rejected whole batches: learn the topic's limit, then the records above
                    # it are dead-lettered up front and batches of small ones stay under it
                    producer.abort_transaction(30)
                    if not self._learn_size_limit():
                        for off in too_large:
                            forced_dead[off] = DeadLetter("record_too_large",
                                                          "the destination rejected the record size")
                    _drop_producer(key)
                    _reset_counts(result)
                    continue
                pairs = [(u, d) for u, d in acks if d is not None]
                syncs, downstream = self._syncs(partition, todo, pairs, upstream_end, position)
                for sync in syncs:
                    producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(),
                                     partition=0)
                producer.commit_transaction(60)
            except KafkaException as exc:
                err = exc.args[0]
                _drop_producer(key)
                # fenced (another Python worker took over this partition's transactional.id) or otherwise
                # fatal: a fresh producer re-fences, re-reads the committed position and retries the chunk
                fatal = err.fatal() or err.code() == KafkaError._FATAL
                if fatal or err.txn_requires_abort() or err.retriable() or _is_too_large(err):
                    _reset_counts(result)
                    continue
                raise WriterError(f"{self.s.mirror} partition {partition}: transaction failed: {err.str()}") from None
            now = time.time() * 1000
            result.latency_ms = [now - r.timestamp_ms for r in todo[:: max(1, len(todo) // 200)]]
            _POSITIONS[key] = Position(upstream_end, downstream)
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
        if limit == self.s.destination_max_message_bytes:
            return False
        log.info("%s: %s accepts %d-byte batches; re-splitting", self.s.mirror, self.s.destination_topic, limit)
        self.s = dataclasses.replace(self.s, destination_max_message_bytes=limit)
        return True

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
        too_large = sorted(u for u, e in errors if _is_too_large(e))
        fatal = [e for _, e in errors if not _is_too_large(e)]
        if fatal:
            raise KafkaException(fatal[0])
        if too_large and self.s.on_error == "fail":
            by_offset = {r.offset: r for r in todo}
            self._dead_letter(producer, by_offset[too_large[0]],
                              DeadLetter("record_too_large", "the destination rejected the record size"), result)
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
        producer, key = _producer(self.s, partition)
        acks, too_large = self._produce_all(producer, chunk, result, {})
        if too_large and self._learn_size_limit():
            # whole batches were rejected: write again from the first rejected record with batches that
            # fit (records after it that did land are written twice: at-least-once)
            first = too_large[0]
            result.mirrored -= len(too_large) + sum(1 for u, _ in acks if u >= first)
            acks = [(u, d) for u, d in acks if u < first]
            position = _POSITIONS.get(key)
            _drop_producer(key)
            if position is not None:
                _POSITIONS[key] = position
            producer, key = _producer(self.s, partition)
            more, too_large = self._produce_all(producer, [r for r in chunk if r.offset >= first], result, {})
            acks += more
        if too_large:
            by_offset = {r.offset: r for r in chunk}
            for off in too_large:
                self._dead_letter(producer, by_offset[off], DeadLetter("record_too_large", "rejected by broker"),
                                  result)
                result.mirrored -= 1
            if producer.flush(60):
                raise WriterError(f"{self.s.mirror}: dead letters not acknowledged within 60 s")
        pairs = [(u, d) for u, d in acks if d is not None]
        upstream_end = result.upstream_end or 0
        syncs, downstream = self._syncs(partition, chunk, pairs, upstream_end, _POSITIONS.get(key))
        for sync in syncs:
            producer.produce(self.s.offset_syncs_topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0)
        if producer.flush(60):
            raise WriterError(f"{self.s.mirror}: offset syncs not acknowledged within 60 s")
        _POSITIONS[key] = Position(upstream_end, downstream)
        now = time.time() * 1000
        result.latency_ms = [now - r.timestamp_ms for r in chunk[:: max(1, len(chunk) // 200)]]
        result.last_downstream = None if downstream is None else downstream - 1


def _is_too_large(err: KafkaError) -> bool:
    return bool(err.code() == KafkaError.MSG_SIZE_TOO_LARGE)


def _abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction(30)
    except KafkaException as exc:  # the producer is dropped by the caller's retry or failure anyway
        log.warning("abort after a failed chunk: %s", exc.args[0].str())


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
