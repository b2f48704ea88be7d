"""Benchmark: mirrorflow vs MirrorMaker 2 vs a raw consume->produce pipe, on one machine, in one run.

Starts its own local clusters (and registries) on free ports, loads the same Avro-framed data
once per value size, drains it with every contender into its own destination topic, then
measures continuous latency at a fixed produce rate. Prints rich tables and writes
``bench/results/<timestamp>.json``; the clusters are always stopped at the end.

    .venv/bin/python bench/run.py [--quick] [--sizes 100,1000] [--records 200000,50000] ...
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: E402

from bench import report  # noqa: E402
from bench.contenders import (  # noqa: E402
    MM2_MAIN,
    Endpoints,
    NoProcess,
    Running,
    java_cmd,
    kcat_cmd,
    mirrorflow_cmd,
    mirrorflow_yaml,
    mm2_properties,
    mm2_remote_topic,
    parse_batches,
    raw_pipe_cmd,
)
from bench.observe import (  # noqa: E402
    Arrivals,
    DrainCounter,
    DstWatcher,
    MachineCpu,
    PauseWatch,
    PidsCpu,
    cores_between,
    disk_read_mb,
    fill_free_memory,
    kernel_threads,
    latency_windows,
    percentile,
    reclaim_between,
    reclaim_counts,
    settle_page_cache,
    unwritten_mb,
)
from bench.workload import (  # noqa: E402
    SCHEMA,
    VERIFICATION,
    Loaded,
    RateProducer,
    load,
    transaction_verification,
    warm_broker,
    warm_shape,
)
from mirror_core import artifacts, local, local_spark  # noqa: E402
from mirror_core.logs import quiet_library_warnings  # noqa: E402
from mirror_core.topics import create_topics  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
# mirrorflow-* mirror with the avro value serde (schema ids rewritten); the *-bytes variants copy values as
# bytes. mm2 is MirrorMaker 2 as shipped, mm2-tuned as a performance-minded operator runs it, mm2-tuned-eos
# that with MM2's exactly-once source support (transactions; opt-in, not in the default set).
# *-direct* run with spark.read_path: direct (Spark plans, the driver reads the ranges itself; what the default,
# read_path: auto, does on a local master) and spark.transactions: per_partition (a transaction per partition and
# batch); the others without it with read_path: spark (Spark's tasks read with Spark's Kafka source); *-writer* with
# read_path: direct and spark.transactions: per_writer (one transaction per writer process and batch, on two
# producers by turns; at_least_once: one idempotent producer per writer process; what the defaults resolve to on a
# local master);
# *-tasks* with spark.read_path: executors (Spark plans; a large batch's ranges are read with mirrorflow's reader
# and written by Spark's tasks, a transaction per partition: what read_path: auto takes on a cluster master; for a
# Spark cluster, --spark-workers); *-tasks-share* with spark.transactions: per_writer too (a transaction per task
# share, on the share's writer ids);
# *-writer-1* with one producer per writer process (spark.writer_producers: 1), as before the turns.
# *-py* variants run with MIRRORFLOW_NATIVE=0: every record through the Python produce loop, none through
# the C loop (mirror_core.native), for an A/B of the two in one invocation; *-pyread* variants with
# MIRRORFLOW_NATIVE_READ=0: the direct reader takes confluent-kafka's Message objects instead of the C consume
# loop's columns (the C produce loop still on), an A/B of the read loop alone; *-pygc* variants with
# MIRRORFLOW_GC=0: Python's default garbage-collector thresholds in the writer processes (an A/B of
# mirror_core.replicate.quiet_gc); *-overlap* variants with spark.overlap_writes: true (a running mirror's
# batch written while Spark records it and plans the next; an A/B of the overlap); *-chmod* variants with
# Hadoop's own local file system for the checkpoint (a chmod process per checkpoint file, as before
# spark_jobs/local_fs.py; an A/B of it); *-c2* variants give the direct path's driver JVM its optimizing
# compiler back (-XX:TieredStopAtLevel=4 after mirrorflow's =1; an A/B of jvm_archive.DIRECT_READ_OPTIONS);
# *-noverify* variants run with the destination brokers' transaction.partition.verification.enable off for
# their run (a dynamic setting, removed again before the next contender; see bench.workload.transaction_verification);
# *-keep* variants with spark.keep_writing_for (KEEP_WRITING_FOR; *-keep10*: 10 seconds): a running mirror's batch
# goes on writing what arrives for that long before it returns to Spark (latency; a --once drain does not keep
# writing); *-keepthrough* as *-keep* with the writer processes left writing while Spark records the batch and plans
# the next (MIRRORFLOW_KEEP_THROUGH_SPARK=1; an A/B of that experiment); *-fetch1* variants read the source with
# librdkafka's default fetch.min.bytes of 1 (MIRRORFLOW_DIRECT_FETCH_MIN_BYTES=1) instead of mirrorflow's
# direct.FETCH_MIN_BYTES (an A/B); *-p3* and *-p4* variants run 3 or 4 writer processes (spark.direct_processes)
# instead of one per core; *-txnflat* variants cut writer transactions at direct.WRITER_TXN_RECORDS records
# whatever their partitions (MIRRORFLOW_WRITER_TXN_PER_PARTITION=0; an A/B of direct.writer_txn_records);
# *-flat* variants read micro-batches of stream.DIRECT_BATCH_RECORDS and cut writer transactions at
# replicate.CHUNK_BYTES whatever the partitions (MIRRORFLOW_DIRECT_BATCH_PER_PARTITION=0,
# MIRRORFLOW_WRITER_TXN_BYTES_PER_PARTITION=0; an A/B of the larger shares a partition at many partitions);
# *-aheadall* variants read the source as before 5 December: a fetch brings up to 1 MiB a partition and the reader
# keeps whatever came past a range's end up to direct.AHEAD_RECORDS a partition, whatever its bytes
# (MIRRORFLOW_DIRECT_PARTITION_FETCH_BYTES=1048576, MIRRORFLOW_DIRECT_AHEAD_BYTES=0; an A/B of the bounded read-ahead);
# *-nowait* variants report each record of a partition whose last commit markers are late at once, without
# waiting for them (MIRRORFLOW_LATE_MARKERS_WAIT=0; an A/B of stream.LATE_MARKERS_WAIT_S); *-chunk* variants write a
# partition's records a chunk at a time (a transaction or flush each 20,000 records), not what was queued for it
# while it wrote the last (MIRRORFLOW_COALESCE_RECORDS=0; an A/B of stream.COALESCE_RECORDS); *-tuned* variants give
# the destination cluster the tuned MirrorMaker 2's producer settings (linger.ms 20, batch.size 262144; the writers'
# own default is linger.ms 5, batch.size 1,000,000); *-heap* variants start the whole job with glibc set to keep the
# heap it frees (GLIBC_TUNABLES=HEAP_TUNABLES, which its writer processes inherit; measured on 6 December and not
# made the default, docs/benchmarks.md); *-oldlookup* variants look positions up as before 7 December, on new
# consumers each time and with a scan's reads waiting 50 ms for more records (MIRRORFLOW_LOOKUP_POOL=0,
# MIRRORFLOW_SCAN_WAIT_MS=50, on the driver and, through spark.executorEnv, the executors; an A/B of both).
# The default set: *-writer* in both modes and serdes (what spark.read_path: auto and spark.transactions: auto
# resolve to on a local[...] master, the defaults), a transaction per partition on the direct path once
# (transactions: per_partition), Spark's read path once, the peers.
CONTENDERS = ("mirrorflow-eos-writer", "mirrorflow-alo-writer", "mirrorflow-eos-writer-bytes",
              "mirrorflow-alo-writer-bytes", "mirrorflow-eos-direct", "mirrorflow-eos", "mm2", "mm2-tuned",
              "raw-python", "kcat")
#: the *-heap* variants' glibc allocator settings: up to 256 MiB of freed heap kept, the heap grown 16 MiB at a time
HEAP_TUNABLES = "glibc.malloc.trim_threshold=268435456:glibc.malloc.top_pad=16777216"
#: the contenders outside the default set, for A/Bs
MORE_CONTENDERS = ("mirrorflow-eos-writer-heap", "mirrorflow-eos-writer-heap-bytes", "mirrorflow-alo-writer-heap",
                   "mirrorflow-alo-writer-heap-bytes", "mirrorflow-alo", "mirrorflow-eos-bytes",
                   "mirrorflow-alo-bytes", "mirrorflow-alo-direct",
                   "mirrorflow-eos-direct-bytes", "mirrorflow-alo-direct-bytes", "mirrorflow-eos-writer-1",
                   "mirrorflow-eos-writer-1-bytes", "mirrorflow-eos-direct-py", "mirrorflow-eos-direct-py-bytes",
                   "mirrorflow-eos-writer-1-py-bytes", "mirrorflow-eos-direct-pygc",
                   "mirrorflow-eos-direct-pygc-bytes", "mirrorflow-alo-direct-pygc-bytes",
                   "mirrorflow-eos-direct-overlap",
                   "mirrorflow-eos-direct-overlap-bytes", "mirrorflow-alo-direct-overlap-bytes", "mm2-tuned-eos",
                   "mirrorflow-eos-chmod", "mirrorflow-eos-direct-chmod", "mirrorflow-alo-direct-chmod",
                   "mirrorflow-eos-direct-pyread", "mirrorflow-eos-direct-pyread-bytes",
                   "mirrorflow-alo-direct-pyread-bytes", "mirrorflow-alo-direct-py-bytes",
                   "mirrorflow-eos-direct-small", "mirrorflow-eos-direct-small-bytes",
                   "mirrorflow-eos-direct-again-bytes", "mirrorflow-alo-direct-again-bytes",
                   "mirrorflow-eos-writer-overlap", "mirrorflow-alo-writer-py-bytes",
                   "mirrorflow-alo-writer-pyread-bytes", "mirrorflow-eos-direct-c2", "mirrorflow-eos-direct-c2-bytes",
                   "mirrorflow-alo-direct-c2-bytes", "mirrorflow-eos-writer-c2", "mirrorflow-eos-writer-c2-bytes",
                   "mirrorflow-eos-writer-noverify", "mirrorflow-eos-writer-noverify-bytes",
                   "mirrorflow-eos-direct-noverify", "mirrorflow-eos-direct-noverify-bytes",
                   "mirrorflow-eos-writer-keep", "mirrorflow-eos-direct-keep", "mirrorflow-alo-direct-keep",
                   "mirrorflow-eos-writer-keep10", "mirrorflow-eos-writer-keepthrough",
                   "mirrorflow-eos-writer-keep-fetch1", "mirrorflow-eos-writer-fetch1-bytes",
                   "mirrorflow-eos-direct-fetch1-bytes", "mirrorflow-eos-writer-keep-p3",
                   "mirrorflow-eos-writer-keep-p4", "mirrorflow-eos-writer-txnflat",
                   "mirrorflow-eos-writer-txnflat-bytes", "mirrorflow-eos-writer-flat",
                   "mirrorflow-eos-writer-flat-bytes", "mirrorflow-eos-writer-aheadall",
                   "mirrorflow-eos-writer-aheadall-bytes", "mirrorflow-eos-writer-nowait",
                   "mirrorflow-eos-writer-nowait-bytes", "mirrorflow-eos-direct-chunk",
                   "mirrorflow-eos-direct-chunk-bytes", "mirrorflow-alo-direct-chunk",
                   "mirrorflow-alo-direct-chunk-bytes", "mirrorflow-eos-chunk", "mirrorflow-eos-chunk-bytes",
                   "mirrorflow-eos-direct-tuned", "mirrorflow-eos-direct-tuned-bytes", "mirrorflow-alo-direct-tuned",
                   "mirrorflow-alo-direct-tuned-bytes", "mirrorflow-eos-tasks", "mirrorflow-alo-tasks",
                   "mirrorflow-eos-tasks-bytes", "mirrorflow-alo-tasks-bytes", "mirrorflow-eos-tasks-share",
                   "mirrorflow-alo-tasks-share", "mirrorflow-eos-tasks-share-bytes", "mirrorflow-alo-tasks-share-bytes",
                   "mirrorflow-eos-tasks-share-oldlookup-bytes", "mirrorflow-eos-tasks-oldlookup-bytes")
#: the ``-tuned`` variants' destination producer settings: the tuned MirrorMaker 2's (``mm2-tuned``)
TUNED_PRODUCER = {"linger.ms": "20", "batch.size": "262144"}
#: ``--quick``'s drain contenders
QUICK_CONTENDERS = ("mirrorflow-eos-writer", "mm2", "mm2-tuned", "raw-python", "kcat")
#: a drain whose destination count rose by this share of its records or more at once (a transaction's commit
#: between two looks) is compared by its steady figure: its 10-90 % window is a few such steps apart, and
#: measures when they landed more than the pace (see bench.report.rate)
COARSE_STEP_SHARE = 0.1
#: the ``-small`` variants' ``spark.max_offsets_per_trigger`` (the direct path's default batch is 500,000 records)
SMALL_BATCH_RECORDS = 125000
#: the ``-keep`` variants' ``spark.keep_writing_for`` (``-keep10``: 10 seconds)
KEEP_WRITING_FOR = "2 seconds"
#: a latency row's ``windows``: the measured window in pieces of this many seconds (by produce time)
LATENCY_WINDOW_S = 0.25
#: a latency row's ``p99_settled_ms``: the p99 of the records produced this many seconds or more into the window
LATENCY_SETTLE_S = 2.0
#: how long past the measured window a latency row waits for the CPU samplers' next samples
CORES_GRACE_S = 0.6
#: the topic each broker is warmed on (see bench.workload.warm_broker)
WARM_TOPIC = "bench.warm"
#: the unmeasured drain before the first measured one (the raw pipe; see Bench.burn_in)
BURN_IN = "burn-in"
#: the burn-in's records per transaction: 80 commits for 4,000,000 records, 20 for 1,000,000
BURN_IN_TRANSACTION_RECORDS = 50_000
FLOOR = "floor"  # no mirror: the watcher reads the source topic itself (what the measurement adds)
LATENCY_CONTENDERS = (FLOOR, "mirrorflow-eos", "mirrorflow-alo", "mirrorflow-eos-direct", "mirrorflow-alo-direct",
                      "mirrorflow-eos-writer", "mm2", "mm2-tuned", "raw-python", "kcat")
#: allowed in the latency phase too, not in its default set, for an A/B: Python's default collector thresholds;
#: a running mirror's batches written while Spark goes on
LATENCY_AB = ("mirrorflow-eos-direct-pygc", "mirrorflow-eos-direct-overlap", "mirrorflow-eos-chmod",
              "mirrorflow-eos-direct-chmod", "mirrorflow-alo-direct-chmod", "mirrorflow-eos-writer-overlap",
              "mirrorflow-eos-direct-c2", "mirrorflow-eos-writer-c2", "mirrorflow-eos-writer-noverify",
              "mirrorflow-eos-direct-noverify", "mirrorflow-eos-writer-keep", "mirrorflow-eos-direct-keep",
              "mirrorflow-alo-direct-keep", "mirrorflow-eos-writer-keep10", "mirrorflow-eos-writer-keepthrough",
              "mirrorflow-eos-writer-keep-fetch1", "mm2-tuned-eos", "mirrorflow-eos-writer-keep-p3",
              "mirrorflow-eos-writer-keep-p4")


def steady_figures(records: int, nbytes: int, started_at: float, done: float, seen: Arrivals,
                   log_start: float | None) -> dict[str, Any]:
    """A drain's wall and steady figures (epoch seconds in): the steady clock runs from the data path's start
    to the last record visible (``done``).

    The data path starts where the contender's own log says its first batch with records started
    (``log_start``: mirrorflow's jobs), before any record was visible, and every record counts. A contender
    the watcher times starts at the first look that saw records, and what that look found had become visible
    before the clock started: those records are not counted. (At 1 KB on 5 December, 23:03, a raw-pipe
    drain's first look found 98,206 of its 1,000,000 records, 0.48 s after the look before it; counted, they
    made its steady figure 11 % higher than what the watcher saw.)"""
    if log_start is not None:
        data_start, before_start = log_start, 0
    elif seen.first_at is not None:
        data_start, before_start = seen.first_at, seen.first_count
    else:
        data_start, before_start = started_at, 0
    wall = done - started_at
    steady = max(done - data_start, 1e-3)
    counted = max(records - before_start, 1)
    return dict(wall_s=round(wall, 2), startup_s=round(data_start - started_at, 2), steady_s=round(steady, 2),
                steady_records=counted, first_visible_s=round((seen.first_at or done) - started_at, 2),
                records_per_s=round(counted / steady), mb_per_s=round(nbytes * counted / records / steady / 1e6, 2),
                records_per_s_wall=round(records / wall))


def _variant_conf(parts: list[str]) -> dict[str, str] | None:
    """A contender variant's own ``spark.conf`` entries (the *-chmod*, *-c2* and *-oldlookup* variants)."""
    conf = {}
    if "chmod" in parts:
        conf["spark.hadoop.fs.file.impl"] = "org.apache.hadoop.fs.LocalFileSystem"
    if "c2" in parts:
        conf["spark.driver.extraJavaOptions"] = "-XX:TieredStopAtLevel=4"
    for key, value in _lookup_env(parts).items():  # the executors' Python workers look positions up too
        conf[f"spark.executorEnv.{key}"] = value
    return conf or None


def _lookup_env(parts: list[str]) -> dict[str, str]:
    """The *-oldlookup* variants' environment: position lookups as before 7 December (new consumers for each,
    a scan's reads waiting 50 ms for more records)."""
    return {"MIRRORFLOW_LOOKUP_POOL": "0", "MIRRORFLOW_SCAN_WAIT_MS": "50"} if "oldlookup" in parts else {}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run (100 B values, 20k records, 5 s latency)")
    ap.add_argument("--sizes", default=None, help="value sizes in bytes, comma-separated (default 100,1000)")
    ap.add_argument("--records", default=None,
                    help="records per size: one number for all or one per size (default 200000,50000)")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--contenders", default=None,
                    help=f"drain contenders (of {','.join(CONTENDERS + MORE_CONTENDERS)}; the default: "
                         f"{','.join(CONTENDERS)}; --quick: {','.join(QUICK_CONTENDERS)})")
    ap.add_argument("--latency-contenders", default=None,
                    help=f"latency contenders (of {','.join(LATENCY_CONTENDERS)}; "
                         "--quick: mirrorflow-eos-direct,mm2-tuned,raw-python)")
    ap.add_argument("--rate", type=float, default=None, help="latency phase produce rate, records/s (default 2000)")
    ap.add_argument("--seconds", type=float, default=None, help="latency phase duration (default 20)")
    ap.add_argument("--latency-size", type=int, default=100, help="value size in the latency phase")
    ap.add_argument("--warmup", type=float, default=None,
                    help="seconds of trickle after a contender's first delivery, before the measured window "
                         "(the same for every contender; default 10, --quick 1)")
    ap.add_argument("--ramp-seconds", type=float, default=0.0,
                    help="produce at the measured rate, unmeasured, for this long right before the measured window, "
                         "so that it measures a mirror already running at its rate (default 0: the window starts "
                         "with the step from the warm-up's trickle to the rate)")
    ap.add_argument("--trigger", default="200 milliseconds", help="mirrorflow's Spark trigger in the latency phase")
    ap.add_argument("--driver-max", type=int, default=None,
                    help="mirrorflow's spark.driver_batch_max_records (default: the product default)")
    ap.add_argument("--mm2-tasks", type=int, default=2, help="MM2 tasks.max (Spark runs local[2])")
    ap.add_argument("--spark-workers", type=int, default=0,
                    help="run mirrorflow on a Spark standalone cluster of this many workers (1 core, 1 GB each; "
                         "executor scaling, with --driver-max 0 so the tasks write) instead of local[2]")
    ap.add_argument("--timeout", type=float, default=600.0, help="deadline per contender run, seconds")
    ap.add_argument("--no-latency", action="store_true", help="skip the latency phase")
    ap.add_argument("--no-drain", action="store_true", help="skip the drain phase")
    ap.add_argument("--rounds", type=int, default=1,
                    help="drain every contender this many times per size, each round on freshly loaded data and "
                         "in an order that balances positions (round 2 reverses round 1, ...), and measure each "
                         "latency contender as many times the same way; the summary tables give each contender's "
                         "mean over the rounds")
    ap.add_argument("--no-sync", action="store_true",
                    help="do not write the page cache to disk (sync) before each measurement")
    ap.add_argument("--warm-seconds", type=float, default=0.0,
                    help="keep warming the brokers this long (at least the warm-up's transactions; values of the "
                         "run's sizes by turns): a broker's CPU per record keeps falling for minutes after start")
    ap.add_argument("--no-warm", action="store_true",
                    help="skip warming the brokers (transactions written and read back) before the contenders")
    ap.add_argument("--no-fill", action="store_true",
                    help="do not fill the free memory with page cache before each round's load (a file of zeros "
                         "written to disk and kept until the end): on a VM whose host takes back free memory, "
                         "the first writes into it cost several times the system CPU, and the drains that grew "
                         "the brokers' page cache into it were the slow ones (--quick leaves it out too: a smoke "
                         "run is no comparison)")
    ap.add_argument("--no-burn-in", action="store_true",
                    help="skip the burn-in: before the first measured drain of each size, the raw pipe copies "
                         "that round's records once into a topic of its own in transactions, unmeasured (the "
                         "invocation's first drain, whoever ran it, was 0.6-0.7x its own later drains)")
    args = ap.parse_args(argv)
    quick = args.quick
    args.sizes = [int(s) for s in (args.sizes or ("100" if quick else "100,1000")).split(",")]
    recs = [int(r) for r in (args.records or ("20000" if quick else "200000,50000")).split(",")]
    if len(recs) == 1:
        recs = recs * len(args.sizes)
    if len(recs) != len(args.sizes):
        ap.error("--records needs one number or one per --sizes entry")
    args.records = recs
    args.no_fill = args.no_fill or quick
    if args.rounds < 1:
        ap.error("--rounds needs 1 or more")
    args.rate = args.rate or (1000.0 if quick else 2000.0)
    args.seconds = args.seconds or (5.0 if quick else 20.0)
    default = [c for c in CONTENDERS if not quick or c in QUICK_CONTENDERS]
    args.contenders = [c for c in args.contenders.split(",") if c] if args.contenders else default
    if args.no_drain:
        args.contenders = []
    lat_default = ["mirrorflow-eos-writer", "mm2-tuned", "raw-python"] if quick else list(LATENCY_CONTENDERS)
    lat = [c for c in args.latency_contenders.split(",") if c] if args.latency_contenders else lat_default
    args.latency_contenders = [] if args.no_latency else lat
    args.warmup = args.warmup if args.warmup is not None else (1.0 if quick else 10.0)
    bad = [c for c in args.contenders if c not in CONTENDERS + MORE_CONTENDERS]
    bad += [c for c in args.latency_contenders if c not in LATENCY_CONTENDERS + LATENCY_AB]
    if bad:
        ap.error(f"unknown contender(s) {bad}; choose from {CONTENDERS + MORE_CONTENDERS}")
    return args


