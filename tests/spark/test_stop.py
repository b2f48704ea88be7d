"""Stopping a mirror is bounded and leaves no process behind; exactly_once loses and duplicates nothing.

Three ways a mirror is stopped: SIGTERM to ``mirrorflow run`` (a user, a service manager), the death of
the process that started the job (Airflow's ``SparkSubmitOperator.on_kill`` SIGKILLs ``spark-submit``),
and a stop while the brokers are unreachable (frozen with SIGSTOP: connections hang, nothing answers).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from confluent_kafka import KafkaException
from test_mirror_e2e import _dst_count, create_topic, group_yaml, read_all, run_once  # tests/spark is on sys.path

from mirror_core import artifacts, process
from mirror_core.clients import SECRETS_DIR_PREFIX
from spark_jobs.jvm_archive import submit_tmpdir
from spark_jobs.mirror_stream import SPARK_SCRATCH_PREFIX

pytestmark = [pytest.mark.spark, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]
STOP_TIMEOUT = 30.0  # the default


class Producing:
    """Keys 0, 1, 2, ... over 3 partitions, about 2000 records/s, until :meth:`stop`, which returns the
    total: the mirror is mid-stream whenever it is stopped."""

    def __init__(self, bootstrap: str, topic: str, tmp_path: Path, limit: int | None = None):
        self.stop_file = tmp_path / f"{topic}.stop"
        self.proc = subprocess.Popen([sys.executable, "-c", f"""
import os, time
from confluent_kafka import Producer
p = Producer({{"bootstrap.servers": "{bootstrap}", "enable.idempotence": True, "linger.ms": 20}})
i = 0
while not os.path.exists("{self.stop_file}") and i < {limit or 10**9}:
    try:
        p.produce("{topic}", key=str(i).encode(), value=str(i).encode() * 3, partition=i % 3)
        i += 1
    except BufferError:
        p.poll(0.05)
    if i % 200 == 0:
        p.poll(0); time.sleep(0.1)
assert p.flush(60) == 0
print(i)
"""], stdout=subprocess.PIPE, text=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int:
        self.stop_file.touch()
        out, _ = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0
        return int(out.strip())


def mirrored(bootstrap: str, topic: str) -> bool:
    """Some records reached ``topic`` (a topic just created may not have its leaders yet: not yet)."""
    try:
        return _dst_count(bootstrap, topic) > 0
    except KafkaException:
        return False


def private_tmp(tmp_path: Path) -> dict[str, str]:
    """The environment of a job whose temporary files (its private secrets directory) go under tmp_path."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return os.environ | {"TMPDIR": str(tmp_path / "tmp")}


def secrets_dirs(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "tmp").glob(f"{SECRETS_DIR_PREFIX}*"))


def scratch_dirs(tmp_path: Path) -> list[Path]:
    """The private directories of local-mode jobs under :func:`private_tmp` for Spark's scratch files."""
    return list((tmp_path / "tmp").glob(f"{SPARK_SCRATCH_PREFIX}*"))


def spark_scratch(tmp_path: Path) -> list[Path]:
    """What Spark of a local-mode job under :func:`private_tmp` keeps on disk: its block manager, the
    connector jars' copies, its Python workers' files (``spark.local.dir``, the job's private directory)."""
    return [p for d in scratch_dirs(tmp_path) for p in d.iterdir()]


def with_a_source_secret(path: Path) -> None:
    """Give the job's source a Java-only secret (a trust store password, unused over PLAINTEXT): the job then
    writes its private secrets directory (an unsecured source's job makes none), which the stop must remove."""
    import yaml

    doc = yaml.safe_load(path.read_text())
    doc["clusters"]["src"].setdefault("java_kafka", {})["ssl.truststore.password"] = "unused-over-plaintext"
    path.write_text(yaml.safe_dump(doc))


