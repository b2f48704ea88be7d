"""Pure decisions of the partition writer: schema ids in headers, pass-through serdes, provenance,
record size, position syncs, and the heartbeat mirror's selection."""

from __future__ import annotations

import dataclasses
import struct

import pytest
import yaml

from mirror_core import replicate
from mirror_core.config import parse_config
from mirror_core.errors import ConfigError
from mirror_core.offsets import UNMAPPED, OffsetSync, OffsetSyncStore, syncs_for_batch
from mirror_core.policy import build_replication_policy
from mirror_core.positions import POSITION_ONLY_HEADER, sync_from_record
from mirror_core.replicate import (
    PROVENANCE_HEADER,
    DeadLetter,
    OutRecord,
    SchemaIdTranslator,
    SourceRecord,
    WriterSettings,
    decide,
    position_syncs,
    record_batch_size,
)
from mirror_core.stream import heartbeat_selection


@pytest.fixture(autouse=True)
def destination_present(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fakes' destination topic is always there. After a failed chunk the writer asks the destination's
    metadata whether the topic was deleted (tests/faults/test_destination_deleted.py, on real brokers); with
    no cluster behind these settings that question would wait out its 15 s timeout and answer "no"."""
    monkeypatch.setattr(replicate.PartitionWriter, "_destination_missing", lambda self: False)


def settings(**over: object) -> WriterSettings:
    base = dict(
        group="g", mirror="g__t__t", source_alias="src", destination_alias="dst", source_topic="t",
        destination_topic="t", source_partitions=3, destination_partitions=3, delivery="exactly_once",
        key_serde="bytes", value_serde="avro", on_error="dead_letter", dlq_topic="g.dlq",
        offset_syncs_topic="syncs", provenance=False, producer_config={},
    )
    return WriterSettings(**(base | over))  # type: ignore[arg-type]


def recording_producers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, object]]:
    """The writer's producers replaced by ones that only record the config each is built with (returned, in
    order), and its producer tables emptied, so each test builds its own."""
    made: list[dict[str, object]] = []

    class Recording:
        def __init__(self, conf: dict[str, object]) -> None:
            made.append(conf)

        def list_topics(self, *_a: object, **_k: object) -> None:
            return None

        def init_transactions(self, *_a: object) -> None:
            return None

    monkeypatch.setattr(replicate, "Producer", Recording)
    for name in ("_PRODUCERS", "_POSITIONS", "_PRODUCER_LIMITS", "_LEARNED_LIMITS", "_PRODUCER_PARTITIONS"):
        monkeypatch.setattr(replicate, name, {})
    return made


def rec(value: bytes | None, headers: tuple = (), key: bytes | None = b"k", offset: int = 5) -> SourceRecord:
    return SourceRecord("t", 1, offset, key, value, tuple(headers), 1_700_000_000_000)


def ids(mapping: dict[int, int]) -> SchemaIdTranslator:
    return SchemaIdTranslator(mapping)


def test_value_schema_id_header_is_translated_and_payload_untouched() -> None:
    payload = b"\x02\x04unframed-avro-body"
    out = decide(rec(payload, (("a", b"1"), ("__value_schema_id", b"\x00" + struct.pack(">i", 7)), ("z", None))),
                 settings(), ids({7: 42}))
    assert isinstance(out, OutRecord)
    assert out.value == payload
    assert out.headers == (("a", b"1"), ("__value_schema_id", b"\x00" + struct.pack(">i", 42)), ("z", None))


def test_item10_unresolvable_guid_is_dead_lettered_not_passed_through() -> None:
    """A GUID the destination cannot decode must not reach it unchanged (item 10 of issue 11)."""
    guid = b"\x01" + bytes(range(16))
    out = decide(rec(b"body", (("__value_schema_id", guid),)), settings(), ids({}))
    assert isinstance(out, DeadLetter) and out.reason == "unknown_schema_guid" and "__value_schema_id" in out.detail
    framed = decide(rec(guid + b"body"), settings(), ids({}))
    assert isinstance(framed, DeadLetter) and framed.reason == "unknown_schema_guid" and framed.detail.startswith("value")


def test_unknown_header_id_is_dead_lettered() -> None:
    bad = decide(rec(b"body", (("__value_schema_id", b"\x00" + struct.pack(">i", 9)),)), settings(), ids({}))
    assert isinstance(bad, DeadLetter) and bad.reason == "unknown_schema_id" and "__value_schema_id" in bad.detail


def test_key_header_translated_only_for_a_schema_key_serde() -> None:
    hdr = ("__key_schema_id", b"\x00" + struct.pack(">i", 3))
    framed = b"\x00" + struct.pack(">i", 3) + b"body"
    out = decide(rec(framed, (hdr,), key=b"raw-key"), settings(key_serde="avro"), ids({3: 30}))
    assert isinstance(out, OutRecord)
    assert out.key == b"raw-key"  # the key's id is in its header
    assert out.headers == (("__key_schema_id", b"\x00" + struct.pack(">i", 30)),)
    assert out.value == b"\x00" + struct.pack(">i", 30) + b"body"  # the value is framed


def test_null_schema_id_header_falls_back_to_payload_framing() -> None:
    framed = b"\x00" + struct.pack(">i", 7) + b"body"
    out = decide(rec(framed, (("__value_schema_id", None),)), settings(), ids({7: 8}))
    assert isinstance(out, OutRecord) and out.value == b"\x00" + struct.pack(">i", 8) + b"body"


def test_string_and_bytes_serdes_pass_everything_through() -> None:
    weird = b"\x00\x00\x00\x00\x07looks framed"
    headers = (("__value_schema_id", b"\x00\x00\x00\x00\x07"), ("h", b"v"))
    for serde in ("string", "bytes"):
        out = decide(rec(weird, headers), settings(key_serde=serde, value_serde=serde), ids({}))
        assert out == OutRecord(1, b"k", weird, headers, 1_700_000_000_000)


def test_provenance_added_only_when_on_and_loops_skipped() -> None:
    s = settings(value_serde="bytes", provenance=True)
    out = decide(rec(b"v", (("h", b"1"),)), s, ids({}))
    assert isinstance(out, OutRecord) and out.headers == (("h", b"1"), (PROVENANCE_HEADER, b"src"))
    came_from_dst = rec(b"v", ((PROVENANCE_HEADER, b"dst"),))
    assert decide(came_from_dst, s, ids({})) == "skip_provenance"
    hop = decide(rec(b"v", ((PROVENANCE_HEADER, b"x"),)), s, ids({}))
    assert isinstance(hop, OutRecord) and hop.headers == ((PROVENANCE_HEADER, b"x,src"),)
    off = decide(rec(b"v", (("h", b"1"),)), settings(value_serde="bytes"), ids({}))
    assert isinstance(off, OutRecord) and off.headers == (("h", b"1"),)


def test_record_larger_than_destination_limit_is_dead_lettered_up_front() -> None:
    s = settings(value_serde="bytes", destination_max_message_bytes=2000)
    assert isinstance(decide(rec(b"x" * 100), s, ids({})), OutRecord)
    big = decide(rec(b"x" * 10_000), s, ids({}))
    assert isinstance(big, DeadLetter) and big.reason == "record_too_large"
    # with compression the broker sees compressed sizes: left to the broker (and the retry path)
    compressed = settings(value_serde="bytes", destination_max_message_bytes=2000,
                          producer_config={"compression.type": "lz4"})
    assert isinstance(decide(rec(b"x" * 10_000), compressed, ids({})), OutRecord)


def test_record_batch_size_matches_kafka_v2_format() -> None:
    # 61-byte batch header + a record of: length(1) attrs(1) tsDelta(1) offDelta(1) keyLen(1)+3 valLen(1)+5 hdrs(1)
    assert record_batch_size(b"key", b"value", ()) == 61 + 1 + 14
    assert record_batch_size(None, None, ()) == 61 + 1 + 6
    assert record_batch_size(b"", b"x" * 200, (("h", b"v"),)) == 61 + 2 + (3 + 1 + 2 + 200 + 1 + 2 + 2)


def test_position_syncs_keep_translation_exact() -> None:
    """A chunk where nothing reached the destination: both ends map to the next downstream position."""
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 0, 0, 0), OffsetSync("t", 0, 9, 9), OffsetSync("t", 0, 10, 10)])
    store.add_all(position_syncs("t", 0, 10, 15, 11))  # 10..14 dead-lettered; 10 is the commit marker
    assert store.translate("t", 0, 15).downstream_offset == 11
    assert store.translate("t", 0, 12).downstream_offset == 11
    assert store.translate("t", 0, 9).downstream_offset == 9
    assert position_syncs("t", 0, 15, 15, 11) == [OffsetSync("t", 0, 15, 11)]


class _Msg:
    def __init__(self, offset: int):
        self._offset = offset

    def offset(self) -> int:
        return self._offset


class _FakeProducer:
    """Just enough of a transactional producer to run the writer without a broker."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None, bytes | None]] = []
        self.committed: list[list[tuple[str, bytes | None, bytes | None]]] = []
        self.full: list[tuple] = []  # (topic, partition, key, value, headers, timestamp) of every produce
        self._txn: list[tuple[str, bytes | None, bytes | None]] = []
        self._cbs: list = []
        self._next: dict[tuple[str, int], int] = {}

    def begin_transaction(self) -> None:
        self._txn = []

    def produce(self, topic, value=None, key=None, partition=0, on_delivery=None, timestamp=0, headers=None):
        if headers is not None and not isinstance(headers, (list, dict)):  # as confluent-kafka checks
            raise TypeError("expected headers to be dict or list of (key, value) tuples, not " + type(headers).__name__)
        self._txn.append((topic, key, value))
        self.full.append((topic, partition, key, value, tuple(headers or ()), timestamp))
        if on_delivery:
            off = self._next.get((topic, partition), 0)
            self._next[(topic, partition)] = off + 1
            self._cbs.append((on_delivery, _Msg(off)))

    def flush(self, timeout: float) -> int:
        for cb, msg in self._cbs:
            cb(None, msg)
        self._cbs = []
        return 0

    def commit_transaction(self, timeout: float) -> None:
        self.committed.append(self._txn)

    def abort_transaction(self, timeout: float) -> None:
        self._txn = []


class _FailingCommits(_FakeProducer):
    """A transactional producer whose first ``failures`` commits raise ``code``."""

    def __init__(self, code: int, failures: int) -> None:
        super().__init__()
        self.code, self.failures, self.commits = code, failures, 0

    def commit_transaction(self, timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException

        self.commits += 1
        if self.commits <= self.failures:
            raise KafkaException(KafkaError(self.code, "commit failed", retriable=True))
        super().commit_transaction(timeout)


def _write_with_failing_commits(monkeypatch, code: int, failures: int) -> tuple[_FailingCommits, object]:
    fake = _FailingCommits(code, failures)
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    monkeypatch.setattr(replicate.time, "sleep", lambda _s: None)  # the outage's pause between tries
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), ids({}), lambda t, p: None,
                                       downstream_end=lambda t, p: 0, destination_high=lambda t, p: 999)
    try:
        return fake, writer.write(0, [rec(b"v", offset=o) for o in range(3)], upstream_end=3)
    except replicate.WriterError as exc:
        return fake, exc


def test_exactly_once_gives_up_a_chunk_after_its_counted_attempts(monkeypatch) -> None:
    """A commit that keeps failing (retriable, the destination answering) is tried four times (three, and one
    more after a fall back to a report per record), then the writer says so, naming the partition; nothing
    was committed."""
    from confluent_kafka import KafkaError

    fake, out = _write_with_failing_commits(monkeypatch, KafkaError.NOT_ENOUGH_REPLICAS, failures=10)
    assert isinstance(out, replicate.WriterError) and "partition 0: could not commit after 3 attempts" in str(out)
    assert fake.commits == 4 and fake.committed == []


def test_exactly_once_waits_out_a_destination_that_does_not_answer_without_counting_it(monkeypatch) -> None:
    """Commits failing because the destination does not answer are waited out (within the delivery timeout),
    not counted as attempts: six in a row, then the chunk commits once."""
    from confluent_kafka import KafkaError

    fake, out = _write_with_failing_commits(monkeypatch, KafkaError._TRANSPORT, failures=6)
    assert not isinstance(out, replicate.WriterError), out
    assert fake.commits == 7 and len(fake.committed) == 1 and out.mirrored == 3


def test_fully_dead_lettered_chunk_writes_a_position_sync(monkeypatch) -> None:
    """So a restart in a new worker resumes after the chunk instead of dead-lettering it again."""
    fake = _FakeProducer()
    s = settings(value_serde="avro")
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: OffsetSync("t", 1, 5, 40),
                                       downstream_end=lambda t, p: 999, destination_high=lambda t, p: 999)
    bad = [rec(b"\x00" + struct.pack(">i", 77) + b"x", offset=o) for o in (5, 6, 7)]
    r = writer.write(1, bad, upstream_end=8)
    assert r.dead_lettered == 3 and r.mirrored == 0 and r.last_downstream == 39
    syncs = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs"]
    assert syncs == [OffsetSync("t", 1, 5, 40), OffsetSync("t", 1, 8, 40)]
    # the same chunk again (a Spark replay): nothing re-dead-lettered
    again = writer.write(1, bad, upstream_end=8)
    assert again.replayed_skipped == 3 and len(fake.committed) == 1


def test_position_sync_without_history_uses_the_destination_end(monkeypatch) -> None:
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(value_serde="bytes", provenance=True), ids({}),
                                       lambda t, p: None, downstream_end=lambda t, p: 17)
    looped = [rec(b"v", ((PROVENANCE_HEADER, b"dst"),), offset=o) for o in (0, 1)]
    r = writer.write(1, looped)
    assert r.provenance_skipped == 2
    syncs = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs"]
    # the position after them maps to the destination's end; theirs are untranslatable (their originals are on
    # the destination, see test_offsets' loop-guard tests)
    assert syncs == [OffsetSync("t", 1, 0, UNMAPPED), OffsetSync("t", 1, 2, 17)]


def _loop_writer(monkeypatch, dst_end: int, committed: OffsetSync | None) -> tuple[_FakeProducer, object]:
    fake = _FakeProducer()
    fake._next[("t", 1)] = dst_end
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(value_serde="bytes", provenance=True), ids({}),
                                       lambda t, p: committed, downstream_end=lambda t, p: dst_end,
                                       destination_high=lambda t, p: dst_end)
    return fake, writer


def test_a_failbacks_copies_leave_no_position_among_them_mapped_past_their_originals(monkeypatch) -> None:
    """Failback, the reverse flow's first batch: 0-9 of the partition are copies of the destination's 0-9 (the
    failover's flow wrote them, with its provenance header), 10-12 were produced here since. A consumer group at 4
    has not read the originals' 4-9: mapped to 10 (the next mirrored record's place), it skipped them."""
    fake, writer = _loop_writer(monkeypatch, 10, None)
    batch = [rec(b"a%d" % o, ((PROVENANCE_HEADER, b"dst"),), offset=o) for o in range(10)] + \
            [rec(b"b%d" % o, offset=o) for o in range(10, 13)]
    r = writer.write(1, batch, upstream_end=13)
    assert (r.provenance_skipped, r.mirrored) == (10, 3)
    syncs = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs"]
    store = OffsetSyncStore()
    store.add_all(syncs)
    assert [store.translate("t", 1, u).downstream_offset for u in (0, 4, 9, 10, 12, 13)] == \
        [None, None, None, 10, 12, 13]