class Bench:
    """One run: the clusters, the output directory, and the result rows."""

    def __init__(self, args: argparse.Namespace, console: Console):
        self.args = args
        self.console = console
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.out = RESULTS / self.stamp
        self.json_path = RESULTS / f"{self.stamp}.json"
        self.env = local.LocalEnv.from_environment(self.out / "state")
        self.spec = local.free_spec(registries=True)
        src, dst = self.spec.sides
        self.ep = Endpoints(src.bootstrap, dst.bootstrap, src.registry_url, dst.registry_url)
        self.rows: list[dict[str, Any]] = []
        self.current: Running | None = None
        #: the value sizes whose first round had its burn-in drain (:meth:`burn_in`)
        self.burned_in: set[int] = set()
        #: CPU time of both clusters' brokers and of their registries, by role (set once they run)
        self.role_cpu: dict[str, PidsCpu] = {}
        self.harness_cpu: PidsCpu | None = None
        self.kswapd_cpu: PidsCpu | None = None
        self.machine_cpu: MachineCpu | None = None
        self.kcat = shutil.which("kcat") or shutil.which("kafkacat")
        #: the Spark master mirrorflow runs on (a standalone cluster with --spark-workers)
        self.master = "local[2]"
        #: that cluster's sessions (its master's and each worker's, with the executors a worker starts)
        self.cluster_sessions: tuple[int, ...] = ()
        #: the destination brokers' transaction verification is off (a ``-noverify`` contender runs)
        self.verification_off = False
        self.doc: dict[str, Any] = {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
                     "kernel": platform.release(), "mem_gb": _mem_gb()},
            "args": {k: v for k, v in vars(args).items()},
            "endpoints": vars(self.ep),
            "notes": [],
            "rows": self.rows,
        }

    def say(self, msg: str) -> None:
        self.console.log(msg)

    def save(self) -> None:
        report.add_ratios(self.rows)
        self.doc["summary"] = report.summarize(self.rows)
        self.doc["latency_summary"] = report.summarize_latency(self.rows)
        report.write_json(self.json_path, self.doc)

    # ------------------------------------------------------------------ setup

    def up(self) -> None:
        t0 = time.monotonic()
        self.say(f"starting local clusters + registries (state in {self.env.state_dir})")
        local.up(self.env, self.spec, progress=lambda m: self.say(f"[dim]{m}"))
        self.doc["clusters_up_s"] = round(time.monotonic() - t0, 1)
        st = local.status(self.env)
        sides = st.get("sides", {})
        # each side's brokers apart, and the registries: which server a contender's extra work lands on
        roles = {f"{name}_brokers": [p["pid"] for p in side.get("brokers", []) if p.get("pid")]
                 for name, side in sides.items()}
        roles["registries"] = [side["registry"]["pid"] for side in sides.values()
                               if (side.get("registry") or {}).get("pid")]
        if not self.args.no_warm:
            try:
                self.warm_brokers()
            except Exception as exc:  # noqa: BLE001 - the run goes on; its JSON says so
                self.doc["notes"].append(f"brokers not warmed: {type(exc).__name__}: {exc}")
                self.say(f"[red]brokers not warmed: {type(exc).__name__}: {exc}")
        self.role_cpu = {role: PidsCpu(pids).start() for role, pids in roles.items() if pids}
        # the harness's own process (its watcher, samplers, librdkafka threads): what it takes from the cores
        self.harness_cpu = PidsCpu([os.getpid()]).start()
        # the kernel's background memory reclaimer (it runs on the same cores) and the whole machine's time
        kswapd = kernel_threads("kswapd")
        self.kswapd_cpu = PidsCpu(kswapd).start() if kswapd else None
        self.machine_cpu = MachineCpu().start()
        try:
            import pyspark

            self.doc["versions"] = {"pyspark": pyspark.__version__, "kafka": artifacts.KAFKA_VERSION}
        except Exception:  # noqa: BLE001 - versions are informative only
            pass
        if self.kcat is None:
            self.doc["notes"].append("kcat not installed (apt-get install -y kcat): kcat rows skipped")
        if self.args.spark_workers:
            self.say(f"starting a Spark standalone cluster of {self.args.spark_workers} workers (1 core, 1 GB each)")
            cluster = local_spark.up(self.env, workers=self.args.spark_workers, cores_per_worker=1,
                                     memory_per_worker="1g")
            self.master = cluster.master_url
            self.cluster_sessions = (cluster.master_pid, *cluster.worker_pids)  # each started in a session of its own
            self.doc["spark_master"] = {"url": cluster.master_url, "workers": self.args.spark_workers}

    def warm_brokers(self) -> None:
        """Warm both clusters' brokers before any contender, both at once (see
        :func:`bench.workload.warm_broker`): at least its transactions, and for ``--warm-seconds``, with
        values of the run's drain sizes by turns."""
        t0 = time.monotonic()
        sides = (("src", self.ep.src_bootstrap), ("dst", self.ep.dst_bootstrap))
        partitions, transactions, per_partition = warm_shape(self.args.partitions)
        for _side, bootstrap in sides:
            self.create_topic(bootstrap, WARM_TOPIC, partitions)
        sizes = tuple(self.args.sizes)
        with self.console.status(f"warming both brokers (at least {transactions} transactions over {partitions} "
                                 "partitions" + (f", {self.args.warm_seconds:.0f} s" if self.args.warm_seconds
                                                 else "") + ")"):
            with ThreadPoolExecutor(len(sides)) as pool:
                futures = {side: pool.submit(warm_broker, bootstrap, WARM_TOPIC, partitions, self.args.warm_seconds,
                                             sizes, transactions, per_partition) for side, bootstrap in sides}
                read = {side: f.result() for side, f in futures.items()}
        took = time.monotonic() - t0
        for side, n in read.items():
            self.say(f"warmed the {side} broker in {took:.0f} s: {n:,} records written and read back")
        self.doc["brokers_warm_s"] = round(took, 1)
        self.doc["brokers_warm_records"] = read

    def destination_verification(self, off: bool) -> None:
        """The destination brokers' transaction verification off for a ``-noverify`` contender, back to their
        own value for any other (only when it changes)."""
        if off == self.verification_off:
            return
        transaction_verification(self.ep.dst_bootstrap, off)
        self.verification_off = off
        self.say(f"[dim]destination brokers: {VERIFICATION} {'off' if off else 'as configured'}")

    def create_topic(self, bootstrap: str, topic: str, partitions: int) -> None:
        # one local broker brings some 250 new partitions a second online here: 9,000 take longer than 30 s
        create_topics(AdminClient({"bootstrap.servers": bootstrap, "log_level": 3}), [NewTopic(topic, partitions, 1)],
                      timeout=max(30.0, partitions / 100))

    def register(self, topic: str) -> int:
        quiet_library_warnings()  # before the registry client's import, which prints one
        from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

        client = SchemaRegistryClient({"url": self.ep.src_registry})
        return int(client.register_schema(f"{topic}-value", Schema(json.dumps(SCHEMA), "AVRO")))

    def source_topic(self, topic: str) -> int:
        """Create ``topic`` on the source and register the value schema; returns the schema id."""
        self.create_topic(self.ep.src_bootstrap, topic, self.args.partitions)
        return self.register(topic)

    # ------------------------------------------------------------------ launching

    def launch(self, contender: str, source: str, tag: str, *, drain: bool) -> tuple[Running, str]:
        """Start ``contender`` mirroring ``source``; returns the process and its destination topic."""
        logs = self.out / "logs"
        cfgs = self.out / "configs"
        cfgs.mkdir(parents=True, exist_ok=True)
        self.destination_verification(off="noverify" in contender.split("-"))
        env: dict[str, str] = {}
        if contender.startswith("mirrorflow-"):
            parts = contender.split("-")
            delivery = "exactly_once" if parts[1] == "eos" else "at_least_once"
            serde = "bytes" if contender.endswith("-bytes") else "avro"
            group = f"bench-{'-'.join(parts[1:])}-{tag}"
            dest = f"{source}.{contender}"
            path = cfgs / f"{group}.yaml"
            path.write_text(mirrorflow_yaml(
                self.ep, group=group, source_topic=source, destination_topic=dest, delivery=delivery,
                value_serde=serde, trigger=self.args.trigger, checkpoint_dir=self.out / "checkpoints",
                driver_batch_max_records=self.args.driver_max, master=self.master,
                read_path="direct" if "direct" in parts or "writer" in parts
                else "executors" if "tasks" in parts else "spark",
                transactions="per_writer" if {"writer", "share"} & set(parts) else "per_partition",
                writer_producers=1 if "1" in parts else None,
                overlap_writes=True if "overlap" in parts else None,
                max_offsets_per_trigger=SMALL_BATCH_RECORDS if "small" in parts else None,
                keep_writing_for=KEEP_WRITING_FOR if {"keep", "keepthrough"} & set(parts)
                else "10 seconds" if "keep10" in parts else None,
                spark_conf=_variant_conf(parts),
                direct_processes=3 if "p3" in parts else 4 if "p4" in parts else None,
                destination_kafka=TUNED_PRODUCER if "tuned" in parts else None))
            cmd = mirrorflow_cmd(path, group, once=drain)
            if "py" in parts:
                env["MIRRORFLOW_NATIVE"] = "0"
            if "pyread" in parts:
                env["MIRRORFLOW_NATIVE_READ"] = "0"
            if "pygc" in parts:
                env["MIRRORFLOW_GC"] = "0"
            if "keepthrough" in parts:
                env["MIRRORFLOW_KEEP_THROUGH_SPARK"] = "1"
            if "fetch1" in parts:
                env["MIRRORFLOW_DIRECT_FETCH_MIN_BYTES"] = "1"
            if "txnflat" in parts:
                env["MIRRORFLOW_WRITER_TXN_PER_PARTITION"] = "0"
            if "chunk" in parts:
                env["MIRRORFLOW_COALESCE_RECORDS"] = "0"
            if "heap" in parts:
                env["GLIBC_TUNABLES"] = HEAP_TUNABLES
            env.update(_lookup_env(parts))
            if "nowait" in parts:
                env["MIRRORFLOW_LATE_MARKERS_WAIT"] = "0"
            if "aheadall" in parts:
                env["MIRRORFLOW_DIRECT_AHEAD_BYTES"] = "0"
                env["MIRRORFLOW_DIRECT_PARTITION_FETCH_BYTES"] = str(1024 * 1024)
            if "flat" in parts:
                env["MIRRORFLOW_DIRECT_BATCH_PER_PARTITION"] = "0"
                env["MIRRORFLOW_WRITER_TXN_BYTES_PER_PARTITION"] = "0"
        elif contender in ("mm2", "mm2-tuned", "mm2-tuned-eos"):
            tuned = contender != "mm2"
            eos = contender.endswith("-eos")
            dest = mm2_remote_topic(source, tuned=tuned, exactly_once=eos)
            path = cfgs / f"{contender}-{tag}.properties"
            path.write_text(mm2_properties(self.ep, source, tasks=self.args.mm2_tasks, tuned=tuned,
                                           exactly_once=eos, rest_port=local._free_port() if eos else None))
            cmd = java_cmd(local.find_java(17), artifacts.fetch_kafka(self.env.cache), MM2_MAIN, str(path))
        elif contender in ("raw-python", BURN_IN):
            dest = f"{source}.raw" if contender == "raw-python" else f"{source}.{BURN_IN}"
            self.create_topic(self.ep.dst_bootstrap, dest, self.args.partitions)
            cmd = raw_pipe_cmd(self.ep, source, dest,
                               transaction_records=BURN_IN_TRANSACTION_RECORDS if contender == BURN_IN else 0)
        elif contender == "kcat":
            if self.kcat is None:
                raise Skip("kcat not installed")
            dest = f"{source}.kcat"
            self.create_topic(self.ep.dst_bootstrap, dest, self.args.partitions)
            cmd = kcat_cmd(self.kcat, self.ep, source, dest, exit_at_end=drain)
        else:
            raise ValueError(contender)
        run = Running(contender, cmd, logs / f"{contender}-{tag}.log", env_extra=env,
                      cluster_sessions=self.cluster_sessions if contender.startswith("mirrorflow-") else ())
        self.current = run
        return run, dest

    def finish(self, run: Running | NoProcess) -> dict[str, Any]:
        self._load_end = os.getloadavg()[0]
        run.stop()
        self.current = None
        return run.mem.summary()

    def measure(self, row: dict[str, Any], run: Any) -> None:
        """Run one contender's measurement into ``row``; a failing contender is a result, not the end of
        the run. Records the load around it, prints the row and saves the results."""
        self.rows.append(row)
        if not self.args.no_sync:
            row["page_cache"] = settle_page_cache()
        load0 = os.getloadavg()[0]
        pause = PauseWatch()
        try:
            run(row)
        except Skip as exc:
            row.update(status="skipped", error=str(exc))
        except Exception as exc:  # noqa: BLE001
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}")
            if self.current:
                row["memory"] = self.finish(self.current)
        _note_load(row, load0, getattr(self, "_load_end", None))
        paused = pause.result()
        if paused:
            row["machine_paused"] = paused
            what = " ".join(str(part) for part in (row.get("phase"), row.get("contender"),
                                                     f"s{row['size']}" if row.get("size") else None,
                                                     f"round {row.get('round', 1)}") if part)
            note = (f"{what}: the machine stood still while it ran (wall clock jumped {paused['clock_jump_s']} s "
                    f"against the monotonic one; VM snapshots logged: {paused['vm_snapshots']}); its figures, and "
                    f"those of the measurements after it, say little")
            self.doc["notes"].append(note)
            self.say(f"[yellow]{note}")
        if "page_cache" in row:
            row["page_cache"]["unwritten_mb_end"] = unwritten_mb()  # what the measurement left to write
        self.say(_row_line(row))
        self.save()

    # ------------------------------------------------------------------ phase 1: drain

    def drain_phase(self, size: int, records: int) -> None:
        for rnd in range(1, self.args.rounds + 1):
            suffix = "" if rnd == 1 else f".r{rnd}"
            topic = f"bench.s{size}{suffix}"
            self.fill_memory(f"s{size} round {rnd}")
            loaded = self.load_topic(topic, size, records)
            if size not in self.burned_in and not self.args.no_burn_in:
                self.burn_in(topic, size, records, loaded.key_bytes + loaded.value_bytes)
            for pos, contender in enumerate(round_order(self.args.contenders, rnd), 1):
                row: dict[str, Any] = {"phase": "throughput", "contender": contender, "size": size,
                                       "records": records, "bytes": loaded.key_bytes + loaded.value_bytes,
                                       "avg_value_bytes": round(loaded.value_bytes / records, 1),
                                       "round": rnd, "position": pos}
                tag = f"s{size}" + ("" if rnd == 1 else f"r{rnd}")
                self.measure(row, lambda r, c=contender, s=topic, t=tag: self.drain_one(c, s, t, records, r))

    def burn_in(self, topic: str, size: int, records: int, loaded_bytes: int) -> None:
        """Before the first measured drain of each value size, the raw pipe copies ``topic`` once into
        ``<topic>.burn-in``, unmeasured, in transactions of :data:`BURN_IN_TRANSACTION_RECORDS`. The brokers'
        warm-up (small transactions) leaves their bulk paths cold: the first drain of an invocation, whoever
        ran it, was slower than its own later drains (the tuned MirrorMaker 2 in first place 530,648 records/s
        against 735,224 in round 2, with 3 times the destination broker's CPU a record; mirrorflow
        504,679-560,031 against 879,454-906,566), which decided a row's mean by the order. A burn-in without
        transactions left their transactional paths to the first exactly_once drain (the destination broker's
        compiler took 126 samples of its first micro-batch on 6 December, 09:06). The JSON keeps what it took
        (``burn_in``)."""
        self.burned_in.add(size)
        row: dict[str, Any] = {"phase": "burn-in", "contender": BURN_IN, "size": size, "records": records,
                               "bytes": loaded_bytes}
        self.measure_quietly(row, lambda r: self.drain_one(BURN_IN, topic, f"s{size}-burn-in", records, r))
        self.doc.setdefault("burn_in", {})[str(size)] = {
            k: row.get(k) for k in ("status", "error", "wall_s", "records_per_s", "records_per_s_window",
                                    "cpu_window")}
        rate = row.get("records_per_s_window") or row.get("records_per_s")
        self.say(f"burn-in: the raw pipe copied {topic} once in transactions, unmeasured ({row.get('status')}, "
                 f"{row.get('wall_s')} s" + (f", {rate:,} records/s)" if rate else ")"))

    def fill_memory(self, label: str) -> None:
        """Fill the free memory with clean page cache before a round (:func:`bench.observe.fill_free_memory`):
        the brokers then grow their logs into memory reclaimed from the page cache, the same for every drain
        of the round. The JSON keeps what each fill wrote (``page_cache_fill``)."""
        if self.args.no_fill:
            return
        directory = self.out / "fill"
        directory.mkdir(parents=True, exist_ok=True)
        with Progress(TextColumn("filling free memory with page cache"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=True) as prog:
            task = prog.add_task("fill", total=None)
            try:
                done = fill_free_memory(directory, progress=lambda i, n: prog.update(task, completed=i, total=n))
            except OSError as exc:  # a full disk: the run goes on as with --no-fill, and says so
                self.doc["notes"].append(f"free memory not filled before {label}: {exc}")
                self.say(f"[red]free memory not filled before {label}: {exc}")
                return
        first = not self.doc.get("page_cache_fill")
        self.doc.setdefault("page_cache_fill", []).append({"before": label, **done})
        if first and not done["mb"]:
            # the run's first fill found the memory taken already: other files hold the page cache (an earlier
            # run's broker logs), and a drain may then read its source back from disk (disk_read_mb): at 1,000
            # partitions on 5 December, 30-1,025 MB of an 871 MB source a drain
            note = (f"free memory not filled before {label}: only {done['free_mb_before']:,.0f} MB free, the page "
                    f"cache holds other files (an earlier run's bench/results/<stamp>/state?); drains may read "
                    f"their source from disk (disk_read_mb)")
            self.doc["notes"].append(note)
            self.say(f"[yellow]{note}")
        if done["mb"]:
            self.say(f"filled {done['mb']:,} MB of free memory with page cache in {done['seconds']} s before "
                     f"{label} (free {done['free_mb_before']:,.0f} -> {done['free_mb_after']:,.0f} MB)")

    def measure_quietly(self, row: dict[str, Any], run: Any) -> None:
        """:meth:`measure` without a row of the results: a failure is noted in ``row`` and the run goes on."""
        try:
            run(row)
        except Exception as exc:  # noqa: BLE001 - an unmeasured step; the JSON says what happened
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}")
            if self.current:
                self.finish(self.current)

    def load_topic(self, topic: str, size: int, records: int) -> Loaded:
        schema_id = self.source_topic(topic)
        with Progress(TextColumn("loading {task.description}"), BarColumn(), MofNCompleteColumn(),
                      TimeElapsedColumn(), console=self.console, transient=True) as prog:
            task = prog.add_task(topic, total=records)
            loaded = load(self.ep.src_bootstrap, topic, records, size, self.args.partitions, schema_id,
                          progress=lambda n: prog.advance(task, n))
        mb = (loaded.key_bytes + loaded.value_bytes) / 1e6
        self.say(f"loaded {records:,} records ({mb:.1f} MB, {loaded.value_bytes / records:.0f} B values) "
                 f"into {topic} in {loaded.seconds:.1f}s")
        return loaded

    def drain_one(self, contender: str, topic: str, tag: str, records: int, row: dict[str, Any]) -> None:
        read_before = disk_read_mb()
        reclaim_before = reclaim_counts()
        run, dest = self.launch(contender, topic, tag, drain=True)
        row.update(destination_topic=dest, log=str(run.log), env=run.env_extra)
        watcher = DrainCounter(self.ep.dst_bootstrap, dest, expected=records)
        try:
            with self.console.status(f"{contender}: draining {records:,} records into {dest}") as st:
                def tick(a: Arrivals) -> None:
                    st.update(f"{contender}: ~{a.count:,}/{records:,} visible on {dest} "
                              f"({time.monotonic() - run.t0:.0f}s)")

                deadline = time.monotonic() + self.args.timeout
                ok = watcher.wait_for(lambda a: a.count >= records, deadline, run.alive, tick)
                if ok:
                    # the offsets count commit markers too: the records themselves decide
                    st.update(f"{contender}: counting the records on {dest}")
                    counted = watcher.count_records(max(deadline, time.monotonic() + 60))
                    ok = counted >= records
                    watcher.seen.count = counted
        finally:
            watcher.close()
        seen = watcher.seen
        row["watcher"] = watcher.looks_summary()
        if contender.startswith("mirrorflow-") and run.proc.poll() is None and ok:
            # --once: let it finish on its own so its log has every batch line and its exit time is known
            try:
                run.proc.wait(60)
            except Exception:  # noqa: BLE001
                pass
            run.alive()
        row["memory"] = self.finish(run)
        if run.cluster is not None:
            # the Spark cluster's processes: the executors and their Python workers started for this job, and the
            # master's and workers' daemons, which outlive it (their figures span the whole run)
            row["cluster_memory"] = run.cluster.summary()
        read_after = disk_read_mb()
        # what the machine read from disk while the contender ran (its source records, if the cache lost them)
        row["disk_read_mb"] = None if read_before is None or read_after is None else round(read_after - read_before, 1)
        # whether the kernel had to free memory while it ran (processes stopped for it, pages it scanned)
        row["reclaim"] = reclaim_between(reclaim_before, reclaim_counts())
        row["exit_code"] = run.proc.returncode
        row["visible"] = seen.count
        if not ok:
            why = f"{seen.count:,}/{records:,} visible"
            why += _death(run)
            row.update(status="failed", error=why, log_tail=run.log_tail())
            return
        done = seen.last_at or time.time()
        start = run.started_at
        log_start = None
        if contender.startswith("mirrorflow-"):
            batches = parse_batches(run.log.read_text(errors="replace"))
            with_data = [b for b in batches if b.summary.get("records")] or batches
            if with_data:
                log_start = with_data[0].started_at
            row["batches"] = [{"id": b.batch_id, "started_s": round(b.started_at - start, 2),
                               "seconds": b.summary.get("seconds"), "records": b.summary.get("records"),
                               "mirrored": b.summary.get("mirrored")} for b in batches]
            row["batch_seconds_total"] = round(sum(float(b.summary.get("seconds") or 0) for b in batches), 2)
            if run.exited_at:
                row["process_exit_s"] = round(run.exited_at - start, 2)
        row.update(status="ok", **steady_figures(records, row["bytes"], start, done, seen, log_start))
        if seen.at_10 is not None and seen.at_90 is not None and seen.at_90 > seen.at_10:
            window = seen.at_90 - seen.at_10
            row.update(window_s=round(window, 2), records_per_s_window=round(0.8 * records / window))
            row["largest_step_share"] = round(seen.largest_step / records, 3)
            if row["largest_step_share"] >= COARSE_STEP_SHARE:
                row["window_coarse"] = True
            mirror_cpu = run.cpu.between(seen.at_10, seen.at_90)  # on a cluster, the cluster's processes too
            cluster_cpu = run.cluster.cpu.between(seen.at_10, seen.at_90) if run.cluster is not None else None
            by_role = {role: t.cpu.between(seen.at_10, seen.at_90) for role, t in self.role_cpu.items()}
            # all the servers: the sum of the roles (None when a role has no figure for the window)
            known = [v for v in by_role.values() if v is not None]
            servers_cpu = sum(known) if by_role and len(known) == len(by_role) else None
            in_window = 0.8 * records
            row["cpu_window"] = {
                "mirror_cores": None if mirror_cpu is None else round(mirror_cpu / window, 2),
                "servers_cores": None if servers_cpu is None else round(servers_cpu / window, 2),
                "mirror_us_per_record": None if mirror_cpu is None else round(mirror_cpu / in_window * 1e6, 2),
                "servers_us_per_record": None if servers_cpu is None else round(servers_cpu / in_window * 1e6, 2)}
            if run.cluster is not None:  # the Spark cluster's part of the mirror's figures
                row["cpu_window"]["cluster_cores"] = None if cluster_cpu is None else round(cluster_cpu / window, 2)
                row["cpu_window"]["cluster_us_per_record"] = (None if cluster_cpu is None
                                                              else round(cluster_cpu / in_window * 1e6, 2))
            for role, used in by_role.items():
                row["cpu_window"][f"{role}_us_per_record"] = None if used is None else round(used / in_window * 1e6, 2)
                # the kernel's part: on a VM, memory the brokers' page cache takes anew costs far more of it
                system = self.role_cpu[role].system.between(seen.at_10, seen.at_90)
                row["cpu_window"][f"{role}_system_us_per_record"] = (None if system is None
                                                                      else round(system / in_window * 1e6, 2))
            harness = self.harness_cpu.cpu.between(seen.at_10, seen.at_90) if self.harness_cpu else None
            row["cpu_window"]["harness_cores"] = None if harness is None else round(harness / window, 2)
            # what else took the cores: the kernel's memory reclaimer, and the VM's host (steal)
            others = {"kswapd": self.kswapd_cpu.cpu if self.kswapd_cpu else None,
                      **(self.machine_cpu.kinds if self.machine_cpu else {})}
            for name, cores in cores_between(others, seen.at_10, seen.at_90).items():
                row["cpu_window"][f"{name}_cores"] = cores
            row["cpu_window"]["other_cores"] = other_cores(row["cpu_window"])

    # ------------------------------------------------------------------ phase 2: latency

    def latency_phase(self) -> None:
        for rnd in range(1, self.args.rounds + 1):
            self.fill_memory(f"latency round {rnd}")
            for pos, contender in enumerate(round_order(self.args.latency_contenders, rnd), 1):
                row: dict[str, Any] = {"phase": "latency", "contender": contender, "rate": self.args.rate,
                                       "seconds": self.args.seconds, "size": self.args.latency_size,
                                       "round": rnd, "position": pos}
                if contender.startswith("mirrorflow-"):
                    row["trigger"] = self.args.trigger
                self.measure(row, lambda r, c=contender, n=rnd: self.latency_one(c, r, n))

    def latency_one(self, contender: str, row: dict[str, Any], rnd: int = 1) -> None:
        """One latency measurement of ``contender`` on a topic (and, for mirrorflow, a group) of its own for the
        round ``rnd``."""
        topic = f"bench.lat.{contender}" + ("" if rnd == 1 else f".r{rnd}")
        if contender == "kcat" and self.kcat is None:
            raise Skip("kcat not installed")
        schema_id = self.source_topic(topic)
        producer = RateProducer(self.ep.src_bootstrap, topic, self.args.partitions, schema_id, self.args.latency_size)
        run: Running | NoProcess
        if contender == FLOOR:
            run, dest = NoProcess(FLOOR), topic
            watcher = DstWatcher(self.ep.src_bootstrap, topic, latency=True)
        else:
            run, dest = self.launch(contender, topic, "lat" if rnd == 1 else f"lat{rnd}", drain=False)
            watcher = DstWatcher(self.ep.dst_bootstrap, dest, latency=True)
        row.update(destination_topic=dest, log=str(run.log), env=run.env_extra)
        total = int(self.args.rate * self.args.seconds)
        try:
            with self.console.status(f"{contender}: starting (warm-up records every 0.5 s)") as st:
                # 1. wait until the contender delivers at all
                deadline = time.monotonic() + self.args.timeout
                next_warm = 0.0
                while watcher.seen.count == 0:
                    if time.monotonic() > deadline or run.alive() is not True:
                        row.update(status="failed", error="never delivered a warm-up record",
                                   log_tail=run.log_tail())
                        return
                    if time.monotonic() >= next_warm:
                        producer.warm()
                        next_warm = time.monotonic() + 0.5
                    watcher.poll(0.1)
                row["ready_s"] = round((watcher.seen.first_at or time.time()) - run.started_at, 2)
                row["warmup_s"] = self.args.warmup
                # 2. a short warm-up at the measured rate's cadence, then the measured window
                warm_until = time.monotonic() + self.args.warmup
                while time.monotonic() < warm_until:
                    producer.warm()
                    watcher.poll(0.05)
                if self.args.ramp_seconds:
                    # 3. optionally, the rate already, unmeasured: the window then starts on a mirror at its rate
                    st.update(f"{contender}: {self.args.rate:.0f} rec/s unmeasured for {self.args.ramp_seconds:.0f}s")
                    producer.run(self.args.rate, self.args.ramp_seconds, measured=False)
                    while not producer.done():
                        watcher.poll(0.05)
                    row["ramp_s"] = self.args.ramp_seconds
                st.update(f"{contender}: {self.args.rate:.0f} rec/s for {self.args.seconds:.0f}s")
                producer.run(self.args.rate, self.args.seconds)
                produced_from = time.time()

                def tick(a: Arrivals) -> None:
                    st.update(f"{contender}: {len(a.measured):,}/{total:,} measured records arrived "
                              f"(sent {producer.sent:,})")

                    # after the measured window, keep a trickle of unmeasured records going, as a live
                    # stream would: a pipe (kcat) may otherwise hold the last records in its buffer
                    if producer.done():
                        producer.warm()

                ok = watcher.wait_for(lambda a: len(a.measured) >= total,
                                      time.monotonic() + self.args.seconds + 120, run.alive, tick)
                producer.join(30)
                # the CPU samplers (every 0.25 s) past the window's end before the contender stops, or a row whose
                # records all arrived within a sample of it (the floor) has no cores over its window
                time.sleep(max(0.0, produced_from + self.args.seconds + CORES_GRACE_S - time.time()))
        finally:
            producer.stop()
            watcher.close()
            row["memory"] = self.finish(run)
        if run.cluster is not None:
            # the Spark cluster's processes: the executors and their Python workers started for this job, and the
            # master's and workers' daemons, which outlive it (their figures span the whole run)
            row["cluster_memory"] = run.cluster.summary()
        lats = list(watcher.seen.measured.values())
        row.update(sent=producer.sent, received=len(lats), duplicates=watcher.seen.duplicates,
                   p50_ms=_r(percentile(lats, 50)), p90_ms=_r(percentile(lats, 90)),
                   p99_ms=_r(percentile(lats, 99)), max_ms=_r(max(lats) if lats else None),
                   min_ms=_r(min(lats) if lats else None))
        # the p99 of the records produced after the first seconds: without the step from the warm-up's trickle to
        # the measured rate, which every mirror (not the floor) meets with a tail of its own
        settled = [ms for seq, ms in watcher.seen.measured.items() if seq >= self.args.rate * LATENCY_SETTLE_S]
        row["p99_settled_ms"] = _r(percentile(settled, 99))
        # where the cores went while the measured rate ran (its first seconds left out, as for the p99 above):
        # the contender's processes, each side's brokers, the registries, the harness itself; and the same over
        # those first seconds (``cores_step``), the step from the warm-up's trickle to the rate
        timelines = {"mirror": getattr(run, "cpu", None), **{r: t.cpu for r, t in self.role_cpu.items()},
                     "harness": self.harness_cpu.cpu if self.harness_cpu else None}
        if run.cluster is not None:  # on a Spark cluster, its part of the mirror's cores apart
            timelines["cluster"] = run.cluster.cpu
        row["cores"] = cores_between(timelines, produced_from + LATENCY_SETTLE_S, produced_from + self.args.seconds)
        row["cores_step"] = cores_between(timelines, produced_from, produced_from + LATENCY_SETTLE_S)
        row["windows"] = latency_windows(watcher.seen.measured, self.args.rate, LATENCY_WINDOW_S)
        if ok:
            row["status"] = "ok"
        else:
            row.update(status="failed", error=f"{len(lats):,}/{total:,} measured records arrived" + _death(run),
                       log_tail=run.log_tail())

    # ------------------------------------------------------------------ teardown

    def down(self) -> None:
        for sampler in (*self.role_cpu.values(), self.harness_cpu, self.kswapd_cpu, self.machine_cpu):
            if sampler is not None:
                sampler.stop()
        if self.current is not None:
            self.say(f"stopping {self.current.name}")
            self.finish(self.current)
        stopped = local_spark.down(self.env) if self.args.spark_workers else []
        stopped += local.down(self.env)
        self.say(f"clusters stopped ({len(stopped)} processes)")
        shutil.rmtree(self.out / "checkpoints", ignore_errors=True)
        shutil.rmtree(self.out / "fill", ignore_errors=True)