def wait_until(what: str, check, timeout: float = 180.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"job exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def answers(bootstrap: str, topic: str) -> bool:
    """The cluster answers a metadata and a describe-configs request for ``topic`` within 5 s."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        admin.list_topics(topic, timeout=5)
        for fut in admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)], request_timeout=5).values():
            fut.result(5)
        return True
    except Exception:
        return False


def job_tree(pid: int, workers: bool, timeout: float = 60.0) -> list[psutil.Process]:
    """The job's processes once Spark's JVM (and, with ``workers``, its Python workers) run."""
    deadline = time.monotonic() + timeout
    procs: list[psutil.Process] = []
    while time.monotonic() < deadline:
        procs = process.alive(process.tree(pid))
        names = [name(p) for p in procs]
        if "java" in names and (not workers or names.count("python") + names.count("python3") >= 3):
            return procs
        time.sleep(0.5)
    return procs


def name(p: psutil.Process) -> str:
    """A process's name; "" once it has ended (see :func:`command`)."""
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return ""


def command(p: psutil.Process) -> str:
    """A process's command line; "" once it has ended (the tree holds short-lived children too, such as the
    ``chmod`` Hadoop's local file system starts per checkpoint file when the job is launched by spark-submit)."""
    try:
        return " ".join(p.cmdline())
    except psutil.NoSuchProcess:
        return ""


def ended_within(procs: list[psutil.Process], seconds: float) -> float:
    """Seconds until every process of ``procs`` is gone; fails if some outlive ``seconds``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if not process.alive(procs):
            return time.monotonic() - t0
        time.sleep(0.1)
    left = [command(p)[:120] for p in process.alive(procs)]
    process.kill_all(procs)
    raise AssertionError(f"{len(left)} processes still running {seconds:.0f}s after the stop: {left}")


def stop_and_time(proc: subprocess.Popen, procs: list[psutil.Process], send) -> tuple[int, float]:
    """``send()`` a stop, then wait for ``proc`` and every process of ``procs`` (its tree); returns ``proc``'s
    exit code and the seconds until the last of them ended (fails if some outlive the timeout and a margin)."""
    t0 = time.monotonic()
    send()
    rc = proc.wait(STOP_TIMEOUT + 10)
    ended_within(procs, STOP_TIMEOUT + 10 - (time.monotonic() - t0))
    took = time.monotonic() - t0
    print(f"stop of {len(procs)} processes took {took:.1f}s (rc {rc})")
    return rc, took


def assert_exactly_once(bootstrap: str, topic: str, total: int) -> None:
    got = read_all(bootstrap, topic, timeout=180)
    keys = [int(m.key()) for ms in got.values() for m in ms]
    assert len(keys) == total, f"{len(keys)} records for {total} produced ({len(keys) - len(set(keys))} duplicates)"
    assert set(keys) == set(range(total))
    for part, ms in got.items():
        ks = [int(m.key()) for m in ms]
        assert ks == sorted(ks), f"partition {part} out of order"


def test_sigterm_to_mirrorflow_run_ends_every_process_and_keeps_exactly_once(clusters, unique, tmp_path):
    topic = unique("stop")
    create_topic(clusters.src_bootstrap, topic, 3)
    # written by the tasks: Spark's Python workers are part of the tree too
    path, cfg = group_yaml(clusters, tmp_path, topic, value_serde="bytes",
                           spark=f', stop_timeout: "{STOP_TIMEOUT:.0f}s", driver_batch_max_records: 0')
    with_a_source_secret(path)
    gname = cfg.groups[0].name
    producer = Producing(clusters.src_bootstrap, topic, tmp_path)
    log = tmp_path / "job.log"
    cli = subprocess.Popen([sys.executable, "-m", "mirror_core.cli", "run", str(path), "--group", gname],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"), env=private_tmp(tmp_path))
    try:
        wait_until("records mirrored", lambda: mirrored(clusters.dst_bootstrap, f"{topic}.mirror"), proc=cli)
        procs = job_tree(cli.pid, workers=True)
        assert len(procs) >= 4, [command(p)[:80] for p in procs]  # CLI, driver, JVM, Python worker(s)
        assert secrets_dirs(tmp_path)
        assert producer.running()
        rc, took = stop_and_time(cli, procs, lambda: cli.send_signal(signal.SIGTERM))
        assert took <= STOP_TIMEOUT, took
        assert rc == 0, log.read_text()[-3000:]
        assert not secrets_dirs(tmp_path)
    finally:
        process.kill_all(process.tree(cli.pid))
        total = producer.stop()
    run_once(path, gname, timeout=600)
    assert_exactly_once(clusters.dst_bootstrap, f"{topic}.mirror", total)


@pytest.mark.parametrize("read_path", ["spark", "direct-per-writer-keep", "direct-per-writer-keep-through"])
def test_sigterm_to_the_jobs_whole_process_group_is_one_clean_stop(clusters, unique, tmp_path, read_path):
    """SIGTERM to every process of the job at once (``kill -TERM -<pgid>``; a service manager's default stops
    a whole control group so): the JVM leaves the stop to the driver, which finishes its batch and stops the
    query and Spark. Exit 0, one line about the stop and no Java or Python traceback (the JVM's own shutdown
    hooks used to stop Spark under the running query: a NullPointerException, py4j errors) or Spark warning
    about the start or the stop, exactly once. ``direct-per-writer-keep``: the direct path's writer processes
    (signalled too) keep writing after each batch's own write (``spark.keep_writing_for``), ``-through``: and
    while Spark plans the next batch (``MIRRORFLOW_KEEP_THROUGH_SPARK=1``); the driver's stop stops them
    wherever it finds them."""
    topic = unique("pgstop")
    create_topic(clusters.src_bootstrap, topic, 3)
    extra = (", read_path: spark" if read_path == "spark"
             else ", read_path: direct, transactions: per_writer, keep_writing_for: 2 seconds")
    env = private_tmp(tmp_path) | ({"MIRRORFLOW_KEEP_THROUGH_SPARK": "1"} if read_path.endswith("-through") else {})
    path, cfg = group_yaml(clusters, tmp_path, topic, value_serde="bytes",
                           spark=f', stop_timeout: "{STOP_TIMEOUT:.0f}s"{extra}')
    gname = cfg.groups[0].name
    producer = Producing(clusters.src_bootstrap, topic, tmp_path)
    log = tmp_path / "job.log"
    job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", gname],
                           cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
                           start_new_session=True)
    try:
        wait_until("records mirrored", lambda: mirrored(clusters.dst_bootstrap, f"{topic}.mirror"), proc=job)
        procs = job_tree(job.pid, workers=False)
        assert "java" in [name(p) for p in procs], [command(p)[:80] for p in procs]
        rc, took = stop_and_time(job, procs, lambda: os.killpg(job.pid, signal.SIGTERM))
        out = log.read_text()
        assert rc == 0, out[-3000:]
        assert took <= STOP_TIMEOUT, took
        assert "signal 15, stopping" in out
        # nor Spark's warnings of a stop between two batches, of its adaptive execution, of the host name's
        # loopback address, of Hadoop's native library and of a scratch directory a cluster manager would
        # override at the start, nor its console progress bar
        for noise in ("Exception", "Traceback", " ERROR ", "Failed to cancel job group", "adaptive",
                      "SPARK_LOCAL_IP", "native-hadoop", "spark.local.dir", "[Stage "):
            assert noise not in out, out[out.index(noise) - 500:][:3000]
    finally:
        process.kill_all(process.tree(job.pid))
        total = producer.stop()
    run_once(path, gname, timeout=600)
    assert_exactly_once(clusters.dst_bootstrap, f"{topic}.mirror", total)


def producing_group(clusters, topic: str, tmp_path: Path) -> tuple[Path, str, Producing]:
    """A 3-partition source topic being produced to, and a group mirroring it (``bytes``, the default stop
    timeout): its config's path and name, and the producer."""
    create_topic(clusters.src_bootstrap, topic, 3)
    path, cfg = group_yaml(clusters, tmp_path, topic, value_serde="bytes",
                           spark=f', stop_timeout: "{STOP_TIMEOUT:.0f}s"')
    return path, cfg.groups[0].name, Producing(clusters.src_bootstrap, topic, tmp_path)


def spark_submit(path: Path, gname: str, tmp_path: Path, driver_options: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen:
    """The stream job as the stream DAG's operator submits it (``local[2]``, the connector jars given at launch),
    in a session of its own: nothing the test does to its own processes reaches it."""
    spark_submit = Path(sys.executable).parent / "spark-submit"
    env = private_tmp(tmp_path) | {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                                   "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "plugins"),
                                                                  os.environ.get("PYTHONPATH", "")])} | (env or {})
    jars = ",".join(artifacts.spark_kafka_jars(artifacts.cache_dir()))  # the driver's classpath: given at launch
    return subprocess.Popen([str(spark_submit), "--master", "local[2]", "--jars", jars,
                             "--conf", f"spark.driver.extraJavaOptions={driver_options}",
                             str(ROOT / "spark_jobs" / "mirror_stream.py"), str(path), "--group", gname],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def test_the_job_ends_when_spark_submit_is_killed(clusters, unique, tmp_path):
    """Airflow's SparkSubmitOperator.on_kill SIGKILLs spark-submit; its Python driver must not outlive it, and
    what the JVM would have removed on a normal end is in the private temporary directory the stream DAG's
    operator gives it (:func:`submit_tmpdir`), not the machine's /tmp."""
    topic = unique("orphan")
    path, gname, producer = producing_group(clusters, topic, tmp_path)
    with submit_tmpdir({}) as conf:
        options = conf["spark.driver.extraJavaOptions"]
        jvm_tmp = Path(options.removeprefix("-Djava.io.tmpdir="))
        submit = spark_submit(path, gname, tmp_path, options)
        try:
            wait_until("records mirrored", lambda: mirrored(clusters.dst_bootstrap, f"{topic}.mirror"),
                       proc=submit)
            procs = job_tree(submit.pid, workers=False)
            driver = [p for p in procs if "mirror_stream.py" in command(p) and p.pid != submit.pid]
            assert driver, [command(p)[:80] for p in procs]
            assert spark_scratch(tmp_path), "Spark keeps its scratch files elsewhere"
            # what only a JVM that ends normally removes: spark-submit's fetch directory, Spark's artifacts'
            assert {p.name.split("-")[0] for p in jvm_tmp.iterdir()} == {"spark", "artifacts"}, \
                list(jvm_tmp.iterdir())
            t0 = time.monotonic()
            submit.kill()  # what on_kill does
            submit.wait(10)
            ended_within(procs, STOP_TIMEOUT + 5)
            took = time.monotonic() - t0
            print(f"after spark-submit was killed, {len(procs)} processes ended in {took:.1f}s")
            assert took <= STOP_TIMEOUT, took
            # the killed JVM never ran Spark's own clean-up; the driver removed its scratch files on its way out
            assert not scratch_dirs(tmp_path)
        finally:
            process.kill_all(process.tree(submit.pid))
            total = producer.stop()
    assert not jvm_tmp.exists()  # removed by the operator's task, with what the killed JVM left in it
    run_once(path, gname, timeout=600)
    assert_exactly_once(clusters.dst_bootstrap, f"{topic}.mirror", total)


def test_a_job_whose_airflow_task_died_stops_and_the_retry_waits_for_it(clusters, unique, tmp_path):
    """A worker killed with SIGKILL takes its task's process with it but not spark-submit (the provider starts it
    as the task's child; nothing kills it when its parent dies), so the job went on streaming, and the task's
    retry started a second job on the same checkpoint. Now the job watches the task's process (the operator names
    it in ``MIRRORFLOW_OWNER``) and stops when it ends; and a job waits while another runs on its checkpoint
    (its lock, beside the checkpoint), here the retry for the orphan's stop. Nothing lost, nothing twice."""
    topic = unique("owner")
    path, gname, producer = producing_group(clusters, topic, tmp_path)
    task = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)"])  # Airflow's task process
    retry_log = tmp_path / "retry.log"
    retry: subprocess.Popen | None = None
    with submit_tmpdir({}) as conf:
        submit = spark_submit(path, gname, tmp_path, conf["spark.driver.extraJavaOptions"],
                              env={process.OWNER_ENV: process.owner_token(task.pid)})
        try:
            wait_until("records mirrored", lambda: mirrored(clusters.dst_bootstrap, f"{topic}.mirror"),
                       proc=submit)
            procs = job_tree(submit.pid, workers=False)
            with retry_log.open("w") as log:
                retry = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group",
                                          gname, "--once"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            wait_until("the retry waiting for the job on its checkpoint",
                       lambda: "the checkpoint is in use by a streaming job" in retry_log.read_text(), timeout=60,
                       proc=retry)
            assert submit.poll() is None
            t0 = time.monotonic()
            task.kill()  # the worker's SIGKILL; spark-submit is not in its tree
            ended_within(procs, STOP_TIMEOUT + 5)
            took = time.monotonic() - t0
            print(f"after the task's process was killed, the orphaned job's {len(procs)} processes ended in "
                  f"{took:.1f}s")
            assert took <= STOP_TIMEOUT, took
            assert retry.wait(300) == 0, retry_log.read_text()[-4000:]
            text = retry_log.read_text()
            assert "the checkpoint is free after" in text, text[-4000:]
        finally:
            task.kill()
            process.kill_all(process.tree(submit.pid))
            if retry is not None:
                process.kill_all(process.tree(retry.pid))
            total = producer.stop()
    run_once(path, gname, timeout=600)
    assert_exactly_once(clusters.dst_bootstrap, f"{topic}.mirror", total)