def test_a_second_failover_maps_none_past_the_originals(monkeypatch) -> None:
    """Second failover: the flow's era 1 ended at 100 -> 105. Since, the destination produced 105-114, which a
    failback's reverse flow copied here to 100-109, and this cluster's producers wrote 110-114. A group at 100
    or 105 has copies ahead of it (their originals 105-114: 115 skipped them), so the syncs give it no place
    (the reverse group's do: test_source_translator); one at 110 read them all."""
    fake, writer = _loop_writer(monkeypatch, 115, OffsetSync("t", 1, 100, 105))
    batch = [rec(b"b%d" % o, ((PROVENANCE_HEADER, b"dst"),), offset=o) for o in range(100, 110)] + \
            [rec(b"a%d" % o, offset=o) for o in range(110, 115)]
    writer.write(1, batch, upstream_end=115)
    syncs = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs"]
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 1, 99, 104), OffsetSync("t", 1, 100, 105), *syncs])
    assert [store.translate("t", 1, u).downstream_offset for u in (99, 100, 101, 105, 109, 110, 114, 115)] == \
        [104, None, None, None, None, 115, 119, 120]


def test_copies_read_over_two_batches_leave_no_exact_place_at_the_boundary(monkeypatch) -> None:
    """The reverse flow reads the copies over two micro-batches: the first ends with a sync at its end, which
    the second, starting with copies too, must supersede (a group at 50 has the copies of 50-99 ahead of it)."""
    fake, writer = _loop_writer(monkeypatch, 100, None)
    looped = ((PROVENANCE_HEADER, b"dst"),)
    writer.write(1, [rec(b"c", looped, offset=o) for o in range(50)], upstream_end=50)
    writer.write(1, [rec(b"c", looped, offset=o) for o in range(50, 100)], upstream_end=100)
    store = OffsetSyncStore()
    store.add_all(OffsetSync.from_record(k, v) for txn in fake.committed for t, k, v in txn if t == "syncs")
    assert [store.translate("t", 1, u).downstream_offset for u in (0, 49, 50, 51, 99, 100)] == \
        [None, None, None, None, None, 100]


def test_records_mirrored_before_copies_keep_their_places_when_the_offsets_line_up(monkeypatch) -> None:
    """Two-way mirroring: 0-4 mirrored to 0-4, 5 a copy (its original is the destination's own 5), 6-9 mirrored
    to 6-9. The offsets line up, so the records' syncs are collinear; the ones before the copy keep theirs."""
    fake, writer = _loop_writer(monkeypatch, 0, None)
    fake._next[("t", 1)] = 0
    looped = ((PROVENANCE_HEADER, b"dst"),)
    batch = [rec(b"m", offset=o) for o in range(5)] + [rec(b"c", looped, offset=5)] + \
            [rec(b"m", offset=o) for o in range(6, 10)]
    real_produce = fake.produce

    def produce(topic, value=None, key=None, partition=0, **kw):  # the destination's own record lands at 5
        if topic == "t" and fake._next.get(("t", partition)) == 5:
            fake._next[("t", partition)] = 6
        return real_produce(topic, value, key, partition, **kw)
    monkeypatch.setattr(fake, "produce", produce)
    writer.write(1, batch, upstream_end=10)
    store = OffsetSyncStore()
    store.add_all(OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs")
    assert [store.translate("t", 1, u).downstream_offset for u in range(11)] == \
        [0, 1, 2, 3, 4, None, 6, 7, 8, 9, 10]


def test_records_after_copies_keep_their_places_when_the_offsets_line_up() -> None:
    """0-4 mirrored to 0-4, 5 a copy, 6 a dead letter, 7-20 mirrored to 7-20 (the destination's own records took
    5 and 6): one collinear run, of which the batch's syncs keep only the ends. The records after the gap keep
    their own places, and the dead letter's position maps to the next record."""
    pairs = [(u, u) for u in range(5)] + [(u, u) for u in range(7, 21)]
    syncs = replicate.loop_marked_syncs(syncs_for_batch("t", 0, pairs, 21), [5], pairs, 0, 21)
    store = OffsetSyncStore()
    store.add_all(syncs)
    assert [store.translate("t", 0, u).downstream_offset for u in range(22)] == \
        [0, 1, 2, 3, 4, None, 7, *range(7, 22)]


def test_dead_letters_and_copies_in_one_gap_leave_it_untranslatable_up_to_the_last_copy(monkeypatch) -> None:
    fake = _FakeProducer()
    fake._next[("t", 1)] = 50
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(provenance=True), ids({1: 9}), lambda t, p: OffsetSync("t", 1, 5, 50),
                                       downstream_end=lambda t, p: 50, destination_high=lambda t, p: 50)
    known, unknown = b"\x00" + struct.pack(">i", 1) + b"x", b"\x00" + struct.pack(">i", 77) + b"x"
    looped = ((PROVENANCE_HEADER, b"dst"),)
    # 5 mirrored (-> 50), 6 a dead letter (an id the registry does not know), 7-8 copies, 9 a dead letter,
    # 10 mirrored (-> 51)
    batch = [rec(known, offset=5), rec(unknown, offset=6), rec(known, looped, offset=7), rec(known, looped, offset=8),
             rec(unknown, offset=9), rec(known, offset=10)]
    r = writer.write(1, batch, upstream_end=11)
    assert (r.mirrored, r.dead_lettered, r.provenance_skipped) == (2, 2, 2)
    syncs = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs"]
    store = OffsetSyncStore()
    store.add_all(syncs)
    got = [store.translate("t", 1, u).downstream_offset for u in range(5, 12)]
    # 6-8: a consumer there has copies ahead of it; 9: only a dead letter, then 10
    assert got == [50, None, None, None, 51, 51, 52]


def test_a_partition_with_nothing_committed_is_looked_up_once(monkeypatch) -> None:
    """The warm-up's lookup (no sync yet: a new mirror) holds for the first write; it is not repeated."""
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    lookups: list[tuple[str, int]] = []
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), ids({}),
                                       lambda t, p: lookups.append((t, p)), downstream_end=lambda t, p: 0)
    writer.prepare(1)
    r = writer.write(1, [rec(b"v", offset=o) for o in (0, 1, 2)])
    assert lookups == [("t", 1)]
    assert r.mirrored == 3 and r.replayed_skipped == 0
    again = writer.write(1, [rec(b"v", offset=o) for o in (0, 1, 2, 3)])  # a replay: only offset 3 is new
    assert again.replayed_skipped == 3 and again.mirrored == 1 and lookups == [("t", 1)]


def _group(policy: str, hb: str = "{enabled: true}", mirrors: str = "[{source_topic: a}]"):
    cfg = parse_config(yaml.safe_load(f"""
clusters: {{src: {{kafka: {{bootstrap.servers: "h1:9092"}}}}, dst: {{kafka: {{bootstrap.servers: "h2:9092"}}}}}}
groups:
  - {{name: g, source: src, destination: dst, replication_policy: {policy}, serdes: {{key: string, value: string}},
      heartbeats: {hb}, mirrors: {mirrors}}}
"""), env={})
    return cfg.groups[0]


def test_heartbeats_selected_and_named_by_policy() -> None:
    for policy, want in (("identity", "heartbeats"), ("prefix", "src.heartbeats")):
        g = _group(policy)
        sel = heartbeat_selection(g, build_replication_policy(g), ["a", "heartbeats"], [])
        assert sel is not None and sel.source_topic == "heartbeats" and sel.destination_topic == want
        assert sel.mirror.settings.serdes.key == "bytes" and sel.mirror.settings.serdes.value == "bytes"
        assert sel.mirror.consumer_group == f"g.mirrorflow.heartbeats__{want}"


def test_heartbeats_not_selected_when_off_or_missing() -> None:
    g = _group("prefix", hb="{enabled: false}")
    assert heartbeat_selection(g, build_replication_policy(g), ["heartbeats"], []) is None
    g = _group("prefix")
    assert heartbeat_selection(g, build_replication_policy(g), ["a"], []) is None
    g = _group("prefix", hb="{enabled: true, topic: hb}")
    sel = heartbeat_selection(g, build_replication_policy(g), ["hb"], [])
    assert sel is not None and sel.destination_topic == "src.hb"


def test_fast_path_produces_exactly_what_decide_decides(monkeypatch) -> None:
    """The writer's inline common case must agree with :func:`decide` record for record: known and
    unknown ids, GUID framing, short and unframed payloads, tombstones, null keys, schema-id headers,
    ordinary headers and sizes around the destination's limit."""
    import random

    rnd = random.Random(7)
    known = {1: 101, 2: 102, 3: 103}

    def framed(sid: int, body: bytes) -> bytes:
        return b"\x00" + struct.pack(">i", sid) + body

    def payload() -> bytes | None:
        kind = rnd.randrange(8)
        body = bytes(rnd.randrange(256) for _ in range(rnd.choice((0, 3, 40, 900, 1100))))
        return [framed(rnd.choice((1, 2, 3)), body), framed(rnd.choice((1, 2, 3)), body), framed(99, body),
                b"\x01" + bytes(16) + body, b"\x00\x01", b"", b"\x07" + body, None][kind]

    def headers() -> tuple:
        return rnd.choice(((), (), (("h", b"1"),), (("__value_schema_id", framed(2, b"")),),
                           (("__key_schema_id", framed(9, b"")), ("x", None)), (("é" * 30, b"v" * 50),),
                           ((PROVENANCE_HEADER, b"other"),), ((PROVENANCE_HEADER, b"dst"), ("h", b"2"))))

    records = [SourceRecord("t", 1, 100 + i, rnd.choice((None, b"k", framed(1, b"key"), framed(42, b"k"))),
                            payload(), headers(), 1_700_000_000_000 + i) for i in range(3000)]
    for over in ({}, {"key_serde": "avro"}, {"destination_max_message_bytes": 1000},
                 {"value_serde": "bytes", "key_serde": "protobuf", "destination_max_message_bytes": 1200},
                 {"delivery": "at_least_once"}, {"delivery": "at_least_once", "destination_max_message_bytes": 1000},
                 {"provenance": True}, {"provenance": True, "destination_max_message_bytes": 1000}):
        s = settings(**over)
        expected = []
        for r in records:
            d = decide(r, s, ids(known))
            if isinstance(d, OutRecord):
                expected.append((s.destination_topic, d.partition, d.key, d.value, d.headers, d.timestamp_ms))
            elif isinstance(d, DeadLetter):
                expected.append((s.dlq_topic, 0, r.key, r.value, tuple(replicate.dead_letter_headers(r, d, s.mirror)),
                                 r.timestamp_ms))
        fake = _FakeProducer()
        monkeypatch.setattr(replicate, "_producer", lambda _s, p, _f=fake, **_k: (_f, "txid"))
        monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
        writer = replicate.PartitionWriter(s, ids(known), lambda t, p: None, downstream_end=lambda t, p: 0)
        assert writer.fast.enabled
        result = writer.write(1, replicate.Columns.from_records(records))
        produced = [f for f in fake.full if f[0] != "syncs"]
        assert produced == expected, over
        assert result.mirrored == sum(1 for e in expected if e[0] == s.destination_topic)
        assert result.dead_lettered == sum(1 for e in expected if e[0] == s.dlq_topic) > 0


def test_columns_from_arrow_splits_partitions_and_keeps_order() -> None:
    """What a coalesced (single-task) batch hands the writer: rows of several Kafka partitions, mixed."""
    import pyarrow as pa

    from mirror_core.stream import columns_from_arrow

    hdr_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    rows = [("a", 0, 5, b"k5", b"v5", [("h", b"1")]), ("a", 1, 7, None, b"v7", None), ("a", 0, 6, b"k6", None, []),
            ("b", 0, 1, b"k1", b"v1", None), ("a", 1, 8, b"k8", b"v8", None)]
    batch = pa.RecordBatch.from_arrays([
        pa.array([r[0] for r in rows]), pa.array([r[1] for r in rows], pa.int32()),
        pa.array([r[2] for r in rows], pa.int64()), pa.array([r[3] for r in rows], pa.binary()),
        pa.array([r[4] for r in rows], pa.binary()),
        pa.array([1_700_000_000_123_456 + 1000 * i for i in range(5)], pa.timestamp("us", tz="UTC")),
        pa.array([r[5] for r in rows], hdr_type),
    ], names=["topic", "partition", "offset", "key", "value", "timestamp", "headers"])
    got = {(t, p): c for t, p, c in columns_from_arrow(batch)}
    assert list(got) == [("a", 0), ("a", 1), ("b", 0)]
    a0 = got[("a", 0)]
    assert a0.offsets == [5, 6] and a0.keys == [b"k5", b"k6"] and a0.values == [b"v5", None]
    assert a0.timestamps == [1_700_000_000_123, 1_700_000_000_125]  # microseconds -> milliseconds
    assert a0.headers == [(("h", b"1"),), ()]
    assert got[("a", 1)].offsets == [7, 8] and got[("a", 1)].headers is None
    single = list(columns_from_arrow(batch.slice(3, 1)))
    assert [(t, p, c.offsets, c.values) for t, p, c in single] == [("b", 0, [1], [b"v1"])]


