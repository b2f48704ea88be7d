"""Issue 11, the driver's side of the streaming mirror without a broker: how Spark's checkpoint is read,
records of topics nobody planned for, and the decisions taken per batch."""

from __future__ import annotations

import logging

import pytest

from mirror_core import stream
from mirror_core.errors import MirrorError
from mirror_core.replicate import Columns


def cols(*offsets: int) -> Columns:
    n = len(offsets)
    return Columns(list(offsets), [b"k"] * n, [b"v"] * n, [0] * n)


def test_item1_record_of_an_unknown_topic_never_passes_silently() -> None:
    """A topic the plan has no settings for fails the batch with one line naming it, unless the group looked
    at it and chose not to mirror it (excluded by a flow): those records are passed over."""
    plan = stream.WriterPlan(settings={}, id_map={}, end_offsets={}, destination_consumer_config={},
                             registries=None, ignored=frozenset({"payments.tmp"}), group="payments-prod")
    bw = stream.BatchWriter(plan)
    bw.feed("payments.tmp", 0, cols(1, 2))  # deliberately not mirrored
    with pytest.raises(stream.UnknownTopicError) as err:
        bw.feed("payments.new", 3, cols(7, 8))
    msg = str(err.value)
    assert "payments-prod" in msg and "'payments.new' [3]@7" in msg and "\n" not in msg
    assert not bw.results


def test_item1_checkpoint_locations_keep_their_uri_and_are_read_as_spark_wrote_them(tmp_path) -> None:
    """``file:`` URIs are read from the disk; other schemes are never taken for a missing local file."""
    f = tmp_path / "g" / "offsets" / "4"
    f.parent.mkdir(parents=True)
    f.write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":12,"1":3}}')
    base = tmp_path.as_uri()
    assert stream.join_location("s3a://bucket/ck", "g", "offsets") == "s3a://bucket/ck/g/offsets"
    assert stream.join_location(base + "/", "g") == base + "/g"
    assert stream.join_location(str(tmp_path), "g") == str(tmp_path / "g")
    assert stream.read_batch_end_offsets(stream.join_location(base, "g"), 4) == {"t": {0: 12, 1: 3}}
    assert stream.read_batch_end_offsets(str(tmp_path / "g"), 4) == {"t": {0: 12, 1: 3}}
    assert stream.read_batch_end_offsets(str(tmp_path / "g"), 5) == {}  # not planned yet
    with pytest.raises(MirrorError, match="s3a"):
        stream.read_batch_end_offsets("s3a://bucket/ck/g", 4)
    # whatever reader the Spark job hands in is the one used
    seen: list[str] = []
    stream.read_batch_end_offsets("hdfs://nn/ck/g", 9, lambda loc: seen.append(loc) or None)
    assert seen == ["hdfs://nn/ck/g/offsets/9"]


def test_item15_provenance_defaults_on_for_identity_naming_and_stops_a_reverse_mm2_loop() -> None:
    """Identity naming marks provenance whatever else the file holds; a record that left this source
    cluster and comes back through a flow that adds no header of its own (MirrorMaker 2) is not sent again."""
    from mirror_core.replicate import PROVENANCE_HEADER, SchemaIdTranslator, SourceRecord, WriterSettings, decide

    assert stream.default_provenance(None, "orders", "orders") is True
    assert stream.default_provenance(None, "orders", "src.orders") is False
    assert stream.default_provenance(False, "orders", "orders") is False
    s = WriterSettings(group="g", mirror="g__t__t", source_alias="a", destination_alias="b", source_topic="t",
                       destination_topic="t", source_partitions=1, destination_partitions=1, delivery="exactly_once",
                       key_serde="bytes", value_serde="bytes", on_error="dead_letter", dlq_topic="d",
                       offset_syncs_topic="s", provenance=True, producer_config={})
    ids = SchemaIdTranslator({})
    back_via_mm2 = SourceRecord("t", 0, 0, b"k", b"v", ((PROVENANCE_HEADER, b"a"),), 0)
    from_b = SourceRecord("t", 0, 1, b"k", b"v", ((PROVENANCE_HEADER, b"b"),), 0)
    from_c = SourceRecord("t", 0, 2, b"k", b"v", ((PROVENANCE_HEADER, b"c"),), 0)
    assert decide(back_via_mm2, s, ids) == "skip_provenance"
    assert decide(from_b, s, ids) == "skip_provenance"
    out = decide(from_c, s, ids)
    assert not isinstance(out, str) and out.headers == ((PROVENANCE_HEADER, b"c,a"),)  # type: ignore[union-attr]


