"""Pure decisions of the partition writer: schema ids in headers, pass-through serdes, provenance,
record size, position syncs, and the heartbeat mirror's selection."""

from __future__ import annotations

import struct

import yaml

from mirror_core import replicate
from mirror_core.config import parse_config
from mirror_core.offsets import OffsetSync, OffsetSyncStore
from mirror_core.policy import build_replication_policy
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


def settings(**over: object) -> WriterSettings:
    base = dict(
        group="g", mirror="g__t__t", source_alias="src", destination_alias="dst", source_topic="t",
        destination_topic="t", source_partitions=3, destination_partitions=3, delivery="exactly_once",
        key_serde="bytes", value_serde="avro", on_error="dead_letter", dlq_topic="g.dlq",
        offset_syncs_topic="syncs", provenance=False, producer_config={},
    )
    return WriterSettings(**(base | over))  # type: ignore[arg-type]


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


def test_guid_header_passes_through_and_unknown_header_id_is_dead_lettered() -> None:
    guid = b"\x01" + bytes(range(16))
    out = decide(rec(b"body", (("__value_schema_id", guid),)), settings(), ids({}))
    assert isinstance(out, OutRecord) and out.headers == (("__value_schema_id", guid),) and out.value == b"body"
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


class _FakeProducer:
    """Just enough of a transactional producer to run the writer without a broker."""

    def __init__(self) -> None:
        self.produced: list[tuple[str, bytes | None, bytes | None]] = []
        self.committed: list[list[tuple[str, bytes | None, bytes | None]]] = []
        self._txn: list[tuple[str, bytes | None, bytes | None]] = []
        self._cbs: list = []

    def begin_transaction(self) -> None:
        self._txn = []

    def produce(self, topic, value=None, key=None, partition=0, headers=None, timestamp=0, on_delivery=None):
        self._txn.append((topic, key, value))
        if on_delivery:
            self._cbs.append(on_delivery)

    def flush(self, timeout: float) -> int:
        for cb in self._cbs:
            cb(None, None)
        self._cbs = []
        return 0

    def commit_transaction(self, timeout: float) -> None:
        self.committed.append(self._txn)

    def abort_transaction(self, timeout: float) -> None:
        self._txn = []


def test_fully_dead_lettered_chunk_writes_a_position_sync(monkeypatch) -> None:
    """So a restart in a new worker resumes after the chunk instead of dead-lettering it again."""
    fake = _FakeProducer()
    s = settings(value_serde="avro")
    monkeypatch.setattr(replicate, "_producer", lambda _s, p: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", {})
    writer = replicate.PartitionWriter(s, ids({}), lambda t, p: OffsetSync("t", 1, 5, 40),
                                       downstream_end=lambda t, p: 999)
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
    monkeypatch.setattr(replicate, "_producer", lambda _s, p: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", {})
    writer = replicate.PartitionWriter(settings(value_serde="bytes", provenance=True), ids({}),
                                       lambda t, p: None, downstream_end=lambda t, p: 17)
    looped = [rec(b"v", ((PROVENANCE_HEADER, b"dst"),), offset=o) for o in (0, 1)]
    r = writer.write(1, looped)
    assert r.provenance_skipped == 2
    syncs = [OffsetSync.from_record(k, v) for t, k, v in fake.committed[0] if t == "syncs"]
    assert syncs == [OffsetSync("t", 1, 0, 17), OffsetSync("t", 1, 2, 17)]


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