def test_dead_letter_too_large_for_the_dlq_keeps_reason_and_coordinates(monkeypatch) -> None:
    """A dead letter over the DLQ's size limit would fail the partition forever: it goes without payload."""
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(), ids({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    huge = rec(b"\x00" + struct.pack(">i", 77) + b"x" * 2_000_000, (("h", b"1"),), offset=9)
    small = rec(b"\x00" + struct.pack(">i", 77) + b"x", offset=10)
    r = writer.write(1, [huge, small])
    assert r.dead_lettered == 2
    (t1, _, k1, v1, h1, _), (t2, _, k2, v2, h2, _) = [f for f in fake.full if f[0] == "g.dlq"]
    assert k1 is None and v1 is None
    hd = dict(h1)
    assert hd["mirrorflow.error.reason"] == b"unknown_schema_id" and hd["mirrorflow.source.offset"] == b"9"
    assert b"value 2000005 B" in hd["mirrorflow.error.payload_omitted"] and "h" not in hd
    assert v2 == small.value and k2 == b"k" and "mirrorflow.error.payload_omitted" not in dict(h2)


def test_batch_cap_defaults_to_the_driver_batch_on_local_masters() -> None:
    from mirror_core import stream
    from mirror_core.config import SparkConfig
    from mirror_core.stream import effective_max_offsets

    # Spark's read path: the driver's batch
    assert effective_max_offsets(SparkConfig(master="local[2]", read_path="spark")) == 50000
    assert effective_max_offsets(SparkConfig(master="local[2]", read_path="spark", driver_batch_max_records=0)) is None
    assert effective_max_offsets(SparkConfig(master="local[2]", read_path="spark", max_offsets_per_trigger=7)) == 7
    assert effective_max_offsets(SparkConfig(master="spark://m:7077")) is None
    # the default (read_path: auto) reads directly on a local master
    assert effective_max_offsets(SparkConfig(master="local[2]")) == 500_000
    # the direct read path: nothing collected, the driver always writes -> larger batches on a local master
    assert effective_max_offsets(SparkConfig(master="local[2]", read_path="direct")) == 500_000
    assert effective_max_offsets(SparkConfig(master="local[2]", read_path="direct", max_offsets_per_trigger=7)) == 7
    assert effective_max_offsets(SparkConfig(master="spark://m:7077", read_path="direct")) is None
    # ... or 2,000 records a partition of the group when that is more (from 250 partitions)
    assert [effective_max_offsets(SparkConfig(master="local[2]", read_path="direct"), n)
            for n in (6, 250, 1000)] == [500_000, 500_000, 2_000_000]
    assert effective_max_offsets(SparkConfig(master="local[2]", read_path="direct", max_offsets_per_trigger=7),
                                 1000) == 7
    with pytest.MonkeyPatch.context() as mp:  # the bench's -flat A/B
        mp.setenv(stream.DIRECT_BATCH_PER_PARTITION_ENV, "0")
        assert effective_max_offsets(SparkConfig(master="local[2]", read_path="direct"), 1000) == 500_000


def test_driver_or_tasks_decided_from_the_spark_checkpoint(tmp_path) -> None:
    """Batch sizes come from Spark's offset log (the first batch from the source's initial offsets, in
    the checkpoint's own format); small batches go to the driver unless their estimated bytes are too many."""
    from mirror_core.stream import MirrorRuntime

    cfg = parse_config(yaml.safe_load(f"""
clusters: {{src: {{kafka: {{bootstrap.servers: "h1:9092"}}}}, dst: {{kafka: {{bootstrap.servers: "h2:9092"}}}}}}
groups:
  - {{name: g, source: src, destination: dst, serdes: {{key: bytes, value: bytes}},
      spark: {{checkpoint_dir: "{tmp_path}", driver_batch_max_records: 1000, driver_batch_max_bytes: 1000000}},
      mirrors: [{{source_topic: a}}]}}
"""), env={})
    rt = MirrorRuntime(cfg, cfg.groups[0])
    ck = tmp_path / "g"
    (ck / "sources" / "0").mkdir(parents=True)
    (ck / "offsets").mkdir()
    (ck / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"a":{"0":100,"1":5}}')
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}'
    for batch, ends in ((0, '{"a":{"0":400,"1":305}}'), (1, '{"a":{"0":1400,"1":306}}'),
                        (2, '{"a":{"0":1500,"1":306,"2":10}}')):
        (ck / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{ends}")
    assert rt.batch_records(0) == 600 and rt.batch_records(1) == 1001
    assert rt.batch_records(2) is None  # a new partition: read from its start, size unknown
    assert rt.batch_records(3) is None  # not planned yet
    assert rt.on_driver(0) and not rt.on_driver(1) and not rt.on_driver(2)
    rt.bytes_per_record = 2000.0  # 600 records x 2000 B > 1000000 B (unknown: 1 KB each)
    assert not rt.on_driver(0)


def test_cached_producer_is_rebuilt_for_a_new_size_limit(monkeypatch) -> None:
    """A partition's producer built before its topic's limit was learned would have its batches rejected
    again (and valid records dead-lettered): the writer must get one built for the current limit."""
    built: list[dict] = []

    class _P:
        def __init__(self, conf: dict) -> None:
            built.append(conf)

        def list_topics(self, *a, **k) -> None:
            return None

        def init_transactions(self, *a) -> None:
            return None

    monkeypatch.setattr(replicate, "Producer", _P)
    for name in ("_PRODUCERS", "_POSITIONS", "_PRODUCER_LIMITS", "_LEARNED_LIMITS"):
        monkeypatch.setattr(replicate, name, {})
    for delivery in ("exactly_once", "at_least_once"):
        built.clear()
        old = settings(delivery=delivery)
        p1, key = replicate._producer(old, 1)
        assert replicate._producer(old, 1)[0] is p1  # cached while the limit is unchanged
        new = dataclasses.replace(old, destination_max_message_bytes=50_000)
        p2, key2 = replicate._producer(new, 1)
        assert p2 is not p1 and key2 == key and built[-1]["batch.size"] == 49_900
    # a limit learned in this process is where the next batch's writers start
    replicate._LEARNED_LIMITS["t"] = 70_000
    w = replicate.PartitionWriter(settings(), ids({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    assert w.s.destination_max_message_bytes == 70_000 and w.fast.limit == 70_000


def test_spark_source_options_defaults_user_options_and_fixed_ones() -> None:
    """A user's source options win over mirrorflow's defaults; the options that the guarantees rest on
    are always mirrorflow's."""
    from mirror_core.stream import SOURCE_DEFAULTS, MirrorRuntime

    def options(spark: str) -> dict[str, str]:
        cfg = parse_config(yaml.safe_load(f"""
clusters: {{src: {{kafka: {{bootstrap.servers: "h1:9092"}}}}, dst: {{kafka: {{bootstrap.servers: "h2:9092"}}}}}}
groups:
  - {{name: g, source: src, destination: dst, serdes: {{key: bytes, value: bytes}}, spark: {spark},
      mirrors: [{{source_topic: a}}, {{source_topic: b}}]}}
"""), env={})
        return MirrorRuntime(cfg, cfg.groups[0]).source_options(once=False)

    plain = options("{}")
    assert {k: plain[k] for k in SOURCE_DEFAULTS} == SOURCE_DEFAULTS
    assert plain["kafka.fetch.max.wait.ms"] == "10"
    assert plain["kafka.isolation.level"] == "read_committed" and plain["includeHeaders"] == "true"
    assert plain["subscribe"] == "a,b" and plain["kafka.bootstrap.servers"] == "h1:9092"
    tuned = options('{source_options: {kafka.fetch.max.wait.ms: "100", kafka.max.partition.fetch.bytes: "2097152"}}')
    assert tuned["kafka.fetch.max.wait.ms"] == "100" and tuned["kafka.max.partition.fetch.bytes"] == "2097152"
    assert tuned["kafka.max.poll.records"] == SOURCE_DEFAULTS["kafka.max.poll.records"]
    with pytest.raises(ConfigError, match="kafka.group.id"):
        options('{source_options: {kafka.group.id: "mirror-group"}}')


# --------------------------------------------------------------------------- issue 11 (writer correctness)


class _FailingProducer(_FakeProducer):
    """A fake producer whose deliveries to ``failing`` topics fail (ACL denied, topic deleted, too small
    a ``max.message.bytes``): reported only to a delivery callback, as librdkafka does."""

    def __init__(self, failing: set[str]) -> None:
        super().__init__()
        self.failing = failing
        self.aborts = 0
        self.open = False

    def begin_transaction(self) -> None:
        from confluent_kafka import KafkaError, KafkaException

        if self.open:
            raise KafkaException(KafkaError(KafkaError._STATE, "a transaction is already in progress"))
        self.open = True
        super().begin_transaction()

    def commit_transaction(self, timeout: float) -> None:
        self.open = False
        super().commit_transaction(timeout)

    def abort_transaction(self, timeout: float) -> None:
        self.open = False
        self.aborts += 1
        super().abort_transaction(timeout)

    def produce(self, topic, value=None, key=None, partition=0, on_delivery=None, timestamp=0, headers=None):
        if topic not in self.failing:
            return super().produce(topic, value, key, partition, on_delivery, timestamp, headers)
        from confluent_kafka import KafkaError

        self.full.append((topic, partition, key, value, tuple(headers or ()), timestamp))
        if on_delivery:
            self._cbs.append((lambda err, msg, _cb=on_delivery: _cb(KafkaError(
                KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed"), msg), _Msg(-1)))


@pytest.mark.parametrize("delivery", ["at_least_once", "exactly_once"])
def test_item4_undelivered_dead_letter_fails_the_chunk(monkeypatch, delivery) -> None:
    """A record whose dead letter the broker refused is neither mirrored nor set aside: the chunk must
    fail (Spark retries it) and no offset sync may move past it."""
    fake = _FailingProducer({"g.dlq"})
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(delivery=delivery), ids({7: 70}), lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    good = b"\x00" + struct.pack(">i", 7) + b"ok"
    bad = b"\x00" + struct.pack(">i", 99) + b"unknown id"
    with pytest.raises(replicate.WriterError, match=r"dead letter of t\[1\]@1 .*g\.dlq.*authorization"):
        writer.write(1, [rec(good, offset=0), rec(bad, offset=1), rec(good, offset=2)])
    synced = [f for f in fake.full if f[0] == "syncs"]
    assert synced == [] and fake.committed == []
    if delivery == "exactly_once":
        assert fake.aborts == 1 and not fake.open


def test_item12_registry_error_on_id_miss_aborts_the_open_transaction(monkeypatch) -> None:
    """A registry failure (or 409) while resolving a missed id must not leave the transaction open: it
    would hold the sync partition's LSO for the transaction timeout and wedge the cached producer."""
    from mirror_core.errors import MirrorError

    fake = _FailingProducer(set())
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    calls: list[int] = []

    def resolver(source_id: int) -> int | None:
        calls.append(source_id)
        if len(calls) == 1:
            raise MirrorError("registry answered 409 Conflict registering t-value")
        return 70

    writer = replicate.PartitionWriter(settings(), SchemaIdTranslator({}, resolver), lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    framed = [rec(b"\x00" + struct.pack(">i", 7) + b"v", offset=o) for o in (0, 1)]
    with pytest.raises(MirrorError, match="409"):
        writer.write(1, framed)
    # framed ids are resolved before the transaction opens (a registry outage is waited out there), so
    # this failure never opened one; either way nothing may stay open or commit
    assert fake.aborts == 0 and not fake.open and fake.committed == []
    r = writer.write(1, framed)  # the retried task: the same cached producer works again
    assert r.mirrored == 2 and len(fake.committed) == 1


@pytest.mark.parametrize("on_error", ["dead_letter", "fail"])
def test_a_schema_the_destination_refuses_is_dead_lettered_and_the_partition_flows(monkeypatch, on_error) -> None:
    """A 409 / 422 for one record's schema is that record's problem: it is dead-lettered with the reason (or
    fails the job with on_error: fail), while records with other schemas are mirrored in the same chunk."""
    from mirror_core.schemas import make_id_resolver
    from tests.fakes import FakeRegistry, RefusingRegistry

    good, refused = ('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}',
                     '{"type": "record", "name": "R", "fields": [{"name": "b", "type": "long"}]}')
    src, dst = FakeRegistry(url="http://src", next_id=0), RefusingRegistry(url="http://dst", next_id=500,
                                                                          refuse=refused, status=409)
    good_id, refused_id = src.add("t-value", good, refused)
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    translator = SchemaIdTranslator({}, make_id_resolver(src, dst, "t", "t", not_found_retries=0))
    writer = replicate.PartitionWriter(settings(on_error=on_error), translator, lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    chunk = [rec(b"\x00" + struct.pack(">i", sid) + b"body", offset=o)
             for o, sid in enumerate((good_id, refused_id, good_id, refused_id, good_id))]
    if on_error == "fail":
        with pytest.raises(replicate.WriterError, match=r"t\[1\]@1: schema_registration_refused: .*HTTP 409"):
            writer.write(1, chunk)
        assert fake.committed == []
        return
    r = writer.write(1, chunk)
    assert (r.mirrored, r.dead_lettered) == (3, 2)
    dst_id = dst.version("t-value", 1).schema_id
    assert [v for t, _, _, v, _, _ in fake.full if t == "t"] == [b"\x00" + struct.pack(">i", dst_id) + b"body"] * 3
    dead = [(dict(h), v) for t, _, _, v, h, _ in fake.full if t == "g.dlq"]
    assert [h["mirrorflow.source.offset"] for h, _ in dead] == [b"1", b"3"]
    assert all(v == chunk[1].value for _, v in dead)  # the source bytes, untouched
    reason, detail = dead[0][0]["mirrorflow.error.reason"], dead[0][0]["mirrorflow.error.detail"].decode()
    assert reason == b"schema_registration_refused"
    assert f"schema id {refused_id}" in detail and "HTTP 409" in detail and "t-value version 2" in detail
    assert len(fake.committed) == 1


def test_item12_chunks_capped_by_bytes_not_only_records(monkeypatch) -> None:
    """A chunk of large records is split so one transaction never carries more than CHUNK_BYTES (the
    transaction and its flush must finish well within the 60 s transaction timeout)."""
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    monkeypatch.setattr(replicate, "CHUNK_BYTES", 10_000, raising=False)
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), ids({}), lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    records = [rec(b"x" * 3000, key=b"k%d" % o, offset=o) for o in range(10)]
    r = writer.write(1, records, upstream_end=12)
    assert r.mirrored == 10 and r.records_in == 10 and r.upstream_end == 12 and r.last_downstream == 9
    data = [[(k, v) for t, k, v in txn if t == "t"] for txn in fake.committed]
    assert len(data) == 4 and all(sum(len(v) for _, v in txn) <= 10_000 for txn in data)
    assert [k for txn in data for k, _ in txn] == [b"k%d" % o for o in range(10)]
    last = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[-1] if t == "syncs"][-1]
    assert last == OffsetSync("t", 1, 12, 10)


def test_item12_kafka4_timestamp_limits_are_not_copied() -> None:
    """Kafka 4's message.timestamp.before/after.max.ms on the destination would reject back-filled old
    records; like MM2's default exclusions they stay the destination's own."""
    from mirror_core.policy import ConfigPropertyFilter

    f = ConfigPropertyFilter()
    assert not f.should_replicate("message.timestamp.before.max.ms")
    assert not f.should_replicate("message.timestamp.after.max.ms")
    assert f.should_replicate("retention.ms")


# --------------------------------------------------------------------------- fewer destination partitions


def test_fewer_destination_partitions_place_keyed_records_by_the_java_key_hash(monkeypatch) -> None:
    """With 4 destination partitions for 6 source partitions the writer hashes keys like a Java producer
    (``toPositive(murmur2(key)) % 4``); records without a key keep ``source partition % 4``."""
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    s = settings(source_partitions=6, destination_partitions=4, value_serde="bytes")
    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    keys = [b"21", b"foobar", None, b"abc"]
    recs = [SourceRecord("t", 5, o, k, b"v", (), 1_700_000_000_000) for o, k in enumerate(keys)]
    r = writer.write(5, recs)
    assert r.mirrored == 4
    placed = [(k, part) for topic, part, k, *_ in fake.full if topic == "t"]
    # murmur2(b"21") = -973932308 -> toPositive 1173551340 % 4 = 0; b"foobar": -790332482 -> 1357151166 % 4
    # = 2; b"abc": 479470107 % 4 = 3; the key-less record: 5 % 4 = 1
    assert placed == [(b"21", 0), (b"foobar", 2), (None, 1), (b"abc", 3)]
    assert not writer.fast.enabled  # partition numbers are not kept: every record takes decide()


# --------------------------------------------------------------------------- schema ids outside int32


def test_a_mapped_schema_id_outside_int32_is_refused_not_written(monkeypatch) -> None:
    framed = b"\x00" + struct.pack(">i", 7) + b"body"
    for mapped in (2**31, -(2**31) - 1):
        out = decide(rec(framed), settings(), ids({7: mapped}))
        assert isinstance(out, DeadLetter) and out.reason == "unknown_schema_id" and str(mapped) in out.detail
        hdr = decide(rec(b"body", (("__value_schema_id", framed[:5]),)), settings(), ids({7: mapped}))
        assert isinstance(hdr, DeadLetter) and hdr.reason == "unknown_schema_id"
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(), ids({7: 2**31, 8: 80}), lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    ok = b"\x00" + struct.pack(">i", 8) + b"body"
    r = writer.write(1, [rec(framed, offset=0), rec(ok, offset=1)])
    assert (r.mirrored, r.dead_lettered) == (1, 1)
    assert [v for t, _, _, v, _, _ in fake.full if t == "t"] == [b"\x00" + struct.pack(">i", 80) + b"body"]
    assert [v for t, _, _, v, _, _ in fake.full if t == "g.dlq"] == [framed]  # the source bytes, unchanged


# --------------------------------------------------------------------------- dead-letter headers


def test_dead_letters_carry_every_documented_header(monkeypatch) -> None:
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(), ids({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    bad = rec(b"\x00" + struct.pack(">i", 77) + b"x", (("app", b"1"),), offset=12)
    writer.write(1, [bad])
    ((topic, part, key, value, headers, ts),) = [f for f in fake.full if f[0] == "g.dlq"]
    assert (part, key, value, ts) == (0, b"k", bad.value, bad.timestamp_ms)
    assert headers[0] == ("app", b"1")  # the record's own headers first, as they were
    ours = dict(headers[1:])
    assert set(ours) == set(replicate.DLQ_HEADERS) - {"mirrorflow.error.payload_omitted"}
    assert ours == {
        "mirrorflow.error.reason": b"unknown_schema_id",
        "mirrorflow.error.detail": b"value: schema id 77 has no destination id",
        "mirrorflow.source.topic": b"t",
        "mirrorflow.source.partition": b"1",
        "mirrorflow.source.offset": b"12",
        "mirrorflow.mirror": b"g__t__t",
    }


# --------------------------------------------------------------------------- at least once


class _AckingProducer(_FakeProducer):
    """An idempotent (non-transactional) producer: any transaction call is a bug; ``fail`` makes the
    delivery of records with those keys fail; ``log`` keeps the order of produces and flushes."""

    def __init__(self, fail: tuple[bytes, ...] = ()) -> None:
        super().__init__()
        self.fail = fail
        self.log: list[tuple[str, str]] = []

    def begin_transaction(self) -> None:
        raise AssertionError("at_least_once must not use transactions")

    commit_transaction = abort_transaction = begin_transaction  # type: ignore[assignment]

    def produce(self, topic, value=None, key=None, partition=0, on_delivery=None, timestamp=0, headers=None):
        self.log.append(("produce", topic))
        super().produce(topic, value, key, partition, on_delivery, timestamp, headers)
        if key in self.fail and on_delivery:
            cb, msg = self._cbs.pop()
            from confluent_kafka import KafkaError

            self._cbs.append((lambda err, m, _cb=cb: _cb(KafkaError(KafkaError._MSG_TIMED_OUT), m), msg))

    def flush(self, timeout: float) -> int:
        self.log.append(("flush", ""))
        return super().flush(timeout)


def test_at_least_once_producer_is_idempotent_with_acks_all(monkeypatch) -> None:
    built: list[dict] = []

    class _P:
        def __init__(self, conf: dict) -> None:
            built.append(conf)

    monkeypatch.setattr(replicate, "Producer", _P)
    for name in ("_PRODUCERS", "_POSITIONS", "_PRODUCER_LIMITS", "_LEARNED_LIMITS"):
        monkeypatch.setattr(replicate, name, {})
    replicate._producer(settings(delivery="at_least_once", producer_config={"bootstrap.servers": "d:1"}), 2)
    (conf,) = built
    assert conf["enable.idempotence"] is True and conf["acks"] == "all"
    assert "transactional.id" not in conf and conf["bootstrap.servers"] == "d:1"


def test_at_least_once_writes_records_then_syncs_after_their_acknowledgement(monkeypatch) -> None:
    fake = _AckingProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    s = settings(delivery="at_least_once")
    writer = replicate.PartitionWriter(s, ids({7: 70}), lambda t, p: None, downstream_end=lambda t, p: 0)
    framed = b"\x00" + struct.pack(">i", 7) + b"body"
    r = writer.write(1, [rec(framed, offset=o) for o in (10, 11, 12)], upstream_end=14)
    assert (r.mirrored, r.dead_lettered, r.last_downstream) == (3, 0, 2)
    assert [(t, p, v) for t, p, _, v, _, _ in fake.full if t == "t"] == \
        [("t", 1, b"\x00" + struct.pack(">i", 70) + b"body")] * 3
    syncs = [OffsetSync.from_record(k, v) for t, _, k, v, _, _ in fake.full if t == "syncs"]
    assert syncs == [OffsetSync("t", 1, 10, 0), OffsetSync("t", 1, 12, 2), OffsetSync("t", 1, 14, 3)]
    first_sync = fake.log.index(("produce", "syncs"))
    assert ("flush", "") in fake.log[:first_sync]  # the records were acknowledged before any sync
    assert fake.log[-1] == ("flush", "")  # and the syncs were waited for too
    # the next chunk continues from the acknowledged position (no lookup, nothing skipped)
    r2 = writer.write(1, [rec(framed, offset=14)])
    assert r2.replayed_skipped == 0 and r2.last_downstream == 3


def test_at_least_once_writes_no_sync_when_a_record_is_not_acknowledged(monkeypatch) -> None:
    fake = _AckingProducer(fail=(b"lost",))
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(delivery="at_least_once", value_serde="bytes"), ids({}),
                                       lambda t, p: None, downstream_end=lambda t, p: 0)
    with pytest.raises(Exception, match="timed out|TIMED_OUT"):
        writer.write(1, [rec(b"v", key=b"ok", offset=0), rec(b"v", key=b"lost", offset=1)])
    assert not [f for f in fake.full if f[0] == "syncs"]  # the position never moves past a lost record


def test_at_least_once_fully_dead_lettered_chunk_writes_a_position_sync(monkeypatch) -> None:
    fake = _AckingProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(delivery="at_least_once"), ids({}), lambda t, p: None,
                                       downstream_end=lambda t, p: 17)
    bad = [rec(b"\x00" + struct.pack(">i", 77) + b"x", offset=o) for o in (5, 6, 7)]
    r = writer.write(1, bad, upstream_end=8)
    assert r.dead_lettered == 3 and r.mirrored == 0 and r.last_downstream == 16
    assert len([f for f in fake.full if f[0] == "g.dlq"]) == 3
    syncs = [OffsetSync.from_record(k, v) for t, _, k, v, _, _ in fake.full if t == "syncs"]
    assert syncs == [OffsetSync("t", 1, 5, 17), OffsetSync("t", 1, 8, 17)]


def test_at_least_once_on_error_fail_stops_before_any_sync(monkeypatch) -> None:
    fake = _AckingProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(delivery="at_least_once", on_error="fail"), ids({}),
                                       lambda t, p: None, downstream_end=lambda t, p: 0)
    with pytest.raises(replicate.WriterError, match=r"cannot mirror t\[1\]@6: unknown_schema_id"):
        writer.write(1, [rec(b"\x00" + struct.pack(">i", 77) + b"x", offset=6)])
    assert not [f for f in fake.full if f[0] in ("syncs", "g.dlq")]


def test_item3_transactional_ids_are_unambiguous(monkeypatch) -> None:
    """Mirrors ``a.b -> c`` and ``a -> b.c`` of one group must not share a transactional id (nor the
    producer, lock and position keyed by it)."""
    one = settings(source_topic="a.b", destination_topic="c")
    two = settings(source_topic="a", destination_topic="b.c")
    assert one.transactional_id_for(0) != two.transactional_id_for(0)
    assert replicate.partition_lock(one, 0) is not replicate.partition_lock(two, 0)
    ids_seen = {settings(group=g, source_topic=s, destination_topic=d).transactional_id_for(p)
                for g, s, d, p in (("g", "t", "t.1", 0), ("g", "t", "t", 10), ("g.t", "t", "t", 0),
                                   ("g", "t.t", "t", 0), ("g", "t", "t.t", 0))}
    assert len(ids_seen) == 5
    assert one.transactional_id_for(3).startswith("mirrorflow.")  # prefixed ACLs on "mirrorflow." still match

    class _P:
        def __init__(self, conf: dict) -> None:
            self.conf = conf

        def list_topics(self, *a, **k) -> None:
            return None

        def init_transactions(self, *a) -> None:
            return None

    monkeypatch.setattr(replicate, "Producer", _P)
    for name in ("_PRODUCERS", "_POSITIONS", "_PRODUCER_LIMITS", "_LEARNED_LIMITS"):
        monkeypatch.setattr(replicate, name, {})
    p1, k1 = replicate._producer(one, 0)
    p2, k2 = replicate._producer(two, 0)
    assert p1 is not p2 and k1 != k2 and p1.conf["transactional.id"] != p2.conf["transactional.id"]


def test_item3_config_refuses_colliding_transactional_ids(monkeypatch) -> None:
    """Both mirrors validate (their ids differ); with an id scheme that collides, validation names the
    two mirrors instead of letting their writers fence each other."""
    from mirror_core import config as config_mod

    text = """
clusters: {src: {kafka: {bootstrap.servers: "s:9092"}}, dst: {kafka: {bootstrap.servers: "d:9092"}}}
groups:
  - name: g
    source: src
    destination: dst
    serdes: {key: bytes, value: bytes}
    mirrors:
      - {source_topic: a.b, destination_topic: c}
      - {source_topic: a, destination_topic: b.c}
"""
    parse_config(yaml.safe_load(text), env={})
    monkeypatch.setattr(config_mod, "transactional_id",
                        lambda group, alias, src, dst: f"mirrorflow.{group}.{alias}.{src}.{dst}", raising=False)
    with pytest.raises(ConfigError, match=r"groups\[0\]\.mirrors\[1\].*transactional id.*groups\[0\]\.mirrors\[0\]"):
        parse_config(yaml.safe_load(text), env={})


@pytest.mark.parametrize(("dst_end", "expected"), [(50, 5), (10, 0)])
def test_item2_item3_an_earlier_release_position_is_taken_once_its_writer_is_fenced(monkeypatch, dst_end,
                                                                                  expected) -> None:
    """Moving over: the newest sync has no destination header (an earlier release wrote it, under the
    dotted transactional id). The writer fences that id, looks again, and takes the sync only if its
    destination holds what the sync says was written there (else it was another mirror's)."""
    from mirror_core.positions import LegacySync

    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    fenced: list[str] = []
    monkeypatch.setattr(replicate, "fence_legacy_writer", lambda s, p: fenced.append(s.legacy_transactional_id_for(p)))
    lookups: list[int] = []

    def lookup(t: str, p: int) -> OffsetSync:
        lookups.append(p)
        return LegacySync("t", 1, 5 if len(lookups) > 1 else 3, 40)  # the fenced writer had committed more

    writer = replicate.PartitionWriter(settings(value_serde="bytes", source_topic="t", destination_topic="t"),
                                       ids({}), lookup, downstream_end=lambda t, p: dst_end,
                                       destination_high=lambda t, p: dst_end)
    r = writer.write(1, [rec(b"v", offset=o) for o in range(8)])
    assert fenced == ["mirrorflow.g.src.t.t.1"] and lookups == [1, 1]
    assert r.replayed_skipped == expected and r.mirrored == 8 - expected
    syncs = [f for f in fake.full if f[0] == "syncs"]
    assert syncs and all(f[4] == (("mirrorflow.destination", b"t"),) for f in syncs)  # new syncs name it


def test_at_least_once_dead_letter_too_large_for_the_dlq_keeps_reason_and_coordinates(monkeypatch) -> None:
    """As in exactly_once: an oversized dead letter goes without its payload instead of failing the partition."""
    fake = _AckingProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(delivery="at_least_once"), ids({}), lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    huge = rec(b"\x00" + struct.pack(">i", 77) + b"x" * 2_000_000, (("h", b"1"),), offset=9)
    r = writer.write(1, [huge])
    assert r.dead_lettered == 1 and r.mirrored == 0
    ((_, _, key, value, headers, _),) = [f for f in fake.full if f[0] == "g.dlq"]
    hd = dict(headers)
    assert key is None and value is None and "h" not in hd
    assert hd["mirrorflow.error.reason"] == b"unknown_schema_id" and hd["mirrorflow.source.offset"] == b"9"
    assert b"value 2000005 B" in hd["mirrorflow.error.payload_omitted"]


def test_item2_one_group_refuses_a_second_mirror_of_the_same_source_topic() -> None:
    """A group reads a source topic once (one Spark subscription, one writer per source partition): a
    second mirror of the same topic in the same group would be silently left out, so validation refuses it
    with one line naming both mirrors (two groups may mirror one topic; each keeps its own position)."""
    text = """
clusters: {src: {kafka: {bootstrap.servers: "s:9092"}}, dst: {kafka: {bootstrap.servers: "d:9092"}}}
groups:
  - name: live
    source: src
    destination: dst
    serdes: {key: bytes, value: bytes}
    mirrors:
      - {source_topic: orders, destination_topic: orders}
      - {source_topic: orders, destination_topic: orders-archive}
"""
    with pytest.raises(ConfigError, match=r"groups\[0\]\.mirrors\[1\]: source topic 'orders' is already mirrored "
                                          r"by groups\[0\]\.mirrors\[0\]"):
        parse_config(yaml.safe_load(text), env={})
    two_groups = text.replace("      - {source_topic: orders, destination_topic: orders-archive}\n", "") + """
  - name: archive
    source: src
    destination: dst
    serdes: {key: bytes, value: bytes}
    mirrors: [{source_topic: orders, destination_topic: orders-archive}]
"""
    parse_config(yaml.safe_load(two_groups), env={})


def _per_writer_fakes(monkeypatch, commit_error: Exception | None = None
                      ) -> tuple[dict[int, OffsetSync], list[list[str]], _FakeProducer]:
    """A fake writer producer for ``transactions: per_writer`` (and a fake per-partition one), with fresh producer
    and position tables. Returns the newest committed sync per partition (what a lookup reads), the topics of
    each committed transaction's records, and the per-partition producer. ``commit_error`` is raised by every
    commit after it went through."""
    store: dict[int, OffsetSync] = {}
    commits: list[list[str]] = []

    class WriterProducer(_FakeProducer):
        def __init__(self, *_a: object) -> None:
            super().__init__()

        def init_transactions(self, timeout: float) -> None:
            pass

        def list_topics(self, *_a: object, **_k: object) -> None:
            pass

        def commit_transaction(self, timeout: float) -> None:
            super().commit_transaction(timeout)
            commits.append([t for t, _k, _v in self._txn])
            for t, k, v in self._txn:
                if t == "syncs":
                    sync = OffsetSync.from_record(k, v)
                    store[sync.partition] = sync
            if commit_error is not None:
                raise commit_error

    per_partition = _FakeProducer()
    monkeypatch.setattr(replicate, "Producer", WriterProducer)
    monkeypatch.setattr(replicate, "fence_transactional_id", lambda config, txid, topic=None: None)
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (per_partition, _s.transactional_id_for(p)))
    for name, empty in (("_POSITIONS", replicate._PositionTable()), ("_PRODUCERS", {}), ("_PRODUCER_LIMITS", {}),
                        ("_PRODUCER_PARTITIONS", {}), ("_FENCED_PARTITIONS", set())):
        monkeypatch.setattr(replicate, name, empty)
    return store, commits, per_partition


def test_per_writer_commit_that_reports_an_error_but_went_through_writes_nothing_twice(monkeypatch) -> None:
    """``transactions: per_writer``: the writer transaction's commit raises (a timeout) although the broker
    committed it. The batch is then written partition by partition, which must start from the positions
    committed meanwhile, not from the ones cached before the transaction: nothing is written twice. An
    earlier fallback left per-partition producers in the process, so no new producer re-reads them."""
    from confluent_kafka import KafkaError, KafkaException

    from mirror_core.replicate import Columns, WriterTransaction
    from mirror_core.stream import BatchWriter, WriterPlan

    s = settings(value_serde="bytes", source_partitions=2, destination_partitions=2)
    timeout = KafkaException(KafkaError(KafkaError._TIMED_OUT, "commit timed out", retriable=True))
    store, _commits, per_partition = _per_writer_fakes(monkeypatch, commit_error=timeout)
    plan = WriterPlan({"t": s}, {}, {"t": {0: 10, 1: 10}}, {}, None, group="g", transactions="per_writer")
    bw = BatchWriter(plan)
    bw._writers["t"] = replicate.PartitionWriter(s, ids({}), lambda t, p: store.get(p),
                                                 downstream_end=lambda t, p: 0, destination_high=lambda t, p: 999)

    def cols() -> Columns:
        return Columns(list(range(10)), [b"k"] * 10, [b"v"] * 10, [1_700_000_000_000] * 10)

    parts = {("t", 0): cols(), ("t", 1): cols()}
    shared = {key: (c, 10) for key, c in parts.items()}
    assert bw.write_shared(WriterTransaction([s], 0, 1), shared) == set(shared)  # the commit "failed": all
    assert {p: (x.upstream_offset, x.downstream_offset) for p, x in store.items()} == {0: (10, 10), 1: (10, 10)}
    for (t, p), c in parts.items():  # what write_ranges_per_writer does next
        bw.feed(t, p, c)
    assert per_partition.full == []  # every record was committed by the writer transaction: none again
    assert [r["replayed_skipped"] for r in bw.rows()] == [10, 10]


def test_per_writer_positions_not_known_are_read_together_before_the_transaction_opens(monkeypatch) -> None:
    """``transactions: per_writer``: the positions a writer does not know (none at first; after a failed
    transaction it forgets them) are read before its transaction opens, in one lookup for the topic: read one
    by one as each partition's records were staged, 250 of them ran past the transaction's timeout, and one
    lookup a partition read the sync topic's tail once for each. A replay after the positions were forgotten
    writes nothing twice."""
    from mirror_core.replicate import Columns, WriterTransaction
    from mirror_core.stream import BatchWriter, WriterPlan

    s = settings(value_serde="bytes", source_partitions=4, destination_partitions=4)
    store, commits, _per_partition = _per_writer_fakes(monkeypatch)
    events: list[object] = []

    def lookup(_t: str, p: int) -> OffsetSync | None:
        events.append(("one", p))
        return store.get(p)

    def lookup_many(_t: str, ps: list[int]) -> dict[int, OffsetSync | None]:
        events.append(("many", sorted(ps)))
        return {p: store.get(p) for p in ps}

    writer_producer = replicate.Producer

    class Noting(writer_producer):  # type: ignore[misc, valid-type]
        def begin_transaction(self) -> None:
            events.append("begin")
            super().begin_transaction()

    monkeypatch.setattr(replicate, "Producer", Noting)
    plan = WriterPlan({"t": s}, {}, {"t": {p: 10 for p in range(4)}}, {}, None, group="g", transactions="per_writer")
    bw = BatchWriter(plan)
    w = bw._writers["t"] = replicate.PartitionWriter(s, ids({}), lookup, downstream_end=lambda t, p: 0,
                                                     destination_high=lambda t, p: 999, positions_lookup=lookup_many)
    shared = {("t", p): (Columns(list(range(10)), [b"k"] * 10, [b"v"] * 10, [1_700_000_000_000] * 10), 10)
              for p in range(4)}
    assert bw.write_shared(WriterTransaction([s], 0, 1), shared) == set()
    assert events == [("many", [0, 1, 2, 3]), "begin"]
    assert {p: (x.upstream_offset, x.downstream_offset) for p, x in store.items()} == {p: (10, 10) for p in range(4)}

    events.clear()
    for p in range(4):
        w.forget_position(p)  # as after a failed transaction
    bw.results.clear()
    assert bw.write_shared(WriterTransaction([s], 0, 1), shared) == set()
    assert events == [("many", [0, 1, 2, 3]), "begin"]
    assert [r["replayed_skipped"] for r in bw.rows()] == [10] * 4
    assert [t for c in commits for t in c].count("t") == 40  # nothing of the records a second time


def test_per_writer_positions_read_together_are_not_kept_when_one_was_forgotten_meanwhile(monkeypatch) -> None:
    """A lookup of many positions that ran while this process forgot a position (a transaction failed: its
    commit may have gone through after the lookup read the sync topic) keeps nothing: each partition reads its
    own again when written. Kept, the older position would have written the committed records twice."""
    s = settings(value_serde="bytes", source_partitions=2, destination_partitions=2)
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    monkeypatch.setattr(replicate, "_FENCED_PARTITIONS", {s.transactional_id_for(p) for p in range(2)})
    w = replicate.PartitionWriter(s, ids({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    other = replicate.PartitionWriter(settings(value_serde="bytes", source_topic="u"), ids({}), lambda t, p: None)
    replicate._POSITIONS[other.s.transactional_id_for(0)] = replicate.Position(5, 5)

    def forgetting(_t: str, ps: list[int]) -> dict[int, OffsetSync | None]:
        other.forget_position(0)  # another partition's transaction failed while the lookup read
        return dict.fromkeys(ps)

    w.positions_lookup = forgetting
    assert w.read_positions([0, 1]) == 0
    assert not w.position_known(0) and not w.position_known(1)

    w.positions_lookup = lambda _t, ps: {p: OffsetSync("t", p, 7, 3) for p in ps}
    w.destination_highs = lambda _t, ps: dict.fromkeys(ps, 3)
    assert w.read_positions([0, 1]) == 2
    assert w.position_known(0) and w.position_known(1)
    assert replicate._POSITIONS[s.transactional_id_for(1)] == replicate.Position(7, 3)
    assert w.read_positions([0, 1]) == 0  # known: not read again


def _write_past_trailing_markers(monkeypatch, s, store: dict[int, OffsetSync]) -> list[dict]:
    """``transactions: per_writer`` with transactions cut every 7 records: a fake reader hands over partition
    0's records (offsets 0-9), then partition 1's (0-9; partition 0's go out first, its end not known yet),
    then the ends of both ranges: partition 0's at 12 (a commit marker and an aborted record follow its
    records), partition 1's at 10. Returns the batch's rows."""
    from mirror_core import direct
    from mirror_core.direct import Range
    from mirror_core.replicate import Columns
    from mirror_core.stream import BatchWriter, WriterPlan

    monkeypatch.setattr(direct, "WRITER_TXN_RECORDS", 7)
    monkeypatch.setattr(direct, "WRITER_TXN_RECORDS_PER_PARTITION", 0)

    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: store.get(p), downstream_end=lambda t, p: 0,
                                       destination_high=lambda t, p: 999)
    monkeypatch.setattr(BatchWriter, "_writer", lambda self, topic, _s: self._writers.setdefault(topic, writer))

    def cols(n: int) -> Columns:
        return Columns(list(range(n)), [b"k"] * n, [b"v"] * n, [1_700_000_000_000] * n)

    class Reader:
        def read(self, rs: list[Range], deliver) -> float:
            deliver(rs[0], cols(10))
            deliver(rs[1], cols(10))
            deliver(rs[0], None)
            deliver(rs[1], None)
            return 0.0

    plan = WriterPlan({"t": s}, {}, {"t": {0: 12, 1: 10}}, {}, None, group="g", transactions="per_writer")
    return direct.write_ranges_per_writer(plan, [Range("t", 0, 0, 12), Range("t", 1, 0, 10)], Reader(), 0, 1)


def test_per_writer_moves_a_position_past_trailing_markers_in_its_own_transaction(monkeypatch) -> None:
    """``transactions: per_writer`` with transactions cut by size: partition 0's records (offsets 0-9) go out
    in a first transaction, and only then does its range turn out to end at 12 (a commit marker and an
    aborted record follow). Its position must move to 12 in the writer's next transaction, by an offset
    sync, not through a producer and a transaction of the partition's own."""
    s = settings(value_serde="bytes", source_partitions=2, destination_partitions=2)
    store, commits, per_partition = _per_writer_fakes(monkeypatch)
    rows = _write_past_trailing_markers(monkeypatch, s, store)
    assert len(commits) == 2 and per_partition.full == []
    assert commits[0].count("t") == 10 and commits[1].count("t") == 10  # partition 0's, then partition 1's
    assert (store[0].upstream_offset, store[0].downstream_offset) == (12, 10)
    assert (store[1].upstream_offset, store[1].downstream_offset) == (10, 10)
    assert sorted((r["partition"], r["mirrored"], r["upstream_end"]) for r in rows) == [(0, 10, 12), (1, 10, 10)]


def _twenty_records_in_three_transactions(monkeypatch, s, store: dict[int, OffsetSync]):
    """``transactions: per_writer`` on the writer's two producers (fakes appending to one destination log),
    transactions cut every 7 records, and a reader handing over one partition's offsets 0-19 in three pieces.
    Returns the producers made (by transactional id), the destination log's next offsets, and a function
    that writes the batch (returning its rows)."""
    from mirror_core import direct
    from mirror_core.direct import Range
    from mirror_core.replicate import Columns
    from mirror_core.stream import BatchWriter, WriterPlan

    monkeypatch.setattr(replicate, "_TURNS", {})
    made: dict[str, _FakeProducer] = {}
    offsets: dict[tuple[str, int], int] = {}  # one destination log, whichever producer appends to it
    fake_producer = replicate.Producer

    def producer(config: dict) -> _FakeProducer:
        p = made[config["transactional.id"]] = fake_producer(config)
        p._next = offsets
        return p

    monkeypatch.setattr(replicate, "Producer", producer)
    monkeypatch.setattr(direct, "WRITER_TXN_RECORDS", 7)
    monkeypatch.setattr(direct, "WRITER_TXN_RECORDS_PER_PARTITION", 0)
    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: store.get(p), downstream_end=lambda t, p: 0,
                                       destination_high=lambda t, p: 999)
    monkeypatch.setattr(BatchWriter, "_writer", lambda self, topic, _s: self._writers.setdefault(topic, writer))

    def cols(first: int, n: int) -> Columns:
        return Columns(list(range(first, first + n)), [b"k%d" % o for o in range(first, first + n)], [b"v"] * n,
                       [1_700_000_000_000] * n)

    class Reader:
        def read(self, rs: list[Range], deliver) -> float:
            for first, n in ((0, 7), (7, 7), (14, 6)):
                deliver(rs[0], cols(first, n))
            deliver(rs[0], None)
            return 0.0

    def run() -> list[dict]:
        plan = WriterPlan({"t": s}, {}, {"t": {0: 20}}, {}, None, group="g", transactions="per_writer")
        return direct.write_ranges_per_writer(plan, [Range("t", 0, 0, 20)], Reader(), 0, 1)

    return made, offsets, run


def test_per_writer_transactions_take_turns_on_the_writers_two_producers(monkeypatch) -> None:
    """``transactions: per_writer``: a writer's transactions go out by turns on its two transactional producers
    (``writer-0``, then ``writer-0.1``), so a transaction need not wait until the broker has written the last
    one's commit markers. Both are started before the first transaction (a restart fences both ids), the turn
    moves only after a commit, and a partition's records still land once and in order, each transaction with
    the offset syncs of its own records."""

    s = settings(value_serde="bytes", source_partitions=1, destination_partitions=1)
    store, _commits, per_partition = _per_writer_fakes(monkeypatch)
    made, _offsets, run = _twenty_records_in_three_transactions(monkeypatch, s, store)
    rows = run()
    first, second = "mirrorflow.g:src::writer-0", "mirrorflow.g:src::writer-0.1"
    assert sorted(made) == [first, second] and per_partition.full == []
    assert [[t for t, _k, _v in c if t == "t"] for c in made[first].committed] == [["t"] * 7, ["t"] * 6]
    assert [[t for t, _k, _v in c if t == "t"] for c in made[second].committed] == [["t"] * 7]
    landed = [k for txn in (made[first].committed[0], made[second].committed[0], made[first].committed[1])
              for t, k, _v in txn if t == "t"]
    assert landed == [b"k%d" % o for o in range(20)]
    for txn, (up, down) in zip((made[first].committed[0], made[second].committed[0], made[first].committed[1]),
                               ((7, 7), (14, 14), (20, 20)), strict=True):
        last = [OffsetSync.from_record(k, v) for t, k, v in txn if t == "syncs"][-1]
        assert (last.upstream_offset, last.downstream_offset) == (up, down)
    assert [(r["mirrored"], r["upstream_end"]) for r in rows] == [(20, 20)]
    assert replicate._TURNS == {first: 1}  # three commits: the next transaction is the second producer's


def test_per_writer_fences_every_writer_id_its_job_does_not_use(monkeypatch) -> None:
    """A writer of an earlier job that ran with more processes, or with more producers per writer, may still
    hold any of those ids: every start fences all but its own (2 processes x 2 producers here)."""
    from mirror_core.config import WRITER_PRODUCERS_MAX, WRITER_SLOTS
    from mirror_core.replicate import WriterTransaction

    _per_writer_fakes(monkeypatch)
    fenced: list[str] = []
    monkeypatch.setattr(replicate, "fence_transactional_id", lambda config, txid, topic=None: fenced.append(txid))
    WriterTransaction([settings(value_serde="bytes")], 1, 2, producers=2).fence_unused()
    stem = "mirrorflow.g:src::writer-"
    ours = {stem + "0", stem + "0.1", stem + "1", stem + "1.1"}
    every = {stem + f"{slot}" + (f".{turn}" if turn else "") for slot in range(WRITER_SLOTS)
             for turn in range(WRITER_PRODUCERS_MAX)}
    assert len(fenced) == len(every) - 4 and set(fenced) == every - ours
    assert {stem + "0.2", stem + "1.3", stem + "15"} <= set(fenced)
    WriterTransaction([settings(value_serde="bytes")], 0, 2, producers=2).fence_unused()  # once per process
    assert len(fenced) == len(every) - 4


def _shared_write_with_a_large_record(monkeypatch, s, big_partition: int):
    """``transactions: per_writer`` through ``direct.write_ranges_per_writer`` (with the test's fake writer
    producers): partitions 0 and 1 of topic "t", ten records each, the fifth of ``big_partition`` 2,000
    bytes. Returns the batch's rows."""
    from mirror_core import direct
    from mirror_core.direct import Range
    from mirror_core.replicate import Columns
    from mirror_core.stream import BatchWriter, WriterPlan

    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: None, downstream_end=lambda t, p: 0,
                                       destination_high=lambda t, p: 999)
    monkeypatch.setattr(BatchWriter, "_writer", lambda self, topic, _s: self._writers.setdefault(topic, writer))

    def cols(big: bool) -> Columns:
        return Columns(list(range(10)), [b"k%d" % o for o in range(10)],
                       [b"x" * 2000 if big and o == 4 else b"v" for o in range(10)], [1_700_000_000_000] * 10)

    class Reader:
        def read(self, rs: list[Range], deliver) -> float:
            deliver(rs[0], cols(big_partition == 0))
            deliver(rs[1], cols(big_partition == 1))
            deliver(rs[0], None)
            deliver(rs[1], None)
            return 0.0

    plan = WriterPlan({"t": s}, {}, {"t": {0: 10, 1: 10}}, {}, None, group="g", transactions="per_writer")
    return direct.write_ranges_per_writer(plan, [Range("t", 0, 0, 10), Range("t", 1, 0, 10)], Reader(), 0, 1)


def test_per_writer_at_least_once_writes_again_only_the_partition_it_could_not_settle(monkeypatch, caplog) -> None:
    """``transactions: per_writer``, at_least_once: the destination rejects one record of partition 0 as too
    large in the writer's shared write. Only partition 0 is written again partition by partition (where the
    size limit is learned and the record dead-lettered); partition 1's records, acknowledged in the same
    write, keep their offset syncs and are not written a second time."""
    from confluent_kafka import KafkaError


    s = settings(delivery="at_least_once", value_serde="bytes", source_partitions=2, destination_partitions=2)
    _store, _commits, per_partition = _per_writer_fakes(monkeypatch)
    fake_producer = replicate.Producer
    made: list[_FakeProducer] = []

    class Rejecting(fake_producer):  # type: ignore[misc, valid-type]
        def produce(self, topic, value=None, key=None, partition=0, on_delivery=None, **kw):
            if on_delivery is not None and value is not None and len(value) > 1000:
                accepted = on_delivery
                on_delivery = lambda _err, msg: accepted(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), msg)  # noqa: E731
            super().produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery, **kw)

        def purge(self) -> None:
            self._cbs = []

    monkeypatch.setattr(replicate, "Producer", lambda *a: made.append(Rejecting(*a)) or made[-1])
    with caplog.at_level("INFO", logger="mirror_core.stream"):
        rows = _shared_write_with_a_large_record(monkeypatch, s, big_partition=0)
    shared = made[0].full
    assert len(made) == 1 and [p for t, p, *_ in shared if t == "t"] == [0] * 10 + [1] * 10
    assert {OffsetSync.from_record(k, v).partition for t, _p, k, v, _h, _ts in shared if t == "syncs"} == {1}
    again = [(p, k) for t, p, k, *_ in per_partition.full if t == "t"]
    assert again == [(0, b"k%d" % o) for o in range(10)]  # partition 0 only, from its start
    assert [r.getMessage() for r in caplog.records if "could not be settled" in r.getMessage()] == [
        "g: 1 of 2 partitions could not be settled in the writer's shared write (first t[0]: a record the "
        "destination rejected as too large, or reports not tied to records); writing those partition by partition"]
    assert sorted((r["partition"], r["mirrored"]) for r in rows) == [(0, 10), (1, 10)]


def _gapless_writer_producer(loses):
    """A fake writer producer with ``enable.gapless.guarantee``: the first record that ``loses(topic,
    partition, key, value)`` picks is lost, and the producer stops: its next flush serves the reports of what
    was produced before the loss, then raises the fatal error; every record produced from the loss on is
    reported failed after it."""
    from confluent_kafka import KafkaError, KafkaException

    stop = KafkaError(KafkaError._GAPLESS_GUARANTEE, "unable to satisfy gap-less guarantee", fatal=True)

    class Gapless(_FakeProducer):
        def __init__(self, *_a: object) -> None:
            super().__init__()
            self.lost_at: int | None = None  # reports before this one are served before the fatal error
            self.raised = False

        def produce(self, topic, value=None, key=None, partition=0, on_delivery=None, **kw):
            if self.lost_at is None and loses(topic, partition, key, value):
                self.lost_at = len(self._cbs)
            if self.lost_at is None:
                super().produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery, **kw)
            elif on_delivery is not None:  # failed by the stop
                self._cbs.append((lambda _err, msg, cb=on_delivery: cb(KafkaError(KafkaError._FATAL), msg),
                                  _Msg(None)))

        def flush(self, timeout: float) -> int:
            if self.lost_at is not None and not self.raised:
                self.raised = True
                for cb, msg in self._cbs[:self.lost_at]:
                    cb(None, msg)
                self._cbs = self._cbs[self.lost_at:]
                raise KafkaException(stop)
            return super().flush(timeout)

    return Gapless


def test_per_writer_at_least_once_a_record_lost_by_the_shared_producer_hands_back_only_what_did_not_land(
        monkeypatch, caplog) -> None:
    """``transactions: per_writer``, at_least_once: the shared producer is gapless. It loses a record of
    partition 1 (the destination rejects it) and stops: its flush raises the fatal error, and every record
    produced after the loss is reported failed. The reports still due are taken; partition 0, whose records
    all landed before the loss, keeps them and its offset syncs go out on a new shared producer; only
    partition 1 is written again partition by partition."""
    s = settings(delivery="at_least_once", value_serde="bytes", source_partitions=2, destination_partitions=2)
    _store, _commits, per_partition = _per_writer_fakes(monkeypatch)
    made: list[_FakeProducer] = []
    gapless = _gapless_writer_producer(lambda _t, _p, _k, v: v is not None and len(v) > 1000)
    monkeypatch.setattr(replicate, "Producer", lambda *a: made.append(gapless(*a)) or made[-1])
    with caplog.at_level("INFO", logger="mirror_core.stream"):
        rows = _shared_write_with_a_large_record(monkeypatch, s, big_partition=1)
    assert len(made) == 2  # the stopped producer was replaced
    assert [p for t, p, *_ in made[0].full if t == "t"] == [0] * 10 + [1] * 4  # partition 1 lost from its 5th
    assert [t for t, *_ in made[0].full] == ["t"] * 14  # no offset sync on the stopped producer
    synced = [OffsetSync.from_record(k, v) for t, _p, k, v, _h, _ts in made[1].full if t == "syncs"]
    assert {x.partition for x in synced} == {0} and max(x.upstream_offset for x in synced) == 10
    again = [(p, k) for t, p, k, *_ in per_partition.full if t == "t"]
    assert again == [(1, b"k%d" % o) for o in range(10)]  # partition 1 only, from its start
    assert "the writer's shared producer lost a record (unable to satisfy gap-less guarantee)" in caplog.text
    assert "1 of 2 partitions could not be settled" in caplog.text
    assert sorted((r["partition"], r["mirrored"]) for r in rows) == [(0, 10), (1, 10)]


def test_per_writer_at_least_once_a_partition_handed_back_does_not_dead_letter_a_record_twice(monkeypatch) -> None:
    """The shared write dead-letters partition 1's fifth record (over the destination's size limit) and its
    dead letter is acknowledged; then the producer loses the partition's seventh record and the partition is
    handed back. Written again partition by partition, its records go out again, the dead letter does not."""
    s = settings(delivery="at_least_once", value_serde="bytes", source_partitions=2, destination_partitions=2,
                 destination_max_message_bytes=1500)
    _store, _commits, per_partition = _per_writer_fakes(monkeypatch)
    made: list[_FakeProducer] = []
    gapless = _gapless_writer_producer(lambda t, p, k, _v: (t, p, k) == ("t", 1, b"k6"))
    monkeypatch.setattr(replicate, "Producer", lambda *a: made.append(gapless(*a)) or made[-1])
    rows = _shared_write_with_a_large_record(monkeypatch, s, big_partition=1)
    assert [t for t, *_ in made[0].full].count("g.dlq") == 1  # in the shared write, before the loss
    assert [t for t, *_ in per_partition.full].count("g.dlq") == 0  # not again
    again = [(p, k) for t, p, k, *_ in per_partition.full if t == "t"]
    assert again == [(1, b"k%d" % o) for o in range(10) if o != 4]
    assert sorted((r["partition"], r["mirrored"], r["dead_lettered"]) for r in rows) == [(0, 10, 0), (1, 9, 1)]


def test_per_writer_at_least_once_partitions_share_one_producer_without_transactions(monkeypatch) -> None:
    """``transactions: per_writer`` with an at_least_once mirror: a writer's partitions go through one
    idempotent producer of the writer, with no transaction and no producer per partition (1,000 producers
    per process were 2.75 GB at 1,000 partitions). Each partition's offset syncs follow its records, and
    partition 0, whose range turns out to end past its records (trailing markers), moves its position by a
    sync through the same producer."""
    s = settings(delivery="at_least_once", value_serde="bytes", source_partitions=2, destination_partitions=2)
    _store, commits, per_partition = _per_writer_fakes(monkeypatch)
    made: list[_FakeProducer] = []
    fake_producer = replicate.Producer
    monkeypatch.setattr(replicate, "Producer", lambda *a: made.append(fake_producer(*a)) or made[-1])
    rows = _write_past_trailing_markers(monkeypatch, s, {})
    assert len(made) == 1 and per_partition.full == [] and commits == []
    out = made[0].full
    assert [p for t, p, *_ in out if t == "t"] == [0] * 10 + [1] * 10
    syncs = [(i, OffsetSync.from_record(k, v)) for i, (t, _p, k, v, _h, _ts) in enumerate(out) if t == "syncs"]
    last = {x.partition: (x.upstream_offset, x.downstream_offset) for _i, x in syncs}
    assert last == {0: (12, 10), 1: (10, 10)}
    for i, x in syncs:  # a sync is produced only after the records it covers were acknowledged
        assert sum(1 for t, p, *_ in out[:i] if t == "t" and p == x.partition) >= min(x.upstream_offset, 10)
    assert sorted((r["partition"], r["mirrored"], r["upstream_end"]) for r in rows) == [(0, 10, 12), (1, 10, 10)]


def test_per_writer_on_two_producers_writes_a_transaction_again_with_reports_when_a_marker_landed_among_a_run(
        monkeypatch, caplog) -> None:
    """With two producers by turns, the broker may write one transaction's commit markers while the next one's
    records go out. When a marker lands among records the C loop produced without reports, their offsets are
    unknown: that transaction is aborted (nothing guessed) and written again by the same writer, each record
    reported, so it cannot meet the same again; no partition's own producer is started, and the position is
    not read again (nothing of an aborted transaction committed; at 1,000 partitions reading them again took
    10-20 s). The writer's later transactions go through the C loop again, and each asks first where the last
    commit's markers are still due (until 6 December every later record was reported, for the life of the
    process)."""
    from mirror_core import native

    s = settings(value_serde="bytes", source_partitions=1, destination_partitions=1)
    store, _commits, per_partition = _per_writer_fakes(monkeypatch)
    monkeypatch.setattr(replicate, "_ASK_ALWAYS", set())
    made, offsets, run = _twenty_records_in_three_transactions(monkeypatch, s, store)
    per_partition._next = offsets
    runs: list[str] = []

    def c_loop(producer, topic, partition, values, keys, stamps, headers, start, stop, value_map, key_map, limit):
        for i in range(start, stop):
            producer.produce(topic, values[i], keys[i], partition, timestamp=stamps[i])
            offsets[(topic, partition)] = offsets.get((topic, partition), 0) + 1  # landed, no report
            if not runs and i == start:
                offsets[(topic, partition)] += 1  # the other producer's commit marker lands among the run
        runs.append("shared" if producer is not per_partition else "partition")
        return stop, native.DONE, 0

    monkeypatch.setattr(native, "usable", lambda p: True)
    monkeypatch.setattr(native, "produce", c_loop)
    lookups: list[int] = []  # positions read and kept, one by one or several at once
    keep = replicate.PartitionWriter._store_position
    monkeypatch.setattr(replicate.PartitionWriter, "_store_position",
                        lambda self, key, p, *a: lookups.append(p) or keep(self, key, p, *a))
    with caplog.at_level("INFO", logger="mirror_core.stream"):
        rows = run()
    assert lookups == [0]
    # the first shared run was not provable; the same records went out again, each reported (no run), then the
    # two later transactions' records through the C loop (the first and last record of each reported)
    assert runs == ["shared", "shared", "shared"]
    assert "writes the transaction again, each record reported, and from now on asks" in caplog.text
    assert replicate._ASK_ALWAYS == {replicate.writer_transactional_id("g", "src", 0, 0)}
    assert per_partition.committed == []
    shared = [k for p in made.values() for c in p.committed for t, k, _v in c if t == "t"]
    assert sorted(shared) == sorted(b"k%d" % o for o in range(20))
    assert [(r["mirrored"], r["upstream_end"]) for r in rows] == [(20, 20)]
    assert (store[0].upstream_offset, store[0].downstream_offset) == (20, offsets[("t", 0)])


def test_per_writer_the_next_transaction_reports_each_record_where_the_last_commits_markers_are_late(
        monkeypatch) -> None:
    """Two producers by turns: the next transaction asks the destination (once, for all of them) which of the
    partitions it shares with the last commit still wait for that commit's markers; those report each record
    (a marker may land among a run without reports), the others go through the C loop. A partition whose
    markers were once seen landed is not asked about again (only a partition's first markers were slow), nor
    when nothing is due; once a marker landed among a run all the same, every partition of the last commit is
    asked about."""
    from mirror_core.replicate import WriterTransaction

    s = settings(value_serde="bytes", producer_config={"bootstrap.servers": "dst:9092"})
    monkeypatch.setattr(replicate, "_TURNS", {})
    monkeypatch.setattr(replicate, "_MARKERS_DUE", {})
    monkeypatch.setattr(replicate, "_MARKERS_SEEN", set())
    monkeypatch.setattr(replicate, "_ASK_ALWAYS", set())
    asked: list[list[tuple[str, int]]] = []

    def pending(config: dict, partitions: list[tuple[str, int]], timeout: float = 10.0) -> list[tuple[str, int]]:
        asked.append(partitions)
        return partitions[:1]

    monkeypatch.setattr(replicate, "markers_pending", pending)
    txn = WriterTransaction([s], 0, 1, producers=2)
    assert txn.late_markers([("t", 0)]) == set() and asked == []  # nothing committed yet
    txn.took_turn([("t", 1), ("t", 2), ("u", 0)])
    assert txn.late_markers([("t", 0), ("t", 1), ("t", 2)]) == {("t", 1)}
    assert asked == [[("t", 1), ("t", 2)]]
    asked.clear()
    assert txn.late_markers([("t", 1)]) == set() and asked == []  # asked once a commit
    txn.took_turn([("t", 1), ("t", 2)])
    assert txn.late_markers([("t", 1), ("t", 2)]) == {("t", 1)}
    assert asked == [[("t", 1)]]  # partition 2's markers were seen landed before: not asked again
    asked.clear()
    txn.took_turn([("t", 1), ("t", 2)])
    txn.ask_always()  # a marker landed among a run all the same
    assert txn.late_markers([("t", 1), ("t", 2)]) == {("t", 1)}
    assert asked == [[("t", 1), ("t", 2)]]  # partition 2 too, although its markers were seen landed before
    asked.clear()
    assert txn.late_markers([("t", 2)]) == set() and asked == []  # nothing due: nothing asked


def test_per_writer_the_admin_that_asks_about_late_markers_is_made_when_the_producers_start(monkeypatch) -> None:
    """A new admin client's first request could wait 1-3 s (it lost its leader lookup while swapping its
    bootstrap connection): with producers by turns, the client that asks about the last commit's markers is
    made when the writer's producers start (the warm-up), so the first commit's lookup finds it there. One
    writer producer asks nothing, and makes none."""
    from mirror_core.replicate import WriterTransaction

    class Quiet:
        def __init__(self, config: dict) -> None:
            self.config = config

        def list_topics(self, *_a: object, **_k: object) -> None:
            pass

        def init_transactions(self, timeout: float) -> None:
            pass

    admins: list[dict] = []
    monkeypatch.setattr(replicate, "Producer", Quiet)
    monkeypatch.setattr(replicate, "AdminClient", lambda config: admins.append(config) or object())
    for name, empty in (("_PRODUCERS", {}), ("_PRODUCER_LIMITS", {}), ("_PRODUCER_PARTITIONS", {}), ("_ADMINS", {}),
                        ("_TURNS", {})):
        monkeypatch.setattr(replicate, name, empty)
    config = {"bootstrap.servers": "dst:9092"}
    WriterTransaction([settings(producer_config=config)], 0, 1, producers=1).producer()
    assert admins == []
    txn = WriterTransaction([settings(producer_config=config)], 0, 1, producers=2)
    txn.producer()
    assert [a["bootstrap.servers"] for a in admins] == ["dst:9092"]
    made = replicate._ADMINS.copy()
    monkeypatch.setattr(replicate, "latest_offsets", lambda admin, parts, committed, timeout: dict.fromkeys(parts, 5))
    assert txn.still_late([("t", 0)], 10.0) == set()
    assert len(admins) == 1 and replicate._ADMINS == made  # the lookup asked through the one made at the start


def _late_markers_writer(monkeypatch):
    """:func:`_twenty_records_in_three_transactions` on a destination the writer can ask about late markers
    (none known landed or due yet, no reporting of every record); returns the sync store, the producers made,
    the destination log's next offsets and the function that writes the batch."""
    s = settings(value_serde="bytes", source_partitions=1, destination_partitions=1,
                 producer_config={"bootstrap.servers": "dst:9092"})
    store, _commits, per_partition = _per_writer_fakes(monkeypatch)
    monkeypatch.setattr(replicate, "_ASK_ALWAYS", set())
    monkeypatch.setattr(replicate, "_MARKERS_DUE", {})
    monkeypatch.setattr(replicate, "_MARKERS_SEEN", set())
    made, offsets, run = _twenty_records_in_three_transactions(monkeypatch, s, store)
    per_partition._next = offsets
    return store, made, offsets, run


def _counting_c_loop(monkeypatch, offsets: dict[tuple[str, int], int]) -> list[int]:
    """The C loop as a fake that appends each record to the fake destination log (``offsets``, as the fake
    producers do) without a report; returns the list of each run's length, filled as runs go out."""
    from mirror_core import native

    runs: list[int] = []

    def c_loop(producer, topic, partition, values, keys, stamps, headers, start, stop, value_map, key_map, limit):
        for i in range(start, stop):
            producer.produce(topic, values[i], keys[i], partition, timestamp=stamps[i])
            offsets[(topic, partition)] = offsets.get((topic, partition), 0) + 1
        runs.append(stop - start)
        return stop, native.DONE, 0

    monkeypatch.setattr(native, "usable", lambda p: True)
    monkeypatch.setattr(native, "produce", c_loop)
    return runs


def test_per_writer_a_partition_whose_last_markers_are_late_is_reported_record_by_record_not_written_twice(
        monkeypatch, caplog) -> None:
    """The C loop's runs go without reports; while the last commit's markers have not landed in a partition
    (the broker was slow to write them), the next transaction reports each of its records there instead, so
    a marker landing among them does not make the transaction go out a second time. Here each transaction's
    markers are still due when the next one starts (the fake destination says so): no record goes through
    the C loop after the first transaction, nothing is written again, and the writer never switches to
    reporting every record for good."""
    from mirror_core import stream

    store, made, offsets, run = _late_markers_writer(monkeypatch)
    asked: list[list[tuple[str, int]]] = []

    def pending(config: dict, partitions: list[tuple[str, int]], timeout: float = 10.0) -> list[tuple[str, int]]:
        asked.append(partitions)
        offsets[("t", 0)] = offsets.get(("t", 0), 0) + 1  # the last commit's marker lands among what comes next
        return partitions

    monkeypatch.setattr(replicate, "markers_pending", pending)
    runs = _counting_c_loop(monkeypatch, offsets)
    monkeypatch.setattr(stream, "LATE_MARKERS_WAIT_S", 0)  # no wait for the markers: reported at once
    with caplog.at_level("INFO", logger="mirror_core.stream"):
        rows = run()
    assert asked == [[("t", 0)], [("t", 0)]]  # before the second and the third transaction
    assert sum(runs) <= 7  # only the first transaction's records went through the C loop
    assert "reports every record from now on" not in caplog.text
    shared = [k for p in made.values() for c in p.committed for t, k, _v in c if t == "t"]
    assert sorted(shared) == sorted(b"k%d" % o for o in range(20))  # each record once
    assert [(r["mirrored"], r["upstream_end"]) for r in rows] == [(20, 20)]
    assert (store[0].upstream_offset, store[0].downstream_offset) == (20, offsets[("t", 0)])


def test_per_writer_a_partition_whose_late_markers_land_while_the_transaction_waits_goes_through_the_c_loop(
        monkeypatch, caplog) -> None:
    """A partition whose last commit markers are late is asked about again while the transaction waits (up to
    ``LATE_MARKERS_WAIT_S``, after its other partitions are staged); once they have landed its records go
    through the C loop after all, not one report a record: the transaction is written once, every record
    arrives once, the sync is right."""
    from mirror_core import stream

    monkeypatch.setattr(stream, "LATE_MARKERS_POLL_S", 0.01)
    store, made, offsets, run = _late_markers_writer(monkeypatch)
    asked: list[list[tuple[str, int]]] = []

    def pending(config: dict, partitions: list[tuple[str, int]], timeout: float = 10.0) -> list[tuple[str, int]]:
        asked.append(partitions)
        if len(asked) % 2:  # the question before a transaction: still due
            return partitions
        offsets[("t", 0)] = offsets.get(("t", 0), 0) + 1  # the marker lands while the transaction waits
        return []

    monkeypatch.setattr(replicate, "markers_pending", pending)
    runs = _counting_c_loop(monkeypatch, offsets)
    with caplog.at_level("DEBUG", logger="mirror_core.stream"):
        rows = run()
    assert asked == [[("t", 0)]] * 4  # before the second and the third transaction, and again while each waited
    assert len(runs) == 3, "a transaction's records were reported one by one although its markers had landed"
    assert "1 landed within" in caplog.text and "reports every record from now on" not in caplog.text
    shared = [k for p in made.values() for c in p.committed for t, k, _v in c if t == "t"]
    assert sorted(shared) == sorted(b"k%d" % o for o in range(20))  # each record once
    assert [(r["mirrored"], r["upstream_end"]) for r in rows] == [(20, 20)]
    assert (store[0].upstream_offset, store[0].downstream_offset) == (20, offsets[("t", 0)])


@pytest.mark.parametrize("setting, quiet", [(None, True), ("0", False)])
def test_a_reading_process_collects_garbage_rarely_unless_turned_off(setting, quiet):
    """A process that reads or writes records (a writer process of the direct path, the driver writing
    a micro-batch) collects reference cycles every GC_THRESHOLD new containers, not every
    700 (a record read is one), with what it held once started frozen out of the collections;
    ``MIRRORFLOW_GC=0`` keeps Python's defaults (the bench's A/B). Process-wide, so in a process of its own."""
    import os
    import subprocess
    import sys

    from mirror_core.replicate import GC_THRESHOLD

    env = {k: v for k, v in os.environ.items() if k != "MIRRORFLOW_GC"} | ({} if setting is None else {"MIRRORFLOW_GC": setting})
    out = subprocess.run([sys.executable, "-c", "import gc\nfrom mirror_core.replicate import quiet_gc\nquiet_gc()\n"
                          "print(gc.get_threshold()[0], gc.get_freeze_count() > 0)"],
                         env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == ([str(GC_THRESHOLD), "True"] if quiet else ["700", "False"])


# --------------------------------------------------------------------------- waiting for acknowledgements


class _Clock:
    """time.monotonic for the writer: advanced by the fake producers' flushes, never by the test's own time."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Away:
    """A fake producer's destination, away until ``back_at`` (on ``clock``): a flush before then acknowledges
    nothing and takes its whole timeout, as librdkafka's does while it retries."""

    def __init__(self, clock: _Clock, back_at: float) -> None:
        super().__init__()
        self.clock = clock
        self.back_at = back_at

    def flush(self, timeout: float) -> int:
        if self.clock.now + timeout < self.back_at:
            self.clock.now += timeout
            return len(self._cbs)  # type: ignore[attr-defined]
        self.clock.now = max(self.clock.now, self.back_at)
        return super().flush(timeout)  # type: ignore[misc]


class _OutageProducer(_Away, _AckingProducer):
    """An idempotent producer whose destination is away until ``back_at``."""


def test_delivery_timeout_and_ack_wait_follow_the_producer_config() -> None:
    assert replicate.delivery_timeout({}) == 300.0  # librdkafka's default message.timeout.ms
    assert replicate.delivery_timeout({"message.timeout.ms": "120000"}) == 120.0
    assert replicate.delivery_timeout({"delivery.timeout.ms": 90000}) == 90.0  # the Java client's name
    assert replicate.delivery_timeout({"message.timeout.ms": 0}) == 300.0  # 0 is "forever" to librdkafka
    assert replicate.ack_wait("at_least_once", {"message.timeout.ms": 120000}) == 125.0
    assert replicate.ack_wait("exactly_once", {"message.timeout.ms": 120000}) == 60.0  # the transaction's limit


def test_at_least_once_rides_out_a_destination_outage_longer_than_a_minute(monkeypatch, caplog) -> None:
    """The destination answers nothing for 95 s: the writer keeps waiting for the producer (which retries
    until its message.timeout.ms), says so in the log every 30 s, and the chunk is written once it is back;
    it used to fail the chunk after a fixed 60 s although the producer had not given up on a record."""
    clock = _Clock()
    fake = _OutageProducer(clock, back_at=clock.now + 95)
    monkeypatch.setattr(replicate.time, "monotonic", clock)
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(delivery="at_least_once", value_serde="bytes"), ids({}),
                                       lambda t, p: None, downstream_end=lambda t, p: 0)
    with caplog.at_level("WARNING", logger="mirror_core.replicate"):
        r = writer.write(1, [rec(b"v", offset=o) for o in (0, 1, 2)], upstream_end=3)
    assert (r.mirrored, r.last_downstream) == (3, 2)
    waits = [m for m in caplog.messages if "waited" in m]
    assert len(waits) == 3 and "3 records have waited 30 s" in waits[0] and "up to 305 s" in waits[0], waits
    syncs = [OffsetSync.from_record(k, v) for t, _, k, v, _, _ in fake.full if t == "syncs"]
    assert syncs[-1] == OffsetSync("t", 1, 3, 3)


def test_at_least_once_gives_up_when_the_producer_would_have(monkeypatch) -> None:
    """Past the producer's own delivery timeout (plus a few seconds for its reports) the chunk fails, with a
    line that says how long it waited; no offset sync moves past records not acknowledged."""
    clock = _Clock()
    fake = _OutageProducer(clock, back_at=clock.now + 10_000)
    monkeypatch.setattr(replicate.time, "monotonic", clock)
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "alo"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    s = settings(delivery="at_least_once", value_serde="bytes", producer_config={"message.timeout.ms": 45000})
    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    with pytest.raises(replicate.WriterError, match=r"2 records not acknowledged within 50 s"):
        writer.write(1, [rec(b"v", offset=o) for o in (0, 1)], upstream_end=2)
    assert clock.now - 1000.0 == pytest.approx(50.0)
    assert not [f for f in fake.full if f[0] == "syncs"]


class _DownProducer(_Away, _FakeProducer):
    """A transactional producer whose destination is away until ``back_at``."""


def _outage_writer(monkeypatch, clock: _Clock, back_at: float, **over: object):
    """An exactly_once writer whose first producer meets an outage until ``back_at``; making a new producer
    fails (after 30 s, as a metadata request would) until then. Returns the writer and the producers made."""
    from confluent_kafka import KafkaError, KafkaException

    made: list[_FakeProducer] = []

    def producer(_s, p, **_k):
        if made and clock.now < back_at:
            clock.now += 30
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Broker transport failure"))
        if not made or replicate._PRODUCERS.get("txid") is None:
            made.append(_DownProducer(clock, back_at))
            replicate._PRODUCERS["txid"] = made[-1]
        return made[-1], "txid"

    monkeypatch.setattr(replicate.time, "monotonic", clock)
    monkeypatch.setattr(replicate.time, "sleep", lambda s: setattr(clock, "now", clock.now + s))
    monkeypatch.setattr(replicate, "_producer", producer)
    monkeypatch.setattr(replicate, "_PRODUCERS", {})
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(value_serde="bytes", **over), ids({}), lambda t, p: None,
                                       downstream_end=lambda t, p: 0)
    return writer, made


def test_exactly_once_rides_out_a_destination_outage_longer_than_its_transaction(monkeypatch, caplog) -> None:
    """The destination is away for 150 s, longer than the transaction's 60 s: the transaction is given up,
    the producer dropped, new producers are tried (each try logged) until the destination answers, and the
    chunk is committed once, by the new producer, from the position read again; nothing of the lost
    transaction commits."""
    clock = _Clock()
    writer, made = _outage_writer(monkeypatch, clock, back_at=clock.now + 150)
    with caplog.at_level("WARNING", logger="mirror_core.replicate"):
        r = writer.write(1, [rec(b"v", key=str(o).encode(), offset=o) for o in (0, 1, 2)], upstream_end=3)
    assert len(made) == 2 and made[0].committed == []
    (txn,) = made[1].committed
    assert [k for t, k, _ in txn if t == "t"] == [b"0", b"1", b"2"]
    assert (r.mirrored, r.last_downstream) == (3, 2)
    tries = [m for m in caplog.messages if "did not answer" in m]
    assert len(tries) >= 3 and "not acknowledged within 60 s" in tries[0] and "up to 300 s" in tries[0], tries


def test_exactly_once_gives_up_on_an_outage_after_the_producers_delivery_timeout(monkeypatch) -> None:
    clock = _Clock()
    writer, made = _outage_writer(monkeypatch, clock, back_at=clock.now + 10_000,
                                  producer_config={"message.timeout.ms": 100_000})
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException, match="transport failure"):
        writer.write(1, [rec(b"v", offset=o) for o in (0, 1)], upstream_end=2)
    assert 100 <= clock.now - 1000.0 <= 100 + 60 + 31
    assert all(p.committed == [] for p in made)


@pytest.mark.parametrize(("configured", "gapless_ms"), [
    ({}, 60000), ({"message.timeout.ms": "300000"}, 60000), ({"delivery.timeout.ms": "0"}, 60000),
    ({"message.timeout.ms": "20000"}, 20000)])
def test_a_partitions_gapless_producer_gives_up_on_a_record_within_60_s_its_usual_producer_waits_as_configured(
        monkeypatch, configured, gapless_ms):
    """at_least_once: a record in flight when the destination broker went down has an unknown fate, and the
    partition's gapless producer (the C loop's) holds it until its delivery timeout; with librdkafka's 300 s a
    30 s outage stalled the mirror for 300 s. That producer gives up within 60 s at most (then the chunk goes
    out again, a report a record, on the partition's usual producer), or sooner when so configured; the usual
    producer keeps the configured delivery timeout, so an outage is still ridden out as long as it says.
    The config stays a redacting ClientConfig."""
    from mirror_core.redaction import ClientConfig

    made: list[dict] = []

    def producer(config: dict) -> object:
        made.append(config)
        return object()

    monkeypatch.setattr(replicate, "Producer", producer)
    monkeypatch.setattr(replicate, "_PRODUCERS", {})
    s = settings(delivery="at_least_once", producer_config=ClientConfig({"bootstrap.servers": "dst:9092",
                                                                         "sasl.password": "hunter2", **configured}))
    replicate._producer(s, 0, gapless=True)
    replicate._producer(s, 0)
    gapless, usual = made
    assert gapless["enable.gapless.guarantee"] is True and gapless["message.timeout.ms"] == gapless_ms
    assert "delivery.timeout.ms" not in gapless
    assert "enable.gapless.guarantee" not in usual
    assert {k: v for k, v in usual.items() if k.endswith("timeout.ms")} == configured
    assert isinstance(gapless, ClientConfig) and "hunter2" not in repr(gapless)


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_the_destinations_producer_tuning_reaches_the_writers_producers_and_its_guarantees_stay(
        monkeypatch: pytest.MonkeyPatch, delivery: str) -> None:
    """``linger.ms`` and ``batch.size`` on the destination cluster (the tuning MirrorMaker 2 users give as
    ``producer.*``) reach the partition writers' producers; a ``batch.size`` over the topic's limit is cut to
    it; the settings the guarantees rest on (idempotence, ``acks=all``) win over the cluster's. Without tuning
    the writers linger 5 ms. (The destination's settings used to be overwritten: ``linger.ms`` always 5.)"""
    made = recording_producers(monkeypatch)
    tuned = {"bootstrap.servers": "dst:9092", "linger.ms": 20, "batch.size": 262144, "enable.idempotence": False,
             "acks": 1}
    replicate._producer(settings(delivery=delivery, producer_config=tuned), 0)
    replicate._producer(settings(delivery=delivery, producer_config=tuned, mirror="g__big",
                                 destination_max_message_bytes=100_000), 0)
    replicate._producer(settings(delivery=delivery, producer_config={"bootstrap.servers": "dst:9092"},
                                 mirror="g__plain"), 0)
    (own, capped, plain) = made
    assert (str(own["linger.ms"]), str(own["batch.size"])) == ("20", "262144")
    assert own["enable.idempotence"] is True and own["acks"] == "all"
    assert str(capped["linger.ms"]) == "20" and capped["batch.size"] == 100_000 - 100
    assert plain["linger.ms"] == replicate.WRITER_LINGER_MS == 5 and "batch.size" not in plain


def test_a_tasks_partitions_start_their_producers_then_read_their_positions_in_one_lookup(monkeypatch) -> None:
    """A transaction per partition in a Spark task (``read_path: executors``): the share's partitions are made
    ready at once, each partition's producer started first (its start fences a zombie of its id) and then the
    exactly-once partitions' positions read in one lookup a topic, not one lookup each as their first writes
    did. A partition whose producer did not start gets no position (it was not fenced): its first write starts
    it and reads its own. At-least-once partitions only start their producers."""
    from concurrent.futures import ThreadPoolExecutor

    from mirror_core.stream import BatchWriter, WriterPlan

    eos = settings(value_serde="bytes", source_partitions=4, destination_partitions=4)
    alo = settings(value_serde="bytes", source_topic="u", destination_topic="u", delivery="at_least_once")
    events: list = []
    for name, empty in (("_POSITIONS", replicate._PositionTable()), ("_PRODUCERS", {}), ("_PRODUCER_LIMITS", {}),
                        ("_PRODUCER_PARTITIONS", {}), ("_FENCED_PARTITIONS", set())):
        monkeypatch.setattr(replicate, name, empty)

    def producer(s: WriterSettings, partition: int, gapless: bool = False) -> tuple[object, str]:
        if (s.source_topic, partition) == ("t", 2):
            raise RuntimeError("destination unreachable")
        key = s.transactional_id_for(partition) if s.delivery == "exactly_once" else f"alo-{partition}"
        replicate._PRODUCERS[key] = object()
        events.append(("start", s.source_topic, partition))
        return replicate._PRODUCERS[key], key

    monkeypatch.setattr(replicate, "_producer", producer)
    writers = {}
    for s in (eos, alo):
        w = replicate.PartitionWriter(s, ids({}), lambda t, p: pytest.fail("a lookup of one partition"),
                                      downstream_end=lambda t, p: 0, destination_high=lambda t, p: 99)
        w.positions_lookup = lambda t, ps: events.append(("lookup", t, sorted(ps))) or {
            p: OffsetSync(t, p, 10 + p, 5) for p in ps}
        w.destination_highs = lambda t, ps: dict.fromkeys(ps, 99)
        writers[s.source_topic] = w
    monkeypatch.setattr(BatchWriter, "_writer", lambda self, topic, _s: writers[topic])
    plan = WriterPlan(settings={"t": eos, "u": alo}, id_map={}, end_offsets={}, destination_consumer_config={},
                      registries=None)
    bw = BatchWriter(plan)
    with ThreadPoolExecutor(4) as pool:
        failed = bw.prepare_many([("t", p) for p in range(4)] + [("u", 0), ("u", 1)], pool)
    assert [(key, str(exc)) for key, exc in failed] == [(("t", 2), "destination unreachable")]
    starts = [e for e in events if e[0] == "start"]
    assert sorted(starts) == [("start", "t", 0), ("start", "t", 1), ("start", "t", 3), ("start", "u", 0),
                              ("start", "u", 1)]
    assert events[len(starts):] == [("lookup", "t", [0, 1, 3])]  # after every start, once, without partition 2
    assert [writers["t"].position_known(p) for p in range(4)] == [True, True, False, True]
    assert replicate._POSITIONS[eos.transactional_id_for(3)] == replicate.Position(13, 5)


class _FencedProducer(_FakeProducer):
    """A transactional producer fenced since its last use: its next commit fails with ``code`` (the fence, by
    default)."""

    def __init__(self, code: int | None = None, fatal: bool = True) -> None:
        super().__init__()
        from confluent_kafka import KafkaError

        self.code = KafkaError._FENCED if code is None else code
        self.fatal = fatal

    def commit_transaction(self, timeout: float) -> None:
        from confluent_kafka import KafkaError, KafkaException

        raise KafkaException(KafkaError(self.code, "failed", fatal=self.fatal, retriable=not self.fatal))


def test_a_position_moved_past_markers_on_a_fenced_producer_is_moved_again_on_a_new_one(monkeypatch) -> None:
    """exactly_once: a range of only transaction markers (or aborted records) moves the partition's position past
    them (``advance_idle``). The producer this process kept for the partition was fenced since its last write
    (the partition went to another Python worker, or to the driver, which wrote it): its commit fails, and the
    position is moved again on a new producer, from the committed position read after that producer's start
    (the other writer's), or not at all when that is already past the range. An error that is not the
    producer's end (a timeout) is raised, and so is a second failure."""
    from confluent_kafka import KafkaError, KafkaException

    s = settings(value_serde="bytes")
    key = s.transactional_id_for(0)
    committed = [OffsetSync("t", 0, 5, 3)]  # what the destination's sync topic holds for partition 0
    made: list[_FakeProducer] = []

    def run(queue: list[_FakeProducer], after_fence: OffsetSync) -> int | None:
        made.clear()
        for name, empty in (("_POSITIONS", replicate._PositionTable()), ("_PRODUCERS", {}),
                            ("_PRODUCER_LIMITS", {}), ("_PRODUCER_PARTITIONS", {})):
            monkeypatch.setattr(replicate, name, empty)
        committed[:] = [OffsetSync("t", 0, 5, 3)]

        def producer(_s: WriterSettings, partition: int, gapless: bool = False) -> tuple[object, str]:
            if key not in replicate._PRODUCERS:
                replicate._PRODUCERS[key] = queue[len(made)]
                made.append(queue[len(made)])
                if len(made) > 1:
                    committed[:] = [after_fence]  # the other writer's commit, seen after the new start
            return replicate._PRODUCERS[key], key

        monkeypatch.setattr(replicate, "_producer", producer)
        w = replicate.PartitionWriter(s, ids({}), lambda t, p: committed[0], downstream_end=lambda t, p: 0,
                                      destination_high=lambda t, p: 999)
        # the process's own position of partition 0 is from before the other writer wrote it
        replicate._POSITIONS[key] = replicate.Position(5, 3)
        return w.advance_idle(0, 9, start=5)

    good = _FakeProducer()
    assert run([_FencedProducer(), good], OffsetSync("t", 0, 7, 4)) == 3
    assert len(made) == 2 and len(good.committed) == 1  # the sync, on the new producer
    assert replicate._POSITIONS[key] == replicate.Position(9, 4)

    good = _FakeProducer()
    assert run([_FencedProducer(), good], OffsetSync("t", 0, 12, 6)) is None  # the other writer went past it
    assert len(made) == 2 and good.committed == []

    with pytest.raises(KafkaException, match="failed"):
        run([_FencedProducer(KafkaError._TIMED_OUT, fatal=False), _FakeProducer()], OffsetSync("t", 0, 7, 4))
    assert len(made) == 1  # not the producer's end: not tried again here
    with pytest.raises(KafkaException, match="failed"):
        run([_FencedProducer(), _FencedProducer()], OffsetSync("t", 0, 7, 4))
    assert len(made) == 2


def _marks_writer(monkeypatch, committed: OffsetSync | None) -> tuple[_FakeProducer, object]:
    """A writer whose producer is kept under the partition's own transactional id (as ``_producer`` keeps it)."""
    fake = _FakeProducer()
    s = settings(value_serde="bytes", provenance=True)
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, s.transactional_id_for(p)))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    return fake, replicate.PartitionWriter(s, ids({}), lambda t, p: committed, downstream_end=lambda t, p: 100,
                                           destination_high=lambda t, p: 100)


