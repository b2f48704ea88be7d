"""Spark entry point of the streaming mirror: ``build_query`` and a thin ``main``.

Spark's own Kafka source reads the source topics (read_committed, headers
included); each micro-batch goes through ``mapInArrow`` to the partition writer
in :mod:`mirror_core.replicate`. The Kafka source gives one Spark partition per
Kafka partition (``minPartitions`` is never set), so a Kafka partition is never
split across tasks and its order is kept. Small micro-batches are collected to
the driver (as Arrow) and written there by one long-lived writer that keeps the
transactional producers warm; see ``spark.driver_batch_max_records``.

    spark-submit spark_jobs/mirror_stream.py CONFIG --group G [--once]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import logging
import os
import re
import shlex
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from mirror_core import artifacts, clients, joblock, process
from mirror_core.config import (
    SUBMITTED_MASTER_ENV,
    GroupConfig,
    MirrorsConfig,
    load_group,
    transactional_id,
    with_master,
)
from mirror_core.errors import MirrorError
from mirror_core.logs import setup_logging
from mirror_core.process import DEFAULT_STOP_TIMEOUT
from mirror_core.replicate import release_producers
from mirror_core.stream import RESULT_DDL, CollectError, MirrorRuntime, arrow_writer, write_batches
from mirror_core.tls import write_private
from spark_jobs import jvm_archive, local_fs
from spark_jobs.local_fs import is_local_path

log = logging.getLogger("mirrorflow.stream")


LOCAL_CHECKPOINT_MANAGER = \
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"


def build_session(group: GroupConfig, app_name: str | None = None) -> SparkSession:
    """A session with the Kafka connector jars from the local cache (no resolution at run time)."""
    cache = artifacts.cache_dir()
    jars = artifacts.spark_kafka_jars(cache)
    fs_jar = local_fs.existing_jar(cache)
    # executors' Python workers must run this interpreter (the venv with confluent-kafka), not PATH's python3
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    conf = group.spark.public_conf()  # secret-looking values never go on the JVM's command line: below
    os.environ.update(jvm_archive.driver_env(group.spark.master, conf))  # read when the JVM starts
    builder = (
        SparkSession.builder.appName(app_name or f"mirrorflow-{group.name}")
        .master(group.spark.master)
        .config("spark.jars", ",".join(jars))
        .config("spark.ui.enabled", "false")
        # a mirror's progress is its batch lines; Spark's bar would draw over them whenever INFO is off
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # streaming queries run without it anyway; left on, Spark says so with a warning at every start
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "20000")
        .config("spark.python.worker.reuse", "true")
        # never two attempts of one task at once (whatever the cluster's defaults say): a speculative copy
        # writes the same records (its fencing makes one of them fail, at best), see config.SparkConfig
        .config("spark.speculation", "false")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
    )
    # a group's own options after mirrorflow's, as spark-submit gets them (jvm_archive.submit_conf): theirs
    # win where they overlap
    driver_options = jvm_archive.driver_options(cache, conf.get("spark.driver.extraJavaOptions", ""),
                                                direct=group.spark.plans_only)
    starts_jvm = local_fs.starts_jvm()
    scratch = scratch_dir(group.spark.master, conf, driver_options, starts_jvm)
    if scratch is not None:
        # the JVM's temporary directory, which Spark takes for its scratch files without spark.local.dir;
        # setting that makes Spark warn at every start that a cluster manager would override it
        given = jvm_archive.with_tmpdir(driver_options, scratch) if starts_jvm else None
        if given is not None:
            driver_options = given
        elif local_scratch(group.spark.master, conf):
            # a JVM already running (spark-submit started it): Spark's own setting, warning and all
            builder = builder.config("spark.local.dir", str(scratch))
    builder = builder.config("spark.driver.extraJavaOptions", driver_options)
    if fs_jar is not None:  # always, when built: the class-data sharing archive was made with this class path
        builder = builder.config("spark.driver.extraClassPath", str(fs_jar))
    if is_local_path(group.spark.checkpoint_dir):
        # Spark's default checkpoint manager (Hadoop FileContext) takes about 55 ms to close each small
        # offset/commit log file on a local disk, twice per micro-batch; the FileSystem one about 15 ms.
        # A local rename is atomic either way; other stores keep Spark's default.
        builder = builder.config("spark.sql.streaming.checkpointFileManagerClass", LOCAL_CHECKPOINT_MANAGER)
        # and no chmod process per checkpoint file (spark_jobs/local_fs.py)
        for k, v in local_fs.session_conf(group.spark.master, fs_jar, conf).items():
            builder = builder.config(k, v)
    for k, v in conf.items():
        if k == "spark.driver.extraJavaOptions":
            continue  # given above
        if k == "spark.driver.extraClassPath" and fs_jar is not None:
            v = f"{fs_jar}{os.pathsep}{v}"
        builder = builder.config(k, v)
    secret = group.spark.secret_conf()
    if starts_jvm:
        with secret_conf_file(secret):
            spark = builder.getOrCreate()
    else:  # spark-submit started the JVM (its command line is whoever ran it): the options go in as usual, and
        # spark.hadoop.* on the Hadoop configuration too, in case a context was made before this session
        for k, v in secret.items():
            builder = builder.config(k, v)
        spark = builder.getOrCreate()
        set_hadoop_options(spark, secret)
    leave_stop_signals_to_python(spark)
    spark.sparkContext.setLogLevel("WARN")
    quiet_spark_loggers(spark)
    if is_local_path(group.spark.checkpoint_dir):
        local_fs.install(spark)  # a JVM started before this session: where Spark has not cached one yet
    return spark


#: a job's private directory for the properties file of its secret ``spark.conf`` values (:func:`secret_conf_file`):
#: this, its process id, ``-``, its host's hash, ``-`` (see :func:`clients.private_dir`)
SECRET_CONF_PREFIX = "mirrorflow-sparkconf-"
#: how pyspark's ``launch_gateway`` is told what else to hand ``spark-submit`` (after the ``--conf`` options it
#: makes of the session's builder options)
SUBMIT_ARGS_ENV = "PYSPARK_SUBMIT_ARGS"


@contextlib.contextmanager
def secret_conf_file(secret: dict[str, str]) -> Iterator[None]:
    """While the block starts the driver JVM, its ``secret`` Spark options are in a 0600 properties file that
    ``spark-submit`` is given with ``--properties-file`` (``--load-spark-defaults``: Spark's
    ``spark-defaults.conf`` is still read, under it) through :data:`SUBMIT_ARGS_ENV`. pyspark turns every
    builder option into ``--conf key=value`` on the ``spark-submit`` and ``java`` command lines, which ``ps``
    shows every user of the host; the file's path is all they show now. The file's directory is removed when
    the block ends (the JVM has read it by then), or by the next job on the host when a SIGKILL cut it short."""
    if not secret:
        yield
        return
    before = os.environ.get(SUBMIT_ARGS_ENV)
    args = before or "pyspark-shell"
    if any(a.split("=", 1)[0] == "--properties-file" for a in shlex.split(args)):
        raise MirrorError(f"{SUBMIT_ARGS_ENV} names a --properties-file: the secret spark.conf options "
                          f"({', '.join(sorted(secret))}) need their own; put them in that file instead")
    directory = clients.private_dir(SECRET_CONF_PREFIX)
    try:
        path = write_private(directory / "spark.properties", clients.properties_text(secret).encode())
        os.environ[SUBMIT_ARGS_ENV] = f"--properties-file {shlex.quote(str(path))} --load-spark-defaults {args}"
        yield
    finally:
        if before is None:
            os.environ.pop(SUBMIT_ARGS_ENV, None)
        else:
            os.environ[SUBMIT_ARGS_ENV] = before
        shutil.rmtree(directory, ignore_errors=True)


HADOOP_PREFIX = "spark.hadoop."


def set_hadoop_options(spark: SparkSession, options: dict[str, str]) -> None:
    """The ``spark.hadoop.*`` of ``options`` set on the running context's Hadoop configuration (without the
    prefix), where a session's options for an existing context do not go. File systems are made when a path
    first needs one, so before any query starts is in time for its checkpoint's."""
    hadoop: Any = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    for k, v in options.items():
        if k.startswith(HADOOP_PREFIX):
            hadoop.set(k[len(HADOOP_PREFIX):], v)


