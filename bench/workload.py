"""The generated data: Avro-framed values, string keys, and the produce-time stamp used for latency.

Values are Confluent wire format (``0x00`` + 4-byte schema id + Avro body) so mirrorflow's
``avro`` serde translates ids; MirrorMaker 2 and the raw pipes copy the bytes as they are.
Latency records carry their produce wall-clock in the key (``m<seq>.<time_ns>``): every
contender keeps keys, including ``kcat`` which cannot carry headers through a pipe.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from fastavro import parse_schema, schemaless_writer

SCHEMA: dict[str, Any] = {
    "type": "record", "name": "BenchEvent", "namespace": "mirrorflow.bench",
    "fields": [{"name": "id", "type": "long"}, {"name": "ts", "type": "long"}, {"name": "payload", "type": "string"}],
}
PARSED = parse_schema(SCHEMA)
_TEXT = ("lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor " * 40).encode()
MEASURED_PREFIX = b"m"


def frame(schema_id: int, body: bytes) -> bytes:
    """Confluent wire format: magic byte 0, big-endian schema id, then the Avro body."""
    return b"\x00" + struct.pack(">I", schema_id) + body


def _body(i: int, payload_len: int) -> bytes:
    buf = BytesIO()
    start = i % 997
    schemaless_writer(buf, PARSED, {"id": i, "ts": 1_700_000_000_000 + i,
                                    "payload": _TEXT[start:start + payload_len].decode()})
    return buf.getvalue()


def payload_len_for(size: int) -> int:
    """The payload length that makes a framed value of about ``size`` bytes (never negative)."""
    overhead = len(frame(0, _body(1_000_000, 0)))
    n = max(0, size - overhead - 1)
    if n > 63:
        n -= 1  # the string length varint takes two bytes from 64 on
    return min(n, len(_TEXT) - 997)


def make_value(schema_id: int, i: int, size: int) -> bytes:
    return frame(schema_id, _body(i, payload_len_for(size)))


def measured_key(seq: int, produced_ns: int) -> bytes:
    return b"m%09d.%d" % (seq, produced_ns)


def parse_measured_key(key: bytes | None) -> tuple[int, int] | None:
    """``(seq, produced_ns)`` of a latency record's key, None for any other key."""
    if not key or not key.startswith(MEASURED_PREFIX):
        return None
    seq, _, ns = key[1:].partition(b".")
    try:
        return int(seq), int(ns)
    except ValueError:
        return None


def _producer(bootstrap: str, linger_ms: int) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": linger_ms, "batch.size": 1_000_000, "log_level": 3})


def _produce(p: Producer, topic: str, key: bytes, value: bytes, partition: int) -> None:
    while True:
        try:
            p.produce(topic, key=key, value=value, partition=partition)
            return
        except BufferError:
            p.poll(0.05)


@dataclass(frozen=True)
class Loaded:
    records: int
    key_bytes: int
    value_bytes: int
    seconds: float


def load(bootstrap: str, topic: str, records: int, size: int, partitions: int, schema_id: int,
         progress: Callable[[int], None] | None = None) -> Loaded:
    """Produce ``records`` records round-robin over ``partitions``; returns what was written."""
    t0 = time.monotonic()
    p = _producer(bootstrap, linger_ms=20)
    plen = payload_len_for(size)
    kb = vb = 0
    for i in range(records):
        key = b"%09d" % i
        value = frame(schema_id, _body(i, plen))
        kb += len(key)
        vb += len(value)
        _produce(p, topic, key, value, i % partitions)
        if i % 5000 == 4999:
            p.poll(0)
            if progress:
                progress(5000)
    if p.flush(120):
        raise RuntimeError(f"{topic}: records still unacknowledged after 120 s")
    return Loaded(records, kb, vb, time.monotonic() - t0)