def test_markers_after_copies_keep_the_position_only_mark(monkeypatch) -> None:
    """A range of the reverse flow's commit markers after a trailing run of copies (``advance_idle``), and a
    writer that reads such a position back after a restart: the syncs moving past them are position-only too,
    with the header that says so; the writer's positions themselves are as before."""
    fake, writer = _marks_writer(monkeypatch, OffsetSync("t", 1, 100, 100))
    writer.write(1, [rec(b"v", ((PROVENANCE_HEADER, b"dst"),), offset=o) for o in range(100, 110)], upstream_end=110)
    assert writer.advance_idle(1, 112, start=110) == 99
    sync_records = [(k, v, h) for t, _p, k, v, h, _ts in fake.full if t == "syncs"]
    assert sync_from_record(*sync_records[-1][:2], list(sync_records[-1][2])) == OffsetSync("t", 1, 112, 100, True)
    assert sync_records[-1][2] == (("mirrorflow.destination", b"t"), (POSITION_ONLY_HEADER, b"1"))
    writer.advance(1, 114, 99)  # markers at the end of the next range, after its (no) records
    (k, v, h), = [(k, v, h) for t, _p, k, v, h, _ts in fake.full if t == "syncs"][len(sync_records):]
    assert sync_from_record(k, v, list(h)) == OffsetSync("t", 1, 114, 100, True)
    # a restarted writer: the lookup gives the mark back, and a range of markers keeps it
    fake2, writer2 = _marks_writer(monkeypatch, OffsetSync("t", 1, 112, 100, True))
    assert writer2.advance_idle(1, 115) == 99
    (_t, _p, k, v, h, _ts), = [x for x in fake2.full if x[0] == "syncs"]
    assert sync_from_record(k, v, list(h)) == OffsetSync("t", 1, 115, 100, True)
    # an unmarked position (after its own last write) stays unmarked
    fake3, writer3 = _marks_writer(monkeypatch, OffsetSync("t", 1, 112, 100))
    writer3.advance_idle(1, 115)
    assert [x[4] for x in fake3.full if x[0] == "syncs"] == [(("mirrorflow.destination", b"t"),)]


def test_only_a_run_that_ends_the_chunk_leaves_position_only_syncs() -> None:
    """0-4 mirrored to 10-14, 5-6 copies, 7 mirrored to 15, 8-9 copies, the chunk's end at 11 (a marker at 10):
    the first run is followed by a mirrored record, whose place is exact; after the second nothing was mirrored,
    so 10 and 11 hold only where the writer resumes (16)."""
    pairs = [(u, u + 10) for u in range(5)] + [(7, 15)]
    syncs = replicate.loop_marked_syncs(syncs_for_batch("t", 0, pairs, 11), [5, 6, 8, 9], pairs, 0, 16)
    assert [(x.upstream_offset, x.downstream_offset, x.position_only) for x in syncs] == [
        (0, 10, False), (4, 14, False), (5, UNMAPPED, False), (7, 15, False), (8, UNMAPPED, False), (10, 16, True),
        (11, 16, True)]