#: a job's private scratch directory for Spark (:func:`scratch_dir`): this, its process id, ``-``, its host's hash,
#: ``-`` (see :func:`clients.private_dir`)
SPARK_SCRATCH_PREFIX = "mirrorflow-spark-"


def scratch_dir(master: str, conf: dict[str, str], driver_options: str = "",
                starts_jvm: bool = True) -> Path | None:
    """This process's private directory for Spark's scratch files, removed when this process exits, and at the
    next job's start when a SIGKILL left it (:func:`clients.private_dir`). Spark removes its own only when its
    JVM ends normally: each job killed (a forced stop, ``spark-submit`` killed by Airflow's ``on_kill``) left
    some 10 MB in the machine's temporary directory.

    When this process starts the driver JVM (any master) it is the JVM's temporary directory, where Spark keeps
    the driver's block manager, the connector jars' copies, its Python workers' files and its artifact
    directory; None if the driver's options (``driver_options``) name one of their own. When ``spark-submit``
    started the JVM it is ``spark.local.dir`` on a ``local[...]`` master (:func:`local_scratch`); None
    elsewhere."""
    if starts_jvm:
        return None if jvm_archive.TMPDIR_OPTION in driver_options else _private_scratch()
    return _private_scratch() if local_scratch(master, conf) else None