class RateProducer:
    """Produces latency records at a fixed rate from a thread; the key carries the produce time."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, schema_id: int, size: int):
        self.topic = topic
        self.partitions = partitions
        self.value = make_value(schema_id, 0, size)
        self.p = _producer(bootstrap, linger_ms=1)
        self.sent = 0
        self._warm = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def warm(self) -> None:
        """One unmeasured record (key ``w...``), to find out when the contender starts delivering."""
        _produce(self.p, self.topic, b"w%09d" % self._warm, self.value, self._warm % self.partitions)
        self._warm += 1
        self.p.poll(0)

    def run(self, rate: float, seconds: float, measured: bool = True) -> None:
        """Start producing ``rate`` records/s for ``seconds`` in the background; ``measured=False``: records
        with unmeasured keys (``r...``), not counted in ``sent``, and no flush at the end (a measured run
        started right after continues the rate)."""
        total = int(rate * seconds)

        def key(seq: int) -> bytes:
            return measured_key(seq, time.time_ns()) if measured else b"r%09d" % seq

        def loop() -> None:
            t0 = time.monotonic()
            seq = 0
            while seq < total and not self._stop.is_set():
                due = min(total, int((time.monotonic() - t0) * rate) + 1)
                while seq < due:
                    _produce(self.p, self.topic, key(seq), self.value, seq % self.partitions)
                    seq += 1
                if measured:
                    self.sent = seq
                self.p.poll(0)
                time.sleep(0.002)
            if measured:
                self.p.flush(30)

        self._thread = threading.Thread(target=loop, name="rate-producer", daemon=True)
        self._thread.start()

    def done(self) -> bool:
        return self._thread is not None and not self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        if self._thread:
            self._thread.join(timeout)

    def stop(self) -> None:
        self._stop.set()
        self.join(10)
        self.p.flush(10)


#: :func:`warm_broker`: transactions, and records of each partition in each, over :data:`WARM_PARTITIONS`
WARM_TRANSACTIONS = 300
WARM_RECORDS_PER_PARTITION = 200
WARM_PARTITIONS = 6
#: ... over more partitions (:func:`warm_shape`): at least this many transactions, and records of 24 partitions
WARM_TRANSACTIONS_MIN = 100


def warm_shape(partitions: int) -> tuple[int, int, int]:
    """The warm-up of a run over ``partitions`` partitions: ``(partitions, transactions, records a partition a
    transaction)``. At most :data:`WARM_PARTITIONS`, the fixed shape. Over more, the run's own count: a broker
    warmed over 6 partitions was still cold for a transaction over 500 (at 1,000 partitions the first contender's
    first two micro-batches took 4-10 times its later ones; warmed over 1,000, 3-4 times, and it drained at 367,800
    records/s against 160,013-229,068). As many records as 24 partitions get, in at least
    :data:`WARM_TRANSACTIONS_MIN` transactions (a commit over 1,000 partitions takes about a second here)."""
    if partitions <= WARM_PARTITIONS:
        return WARM_PARTITIONS, WARM_TRANSACTIONS, WARM_RECORDS_PER_PARTITION
    per_txn = WARM_PARTITIONS * WARM_RECORDS_PER_PARTITION  # records a transaction of the fixed shape
    transactions = max(WARM_TRANSACTIONS_MIN, min(WARM_TRANSACTIONS, WARM_TRANSACTIONS * 24 // partitions))
    return partitions, transactions, max(1, per_txn // partitions)


def warm_broker(bootstrap: str, topic: str, partitions: int, seconds: float = 0.0,
                sizes: tuple[int, ...] = (100,), transactions: int = WARM_TRANSACTIONS,
                per_partition: int = WARM_RECORDS_PER_PARTITION) -> int:
    """Run a broker's write, transaction and read paths before anything is measured on it; returns the
    records written and read back.

    A freshly started broker runs its code interpreted until the JIT has compiled the hot paths. Without
    this, the first contender of a run to write transactions was slower, with more broker CPU per record,
    than the same contender later in the run (with it, still somewhat: see bench/README.md); brokers in
    production are long warm. ``topic`` (``partitions`` of them, already created) gets at least
    ``transactions`` small transactions of ``per_partition`` records a partition (see :func:`warm_shape`), and more
    until ``seconds`` have passed, their values of
    each size of ``sizes`` by turns; they are read back ``read_committed`` with group offset commits as
    they commit. It also has the broker create its group-offset and transaction-state topics (50
    partitions each) here rather than under the first contender that needs them."""
    from confluent_kafka import Consumer, TopicPartition

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-warm-{topic}", "linger.ms": 5,
                  "log_level": 3})
    p.init_transactions(60)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-warm-{topic}", "log_level": 3,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "fetch.queue.backoff.ms": 10})
    c.assign([TopicPartition(topic, part, 0) for part in range(partitions)])
    values = [b"w" * size for size in sizes]
    read = 0

    def read_back(timeout: float) -> None:
        nonlocal read
        msgs = c.consume(10000, timeout)
        read += sum(1 for m in msgs if m.error() is None)
        if msgs:
            try:
                c.commit(asynchronous=False)
            except Exception:  # noqa: BLE001 - nothing new to commit (only errors came back)
                pass

    deadline = time.monotonic() + seconds
    written = 0
    while written < transactions or time.monotonic() < deadline:
        value = values[written % len(values)]
        p.begin_transaction()
        for part in range(partitions):
            for _ in range(per_partition):
                _produce(p, topic, b"warm", value, part)
        p.commit_transaction(60)
        written += 1
        read_back(0)
    total = written * partitions * per_partition
    deadline = time.monotonic() + 120
    while read < total and time.monotonic() < deadline:
        read_back(0.5)
    c.close()
    return read


#: Kafka's check, on each transactional write to a partition, that the partition was added to the producer's
#: transaction (KIP-890; on by default since 3.6): a round trip to the transaction coordinator per partition
#: and transaction, which the broker makes while that connection's next request waits
VERIFICATION = "transaction.partition.verification.enable"


def transaction_verification(bootstrap: str, off: bool, timeout: float = 30.0) -> list[int]:
    """Turn the transaction verification of every broker of ``bootstrap`` off (a dynamic per-broker setting),
    or, with ``off=False``, remove that setting again (the broker's own configuration applies); wait until
    each broker reports what was asked. Returns the broker ids. For an A/B in one invocation (the
    ``-noverify`` contenders of bench/run.py)."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    ids = sorted(admin.list_topics(timeout=10).brokers)
    op = AlterConfigOpType.SET if off else AlterConfigOpType.DELETE
    resources = [ConfigResource(ResourceType.BROKER, str(i), incremental_configs=[
        ConfigEntry(VERIFICATION, "false" if off else None, incremental_operation=op)]) for i in ids]
    for future in admin.incremental_alter_configs(resources).values():
        future.result(timeout)
    dynamic = ConfigSource.DYNAMIC_BROKER_CONFIG.value
    asked = [ConfigResource(ResourceType.BROKER, str(i)) for i in ids]
    deadline = time.monotonic() + timeout
    while True:
        got = {}
        for resource, future in admin.describe_configs(asked).items():
            entry = future.result(timeout)[VERIFICATION]
            got[resource.name] = (entry.value, entry.source)
        if all((value == "false" and source == dynamic) if off else source != dynamic
               for value, source in got.values()):
            return ids
        if time.monotonic() > deadline:
            want = "off" if off else "back to the brokers' own value"
            raise RuntimeError(f"{VERIFICATION} did not turn {want} on {bootstrap} within {timeout:.0f} s: {got}")
        time.sleep(0.2)