def test_a_job_waiting_behind_a_drain_does_not_start_once_a_failover_stopped_the_group(clusters, unique, tmp_path):
    """A streaming job (the stream DAG's next run) waits while a drain holds the group's checkpoint (say, the
    failover's final drain, or a scheduled one); meanwhile the failover's finalize writes the group's stop.
    The waiting job sees it and exits 0 without starting, saying why, while the drain runs on. It used to
    wait for the drain to end, holding finalize's wait for the stream's end for as long."""
    from mirror_core import failover, joblock
    from tests.dags import support

    topic = unique("behind")
    create_topic(clusters.src_bootstrap, topic, 1)
    path, cfg = group_yaml(clusters, tmp_path, topic, value_serde="bytes")
    group = cfg.groups[0]
    lock = joblock.lock_path(group.spark.checkpoint_dir, group.name)
    assert lock is not None
    lock.parent.mkdir(parents=True, exist_ok=True)
    job_log = tmp_path / "job.log"
    with support.job_holding(lock, 600, once=True) as drain, job_log.open("w") as out:
        job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", group.name],
                               cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_until("the job waiting for the drain", lambda: "waiting for the job already running on its "
                       "checkpoint to end: a drain (--once)" in job_log.read_text(), timeout=60, proc=job)
            t0 = time.monotonic()
            failover.request_stream_stop(cfg, group, f"failover of group {group.name} to dst")
            assert job.wait(30) == 0, job_log.read_text()[-3000:]
            took = time.monotonic() - t0
            assert drain.poll() is None  # the drain runs on
        finally:
            process.kill_all(process.tree(job.pid))
    text = job_log.read_text()
    assert f"{group.name}: not started: failover of group {group.name} to dst at " in text, text[-3000:]
    print(f"the waiting job ended {took:.1f}s after the stop was written")
    assert took < 5, took