def local_scratch(master: str, conf: dict[str, str]) -> bool:
    """Spark's scratch files go to this process's directory by ``spark.local.dir``: a ``local[...]`` master (the
    driver's JVM is the executor too; elsewhere a cluster manager overrides it) whose group sets none."""
    return master.startswith("local") and "spark.local.dir" not in conf


@functools.cache
def _private_scratch() -> Path:
    """One per process: a session built again in the same process keeps the first one's directory."""
    path = clients.private_dir(SPARK_SCRATCH_PREFIX)
    atexit.register(shutil.rmtree, path, True)
    return path


def leave_stop_signals_to_python(spark: SparkSession) -> None:
    """The driver's JVM ignores SIGTERM and SIGHUP (pyspark already has it ignore SIGINT): a stop is this
    process's to carry out (:class:`Stopper`: the batch ends, the query stops, then Spark). A signal sent to
    the job's whole process group or control group (``kill -TERM -<pgid>``, a service manager's default)
    would otherwise also run the JVM's shutdown hooks, which stop Spark under the running query: a wall of
    Java and py4j tracebacks and a batch cut short. The JVM still ends with this process (its gateway ends
    when the pipe from this process closes) and with a SIGKILL.

    Only for a JVM this process started: under ``spark-submit`` the JVM started this process, and a SIGTERM
    to it (a pod's deletion, ``kill <pid>``) must still stop the job."""
    jvm: Any = spark.sparkContext._jvm
    try:
        parent = jvm.java.lang.ProcessHandle.current().parent()
        if not (parent.isPresent() and parent.get().pid() == os.getpid()):
            return
        for name in ("TERM", "HUP"):
            jvm.sun.misc.Signal.handle(jvm.sun.misc.Signal(name), jvm.sun.misc.SignalHandler.SIG_IGN)
    except Exception as exc:  # noqa: BLE001 - a JVM without sun.misc.Signal: only the output suffers
        log.debug("the JVM keeps its own SIGTERM handling: %s", exc)


#: Spark loggers whose warnings repeat on every micro-batch or stop and tell an operator nothing mirrorflow's own
#: lines do not: a trigger shorter than a batch's cycle ("Current batch is falling behind", which a latency-
#: minded trigger of 50 ms hits on most batches) is what that trigger asks for; a query stopped between two
#: batches has no job to cancel ("Failed to cancel job group ... Cannot find active jobs for it", twice a stop)
QUIET_SPARK_LOGGERS = ("org.apache.spark.sql.execution.streaming.runtime.ProcessingTimeExecutor",
                       "org.apache.spark.scheduler.DAGScheduler")


def quiet_spark_loggers(spark: SparkSession) -> None:
    """Errors only from :data:`QUIET_SPARK_LOGGERS` (best effort: a Spark without them is left as it is)."""
    jvm = spark.sparkContext._jvm
    try:
        level = jvm.org.apache.logging.log4j.Level.ERROR  # type: ignore[union-attr]
        for name in QUIET_SPARK_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, level)  # type: ignore[union-attr]
    except Exception as exc:  # noqa: BLE001 - only log noise is at stake
        log.debug("could not quiet Spark's per-batch warnings: %s", exc)


