"""The benchmark harness's pure helpers: data framing, latency keys, percentiles, configs, log parsing."""

from __future__ import annotations

import os
import shlex
import struct
import time
from datetime import datetime
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from fastavro import schemaless_reader

import bench.workload
from bench.contenders import (
    Endpoints,
    kcat_cmd,
    mirrorflow_yaml,
    mm2_properties,
    mm2_remote_topic,
    parse_batches,
)
from bench.observe import (
    CpuTimeline,
    MachineCpu,
    cpu_seconds,
    disk_read_mb,
    kernel_threads,
    latency_windows,
    machine_cpu_seconds,
    meminfo_mb,
    percentile,
    reclaim_between,
    reclaim_counts,
    unwritten_mb,
)
from bench.report import add_ratios, summarize, summarize_latency
from bench.run import CONTENDERS, QUICK_CONTENDERS, other_cores, round_order
from bench.workload import PARSED, RateProducer, make_value, measured_key, parse_measured_key
from mirror_core.config import SparkConfig, parse_config

EP = Endpoints("127.0.0.1:1", "127.0.0.1:2", "http://127.0.0.1:3/apis/ccompat/v7", "http://127.0.0.1:4/apis/ccompat/v7")


def test_values_are_confluent_framed_avro_of_about_the_requested_size():
    for size in (100, 1000):
        v = make_value(42, 7, size)
        assert v[0] == 0 and struct.unpack(">I", v[1:5])[0] == 42
        assert size - 5 <= len(v) <= size
        assert schemaless_reader(BytesIO(v[5:]), PARSED, None)["id"] == 7


def test_measured_keys_round_trip_and_other_keys_are_ignored():
    assert parse_measured_key(measured_key(12, 1_700_000_000_123_456_789)) == (12, 1_700_000_000_123_456_789)
    assert parse_measured_key(b"w000000001") is None
    assert parse_measured_key(b"000000001") is None
    assert parse_measured_key(None) is None
    assert parse_measured_key(b"mxyz.1") is None


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) is None


def test_latency_windows_place_a_tail_in_time():
    # 10 records/s for 2 s: the second half-second holds one slow record
    measured = {seq: 10.0 for seq in range(20)}
    measured[7] = 900.0
    del measured[12]  # not arrived: the piece counts what did
    got = latency_windows(measured, rate=10, window_s=0.5)
    assert [w[0] for w in got] == [0.0, 0.5, 1.0, 1.5]
    assert [w[1] for w in got] == [5, 5, 4, 5]
    assert got[1][2:] == [10.0, 900.0, 900.0]  # p50, p99, max
    assert got[0][2:] == [10.0, 10.0, 10.0]
    assert latency_windows({}, rate=10, window_s=0.5) == []


def test_the_default_set_measures_what_the_defaults_resolve_to(tmp_path: Path):
    """The bench's default set leads with ``*-writer`` contenders because that is what a user gets by default
    on a local master (read directly, a transaction per writer process): should either default change, this
    fails, and the default set must follow."""
    default = SparkConfig(master="local[2]")
    assert (default.reads_directly, default.writes_per_writer) == (True, True)
    for contender in ("mirrorflow-eos-writer", "mirrorflow-alo-writer", "mirrorflow-eos-writer-bytes",
                      "mirrorflow-alo-writer-bytes"):
        assert contender in CONTENDERS
    assert QUICK_CONTENDERS[0] == "mirrorflow-eos-writer"
    writer = mirrorflow_yaml(EP, group="bench-eos-writer-s100", source_topic="bench.s100",
                             destination_topic="bench.s100.w", delivery="exactly_once", value_serde="avro",
                             trigger="1 second", checkpoint_dir=tmp_path, read_path="direct", transactions="per_writer")
    spark = parse_config(yaml.safe_load(writer), env={}).group("bench-eos-writer-s100").spark
    assert (spark.master, spark.reads_directly, spark.writes_per_writer) == ("local[2]", True, True)
    # *-direct*: the direct read path with a transaction per partition, asked for
    direct = mirrorflow_yaml(EP, group="bench-eos-direct-s100", source_topic="bench.s100",
                             destination_topic="bench.s100.d", delivery="exactly_once", value_serde="avro",
                             trigger="1 second", checkpoint_dir=tmp_path, read_path="direct")
    spark = parse_config(yaml.safe_load(direct), env={}).group("bench-eos-direct-s100").spark
    assert (spark.reads_directly, spark.writes_per_writer) == (True, False)


