"""Issue 11 item 9 without a broker: positions before a chunk's first mirrored record, produce failures of
checkpoints and heartbeats, and the offset-sync history read incrementally. Small in-memory fakes of the
Kafka clients stand in; the real-broker behaviour is covered in tests/integration."""

from __future__ import annotations

import struct
from typing import Any

import pytest
import yaml

from mirror_core import checkpoint, clients, replicate
from mirror_core.config import parse_config
from mirror_core.errors import KafkaOperationError
from mirror_core.offsets import OffsetSync, OffsetSyncStore
from mirror_core.replicate import SchemaIdTranslator, SourceRecord, WriterSettings


def group(tmp: str = "g"):
    cfg = parse_config(yaml.safe_load(f"""
clusters: {{src: {{kafka: {{bootstrap.servers: "h1:9092"}}}}, dst: {{kafka: {{bootstrap.servers: "h2:9092"}}}}}}
groups:
  - {{name: {tmp}, source: src, destination: dst, serdes: {{key: bytes, value: bytes}},
      mirrors: [{{source_topic: t}}]}}
"""), env={})
    return cfg, cfg.groups[0]


class _Err:
    def __init__(self, text: str):
        self.text = text

    def str(self) -> str:
        return self.text


class _Msg:
    def __init__(self, offset: int = 0, key: bytes | None = None, value: bytes | None = None):
        self._o, self._k, self._v = offset, key, value

    def offset(self) -> int:
        return self._o

    def key(self) -> bytes | None:
        return self._k

    def value(self) -> bytes | None:
        return self._v

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000 + self._o)  # (CreateTime, ms)

    def headers(self) -> list[tuple[str, bytes]] | None:
        return None  # a sync without the destination header (as an earlier release wrote): every group's


class _Producer:
    """Delivers every record, or fails every delivery with ``error`` (as a broker rejection does)."""

    def __init__(self, error: str | None = None):
        self.error = error
        self.produced: list[tuple[str, bytes | None, bytes | None]] = []
        self.committed: list[list[tuple[str, bytes | None, bytes | None]]] = []
        self._txn: list[tuple[str, bytes | None, bytes | None]] = []
        self._cbs: list[Any] = []
        self._next: dict[tuple[str, int], int] = {}

    def begin_transaction(self) -> None:
        self._txn = []

    def produce(self, topic, value=None, key=None, partition=0, on_delivery=None, timestamp=0, headers=None):
        self.produced.append((topic, key, value))
        self._txn.append((topic, key, value))
        if on_delivery is not None:
            off = self._next.get((topic, partition), 0)
            self._next[(topic, partition)] = off + 1
            self._cbs.append((on_delivery, _Msg(off)))

    def flush(self, timeout: float = 0) -> int:
        for cb, msg in self._cbs:
            cb(_Err(self.error) if self.error else None, msg)
        self._cbs = []
        return 0

    def commit_transaction(self, timeout: float = 0) -> None:
        self.committed.append(self._txn)

    def abort_transaction(self, timeout: float = 0) -> None:
        self._txn = []


def test_item9_first_record_dead_lettered_keeps_the_partition_start_translatable(monkeypatch) -> None:
    """Offset 0 (a group that has read nothing) translates to the first mirrored record, not 'too old'."""
    fake = _Producer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    s = WriterSettings(group="g", mirror="g__t__t", source_alias="src", destination_alias="dst",
                       source_topic="t", destination_topic="t", source_partitions=1, destination_partitions=1,
                       delivery="exactly_once", key_serde="bytes", value_serde="avro", on_error="dead_letter",
                       dlq_topic="g.dlq", offset_syncs_topic="syncs", provenance=False, producer_config={})
    known = b"\x00" + struct.pack(">i", 1) + b"ok"
    unknown = b"\x00" + struct.pack(">i", 77) + b"bad"
    recs = [SourceRecord("t", 0, o, b"k", v, (), 0) for o, v in ((0, unknown), (1, known), (2, known))]
    w = replicate.PartitionWriter(s, SchemaIdTranslator({1: 5}), lambda t, p: None, downstream_end=lambda t, p: 0)
    r = w.write(0, recs, upstream_end=3)
    assert r.dead_lettered == 1 and r.mirrored == 2
    store = OffsetSyncStore()
    store.add_all(OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs")
    assert store.translate("t", 0, 0).downstream_offset == 0  # the record at destination offset 0 is source 1
    assert store.translate("t", 0, 1).downstream_offset == 0
    assert store.translate("t", 0, 2).downstream_offset == 1
    assert store.translate("t", 0, 3).downstream_offset == 2


def test_item9_checkpoint_produce_failure_is_an_error(monkeypatch) -> None:
    cfg, g = group()
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 0, 0, 0), OffsetSync("t", 0, 10, 10)])
    monkeypatch.setattr(checkpoint, "load_checkpoints", lambda c, gr: {})
    monkeypatch.setattr(checkpoint, "remapped_topics", lambda c, gr, m: set())
    monkeypatch.setattr(checkpoint, "source_group_offsets", lambda c, gr, topics: {"app": {("t", 0): 4}})
    fake = _Producer("Broker: Topic authorization failed")
    monkeypatch.setattr(clients, "producer", lambda cluster, **kw: fake)
    mappings = [checkpoint.TopicMapping("t", "t", "g__t__t", "g__t__t")]
    with pytest.raises(KafkaOperationError, match="checkpoint.*not written: Broker: Topic authorization failed"):
        checkpoint.emit_checkpoints(cfg, g, store, mappings, checkpoint.RoundReport("g"))
    fake.error = None
    current = checkpoint.emit_checkpoints(cfg, g, store, mappings, checkpoint.RoundReport("g"))
    assert current[("app", "t", 0)].downstream_offset == 4