def _runtime(tmp_path, allow: bool = False):
    import yaml

    from mirror_core.config import parse_config

    cfg = parse_config(yaml.safe_load(f"""
clusters: {{src: {{kafka: {{bootstrap.servers: "h1:9092"}}}}, dst: {{kafka: {{bootstrap.servers: "h2:9092"}}}}}}
groups:
  - {{name: g, source: src, destination: dst, serdes: {{key: bytes, value: bytes}},
      topics_mirroring: {{partition_count: {{type: mirror_source, max: 2}}, allow_placement_change: {str(allow).lower()}}},
      spark: {{checkpoint_dir: "{tmp_path}"}}, mirrors: [{{source_topic: t}}]}}
"""), env={})
    return stream.MirrorRuntime(cfg, cfg.groups[0])


def _settings(src: int, dst: int):
    from mirror_core.replicate import WriterSettings

    return WriterSettings(group="g", mirror="g__t__t", source_alias="src", destination_alias="dst", source_topic="t",
                          destination_topic="t", source_partitions=src, destination_partitions=dst,
                          delivery="exactly_once", key_serde="bytes", value_serde="bytes", on_error="dead_letter",
                          dlq_topic="d", offset_syncs_topic="s", provenance=True, producer_config={})


def test_item8_restart_refuses_to_switch_existing_partitions_to_hash_placement(tmp_path) -> None:
    """The source grew to 4 partitions while the destination may keep 2 (partition_count max): the batch
    before read only partitions 0-1, so they were mirrored partition to partition; hashing now is refused in
    one line naming the mirror, unless the operator allows it. A mirror hashed from the start goes on."""
    ck = tmp_path / "g" / "offsets"
    ck.mkdir(parents=True)
    meta = '{"batchWatermarkMs":0}'
    (ck / "1").write_text(f'v1\n{meta}\n{{"t":{{"0":10,"1":10}}}}')
    (ck / "2").write_text(f'v1\n{meta}\n{{"t":{{"0":12,"1":12,"2":0,"3":0}}}}')
    rt = _runtime(tmp_path)
    rt.settings = {"t": _settings(4, 2)}
    rt.known_topics = {"t"}
    rt.placement_change_allowed = {"t": False}
    with pytest.raises(MirrorError) as err:
        rt.writer_plan(2)
    msg = str(err.value)
    assert msg.startswith("g__t__t: ") and "allow_placement_change" in msg and "\n" not in msg
    rt.placement_change_allowed = {"t": True}
    assert rt.writer_plan(2).settings["t"].destination_partitions == 2
    rt.placement_change_allowed = {"t": False}
    (ck / "3").write_text(f'v1\n{meta}\n{{"t":{{"0":13,"1":12,"2":1,"3":0}}}}')
    assert rt.writer_plan(3).settings["t"].destination_partitions == 2  # already hashed in batch 2: no switch


def test_item5_records_expired_before_they_were_mirrored_are_counted(tmp_path, monkeypatch) -> None:
    """Batch 3 planned t[0] 20-30 and t[1] 5-9: retention left t[0] starting at 30 (no record read: all 10
    expired) and t[1] at 7 (read from 7: 2 expired). A gap that retention does not explain counts nothing."""
    from mirror_core import clients, metrics

    ck = tmp_path / "g" / "offsets"
    ck.mkdir(parents=True)
    meta = '{"batchWatermarkMs":0}'
    (ck / "2").write_text(f'v1\n{meta}\n{{"t":{{"0":20,"1":5,"2":4}}}}')
    (ck / "3").write_text(f'v1\n{meta}\n{{"t":{{"0":30,"1":9,"2":8}}}}')
    rt = _runtime(tmp_path)
    rt.settings = {"t": _settings(3, 3)}
    monkeypatch.setattr(clients, "end_offsets", lambda cluster, topic, **kw: {0: (30, 30), 1: (7, 9), 2: (0, 8)})
    rows = [{"topic": "t", "partition": 1, "first_offset": 7}, {"topic": "t", "partition": 2, "first_offset": 6}]
    before = metrics.EXPIRED.labels("g", "g__t__t")._value.get()
    assert rt.report_expired(3, rows) == 12
    assert metrics.EXPIRED.labels("g", "g__t__t")._value.get() - before == 12


def _row(partition: int, end: int) -> dict:
    return {"topic": "t", "partition": partition, "records_in": 1, "mirrored": 1, "bytes_out": 10, "dead_lettered": 0,
            "replayed_skipped": 0, "provenance_skipped": 0, "cache_misses": 0, "latency_ms": [], "upstream_end": end,
            "first_offset": end - 1, "input_ms": 0.0, "setup_ms": 0.0, "produce_ms": 0.0, "commit_ms": 0.0}