def round_order(contenders: list[str], rnd: int) -> list[str]:
    """The order of the contenders in round ``rnd`` (1-based): even rounds reverse the round before, and
    every pair of rounds starts one place further on, so over two rounds each contender's mean position is
    the same (the first drain after a load ran slower than the same drain later in the invocation)."""
    if not contenders:
        return []
    shift = ((rnd - 1) // 2) % len(contenders)
    order = contenders[shift:] + contenders[:shift]
    return order[::-1] if rnd % 2 == 0 else order


class Skip(Exception):
    """A contender that cannot run here (recorded as skipped, with the reason)."""


def _death(run: Running | NoProcess) -> str:
    """Why a contender stopped on its own: exit code and its first ERROR line ("" while it runs)."""
    if not isinstance(run, Running) or run.proc.returncode in (None, 0, -15, 143):
        return ""
    first = next((ln.strip() for ln in run.log.read_text(errors="replace").splitlines()
                  if " ERROR " in ln and "mirror failed" in ln), None)
    first = first or next((ln.strip() for ln in run.log.read_text(errors="replace").splitlines() if "ERROR" in ln), "")
    return f"; exited {run.proc.returncode}" + (f": {first[:300]}" if first else "")


def _note_load(row: dict[str, Any], start: float, end: float | None) -> None:
    """The 1-minute load average around a measurement: other work on the machine skews every figure."""
    row["loadavg_1m"] = {"start": round(start, 2), "end": None if end is None else round(end, 2),
                         "cpus": os.cpu_count()}


def _r(v: float | None) -> float | None:
    return None if v is None else round(v, 1)


def _mem_gb() -> float | None:
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        return round(kb / 1024 / 1024, 1)
    except (OSError, ValueError, IndexError):
        return None


#: a drain's window in which something the bench did not start took this many cores or more is named in its line
OTHER_CORES_SAID = 0.2


def other_cores(cpu: dict[str, Any]) -> float | None:
    """The cores busy in a drain's window with what the bench did not start (``busy_cores`` less the contender,
    the servers, the harness and kswapd): another process on the machine, kernel threads. On 6 December (11:05)
    the invocation's first drain had 0.68 cores of it, while its developer ran tests beside it, and ran at 0.6x
    its round-2 rate; every other drain of that run had -0.03 to 0.08. None when a part has no figure."""
    parts = [cpu.get(k) for k in ("busy_cores", "mirror_cores", "servers_cores", "harness_cores", "kswapd_cores")]
    if any(v is None for v in parts):
        return None
    busy, *known = parts
    return round(busy - sum(known), 2)


def _row_line(r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return f"[red]{r['phase']} {r['contender']}: {r.get('status')} - {r.get('error')}"
    if r["phase"] == "throughput":
        reclaim = r.get("reclaim") or {}
        stalls = (f", {reclaim['allocstall']:,} reclaim stalls ({reclaim['pgscan_direct']:,} pages scanned)"
                  if reclaim.get("allocstall") else "")
        other = (r.get("cpu_window") or {}).get("other_cores")
        if other is not None and other >= OTHER_CORES_SAID:
            stalls += f", [yellow]{other} cores busy with processes the bench did not start[/yellow]"
        return (f"{r['contender']} s{r['size']}: {r['records_per_s']:,} rec/s steady, wall {r['wall_s']}s "
                f"(startup {r['startup_s']}s), peak RSS {r['memory']['peak_rss_mb']} MB{stalls}")
    return (f"{r['contender']} latency: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms "
            f"({r['received']}/{r['sent']}), peak RSS {r['memory']['peak_rss_mb']} MB")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # a log file or pipe gets the whole table rather than 80 squeezed columns
    console = Console() if sys.stdout.isatty() else Console(width=170)
    bench = Bench(args, console)

    def on_term(_sig: int, _frm: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    t0 = time.monotonic()
    rc = 0
    try:
        bench.up()
        for size, records in zip(args.sizes, args.records, strict=True):
            if args.contenders:
                bench.drain_phase(size, records)
        if args.latency_contenders:
            bench.latency_phase()
    except KeyboardInterrupt:
        bench.doc["notes"].append("interrupted")
        console.log("[yellow]interrupted; stopping everything")
        rc = 130
    except Exception as exc:  # noqa: BLE001 - report, then tear down
        bench.doc["error"] = f"{type(exc).__name__}: {exc}"
        console.log(f"[red]benchmark failed: {exc}")
        rc = 1
    finally:
        try:
            bench.down()
        finally:
            bench.doc["total_s"] = round(time.monotonic() - t0, 1)
            bench.save()
    report.print_tables(console, bench.rows)
    console.log(f"results: {bench.json_path} (logs and configs in {bench.out})")
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