def test_item9_heartbeat_produce_failure_is_an_error(monkeypatch) -> None:
    cfg, g = group()

    class _Admin:
        def list_topics(self, timeout: float = 0) -> Any:
            return type("Md", (), {"topics": {"heartbeats": object()}, "brokers": {1: object()}})()

    fake = _Producer("Broker: Message size too large")
    monkeypatch.setattr(clients, "admin", lambda cluster, **kw: _Admin())
    monkeypatch.setattr(clients, "producer", lambda cluster, **kw: fake)
    with pytest.raises(KafkaOperationError, match="heartbeat to heartbeats on src not written: Broker: Message size"):
        checkpoint.emit_heartbeat(cfg, g)
    fake.error = None
    assert checkpoint.emit_heartbeat(cfg, g) is True


def test_item9_sync_history_is_read_incrementally(monkeypatch) -> None:
    """A second round reads only the syncs written since the first; a re-created topic is read afresh."""
    cfg, g = group()
    log: list[OffsetSync] = [OffsetSync("t", 0, u, u) for u in range(0, 100, 10)]
    low = [0]
    reads: list[tuple[int, int]] = []

    def end_offsets(cluster: Any, topic: str, committed: bool = True, timeout: float = 30.0):
        assert topic == g.offset_syncs
        return {0: (low[0], len(log))}

    def read_partition(cluster: Any, topic: str, p: int, start: int, end: int, timeout: float = 60.0):
        reads.append((start, end))
        for i in range(start, end):
            yield _Msg(i, log[i].key_bytes(), log[i].value_bytes())

    monkeypatch.setattr(checkpoint, "_SYNC_TAILS", {}, raising=False)
    monkeypatch.setattr(clients, "end_offsets", end_offsets)
    monkeypatch.setattr(clients, "read_partition", read_partition)
    first = checkpoint.load_sync_store(cfg, g)
    assert first.latest("t", 0) == OffsetSync("t", 0, 90, 90)
    log.extend([OffsetSync("t", 0, 100, 104), OffsetSync("t", 0, 110, 114)])
    second = checkpoint.load_sync_store(cfg, g)
    assert sum(e - s for s, e in reads) == 12  # 10, then only the 2 new ones
    assert second.translate("t", 0, 105).downstream_offset == 109 and second.translate("t", 0, 50).exact
    # the topic re-created (its end moved back): read from scratch, old history forgotten
    log[:] = [OffsetSync("t", 0, 3, 1)]
    third = checkpoint.load_sync_store(cfg, g)
    assert third.latest("t", 0) == OffsetSync("t", 0, 3, 1) and third.oldest("t", 0) == OffsetSync("t", 0, 3, 1)


def test_item5_writer_mirrors_a_recreated_partition_from_its_start(monkeypatch) -> None:
    """The committed position (100) is beyond the source partition's end (3): the topic was re-created, so
    its records 0-2 are new and are mirrored, not skipped as already mirrored. A real replay is still skipped."""
    fake = _Producer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    s = WriterSettings(group="g", mirror="g__t__t", source_alias="src", destination_alias="dst",
                       source_topic="t", destination_topic="t", source_partitions=1, destination_partitions=1,
                       delivery="exactly_once", key_serde="bytes", value_serde="bytes", on_error="dead_letter",
                       dlq_topic="g.dlq", offset_syncs_topic="syncs", provenance=False, producer_config={})
    ends = {"t": 3}
    kwargs: dict[str, Any] = {"downstream_end": lambda t, p: 250, "destination_high": lambda t, p: 250}
    if "source_end" in replicate.PartitionWriter.__init__.__code__.co_varnames:
        kwargs["source_end"] = lambda t, p: ends[t]
    w = replicate.PartitionWriter(s, SchemaIdTranslator({}), lambda t, p: OffsetSync("t", 0, 100, 250), **kwargs)
    recs = [SourceRecord("t", 0, o, b"k", b"v%d" % o, (), 0) for o in range(3)]
    r = w.write(0, recs, upstream_end=3)
    assert r.mirrored == 3 and r.replayed_skipped == 0
    again = w.write(0, recs, upstream_end=3)  # Spark replays the batch: now it is already mirrored
    assert again.mirrored == 0 and again.replayed_skipped == 3


def test_item8_cached_producer_is_rebuilt_when_the_destination_grows(monkeypatch) -> None:
    """A destination grown while the mirror runs: the partition's producer is built again, so its metadata
    knows the new partitions (librdkafka refuses a partition it does not know)."""
    import dataclasses

    from tests.unit.test_replicate import recording_producers

    recording_producers(monkeypatch)
    monkeypatch.setattr(replicate, "fence_legacy_writer", lambda s, p: None, raising=False)
    for delivery in ("exactly_once", "at_least_once"):
        s = WriterSettings(group="g", mirror="m", source_alias="src", destination_alias="dst", source_topic="t",
                           destination_topic="t", source_partitions=2, destination_partitions=2, delivery=delivery,
                           key_serde="bytes", value_serde="bytes", on_error="dead_letter", dlq_topic="d",
                           offset_syncs_topic="s", provenance=False, producer_config={})
        p1, _ = replicate._producer(s, 1)
        assert replicate._producer(s, 1)[0] is p1
        grown = dataclasses.replace(s, source_partitions=4, destination_partitions=4)
        assert replicate._producer(grown, 1)[0] is not p1, delivery