def test_the_source_offset_commit_runs_beside_the_next_batch_and_in_batch_order(tmp_path) -> None:
    """The commit of a batch's source positions (monitoring only) must not hold the next micro-batch; a
    later batch's commit waits for the earlier one (positions never move back), and close() waits for the
    last one, so a drain's consumer group ends at its end."""
    import threading

    release = threading.Event()
    commits: list[list[tuple[int, int]]] = []

    class SlowCommitter:
        def commit(self, offsets, asynchronous):
            assert asynchronous is False
            release.wait(10)
            commits.append([(tp.partition, tp.offset) for tp in offsets])

    rt = _runtime(tmp_path)
    rt.settings = {"t": _settings(2, 2)}
    rt.consumer_groups = {"t": "cg"}
    rt._committer = lambda cg: SlowCommitter()  # type: ignore[method-assign]
    rt._starts = {0: ({}, {"t": {0: 5, 1: 7}})}  # the batch's ends, as writer_plan leaves them
    rt.after_batch(0, [_row(0, 5), _row(1, 7)], 0.1)
    assert commits == []  # after_batch returned while its commit is still running
    # the written log is not left to that thread: it is recorded before the batch goes back to Spark, so a
    # batch Spark records as done is in the log (a restart goes back only for a write cut short)
    assert rt.written_log().last() == {"t": {0: 5, 1: 7}}
    rt._starts = {1: ({}, {"t": {0: 9, 1: 7}})}
    second = threading.Thread(target=rt.after_batch, args=(1, [_row(0, 9)], 0.1))
    second.start()
    second.join(0.3)
    assert second.is_alive() and commits == []  # batch 1's commit waits for batch 0's
    release.set()
    second.join(10)
    rt.close()
    assert commits == [[(0, 5), (1, 7)], [(0, 9)]]
    # the written log follows in batch order, on Spark's read path too (a job that moves to the direct path
    # later starts from there, not from an old entry)
    assert rt.written_log().last() == {"t": {0: 9, 1: 7}}
    assert sorted(rt.checkpoint_files.names(rt.written_log().dir)) == ["0", "1"]


def test_source_offsets_of_thousands_of_partitions_are_committed_in_requests_the_broker_accepts(tmp_path,
                                                                                            caplog) -> None:
    """A commit of 9,000 partitions' positions is one record batch on the group coordinator, over the
    broker's 1 MB message limit: it failed on every batch. They go out in requests of at most 1,000
    partitions (SOURCE_COMMIT_PARTITIONS), every partition once; a request that fails is one warning, and the
    next batch commits again."""
    from confluent_kafka import KafkaError, KafkaException

    requests: list[list[tuple[str, int, int]]] = []

    class Committer:
        fail_at: int | None = None

        def commit(self, offsets, asynchronous):
            assert asynchronous is False
            if len(requests) == self.fail_at:
                raise KafkaException(KafkaError(KafkaError.UNKNOWN, "Unknown broker error"))
            requests.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    committer = Committer()
    rt = _runtime(tmp_path)
    rt._committer = lambda cg: committer  # type: ignore[method-assign]
    tps = [("t", p, p + 10) for p in range(2500)]
    rt.commit_source_offsets({"cg": tps})
    assert [len(r) for r in requests] == [1000, 1000, 500]  # the README's "at most 1,000 partitions"
    assert [x for r in requests for x in r] == tps
    requests.clear()
    committer.fail_at = 1
    with caplog.at_level(logging.WARNING, logger="mirror_core.stream"):
        rt.commit_source_offsets({"cg": tps})
    assert len(requests) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{rt.group.name}: could not commit source offsets for cg: Unknown broker error"]


def test_a_batch_observes_a_bounded_spread_of_its_latency_samples(tmp_path) -> None:
    """1,000 partitions of 200 latency samples each must not cost a micro-batch 200,000 histogram
    observations: about LATENCY_SAMPLES of them, taken from every partition, and the batch's p50 from all."""
    from mirror_core import metrics

    rt = _runtime(tmp_path)
    rt.settings = {"t": _settings(1000, 1000)}
    rt.consumer_groups = {"t": "cg"}
    rt._commit_in_background = lambda commits: None  # type: ignore[method-assign]
    rows = []
    for p in range(1000):
        row = _row(p, 5)
        row["latency_ms"] = [float(p)] * 200
        rows.append(row)
    hist = metrics.LATENCY_MS.labels("g", "g__t__t")
    before = hist._sum.get()
    summary = rt.after_batch(0, rows, 0.1)
    # each partition's samples (all p ms) were observed exactly once: the sum of 0..999, and no more
    assert hist._sum.get() - before == sum(range(1000))
    assert summary["latency_p50_ms"] == 499.5