def hadoop_checkpoint_reader(spark: SparkSession) -> Any:
    """A checkpoint reader (``mirror_core.stream.CheckpointReader``) that goes through Hadoop's file
    system, as Spark itself writes the checkpoint: ``s3a://``, ``hdfs://``, ``file:`` and the rest."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]

    def read(location: str) -> str | None:
        path = jvm.org.apache.hadoop.fs.Path(location)  # type: ignore[union-attr]
        fs = path.getFileSystem(conf)
        if not fs.exists(path):
            return None
        stream = fs.open(path)
        try:
            data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)  # type: ignore[union-attr]
        finally:
            stream.close()
        return bytes(data).decode(errors="replace")

    return read


class HadoopCheckpointFiles:
    """mirrorflow's own files in a checkpoint (``mirror_core.stream.WrittenLog``) through Hadoop's file system,
    as Spark writes its logs: ``s3a://``, ``hdfs://`` and the rest."""

    def __init__(self, spark: SparkSession):
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
        self.read = hadoop_checkpoint_reader(spark)

    def _fs(self, location: str) -> tuple[Any, Any]:
        path = self.jvm.org.apache.hadoop.fs.Path(location)  # type: ignore[union-attr]
        return path.getFileSystem(self.conf), path

    def create(self, location: str, text: str) -> None:
        fs, path = self._fs(location)
        out = fs.create(path, True)
        try:
            out.write(bytearray(text.encode()))
        finally:
            out.close()

    def names(self, location: str) -> list[str]:
        fs, path = self._fs(location)
        if not fs.exists(path):
            return []
        return [st.getPath().getName() for st in fs.listStatus(path)]

    def delete(self, location: str) -> None:
        fs, path = self._fs(location)
        fs.delete(path, False)


def prepare(rt: MirrorRuntime) -> None:
    """Provision the group's topics and schemas, check the destination lets its principal use the group's
    transactional ids (exactly_once), then warm its writers up in the background."""
    for line in rt.prepare():
        log.info("%s: %s", rt.group.name, line)
    if any(s.delivery == "exactly_once" for s in rt.settings.values()):
        probe = transactional_id(rt.group.name, rt.group.source, "access-check", "-")
        clients.check_transactional_access(rt.group.destination, rt.dst, probe)
    rt.warm_up()