def test_mirrorflow_yaml_is_a_valid_mirrors_config(tmp_path: Path):
    text = mirrorflow_yaml(EP, group="bench-eos-s100", source_topic="bench.s100",
                           destination_topic="bench.s100.mirrorflow-eos", delivery="exactly_once",
                           value_serde="avro", trigger="200 milliseconds", checkpoint_dir=tmp_path)
    cfg = parse_config(yaml.safe_load(text), env={})
    g = cfg.group("bench-eos-s100")
    assert g.delivery == "exactly_once" and g.serdes.value == "avro"
    assert g.spark.trigger == "200 milliseconds" and g.spark.conf["spark.ui.showConsoleProgress"] == "false"
    assert g.mirrors[0].destination_topic == "bench.s100.mirrorflow-eos"
    assert g.spark.read_path == "spark"
    direct = mirrorflow_yaml(EP, group="bench-eos-direct-s100", source_topic="bench.s100",
                             destination_topic="bench.s100.d", delivery="exactly_once", value_serde="bytes",
                             trigger="1 second", checkpoint_dir=tmp_path, read_path="direct")
    assert parse_config(yaml.safe_load(direct), env={}).group("bench-eos-direct-s100").spark.read_path == "direct"
    one = mirrorflow_yaml(EP, group="bench-eos-writer-1-s100", source_topic="bench.s100",
                          destination_topic="bench.s100.w", delivery="exactly_once", value_serde="bytes",
                          trigger="1 second", checkpoint_dir=tmp_path, read_path="direct", transactions="per_writer",
                          writer_producers=1)
    spark = parse_config(yaml.safe_load(one), env={}).group("bench-eos-writer-1-s100").spark
    assert (spark.transactions, spark.writer_producers) == ("per_writer", 1)
    assert g.spark.writer_producers == 2  # unset: the default
    p3 = mirrorflow_yaml(EP, group="bench-eos-writer-keep-p3-s100", source_topic="bench.s100",
                         destination_topic="bench.s100.p", delivery="exactly_once", value_serde="bytes",
                         trigger="1 second", checkpoint_dir=tmp_path, read_path="direct", transactions="per_writer",
                         keep_writing_for="2 seconds", direct_processes=3)
    spark = parse_config(yaml.safe_load(p3), env={}).group("bench-eos-writer-keep-p3-s100").spark
    assert (spark.direct_processes, spark.keep_writing_for) == (3, 2.0)
    assert g.spark.direct_processes == 0  # unset: one per core
    tuned = mirrorflow_yaml(EP, group="bench-eos-direct-tuned-s100", source_topic="bench.s100",
                            destination_topic="bench.s100.t", delivery="exactly_once", value_serde="bytes",
                            trigger="1 second", checkpoint_dir=tmp_path, read_path="direct",
                            destination_kafka={"linger.ms": "20", "batch.size": "262144"})
    dst = parse_config(yaml.safe_load(tuned), env={}).clusters["dst"].kafka_properties()
    assert (dst["linger.ms"], dst["batch.size"]) == ("20", "262144")
    assert "linger.ms" not in cfg.clusters["dst"].kafka_properties()
    chmod = mirrorflow_yaml(EP, group="bench-eos-chmod-s100", source_topic="bench.s100", destination_topic="bench.s100.c",
                            delivery="exactly_once", value_serde="avro", trigger="1 second", checkpoint_dir=tmp_path,
                            spark_conf={"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"})
    conf = parse_config(yaml.safe_load(chmod), env={}).group("bench-eos-chmod-s100").spark.conf
    assert conf == {"spark.ui.showConsoleProgress": "false",
                    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem"}


def test_mm2_properties_give_every_internal_topic_replication_factor_one():
    props = dict(line.split(" = ", 1) for line in mm2_properties(EP, "bench.s100").splitlines())
    assert props["clusters"] == "src, dst" and props["src->dst.enabled"] == "true"
    assert props["dst->src.enabled"] == "false" and props["src->dst.topics"] == "bench.s100"
    for key in ("replication.factor", "offset-syncs.topic.replication.factor", "checkpoints.topic.replication.factor",
                "heartbeats.topic.replication.factor", "config.storage.replication.factor",
                "offset.storage.replication.factor", "status.storage.replication.factor"):
        assert props[key] == "1", key
    assert mm2_remote_topic("bench.s100") == "src.bench.s100"


def test_kcat_pipeline_exits_at_end_only_when_draining():
    drain = kcat_cmd("kcat", EP, "a", "b", exit_at_end=True)
    live = kcat_cmd("kcat", EP, "a", "b", exit_at_end=False)
    assert drain[:2] == ["bash", "-c"] and drain[2].startswith("set -o pipefail; ")

    def consumer_args(cmd: list[str]) -> list[str]:
        tokens = shlex.split(cmd[2].removeprefix("set -o pipefail; "))
        return tokens[:tokens.index("|")]

    assert "-e" in consumer_args(drain) and "-e" not in consumer_args(live)


def test_parse_batches_reads_summaries_even_behind_a_progress_bar():
    log = (
        "2026-01-02 03:04:05,250 INFO py4j.clientserver Python Server ready\n"
        "[Stage 0:====>   (1 + 1) / 6]\r        \r2026-01-02 03:04:10,500 INFO mirrorflow.stream g batch 0: "
        "{'records': 20000, 'mirrored': 20000, 'latency_p50_ms': None, 'batch_id': 0, 'seconds': 2.5}\n"
        "2026-01-02 03:04:11,000 INFO mirrorflow.stream g batch 1: {'records': 0, 'seconds': 0.1}\n"
    )
    batches = parse_batches(log)
    assert [b.batch_id for b in batches] == [0, 1]
    assert batches[0].summary["records"] == 20000
    logged = datetime(2026, 1, 2, 3, 4, 10, 500000).timestamp()
    assert abs(batches[0].logged_at - logged) < 1e-6
    assert abs(batches[0].started_at - (logged - 2.5)) < 1e-6


def test_ratios_compare_with_mm2_and_the_raw_pipe_of_the_same_size():
    rows = [
        {"phase": "throughput", "contender": "mm2", "size": 100, "status": "ok", "records_per_s": 10000},
        {"phase": "throughput", "contender": "raw-python", "size": 100, "status": "ok", "records_per_s": 50000},
        {"phase": "throughput", "contender": "mirrorflow-eos", "size": 100, "status": "ok", "records_per_s": 5000},
        {"phase": "throughput", "contender": "mm2", "size": 1000, "status": "ok", "records_per_s": 1},
        {"phase": "latency", "contender": "mm2", "status": "ok", "p50_ms": 40.0, "p99_ms": 100.0},
        {"phase": "latency", "contender": "mirrorflow-eos", "status": "ok", "p50_ms": 400.0, "p99_ms": 500.0},
        {"phase": "latency", "contender": "kcat", "status": "failed"},
    ]
    add_ratios(rows)
    assert rows[2]["x_mm2"] == 0.5 and rows[2]["x_raw-python"] == 0.1
    assert rows[5]["p50_x_mm2"] == 10.0 and rows[5]["p99_x_mm2"] == 5.0 and rows[5]["p50_x_raw-python"] is None
    assert "x_mm2" not in rows[6]


def test_tuned_mm2_batches_more_and_mirrors_data_only_while_the_default_one_is_as_shipped():
    shipped = dict(line.split(" = ", 1) for line in mm2_properties(EP, "bench.s100").splitlines())
    tuned = dict(line.split(" = ", 1) for line in mm2_properties(EP, "bench.s100", tuned=True).splitlines())
    assert "dst.producer.linger.ms" not in shipped and "replication.policy.class" not in shipped
    # its own aliases: the Connect offsets topic (mm2-offsets.<alias>.internal) is not the shipped one's
    assert tuned["clusters"] == "tsrc, tdst" and tuned["tsrc->tdst.enabled"] == "true"
    assert tuned["tsrc.bootstrap.servers"] == EP.src_bootstrap and tuned["tdst.bootstrap.servers"] == EP.dst_bootstrap
    assert tuned["tdst.producer.linger.ms"] == "20" and tuned["tdst.producer.batch.size"] == "262144"
    assert tuned["replication.policy.class"].endswith("IdentityReplicationPolicy")
    for flag in ("emit.checkpoints.enabled", "emit.heartbeats.enabled", "sync.group.offsets.enabled",
                 "sync.topic.configs.enabled"):
        assert tuned[f"tsrc->tdst.{flag}"] == "false", flag
    assert tuned["tsrc->tdst.topics"] == "bench.s100"
    assert mm2_remote_topic("bench.s100", tuned=True) == "bench.s100"


def test_exactly_once_mm2_is_the_tuned_one_with_transactions_in_a_topic_of_its_own():
    """``mm2-tuned-eos``: the tuned producer, exactly-once source support on the target and the internal REST
    server it needs; its own aliases (Connect offsets) and destination topic, so it never resumes from or
    writes into the tuned contender's."""
    tuned = dict(line.split(" = ", 1) for line in mm2_properties(EP, "bench.s100", tuned=True).splitlines())
    eos = dict(line.split(" = ", 1) for line in mm2_properties(
        EP, "bench.s100", tuned=True, exactly_once=True, rest_port=18083).splitlines())
    assert "tdst.exactly.once.source.support" not in tuned and "listeners" not in tuned
    assert eos["clusters"] == "esrc, edst" and eos["esrc->edst.enabled"] == "true"
    assert eos["edst.exactly.once.source.support"] == "enabled"
    assert eos["dedicated.mode.enable.internal.rest"] == "true" and eos["listeners"] == "http://127.0.0.1:18083"
    assert eos["edst.producer.linger.ms"] == "20" and eos["edst.producer.batch.size"] == "262144"
    assert eos["esrc->edst.emit.checkpoints.enabled"] == "false"
    assert "replication.policy.class" not in eos
    assert mm2_remote_topic("bench.s100", tuned=True, exactly_once=True) == "esrc.bench.s100"


def test_ratios_use_the_10_to_90_percent_window_and_compare_with_both_mm2_contenders():
    rows = [
        {"phase": "throughput", "contender": "mm2", "size": 100, "status": "ok", "records_per_s": 900,
         "records_per_s_window": 1000},
        {"phase": "throughput", "contender": "mm2-tuned", "size": 100, "status": "ok", "records_per_s": 2000},
        {"phase": "throughput", "contender": "mirrorflow-eos-bytes", "size": 100, "status": "ok",
         "records_per_s": 100, "records_per_s_window": 3000},
        {"phase": "latency", "contender": "mm2-tuned", "status": "ok", "p50_ms": 10.0, "p99_ms": 50.0},
        {"phase": "latency", "contender": "mirrorflow-eos", "status": "ok", "p50_ms": 100.0, "p99_ms": 100.0},
    ]
    add_ratios(rows)
    assert rows[2]["x_mm2"] == 3.0 and rows[2]["x_mm2-tuned"] == 1.5 and rows[2]["x_raw-python"] is None
    assert rows[4]["p99_x_mm2-tuned"] == 2.0


def test_a_drain_whose_records_became_visible_in_large_steps_is_compared_by_its_steady_figure():
    """A mirror that commits a large share of the drain in one transaction makes the 10-90 % window the gap
    between two commits (it can even fall between two polls): such a row is marked coarse and its ratios use
    the steady figure, in every round's ratio and in the table."""
    from bench.report import rate, throughput_table

    rows = [
        {"phase": "throughput", "contender": "mm2-tuned", "size": 100, "status": "ok", "records_per_s": 180,
         "records_per_s_window": 200},
        {"phase": "throughput", "contender": "mirrorflow-eos-writer-bytes", "size": 100, "status": "ok",
         "records_per_s": 300, "records_per_s_window": 900, "window_coarse": True},
        {"phase": "throughput", "contender": "mirrorflow-alo-writer-bytes", "size": 100, "status": "ok",
         "records_per_s": 300, "records_per_s_window": 400},
    ]
    add_ratios(rows)
    assert rate(rows[1]) == 300 and rows[1]["x_mm2-tuned"] == 1.5
    assert rows[2]["x_mm2-tuned"] == 2.0  # a fine window is still what counts
    window = next(list(col.cells) for col in throughput_table(rows).columns if col.header == "rec/s 10-90%")
    assert window == ["200", "900 ~", "400"]


def test_the_watcher_marks_when_10_and_90_percent_of_the_expected_records_arrived():
    from bench.observe import DstWatcher

    class Msg:
        def error(self) -> None:
            return None

        def key(self) -> bytes:
            return b"k"

    class FakeConsumer:
        def __init__(self) -> None:
            self.batches = [[Msg()] * 5, [Msg()] * 4, [Msg()]]

        def poll(self, timeout: float) -> Msg | None:
            batch = self.batches[0] if self.batches else []
            return batch[0] if batch else None

        def consume(self, n: int, timeout: float) -> list[Msg]:
            return self.batches.pop(0)[1:]

    w = DstWatcher.__new__(DstWatcher)
    w.topic, w.latency, w.expected, w.assigned = "t", False, 10, True
    from bench.observe import Arrivals
    w.seen = Arrivals()
    w.c = FakeConsumer()  # type: ignore[assignment]
    w.poll()
    assert w.seen.at_10 is not None and w.seen.at_90 is None
    w.poll()
    assert w.seen.at_90 is not None and w.seen.count == 9


def test_rounds_reverse_the_order_so_every_contender_has_the_same_mean_position():
    cs = ["a", "b", "c", "d"]
    assert round_order(cs, 1) == ["a", "b", "c", "d"]
    assert round_order(cs, 2) == ["d", "c", "b", "a"]
    assert round_order(cs, 3) == ["b", "c", "d", "a"]  # the next pair starts one place on
    for rounds in (2, 4):
        positions = {c: [round_order(cs, r).index(c) for r in range(1, rounds + 1)] for c in cs}
        assert len({sum(p) for p in positions.values()}) == 1, positions
    assert round_order([], 2) == []


def test_ratios_compare_within_a_round_and_the_summary_takes_the_means_over_rounds():
    def row(c: str, rnd: int, rate: int, status: str = "ok") -> dict:
        return {"phase": "throughput", "contender": c, "size": 100, "round": rnd, "status": status,
                "records_per_s_window": rate, "position": 1}

    rows = [row("mirrorflow-eos", 1, 240), row("mm2-tuned", 1, 200), row("raw-python", 1, 300),
            row("raw-python", 2, 100), row("mm2-tuned", 2, 100), row("mirrorflow-eos", 2, 160),
            row("mirrorflow-eos", 3, 999, status="failed"), row("mm2-tuned", 3, 150)]
    add_ratios(rows)
    assert [r.get("x_mm2-tuned") for r in rows[:6]] == [1.2, 1.0, 1.5, 1.0, 1.0, 1.6]
    summary = {s["contender"]: s for s in summarize(rows)}
    eos = summary["mirrorflow-eos"]
    assert (eos["rounds"], eos["ok"], eos["mean"], eos["min"], eos["max"]) == (3, 2, 200, 160, 240)
    assert eos["x_mm2-tuned"] == 1.33  # 200 / mean(200, 100, 150)
    assert eos["x_mm2-tuned_by_round"] == [1.2, 1.6, None]
    assert eos["x_raw-python"] == 1.0
    # a run during which the machine stood still (a VM snapshot) says little: out of the means, and counted
    rows.append(row("mirrorflow-eos", 4, 10) | {"machine_paused": {"clock_jump_s": 49.0, "vm_snapshots": 1}})
    eos = {s["contender"]: s for s in summarize(rows)}["mirrorflow-eos"]
    assert (eos["rounds"], eos["ok"], eos["paused"], eos["mean"], eos["min"]) == (4, 2, 1, 200, 160)


def test_one_round_has_no_summary():
    rows = [{"phase": "throughput", "contender": "mm2-tuned", "size": 100, "round": 1, "status": "ok",
             "records_per_s_window": 5}]
    assert summarize(rows) == []


def test_latency_over_rounds_is_the_mean_of_the_runs_that_succeeded_with_each_round_kept():
    def lat(contender: str, rnd: int, pos: int, p50: float, p99: float, status: str = "ok") -> dict:
        return {"phase": "latency", "contender": contender, "round": rnd, "position": pos, "status": status,
                "p50_ms": p50, "p99_ms": p99, "p99_settled_ms": p99 / 2}

    rows = [lat("mm2-tuned", 1, 1, 20.0, 60.0), lat("mirrorflow-eos-direct", 1, 2, 200.0, 600.0),
            lat("mirrorflow-eos-direct", 2, 1, 100.0, 300.0), lat("mm2-tuned", 2, 2, 30.0, 90.0, status="failed")]
    add_ratios(rows)
    assert rows[1]["p50_x_mm2-tuned"] == 10.0 and rows[2].get("p50_x_mm2-tuned") is None  # within a round only
    by = {s["contender"]: s for s in summarize_latency(rows)}
    eos, mm2 = by["mirrorflow-eos-direct"], by["mm2-tuned"]
    assert (eos["p50_mean"], eos["p99_mean"], eos["positions"]) == (150.0, 450.0, [2, 1])
    assert eos["p99_settled_mean"] == 225.0  # after the step to the measured rate
    assert eos["p50_by_round"] == [200.0, 100.0]
    assert (mm2["ok"], mm2["rounds"], mm2["p50_mean"], mm2["p50_by_round"]) == (1, 2, 20.0, [20.0, None])
    assert eos["p50_x_mm2-tuned"] == 7.5 and eos["p99_x_mm2-tuned"] == 7.5
    assert summarize_latency([lat("floor", 1, 1, 3.0, 9.0)]) == []


def test_unwritten_page_cache_is_dirty_plus_writeback_in_mb():
    meminfo = "MemFree:  100 kB\nDirty:    2048 kB\nWriteback:  1024 kB\nWritebackTmp:  4096 kB\n"
    assert unwritten_mb(meminfo) == 3.0
    assert unwritten_mb("MemFree: 1 kB\n") is None


def test_free_memory_and_disk_reads_are_read_in_mb():
    assert meminfo_mb("MemFree", "MemTotal:  4096 kB\nMemFree:  2048 kB\n") == 2.0
    assert meminfo_mb("Cached", "MemFree:  2048 kB\n") is None
    assert disk_read_mb("pgpgin_x 1\npgpgin 3072\npgpgout 5\n") == 3.0  # pgpgin counts KB read from disks
    assert disk_read_mb("pgpgout 5\n") is None


def test_the_machines_cpu_time_by_kind_steal_apart_and_the_reclaimer_found_by_name() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    # user nice system idle iowait irq softirq steal guest guest_nice, in clock ticks
    stat = f"cpu  {ticks * 10} {ticks} {ticks * 4} {ticks * 100} {ticks * 2} 0 {ticks} {ticks * 3} 0 0\ncpu0 1 2 3\n"
    assert machine_cpu_seconds(stat) == {"busy": 16.0, "iowait": 2.0, "idle": 100.0, "steal": 3.0}
    assert machine_cpu_seconds("intr 5\n") is None
    now = machine_cpu_seconds()  # this machine's
    assert now is not None and now["busy"] > 0 and now["idle"] > 0
    sampler = MachineCpu(interval=0.05).start()
    try:
        time.sleep(0.1)  # samples on both sides of the stretch asked about
        t0 = time.time()
        time.sleep(0.3)
        busy = sampler.kinds["busy"].between(t0, time.time() - 0.1)
    finally:
        sampler.stop()
    assert busy is not None and busy >= 0
    assert kernel_threads("kswapd") == sorted(int(p.parent.name) for p in Path("/proc").glob("[0-9]*/comm")
                                              if p.read_text().startswith("kswapd"))
    assert kernel_threads("no-such-thread-") == []


def test_reclaim_counts_sum_the_zones_stalls_and_a_drain_gets_what_grew_while_it_ran() -> None:
    before = reclaim_counts("allocstall_dma 0\nallocstall_normal 2\nallocstall_movable 5\npgscan_direct 100\n"
                            "pgsteal_direct 90\npgscan_kswapd 7\npgsteal_kswapd 6\ncompact_stall 1\npgmajfault 3\n"
                            "pgscan_direct_throttle 4\n")
    assert before == {"allocstall": 7, "pgscan_direct": 100, "pgsteal_direct": 90, "pgscan_kswapd": 7,
                      "pgsteal_kswapd": 6, "compact_stall": 1, "pgmajfault": 3}
    after = reclaim_counts("allocstall_normal 2\nallocstall_movable 9\npgscan_direct 350\npgsteal_direct 300\n"
                           "pgscan_kswapd 7\npgsteal_kswapd 6\ncompact_stall 1\npgmajfault 3\n")
    assert reclaim_between(before, after) == {"allocstall": 4, "pgscan_direct": 250, "pgsteal_direct": 210,
                                              "pgscan_kswapd": 0, "pgsteal_kswapd": 0, "compact_stall": 0,
                                              "pgmajfault": 0}
    assert reclaim_between(None, after) is None and reclaim_counts("") is None


def test_system_cpu_is_the_kernel_part_of_a_process_cpu() -> None:
    """A window's system CPU (the kernel's part of a server's cost) is apart from its user CPU: pure
    arithmetic raises the total, not the system part."""
    pid = os.getpid()
    total0, system0 = cpu_seconds(pid), cpu_seconds(pid, system_only=True)
    assert total0 is not None and system0 is not None and system0 <= total0
    # user-mode work only, until the process's CPU rose by 0.2 s or more (the clock ticks are 10 ms; on a fast
    # machine a fixed amount of work took under 0.1 s)
    deadline = time.monotonic() + 10
    total1, system1 = total0, system0
    while total1 - total0 < 0.2 and time.monotonic() < deadline:
        sum(i * i for i in range(300_000))
        total1, system1 = cpu_seconds(pid), cpu_seconds(pid, system_only=True)
        assert total1 is not None and system1 is not None
    assert total1 - total0 >= 0.2
    assert system1 - system0 < (total1 - total0) / 2


class _Clock:
    """The drain counter's clocks and sleep, advanced by hand: ``took(s)`` is time spent answering."""

    def __init__(self, monkeypatch: Any) -> None:
        from bench import observe

        self.mono, self.wall = 0.0, 1000.0
        self.slept: list[float] = []
        monkeypatch.setattr(observe.time, "monotonic", lambda: self.mono)
        monkeypatch.setattr(observe.time, "time", lambda: self.wall)
        monkeypatch.setattr(observe.time, "sleep", self.sleep)

    def took(self, s: float) -> None:
        self.mono += s
        self.wall += s

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.took(s)


def _drain_counter(clock: _Clock, answers: list[tuple[float, int]]) -> Any:
    """A DrainCounter of 1,000 expected records over one partition whose ListOffsets answers are ``answers``:
    (seconds it takes, offset)."""
    from bench.observe import Arrivals, DrainCounter

    left = iter(answers)

    class Admin:
        def list_offsets(self, asked: dict, isolation_level: Any, request_timeout: float) -> dict:
            took, offset = next(left)
            clock.took(took)
            return {tp: SimpleNamespace(result=lambda: SimpleNamespace(offset=offset)) for tp in asked}

    w = DrainCounter.__new__(DrainCounter)
    w.topic, w.expected, w.seen = "t", 1000, Arrivals()
    w._admin, w._latest, w._committed, w._interval = Admin(), lambda: None, None, 0.02
    w._parts, w.offsets_count, w._polled_at, w.looks = [0], 0, None, []
    return w


def test_the_drain_counter_leaves_the_machine_to_the_contender_and_puts_the_marks_between_its_polls(monkeypatch):
    """The drain counter asks the destination's offsets no more often than leaves it idle nine times as long
    as the asking took (at thousands of partitions a ListOffsets is slow), and a 10 %/90 % mark crossed
    between two polls is put where an even pace between them puts it, not at the later poll."""
    import pytest

    clock = _Clock(monkeypatch)
    w = _drain_counter(clock, [(0.1, 0), (0.1, 50), (0.1, 250), (0.1, 1000)])  # each ListOffsets takes 100 ms
    for _ in range(4):
        w.poll()
    # not 20 ms apart: 100 ms busy, 900 ms idle (the first look, which connects, does not count)
    assert clock.slept == pytest.approx([0.0, 0.9, 0.9, 0.9])
    # polls answered at wall 1000.1, 1000.2, 1001.2, 1002.2 with 0, 50, 250, 1000 records
    assert w.seen.at_10 == pytest.approx(1000.2 + 1.0 * (100 - 50) / 200)
    assert w.seen.at_90 == pytest.approx(1001.2 + 1.0 * (900 - 250) / 750)
    assert w.seen.largest_step == 750  # the most that became visible between two polls
    assert w.seen.first_at == pytest.approx(1000.2) and w.seen.first_count == 50
    assert w.looks_summary() == {"looks": 4, "largest_gap_s": 1.0, "slowest_look_s": 0.1, "first_count": 50,
                                 "first_after_s": 0.1}


def test_one_slow_answer_does_not_leave_the_drain_counter_blind(monkeypatch):
    """A broker busy with the drain answers a ListOffsets slowly now and then; the counter's idle time follows
    the quickest of its last looks, so one slow answer does not stop it looking for nine times as long (at 1 KB
    on 5 December, 23:03, a 0.12 s answer left it blind for 1.1 s and its next look found 29 % of a drain)."""
    import pytest

    clock = _Clock(monkeypatch)
    w = _drain_counter(clock, [(t, 0) for t in (0.05, 0.002, 0.002, 0.12, 0.002, 0.002)])
    for _ in range(6):
        w.poll()
    # the first look connects (50 ms): no idle time for it; the 120 ms answer: 18 ms of idle, not 1.08 s
    assert clock.slept == pytest.approx([0.0, 0.018, 0.018, 0.018, 0.018, 0.018])
    assert w.looks_summary()["slowest_look_s"] == 0.12


def test_a_contender_the_watcher_times_is_not_credited_with_what_its_first_look_found():
    """The steady figure of a contender timed by the watcher runs from the first look that saw records and
    counts only the records after it; a mirrorflow job's runs from its first batch's start in its log and
    counts every record."""
    from bench.observe import Arrivals
    from bench.run import steady_figures

    seen = Arrivals(count=1000, first_at=100.5, last_at=102.5, first_count=200)
    pipe = steady_figures(1000, 1_000_000, 100.0, 102.5, seen, None)
    assert pipe["records_per_s"] == 400 and pipe["steady_records"] == 800  # not 1000 / 2 s
    assert pipe["mb_per_s"] == 0.4 and pipe["startup_s"] == 0.5 and pipe["records_per_s_wall"] == 400
    job = steady_figures(1000, 1_000_000, 100.0, 102.5, seen, 100.0)
    assert job["records_per_s"] == 400 and job["steady_records"] == 1000 and job["startup_s"] == 0.0
    nothing = steady_figures(1000, 1_000_000, 100.0, 102.5, Arrivals(), None)
    assert nothing["steady_s"] == 2.5 and nothing["records_per_s"] == 400


def test_a_contender_runs_with_the_environment_it_is_given_and_its_log_and_row_say_so(tmp_path: Path):
    """A contender's switches (``MIRRORFLOW_...=...``, an A/B variant's) reach its process, open its log in
    front of the command, and are kept for its result row (``Running.env_extra``); the floor has none."""
    import sys

    from bench.contenders import NoProcess, Running

    log = tmp_path / "c.log"
    run = Running("c", [sys.executable, "-c", "import os; print('got', os.environ['MIRRORFLOW_X'])"], log,
                  env_extra={"MIRRORFLOW_X": "on 1"})
    assert run.proc.wait(30) == 0
    run.stop()
    lines = log.read_text().splitlines()
    assert lines[0].startswith("$ MIRRORFLOW_X='on 1' ") and lines[0].endswith(shlex.join(run.cmd))
    assert "got on 1" in lines
    assert run.env_extra == {"MIRRORFLOW_X": "on 1"}
    assert NoProcess("floor").env_extra == {}


def _timeline(*samples: tuple[float, float]) -> CpuTimeline:
    """A CPU timeline of these (time, CPU seconds) samples."""
    t = CpuTimeline()
    t.series = list(samples)
    return t


def test_a_latency_rows_cores_are_each_timelines_cpu_over_the_window_and_shown_in_its_table():
    """``cores_between``: CPU seconds over a wall-time window per second of it, per timeline (interpolated
    between samples), None for a timeline without samples around both ends or none at all; the latency
    table shows the contender's, the source brokers' and the destination brokers' ("-" where unknown)."""
    from rich.console import Console

    from bench.observe import cores_between
    from bench.report import latency_table

    busy = _timeline((100.0, 10.0), (102.0, 12.0), (110.0, 14.0))  # a core, then a quarter of one
    late = _timeline((104.0, 0.0), (110.0, 3.0))
    got = cores_between({"mirror": busy, "src_brokers": late, "harness": None}, 101.0, 106.0)
    assert got == {"mirror": round((12.0 + 1.0 - 11.0) / 5, 2), "src_brokers": None, "harness": None}
    assert cores_between({"mirror": busy}, 106.0, 106.0) == {"mirror": None}

    row = {"phase": "latency", "contender": "mirrorflow-eos", "status": "ok", "p50_ms": 50.0, "p99_ms": 90.0,
           "cores": {"mirror": 0.4, "src_brokers": 0.55, "dst_brokers": None}}
    console = Console(width=400, record=True)
    console.print(latency_table([row]))
    text = console.export_text()
    assert "cores mirror/src/dst" in text and "0.40/0.55/-" in text


def test_rate_producer_ramp_records_are_not_measured(monkeypatch):
    """``--ramp-seconds``: the records before the measured window carry keys the watcher does not time, and do
    not count as sent; the measured run after it numbers its records from 0 again."""
    keys: list[bytes] = []
    monkeypatch.setattr(bench.workload, "_produce", lambda p, topic, key, value, partition: keys.append(key))
    rp = RateProducer("127.0.0.1:1", "t", 4, schema_id=1, size=10)
    rp.run(2000, 0.05, measured=False)
    rp.join(5)
    ramp = list(keys)
    assert len(ramp) == 100 and rp.sent == 0
    assert all(parse_measured_key(k) is None for k in ramp)
    keys.clear()
    rp.run(2000, 0.05)
    rp.join(5)
    assert rp.sent == 100
    assert [parse_measured_key(k)[0] for k in keys] == list(range(100))


def test_the_warm_up_covers_as_many_partitions_as_the_run():
    """The brokers are warmed over the run's partitions when it has more than the fixed 6 (a broker warmed over
    6 was still cold for the first contender's transactions over 500), with as many records as 24 partitions
    get and at least 100 transactions; runs over 6 partitions or fewer keep the fixed shape."""
    from bench.workload import warm_shape

    assert warm_shape(1) == warm_shape(6) == (6, 300, 200)
    assert warm_shape(24) == (24, 300, 50)
    assert warm_shape(96) == (96, 100, 12)
    assert warm_shape(1000) == (1000, 100, 1)


def test_the_burn_in_drains_once_per_size_before_the_first_measured_drain_and_is_no_result(monkeypatch):
    """Before the first measured drain of each value size the raw pipe copies that round's records once,
    unmeasured (the invocation's first drain was slower whoever ran it): it runs before round 1's first
    contender of each size, never again, is not a row of the results, and a failing burn-in is noted and
    the measured drains still run. ``--no-burn-in`` leaves it out."""
    from argparse import Namespace

    import bench.run as run
    from bench.workload import Loaded

    def bench(no_burn_in: bool, fail: bool = False) -> tuple[run.Bench, list[tuple[str, str]]]:
        b = run.Bench.__new__(run.Bench)
        b.args = Namespace(rounds=2, contenders=["mirrorflow-eos-writer", "mm2-tuned"], no_burn_in=no_burn_in,
                           no_sync=True, no_fill=True)
        b.rows, b.doc, b.current, b.burned_in = [], {"notes": []}, None, set()
        calls: list[tuple[str, str]] = []

        def drain_one(contender: str, topic: str, tag: str, records: int, row: dict) -> None:
            calls.append((contender, topic))
            assert row["bytes"] == 10 * int(topic.split(".")[1][1:])  # the loaded bytes, which drain_one uses
            if fail and contender == run.BURN_IN:
                raise RuntimeError("no broker")
            row.update(status="ok", wall_s=1.0, startup_s=0.5, records_per_s=records, memory={"peak_rss_mb": 1.0})

        monkeypatch.setattr(b, "load_topic", lambda topic, size, records: Loaded(records, 0, size * records, 0.1))
        monkeypatch.setattr(b, "drain_one", drain_one)
        monkeypatch.setattr(b, "say", lambda msg: None)
        monkeypatch.setattr(b, "save", lambda: None)
        for size in (100, 1000):
            b.drain_phase(size, 10)
        return b, calls

    b, calls = bench(no_burn_in=False)
    assert calls == [("burn-in", "bench.s100"), ("mirrorflow-eos-writer", "bench.s100"), ("mm2-tuned", "bench.s100"),
                     ("mm2-tuned", "bench.s100.r2"), ("mirrorflow-eos-writer", "bench.s100.r2"),
                     ("burn-in", "bench.s1000"), ("mirrorflow-eos-writer", "bench.s1000"), ("mm2-tuned", "bench.s1000"),
                     ("mm2-tuned", "bench.s1000.r2"), ("mirrorflow-eos-writer", "bench.s1000.r2")]
    assert [r["contender"] for r in b.rows] == [c for c, _ in calls if c != "burn-in"]
    assert b.doc["burn_in"]["100"]["status"] == "ok" and b.doc["burn_in"]["1000"]["records_per_s"] == 10
    b, calls = bench(no_burn_in=False, fail=True)
    assert b.doc["burn_in"]["100"]["error"] == "RuntimeError: no broker"
    assert [r["status"] for r in b.rows] == ["ok"] * 8
    b, calls = bench(no_burn_in=True)
    assert "burn-in" not in [c for c, _ in calls] and "burn_in" not in b.doc


def test_the_fill_turns_free_memory_less_what_it_leaves_into_a_file_on_disk(monkeypatch, tmp_path):
    """``fill_free_memory`` writes a file as large as the free memory less what it leaves (in whole pieces, and
    never into the file system's last gigabytes), to disk; with nothing to spare it writes nothing."""
    import bench.observe as observe

    free = {"MemFree": observe.FILL_LEAVE_MB + 5.5}
    monkeypatch.setattr(observe, "meminfo_mb", lambda key, meminfo=None: free[key])
    monkeypatch.setattr(observe, "FILL_CHUNK_MB", 1)
    monkeypatch.setattr(observe, "FILL_DISK_LEAVE_MB", 0)
    steps: list[tuple[int, int]] = []
    done = observe.fill_free_memory(tmp_path, progress=lambda i, n: steps.append((i, n)))
    files = list(tmp_path.iterdir())
    assert done["mb"] == 5 and [f.stat().st_size for f in files] == [5 * 1024 * 1024]
    assert steps == [(i, 5) for i in range(1, 6)]
    assert files[0].read_bytes()[-1024:] == bytes(1024)
    monkeypatch.setattr(observe.shutil, "disk_usage", lambda p: SimpleNamespace(free=3 * 1024 * 1024))
    assert observe.fill_free_memory(tmp_path)["mb"] == 3  # the disk's free space bounds it
    free["MemFree"] = observe.FILL_LEAVE_MB - 1.0
    assert observe.fill_free_memory(tmp_path)["mb"] == 0 and len(list(tmp_path.iterdir())) == 2


def test_a_first_fill_that_finds_the_memory_taken_says_so_and_later_ones_do_not(monkeypatch, tmp_path):
    """When the run's first fill writes nothing, the page cache holds other files (an earlier run's logs) and a
    drain may read its source from disk: the run notes it (console and JSON). A later fill that writes nothing
    is the usual case (the first one's file still holds the memory) and says nothing."""
    from argparse import Namespace

    from rich.console import Console

    import bench.run as run

    b = run.Bench.__new__(run.Bench)
    b.args = Namespace(no_fill=False)
    b.doc, b.console, b.out = {"notes": []}, Console(quiet=True), tmp_path
    said: list[str] = []
    monkeypatch.setattr(b, "say", said.append)
    monkeypatch.setattr(run, "fill_free_memory", lambda directory, progress=None: {
        "mb": 0, "seconds": 0.0, "free_mb_before": 861.4, "free_mb_after": 861.4})
    b.fill_memory("s100 round 1")
    assert len(b.doc["notes"]) == 1 and "only 861 MB free" in b.doc["notes"][0] and "disk_read_mb" in said[0]
    b.fill_memory("s100 round 2")
    assert len(b.doc["notes"]) == 1 and len(said) == 1


def test_each_round_fills_free_memory_before_its_load_unless_told_not_to(monkeypatch, tmp_path):
    """The drain phase fills free memory before each round's load (its drains then grow the brokers' logs into
    reclaimed page cache alike), the latency phase before each of its rounds; ``--no-fill`` leaves it out."""
    from argparse import Namespace

    from rich.console import Console

    import bench.run as run
    from bench.workload import Loaded

    def phases(no_fill: bool) -> tuple[run.Bench, list[str]]:
        b = run.Bench.__new__(run.Bench)
        b.args = Namespace(rounds=2, contenders=["raw-python"], latency_contenders=[], no_burn_in=True, no_sync=True,
                           no_fill=no_fill)
        b.rows, b.doc, b.current, b.burned_in = [], {"notes": []}, None, set()
        b.console, b.out = Console(quiet=True), tmp_path
        steps: list[str] = []

        def fill(directory: Path, progress: Any = None) -> dict[str, float]:
            steps.append("fill")
            return {"mb": 1, "seconds": 0.1, "free_mb_before": 3000.0, "free_mb_after": 2000.0}

        def load_topic(topic: str, size: int, records: int) -> Loaded:
            steps.append(f"load {topic}")
            return Loaded(records, 0, size * records, 0.1)

        def drain_one(contender: str, topic: str, tag: str, records: int, row: dict) -> None:
            steps.append(f"drain {topic}")
            row.update(status="ok", wall_s=1.0, startup_s=0.5, records_per_s=records, memory={"peak_rss_mb": 1.0})

        monkeypatch.setattr(run, "fill_free_memory", fill)
        monkeypatch.setattr(b, "load_topic", load_topic)
        monkeypatch.setattr(b, "drain_one", drain_one)
        monkeypatch.setattr(b, "say", lambda msg: None)
        monkeypatch.setattr(b, "save", lambda: None)
        b.drain_phase(100, 10)
        b.latency_phase()
        return b, steps

    b, steps = phases(no_fill=False)
    assert steps == ["fill", "load bench.s100", "drain bench.s100", "fill", "load bench.s100.r2", "drain bench.s100.r2",
                     "fill", "fill"]
    assert [f["before"] for f in b.doc["page_cache_fill"]] == ["s100 round 1", "s100 round 2", "latency round 1",
                                                               "latency round 2"]
    assert b.doc["notes"] == []
    b, steps = phases(no_fill=True)
    assert steps == ["load bench.s100", "drain bench.s100", "load bench.s100.r2", "drain bench.s100.r2"]
    assert "page_cache_fill" not in b.doc
    # a run fills unless told not to; a --quick smoke run never does
    assert [run.parse_args(a).no_fill for a in ([], ["--no-fill"], ["--quick"])] == [False, True, True]


def test_a_measurement_during_which_the_machine_stood_still_is_marked(monkeypatch):
    """A VM paused or snapshotted during a drain stops the monotonic clock but not the wall clock, and a
    snapshot leaves a line in the kernel log: either marks the row (``machine_paused``), notes it in the JSON
    and says it on the console; a measurement with neither is left alone."""
    from argparse import Namespace

    import bench.run as run
    from bench import observe

    clock = {"mono": 10.0, "wall": 1000.0}
    log = ["[1.2] random: crng reseeded due to virtual machine fork\n"]
    monkeypatch.setattr(observe.time, "monotonic", lambda: clock["mono"])
    monkeypatch.setattr(observe.time, "time", lambda: clock["wall"])
    real_vm_forks = observe.vm_forks  # reads the text it is given instead of running dmesg
    monkeypatch.setattr(observe, "vm_forks", lambda: real_vm_forks("".join(log)))

    b = run.Bench.__new__(run.Bench)
    b.args = Namespace(no_sync=True)
    b.rows, b.doc, b.current = [], {"notes": []}, None
    said: list[str] = []
    monkeypatch.setattr(b, "say", said.append)
    monkeypatch.setattr(b, "save", lambda: None)

    def drain(mono: float, wall: float, snapshot: bool = False) -> dict:
        def run_it(row: dict) -> None:
            clock["mono"] += mono
            clock["wall"] += wall
            if snapshot:
                log.append("[33661.4] random: crng reseeded due to virtual machine fork\n")
            row.update(status="ok", records_per_s=1, wall_s=1.0, startup_s=0.1, memory={"peak_rss_mb": 1.0})

        row = {"phase": "throughput", "contender": "raw-python", "size": 1000, "round": 1}
        b.measure(row, run_it)
        return row

    assert "machine_paused" not in drain(5.0, 5.3)  # clocks that drift a little
    assert not b.doc["notes"]
    assert drain(8.0, 57.0)["machine_paused"] == {"clock_jump_s": 49.0, "vm_snapshots": 0}
    assert drain(8.0, 8.0, snapshot=True)["machine_paused"] == {"clock_jump_s": 0.0, "vm_snapshots": 1}
    assert len(b.doc["notes"]) == 2 and "49.0 s" in b.doc["notes"][0]
    assert b.doc["notes"][0].startswith("throughput raw-python s1000 round 1: the machine stood still")
    assert sum("stood still" in s for s in said) == 2
    # where the kernel log cannot be read, the clocks alone decide
    monkeypatch.setattr(observe, "vm_forks", lambda: None)
    assert drain(3.0, 3.0).get("machine_paused") is None
    assert drain(3.0, 9.0)["machine_paused"] == {"clock_jump_s": 6.0, "vm_snapshots": None}


def test_what_else_took_the_cores_is_what_the_machine_was_busy_with_beyond_the_parts_the_bench_follows():
    cpu = {"busy_cores": 1.96, "mirror_cores": 0.9, "servers_cores": 0.32, "harness_cores": 0.06, "kswapd_cores": 0.0}
    assert other_cores(cpu) == 0.68  # tests run beside the bench (6 December, 11:05)
    assert other_cores(cpu | {"mirror_cores": 1.58}) == 0.0
    assert other_cores(cpu | {"kswapd_cores": None}) is None  # a part without a figure: no guess


def test_a_mirror_on_a_spark_cluster_counts_the_clusters_processes_as_its_own(tmp_path):
    """On a standalone cluster the job's tasks run in executors the workers start in their own sessions: the
    contender's CPU is its session's and the cluster's (``Running.cpu``), with the cluster's part apart."""
    import subprocess
    import sys

    from bench.contenders import Running
    from bench.observe import SummedCpu, cores_between, session_members

    job, cluster = _timeline((0.0, 1.0), (10.0, 6.0)), _timeline((0.0, 0.0), (10.0, 10.0))
    assert cores_between({"mirror": SummedCpu(job, cluster)}, 0.0, 10.0) == {"mirror": 1.5}
    assert SummedCpu(job, _timeline((5.0, 0.0), (10.0, 1.0))).between(0.0, 10.0) is None  # a part unknown

    # a process in a session of its own, as local_spark starts a worker: found with the contender's session
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    run = Running("mirrorflow-x", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "x.log",
                  cluster_sessions=(worker.pid,))
    try:
        assert worker.pid in session_members(run.proc.pid, worker.pid)
        assert worker.pid not in session_members(run.proc.pid)
        run.cluster.sample()
        assert worker.pid in run.cluster.hwm_kb and run.proc.pid not in run.cluster.hwm_kb
        assert isinstance(run.cpu, SummedCpu)
    finally:
        run.stop(5)
        worker.kill()
        worker.wait()
    alone = Running("raw-python", [sys.executable, "-c", "pass"], tmp_path / "y.log")
    alone.stop(5)
    assert alone.cluster is None and alone.cpu is alone.mem.cpu