@pytest.mark.slow
def test_stop_is_bounded_while_the_brokers_are_unreachable(clusters, unique, tmp_path):
    """Brokers frozen (SIGSTOP): the mirror cannot finish its batch or commit; the stop still ends every
    process within the timeout, and after the brokers come back a drain completes exactly once."""
    from mirror_core import local

    env = local.LocalEnv.from_environment(tmp_path / "own-clusters")
    spec = local.free_spec(registries=False)
    local.up(env, spec)
    brokers = [psutil.Process(b["pid"]) for s in local.status(env)["sides"].values() for b in s["brokers"]]
    try:
        src, dst = spec.sides
        eps = type(clusters)(src.bootstrap, dst.bootstrap, None, None)  # tests/conftest.py's Endpoints
        topic = unique("frozen")
        create_topic(src.bootstrap, topic, 3)
        path, cfg = group_yaml(eps, tmp_path, topic, value_serde="bytes", spark=', stop_timeout: "15s"')
        with_a_source_secret(path)
        gname = cfg.groups[0].name
        producer = Producing(src.bootstrap, topic, tmp_path)
        cli = subprocess.Popen([sys.executable, "-m", "mirror_core.cli", "run", str(path), "--group", gname],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=(tmp_path / "job.log").open("w"),
                               env=private_tmp(tmp_path))
        try:
            wait_until("records mirrored", lambda: mirrored(dst.bootstrap, f"{topic}.mirror"), proc=cli)
            procs = job_tree(cli.pid, workers=False)
            assert secrets_dirs(tmp_path)
            assert spark_scratch(tmp_path), "Spark keeps its scratch files elsewhere"
            for b in brokers:
                b.suspend()
            t0 = time.monotonic()
            cli.send_signal(signal.SIGTERM)
            cli.wait(30)
            ended_within(procs, 25 - (time.monotonic() - t0))
            took = time.monotonic() - t0
            print(f"stop with frozen brokers: {len(procs)} processes ended in {took:.1f}s")
            assert took <= 15.0, took
            # a forced stop (the JVM killed: Spark's own clean-up never runs) still removes the job's private
            # directories: its secrets, and Spark's scratch files (some 10 MB a job, left in /tmp until 6 December)
            assert not secrets_dirs(tmp_path)
            assert not scratch_dirs(tmp_path)
        finally:
            for b in brokers:
                b.resume()
            process.kill_all(process.tree(cli.pid))
            total = producer.stop()
        # thawed brokers (their controllers were frozen too) may take a while to serve requests again; the
        # drain starts once both answer, as an operator would restart the mirror after such an outage
        wait_until("the thawed clusters answer", lambda: answers(src.bootstrap, topic)
                   and answers(dst.bootstrap, f"{topic}.mirror"))
        run_once(path, gname, timeout=600)
        assert_exactly_once(dst.bootstrap, f"{topic}.mirror", total)
    finally:
        from mirror_core import replicate

        replicate.release_producers()
        local.down(env)