def build_query(spark: SparkSession, cfg: MirrorsConfig, group: GroupConfig, *, once: bool = False,
                runtime: MirrorRuntime | None = None, on_batch: Any = None, prepared: bool = False) -> StreamingQuery:
    """Provision the group (unless ``prepared``), then start its streaming query (``once``: drain what is
    there and stop)."""
    rt = runtime or MirrorRuntime(cfg, group)
    if not is_local_path(group.spark.checkpoint_dir) or group.spark.checkpoint_dir.lower().startswith("file:"):
        # the offset log tells the mirror each batch's end offsets (new topics, batch sizes): read it as
        # Spark wrote it; a plain local path is read directly (faster, and the same bytes)
        rt.read_checkpoint = hadoop_checkpoint_reader(spark)
        rt.checkpoint_files = HadoopCheckpointFiles(spark)
    if not prepared:
        prepare(rt)
    reader = spark.readStream.format("kafka")
    for k, v in rt.source_options(once).items():
        reader = reader.option(k, v)
    source = reader.load()
    drains = once or group.spark.trigger == "available_now"  # ends when what is there is written

    def report(batch_id: int, rows: list[dict[str, Any]], t0: float, t1: float, written_by: str, read_by: str,
               transactions: str, waited: float = 0.0) -> None:
        t2 = time.monotonic()
        summary = rt.after_batch(batch_id, rows, t2 - t0)
        summary["written_by"] = written_by
        summary["read_by"] = read_by
        summary["transactions"] = transactions  # as spark.transactions resolved (auto: per_writer reading directly)
        summary["driver_ms"] = {"plan": round((t1 - t0) * 1000), "tasks": round((t2 - t1) * 1000),
                                "after": round((time.monotonic() - t2) * 1000)}
        if waited:
            # how long the batch waited for the batch before's write (spark.overlap_writes)
            summary["driver_ms"]["waited"] = round(waited * 1000)
        log.info("%s batch %d: %s", group.name, batch_id, summary)
        if log.isEnabledFor(logging.DEBUG):
            for r in sorted(rows, key=lambda r: (r["topic"], r["partition"])):
                log.debug("%s batch %d: %s[%d]: %d records read (offsets %s-%s), upstream end %s, %d mirrored",
                          group.name, batch_id, r["topic"], r["partition"], r["records_in"], r["first_offset"],
                          r["last_offset"], r["upstream_end"], r["mirrored"])
        if on_batch is not None:
            on_batch(summary)

    def for_each_batch(df: DataFrame, batch_id: int) -> None:
        t0 = time.monotonic()
        direct = group.spark.reads_directly
        if direct and group.spark.overlap_writes:
            # the batch before may still be writing (it ran on while Spark planned this one): it finishes
            # first, and its failure fails this batch (a restart re-reads it, see MirrorRuntime.replay_starts)
            rt.wait_for_write()
            waited, t0 = time.monotonic() - t0, time.monotonic()
            plan = rt.writer_plan(batch_id)
            overlap = rt.overlaps(batch_id, plan)  # a large batch (a backlog) is written before Spark goes on
            t1 = time.monotonic()
            rt.write_direct_behind(plan, batch_id,
                                   lambda rows: report(batch_id, rows, t0, t1, "driver", "direct", plan.transactions,
                                                      waited))
            if not overlap:
                rt.wait_for_write()
            return
        plan = rt.writer_plan(batch_id)
        # A small batch is collected and written here, by the driver's long-lived writer: its producers
        # and positions stay warm. Tasks land on whichever Python worker is free, so a partition that
        # moves costs a new producer, a fence and a position lookup; worth it only for large batches.
        on_driver = direct or rt.on_driver(batch_id)
        in_tasks = group.spark.reads_in_tasks
        t1 = time.monotonic()
        rows = None
        if in_tasks and not on_driver:
            # Spark planned the batch; its tasks read their shares of the ranges with mirrorflow's reader and
            # write them (df is never evaluated)
            rt.stop_warm_up()
            release_producers()  # the tasks' producers fence the driver's
            sc = spark.sparkContext
            rows = rt.write_in_tasks(plan, batch_id, sc.defaultParallelism,
                                     lambda shares, fn: sc.parallelize(shares, len(shares)).mapPartitions(fn).collect(),
                                     task_attempt)
        elif direct or in_tasks:
            # Spark planned the batch (its offset log); the driver reads the ranges itself: df is never
            # evaluated, so Spark fetches nothing. Always the driver on the direct path (see README, The data
            # path); with read_path: executors a small batch, as Spark's read path collects one
            rows = rt.write_direct(plan, batch_id)
            if not drains:
                rows = rt.keep_writing(plan, batch_id, rows)  # spark.keep_writing_for (else as they are)
        elif on_driver:
            try:
                rows = write_batches(plan, arrow_batches(df))
            except CollectError as exc:
                # partitions written before the failure stay written; exactly_once tasks skip them by their
                # committed positions (at_least_once may write them twice, as after any retry)
                log.warning("%s batch %d: collecting to the driver failed (%s); the tasks write it",
                            group.name, batch_id, failure_reason(str(exc)))
                on_driver = False
        if rows is None:
            rt.stop_warm_up()
            release_producers()  # the tasks' producers fence the driver's
            rows = [r.asDict() for r in df.mapInArrow(arrow_writer(plan), RESULT_DDL).collect()]
        rows += rt.write_rewound(plan)  # partitions whose end moved back: Spark dropped their range
        report(batch_id, rows, t0, t1, "driver" if on_driver else "tasks",
               "direct" if direct or in_tasks else "spark", plan.transactions)

    rt.rewind_unwritten_batch()  # a batch whose write a crash cut short runs again, also on a quiet source
    writer = source.writeStream.foreachBatch(for_each_batch).option("checkpointLocation", rt.checkpoint_dir())
    writer = writer.queryName(f"mirrorflow-{group.name}")
    if drains:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=group.spark.trigger)
    return writer.start()


def task_attempt() -> int:
    """In a Spark task: which attempt of it this is (0: the first; more: a retry, after an attempt that failed or
    one Spark gave up on when it lost its executor, which may still run); 0 elsewhere."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return 0 if ctx is None else ctx.attemptNumber()


def arrow_batches(df: DataFrame) -> Iterator[Any]:
    """The micro-batch as Arrow record batches, yielded as Spark's tasks finish (``df.toArrow()`` returns
    only when every partition is in). This is the stream ``toArrow`` reads; a Spark partition's batches
    arrive together and in order, and the order across partitions, sent at the end, is not needed: the
    writer keeps order per Kafka partition. A failure in Spark is raised when the stream reaches it."""
    import pyarrow as pa
    from pyspark.errors.exceptions.captured import unwrap_spark_exception
    from pyspark.sql.pandas.serializers import ArrowCollectSerializer
    from pyspark.traceback_utils import SCCallSiteSync
    from pyspark.util import _load_from_socket

    with SCCallSiteSync(df.sparkSession.sparkContext):
        port, secret, server = df._jdf.collectAsArrowToPython()
    try:
        with _load_from_socket((port, secret), ArrowCollectSerializer()) as stream:
            for item in stream:
                if isinstance(item, pa.RecordBatch):
                    yield item
    finally:
        with unwrap_spark_exception():
            server.getResult()  # the serving thread's own failure, if any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mirror_stream", description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--group", required=True)
    ap.add_argument("--once", action="store_true", help="drain what is there now, then stop")
    ap.add_argument("--stop-timeout", type=float, default=None,
                    help="seconds a stop may take before the job's processes are killed (default: spark.stop_timeout)")
    ap.add_argument("--verbose", action="store_true",
                    help="mirrorflow's own debug lines too (each batch's offsets per partition)")
    args = ap.parse_args(argv)
    setup_logging(verbose=args.verbose)
    # before anything that can block (provisioning, the JVM's start): a stop is bounded from the start
    stopper = Stopper(args.group, args.stop_timeout or DEFAULT_STOP_TIMEOUT)
    stopper.install()
    cfg = load_group(args.config, args.group)  # another group's mistake does not stop this one
    # submitted by Airflow: the Spark connection's master, not the group's (the session's master would win)
    group = with_master(cfg.group(args.group), os.environ.get(SUBMITTED_MASTER_ENV))
    if args.stop_timeout is None:
        stopper.timeout = group.spark.stop_timeout
    from mirror_core import stops

    # a failover's stop, read on the destination wherever the job runs: now, then by a thread every second
    stop_watch = stops.Watch(cfg, group)
    try:
        return _run_job(args, cfg, group, stopper, stop_watch)
    finally:
        stop_watch.close()


def _run_job(args: argparse.Namespace, cfg: MirrorsConfig, group: GroupConfig, stopper: Stopper,
             stop_watch: Any) -> int:
    from mirror_core import metrics, stops

    try:
        stopped = stop_watch.first()
    except stops.StopSignalError as exc:
        log.error("%s: cannot start the mirror: %s", group.name, exc)
        return stopper.finished(1)
    if stopped:
        log.info("%s: not started: %s", group.name, stopped)
        return 0
    lock = joblock.lock_path(group.spark.checkpoint_dir, group.name)
    if lock is not None:
        try:
            # kept until this process exits (the kernel releases it, however the process ends); the wait ends
            # on a stop, or on a failover's stop written meanwhile (a failover behind the drain this job waits for)
            if not joblock.take(joblock.JobLock(lock), joblock.Holder.me(args.once), group=group.name,
                                patience=joblock.patience(stopper.timeout),
                                stop=lambda: stopper.requested or stop_watch() is not None):
                stopped = stop_watch()
                if stopped:
                    log.info("%s: not started: %s", group.name, stopped)
                return stopper.finished(0)
        except joblock.CheckpointBusy as exc:
            log.error("%s", exc)
            return stopper.finished(1)
        except joblock.CheckpointLockError as exc:
            log.error("%s: cannot start the mirror: %s", group.name, exc)
            return stopper.finished(1)
        try:  # a failover may have stopped the group meanwhile (the watch looks only once a second)
            stopped = stops.requested(cfg, group, timeout=stops.WATCH_TIMEOUT_S)
        except stops.StopSignalError as exc:
            log.error("%s: cannot start the mirror: %s", group.name, exc)
            return stopper.finished(1)
        if stopped:
            log.info("%s: not started: %s", group.name, stopped)
            return stopper.finished(0)

    metrics.serve(group.spark.metrics_port)
    from mirror_core import native

    rt = MirrorRuntime(cfg, group)
    if not native.available() and any(m.settings.delivery == "exactly_once" for m in rt.mirrors):
        log.info("%s: the C produce loop is not used (%s): every record is produced from Python, at more CPU "
                 "per record", group.name, native.why_not())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirrorflow-prepare") as pool:
        # provisioning is network round trips: it runs while the Spark session (a JVM) starts
        provisioned = pool.submit(prepare, rt)
        spark = build_session(group)
        try:
            provisioned.result()
        except MirrorError as exc:
            log.error("%s: cannot start the mirror: %s", group.name, exc)
            spark.stop()
            return stopper.finished(1)
    if stopper.requested:
        spark.stop()
        return stopper.finished(0)
    rt.stop_requested = lambda: stopper.requested  # a batch that keeps writing (spark.keep_writing_for) ends
    query = build_query(spark, cfg, group, once=args.once, runtime=rt, prepared=True)
    rc = run_until_done(query, group.name, stopper, stop_watch)
    rc = finish_writes(rt, group.name, rc)
    log.info("%s: counted by this run: %s", group.name, "; ".join(metrics.counter_samples(group.name)) or "nothing")
    rt.stop_warm_up(timeout=1.0)
    rt.close()
    spark.stop()  # the JVM ends its Python workers; then this process ends the JVM
    return stopper.finished(rc)


class Stopper:
    """Bounded stop of this job and every process it started (Spark's JVM and its Python workers).

    SIGTERM, SIGINT, SIGHUP, or the death of the process that started the job (``spark-submit`` killed by
    Airflow's ``on_kill``, ``mirrorflow run`` killed) request a stop: the running micro-batch may finish
    (its transactions commit), the query and Spark stop. If that has not happened ``timeout`` seconds
    after the request (brokers unreachable, a batch stuck), every process below this one is killed and
    this one exits with 1: an open destination transaction is then aborted when the mirror next starts
    (its writer fences it), so nothing is lost or duplicated."""

    #: shares of the timeout: the graceful path may use the first, the forced stop starts at the second;
    #: the rest is for killing and for the kernel to tear big JVMs down on a loaded machine (whoever
    #: started the job kills what is left at 85%)
    GRACEFUL_SHARE = 0.6
    FORCE_AT = 0.75

    def __init__(self, group_name: str, timeout: float):
        self.group_name = group_name
        self.timeout = timeout
        self._requested = threading.Event()
        self._done = threading.Event()
        self._requested_at = float("inf")
        self._parent = os.getppid()

    @property
    def requested(self) -> bool:
        return self._requested.is_set()

    def graceful_left(self) -> float:
        """Seconds the graceful path still has (its budget ends before the forced stop)."""
        return max(0.0, self._requested_at + self.GRACEFUL_SHARE * self.timeout - time.monotonic())

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda signum, _frame: self.request(f"signal {signum}"))
        threading.Thread(target=self._watch_parent, name="mirrorflow-parent-watch", daemon=True).start()

    def request(self, why: str) -> None:
        if self._requested.is_set():
            return
        self._requested_at = time.monotonic()
        self._requested.set()
        log.info("%s: %s, stopping (after the current batch; everything ends within %.0fs)", self.group_name, why,
                 self.timeout)
        threading.Thread(target=self._force_at_deadline, name="mirrorflow-stop-deadline", daemon=True).start()

    def finished(self, rc: int) -> int:
        """The job's work is over; returns ``rc``. A requested stop's deadline stays armed until the process
        has exited: a shutdown that hangs (a non-daemon thread, the JVM) is still bounded."""
        self._done.set()
        return rc

    def _watch_parent(self) -> None:
        """Requests a stop when the parent process ends, or the process that owns the job (``OWNER_ENV``,
        set by Airflow's task: spark-submit, this job's parent, outlives a SIGKILLed task)."""
        owner = os.environ.get(process.OWNER_ENV, "")
        seen = process.owner_alive(owner) if owner else None
        if owner and seen is None:
            log.debug("%s: the owner %s is not a process this machine can see; not watched", self.group_name, owner)
            owner = ""
        if seen is False:  # it died while the job started
            self.request(f"the process that started it ({owner.rsplit(':', 2)[1]}) ended")
            return
        while not self._done.wait(1.0):
            if os.getppid() != self._parent:
                self.request(f"parent process {self._parent} ended")
                return
            if owner and process.owner_alive(owner) is False:
                self.request(f"the process that started it ({owner.rsplit(':', 2)[1]}) ended")
                return

    def _force_at_deadline(self) -> None:
        time.sleep(max(0.0, self._requested_at + self.FORCE_AT * self.timeout - time.monotonic()))

        left = process.tree(os.getpid())[1:]
        log.error("%s: not stopped within %.0fs; killing %d processes (an open transaction is aborted when "
                  "the mirror next starts)", self.group_name, self.timeout, len(left))
        process.kill_all(left, wait=max(1.0, (1.0 - self.FORCE_AT) * self.timeout / 2))
        # the exit handlers still run (they remove the private secrets directory), for a bounded time
        cleanup = threading.Thread(target=atexit._run_exitfuncs, name="mirrorflow-exit-handlers", daemon=True)
        cleanup.start()
        cleanup.join(2.0)
        logging.shutdown()
        os._exit(1)


def run_until_done(query: StreamingQuery, group_name: str, stopper: Stopper | None = None,
                   stop_requested: Any = None) -> int:
    """Wait for the query; a stop request (a signal, the parent's death, or ``stop_requested()`` returning a
    reason: a failover's stop, :class:`mirror_core.stops.Watch`) lets the running micro-batch finish (within the stop's graceful
    budget), then stops the query. Returns the exit code: 0 when it finished or was stopped, 1 when it
    failed (one clear line naming the record that stopped it)."""
    if stopper is None:
        stopper = Stopper(group_name, DEFAULT_STOP_TIMEOUT)
        stopper.install()
    try:
        while not stopper.requested:
            if query.awaitTermination(1):
                break
            reason = stop_requested() if stop_requested is not None else None
            if reason:
                stopper.request(reason)  # a failover's stop
        if stopper.requested:
            wait_for_batch_end(query, timeout=stopper.graceful_left())
            query.stop()
        query.awaitTermination()
    except StreamingQueryException as exc:
        log.error("%s: mirror failed: %s", group_name, failure_reason(str(exc)))
        return 1
    return 0


def finish_writes(rt: MirrorRuntime, group_name: str, rc: int) -> int:
    """Wait for the last micro-batch's write when it runs on after its batch (``spark.overlap_writes``): the job
    ends once everything Spark planned is written. Returns ``rc``, or 1 when that write failed (one line)."""
    try:
        rt.wait_for_write()
    except Exception as exc:  # noqa: BLE001 - whatever stopped the write: one line, and the job fails
        log.error("%s: mirror failed: %s", group_name, failure_reason(f"{type(exc).__name__}: {exc}"))
        return 1
    return rc


def wait_for_batch_end(query: StreamingQuery, timeout: float = 120.0) -> None:
    """Let a running micro-batch finish (``query.stop()`` interrupts it; a replay would redo it)."""
    deadline = time.monotonic() + timeout
    while query.isActive and time.monotonic() < deadline:
        try:
            if not query.status.get("isTriggerActive"):
                return
        except Exception:  # noqa: BLE001 - the query may end while we ask
            return
        time.sleep(0.05)


def failure_reason(text: str) -> str:
    """The writer's own message out of a Spark failure's nested traces (else the first line)."""
    found = re.findall(r"(?:DestinationTopicError|WriterError|MirrorError|PlanError|PlacementChangeError|UnknownTopicError|AccessDeniedError): ([^\n]+)", text)
    if found:
        return found[-1].strip()
    kafka = re.findall(r'KafkaError\{[^}]*code=(\w+)[^}]*str="([^"]*)"', text)
    if kafka:
        code, detail = kafka[-1]
        return f"kafka: {detail} ({code})"
    return text.strip().splitlines()[0] if text.strip() else "unknown error"


if __name__ == "__main__":
    sys.exit(main())
