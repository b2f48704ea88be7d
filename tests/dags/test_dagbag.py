"""The generated DAGs: they import without errors, parse fast, the stream task's command is exact; and what the
stream and finalize tasks do around the job without clusters (the owner they name, the checkpoint's lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import FakeBoard, fake_boards

ROOT = Path(__file__).resolve().parents[2]
DAGS = ROOT / "dags"


def _dagbag(config: Path | None, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN202
    from airflow.dag_processing.dagbag import DagBag

    if config is not None:
        monkeypatch.setenv("MIRRORFLOW_CONFIG", str(config))
    return DagBag(str(DAGS))


def dagbag_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text: str, name: str = "mirrors.yaml"):  # noqa: ANN201
    """The DAGs of a config written from ``yaml_text`` (dedented) into ``tmp_path``; it must import cleanly."""
    cfg = tmp_path / name
    cfg.write_text(textwrap.dedent(yaml_text))
    bag = _dagbag(cfg, monkeypatch)
    assert bag.import_errors == {}
    return bag


def test_every_dag_of_the_local_config_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIRRORFLOW_CONFIG", raising=False)
    bag = _dagbag(ROOT / "config" / "local.yaml", monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == [f"mirrorflow__demo__{p}" for p in ("failover", "offset_sync", "provision", "stream")]
    failover = bag.dags["mirrorflow__demo__failover"]
    assert [t.task_id for t in failover.topological_sort()] == [
        "preflight", "wait_for_lag", "approve_stop_producers", "wait_for_quiet", "final_sync", "verify_parity",
        "approve_switch_consumers", "finalize", "report"]
    assert failover.get_task("report").trigger_rule == "all_done"
    assert "group:demo" in bag.dags["mirrorflow__demo__stream"].tags
    stream = bag.dags["mirrorflow__demo__stream"]
    assert stream.max_active_runs == 1 and type(stream.timetable).__name__ == "ContinuousTimetable"
    assert stream.get_task("mirror_stream").retries == 10
    assert set(failover.params.keys()) == {"consumer_groups", "max_lag_records", "max_lag_seconds", "quiet_seconds"}


def test_the_example_config_builds_failback_and_available_now(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "two-way.yaml"
    cfg.write_text(textwrap.dedent("""
        clusters:
          a: {kafka: {bootstrap.servers: "a:9092"}}
          b: {connection: kafka_b}
        groups:
          - name: ab
            source: a
            destination: b
            spark: {mode: available_now, drain_every: 2 minutes}
            mirrors: [{source_topic: orders}]
          - name: ba
            source: b
            destination: a
            enabled: false
            mirrors: [{source_topic: refunds}]
    """))
    bag = _dagbag(cfg, monkeypatch)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == [f"mirrorflow__ab__{p}" for p in
                                ("failback", "failover", "offset_sync", "provision", "stream")]
    failover = bag.dags["mirrorflow__ab__failover"]
    assert "final_drain" in failover.task_ids  # available_now: the failover drains the rest itself
    failback = bag.dags["mirrorflow__ab__failback"]
    assert failback.get_task("approve_stop_producers").subject == "Stop the producers on b"
    assert failback.get_task("approve_switch_consumers").subject == "Switch consumers to a"
    assert failback.get_task("finalize").stream_dag_id == "mirrorflow__ba__stream"


def test_an_invalid_config_is_one_import_error_naming_the_yaml(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("clusters: {a: {kafka: {bootstrap.servers: 'a:1'}}}\ngroups:\n  - {name: g, source: a, "
                   "destination: nowhere, mirrors: [{source_topic: t}]}\n")
    bag = _dagbag(cfg, monkeypatch)
    assert bag.dags == {}
    assert len(bag.import_errors) == 1
    (message,) = bag.import_errors.values()
    last = message.strip().splitlines()[-1]
    assert str(cfg) in last and "groups[0].destination: undefined cluster 'nowhere'" in last


def test_one_groups_mistake_leaves_the_other_groups_dags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A ${VAR} unset where the DAG processor parses the file, in a cluster one group uses: that group's DAGs are
    left out and one import error names it and the problem; the other group's DAGs stay, and its tasks load it."""
    from mirrorflow_airflow.hooks import MirrorflowHook

    from mirror_core.errors import ConfigError

    cfg = tmp_path / "mirrors.yaml"
    cfg.write_text(textwrap.dedent("""
        clusters:
          a: {kafka: {bootstrap.servers: "a:9092"}}
          b: {kafka: {bootstrap.servers: "b:9092"}}
          legacy: {kafka: {bootstrap.servers: "l:9092", sasl.password: "${LEGACY_PASSWORD}"}}
        groups:
          - {name: orders, source: a, destination: b, mirrors: [{source_topic: orders}]}
          - {name: old, source: legacy, destination: b, mirrors: [{source_topic: old}]}
    """))
    monkeypatch.delenv("LEGACY_PASSWORD", raising=False)
    bag = _dagbag(cfg, monkeypatch)
    assert sorted(bag.dags) == [f"mirrorflow__orders__{p}" for p in ("failover", "offset_sync", "provision", "stream")]
    assert [Path(f).name for f in bag.import_errors] == ["mirrorflow_config_check.py"]
    last = next(iter(bag.import_errors.values())).strip().splitlines()[-1]
    assert str(cfg) in last and "1 group(s) left out" in last
    assert "group 'old' (groups[1]): clusters.legacy.kafka.sasl.password: environment variable ${LEGACY_PASSWORD}" \
        in last and "'orders'" not in last

    assert MirrorflowHook(str(cfg)).get_group("orders")[1].source == "a"
    with pytest.raises(ConfigError, match="LEGACY_PASSWORD"):
        MirrorflowHook(str(cfg)).get_group("old")

    monkeypatch.setenv("LEGACY_PASSWORD", "set")  # fixed: both groups, no error
    bag = _dagbag(cfg, monkeypatch)
    assert bag.import_errors == {} and len(bag.dags) == 8


def test_a_task_looks_up_only_its_own_groups_connections(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Group ``old``'s cluster names an Airflow connection that is not defined: group ``orders``'s tasks still load
    (the reverse group ``back`` comes with it, for a failback and the offsets' reverse lookups), and its job's
    connections file holds only its own clusters' secrets."""
    from mirrorflow_airflow.hooks import MirrorflowHook

    cfg = tmp_path / "mirrors.yaml"
    cfg.write_text(textwrap.dedent("""
        clusters:
          a: {connection: kafka_a}
          b: {kafka: {bootstrap.servers: "b:9092"}}
          legacy: {connection: kafka_legacy}
        groups:
          - {name: orders, source: a, destination: b, mirrors: [{source_topic: orders}]}
          - {name: back, source: b, destination: a, mirrors: [{source_topic: orders}]}
          - {name: old, source: legacy, destination: b, mirrors: [{source_topic: old}]}
    """))
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_A", json.dumps({"conn_type": "kafka", "password": "a-secret",
                                                           "extra": {"bootstrap.servers": "a:9092"}}))
    monkeypatch.delenv("AIRFLOW_CONN_KAFKA_LEGACY", raising=False)
    hook = MirrorflowHook(str(cfg))
    loaded, group = hook.get_group("orders")
    assert group.source == "a" and [g.name for g in loaded.groups] == ["orders", "back"]
    assert sorted(loaded.clusters) == ["a", "b"]
    with hook.connections_file() as name:
        assert name is not None and sorted(json.loads(Path(name).read_text())) == ["a"]
    from airflow.sdk.exceptions import AirflowNotFoundException

    with pytest.raises(AirflowNotFoundException):
        MirrorflowHook(str(cfg)).get_group("old")


def _big_config(path: Path, groups: int = 10, per_group: int = 10) -> Path:
    lines = ["clusters:", "  src: {kafka: {bootstrap.servers: 'src:9092'}}", "  dst: {kafka: {bootstrap.servers: 'dst:9092'}}",
             "groups:"]
    for g in range(groups):
        lines += [f"  - name: g{g}", "    source: src", "    destination: dst", "    mirrors:"]
        lines += [f"      - {{source_topic: t{g}-{m}}}" for m in range(per_group)]
    path.write_text("\n".join(lines) + "\n")
    return path


PARSE_PROBE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag  # airflow itself is loaded before the clock starts
t, c = time.perf_counter(), time.process_time()
bag = DagBag(sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - t, "cpu": time.process_time() - c, "dags": len(bag.dags),
                  "errors": len(bag.import_errors)}))
"""


def test_parse_time_of_100_mirrors_in_10_groups(tmp_path: Path) -> None:
    """The whole dags folder for 100 mirrors in 10 groups parses in under a second (goal in the README).
    Measured in a fresh process, as the DAG processor does: it includes importing mirror_core and the
    providers the DAG file needs, but not Airflow itself. The assertion is on CPU time, which other
    processes on a busy machine do not inflate; wall time is printed next to it."""
    cfg = _big_config(tmp_path / "big.yaml")
    env = dict(os.environ, MIRRORFLOW_CONFIG=str(cfg))
    runs = []
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(DAGS)], env=env, capture_output=True, text=True,
                             timeout=300, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert all(r["dags"] == 40 and r["errors"] == 0 for r in runs), runs
    best = min(r["cpu"] for r in runs)
    print(f"parse time, 100 mirrors / 10 groups / 40 DAGs: CPU best {best:.3f} s, wall "
          f"{[round(r['seconds'], 3) for r in runs]} s")
    assert best < 1.0


def test_the_stream_task_builds_the_exact_spark_submit_command(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_MIRRORFLOW_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))  # no log4j2 file of the user's own
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    bag = _dagbag(ROOT / "config" / "local.yaml", monkeypatch)
    task = bag.dags["mirrorflow__demo__stream"].get_task("mirror_stream")
    assert task.jars is None  # nothing looked up at parse time
    task.prepare_submit()
    hook = task._get_hook()
    cmd = hook._build_spark_submit_command(task.application)
    py = sys.executable
    from mirror_core import artifacts
    from spark_jobs import jvm_archive, local_fs

    cache = artifacts.cache_dir()
    jars = artifacts.spark_kafka_jars(cache)
    assert jars and all(j.endswith(".jar") for j in jars)
    # the driver JVM starts before the job's session: its options come on the command line (config/local.yaml
    # has a local checkpoint and master, so the file system without a chmod process per file too)
    fs_jar, archive = local_fs.existing_jar(cache), jvm_archive.java_options(cache)
    assert fs_jar is not None and archive, "mirrorflow local fetch builds both"
    logs = f"-Dlog4j2.configurationFile={jvm_archive.LOG_CONFIG}"
    # the default read path on a local master is the direct one: the JVM only plans (its quick compiler alone)
    direct = " ".join(jvm_archive.DIRECT_READ_OPTIONS)
    assert cmd == [
        "spark-submit", "--master", "local[2]",
        "--conf", f"spark.driver.extraJavaOptions={logs} {archive[0]} {direct}",
        "--conf", f"spark.driver.extraClassPath={fs_jar}",
        "--conf", f"spark.hadoop.fs.file.impl={local_fs.FS_CLASS}",
        "--conf", f"spark.pyspark.python={py}", "--conf", f"spark.pyspark.driver.python={py}",
        "--jars", ",".join(jars), "--name", "mirrorflow-demo",
        str(ROOT / "spark_jobs" / "mirror_stream.py"), str(ROOT / "config" / "local.yaml"), "--group", "demo",
    ]
    # a local master and no UI: the driver binds to the loopback address
    # ... and the job is told the master it is submitted to (its session's would otherwise win)
    assert task.env_vars == {"PYSPARK_PYTHON": py, "PYSPARK_DRIVER_PYTHON": py, "SPARK_LOCAL_IP": "127.0.0.1",
                             "MIRRORFLOW_SPARK_MASTER": "local[2]"}
    # a task given driver options of its own (a DAG author's conf=) keeps mirrorflow's before them: a class path
    # without the jar would leave fs.file.impl naming a class the driver cannot load; preparing again adds
    # nothing twice
    task.conf = {**task.conf, "spark.driver.extraClassPath": "/opt/mine.jar",
                 "spark.driver.extraJavaOptions": "-Dmine=1"}
    task.prepare_submit()
    task.prepare_submit()
    assert task.conf["spark.driver.extraClassPath"] == f"{fs_jar}{os.pathsep}/opt/mine.jar"
    assert task.conf["spark.driver.extraJavaOptions"] == f"{logs} {archive[0]} {direct} -Dmine=1"
    drain = bag.dags["mirrorflow__demo__stream"]  # continuous: no --once
    assert "--once" not in drain.get_task("mirror_stream").application_args


def test_a_stream_job_runs_on_the_spark_connections_master(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Spark connection to a cluster (host and port, as the provider reads them) is where the job runs, though
    the group says ``local[2]``: spark-submit gets it, and so does the job (``MIRRORFLOW_SPARK_MASTER``), whose
    session would otherwise set the group's master over spark-submit's. ``read_path: auto`` then reads in
    Spark's tasks on the executors with mirrorflow's reader (the driver JVM only plans: the direct path's JVM
    options), and the driver is not bound to the loopback address."""
    monkeypatch.setenv("AIRFLOW_CONN_MIRRORFLOW_SPARK",
                       json.dumps({"conn_type": "spark", "host": "spark://spark-master", "port": 7077}))
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    bag = _dagbag(ROOT / "config" / "local.yaml", monkeypatch)
    task = bag.dags["mirrorflow__demo__stream"].get_task("mirror_stream")
    task.prepare_submit()
    cmd = task._get_hook()._build_spark_submit_command(task.application)
    assert cmd[:3] == ["spark-submit", "--master", "spark://spark-master:7077"]
    assert task.env_vars["MIRRORFLOW_SPARK_MASTER"] == "spark://spark-master:7077"
    assert "SPARK_LOCAL_IP" not in task.env_vars
    from spark_jobs import jvm_archive

    options = task.conf["spark.driver.extraJavaOptions"].split()
    assert set(jvm_archive.DIRECT_READ_OPTIONS) <= set(options), options
    assert "spark.hadoop.fs.file.impl" not in task.conf  # the local file system's class is for local masters


def test_a_spark_connection_that_cannot_be_read_fails_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a connection that is not defined gives way to the group's master: a lookup that fails otherwise (a
    secrets backend refusing it) fails the task, rather than submit the job somewhere else."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException, AirflowSecretsBackendAccessDenied

    monkeypatch.delenv("AIRFLOW_CONN_MIRRORFLOW_SPARK", raising=False)
    bag = _dagbag(ROOT / "config" / "local.yaml", monkeypatch)
    task = bag.dags["mirrorflow__demo__stream"].get_task("mirror_stream")

    def refused(conn_id: str) -> Any:
        raise AirflowSecretsBackendAccessDenied(f"{conn_id}: access denied")

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(refused))
    with pytest.raises(AirflowSecretsBackendAccessDenied):
        task._ensure_connection()
    assert "AIRFLOW_CONN_MIRRORFLOW_SPARK" not in os.environ

    def missing(conn_id: str) -> Any:
        raise AirflowNotFoundException(f"The conn_id `{conn_id}` isn't defined")

    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(missing))
    task._ensure_connection()
    assert json.loads(os.environ.pop("AIRFLOW_CONN_MIRRORFLOW_SPARK"))["host"] == task.master


def test_a_stream_job_is_told_the_task_process_it_belongs_to(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """spark-submit outlives a task process killed with SIGKILL; the job watches the process named in
    ``MIRRORFLOW_OWNER`` (this one, which runs the task) and stops when it ends (tests/spark/test_stop.py)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    from mirror_core import process

    bag = _dagbag(_own_checkpoint_config(tmp_path), monkeypatch)
    fake_boards(monkeypatch)  # no clusters here: the destination's stops topic, in memory
    task = bag.dags["mirrorflow__demo__stream"].get_task("mirror_stream")
    submitted: list[dict[str, str]] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(dict(self.env_vars)))
    task.execute({})
    owner = submitted[0][process.OWNER_ENV]
    assert process.owner_alive(owner) is True and owner.rsplit(":", 2)[1] == str(os.getpid())


def test_a_stream_task_waits_after_a_failover_and_fails_when_it_cannot_tell(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    """The stream task reads the group's stop on the destination before it submits anything: stopped, it waits
    (deferred) for the stop's removal (tests/dags/test_stream_stop_wait.py); the destination not answering, it
    fails with that one line (and is retried), launching nothing."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    from mirror_core import stops
    from mirror_core.config import load_config

    config = _own_checkpoint_config(tmp_path)
    bag = _dagbag(config, monkeypatch)
    boards = fake_boards(monkeypatch)
    task = bag.dags["mirrorflow__demo__stream"].get_task("mirror_stream")
    submitted: list[Any] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: submitted.append(context))
    boards["dst"] = FakeBoard()
    boards["dst"].stops[stops.key(load_config(config).group("demo"))] = "failover of group demo to dst at 12:00"
    with pytest.raises(TaskDeferred) as deferred:
        task.execute({})
    assert deferred.value.trigger.reason == "failover of group demo to dst at 12:00"
    boards["dst"].down = True
    with pytest.raises(AirflowException, match="^cannot read the failover stops from topic mirrorflow-stops.internal"):
        task.execute({})
    assert submitted == []


def _own_checkpoint_config(tmp_path: Path) -> Path:
    """config/local.yaml with a checkpoint directory of the test's own (no lock of a demo run)."""
    config = tmp_path / "local.yaml"
    text = (ROOT / "config" / "local.yaml").read_text()
    assert '"../.state/checkpoints/demo"' in text
    config.write_text(text.replace('"../.state/checkpoints/demo"', f'"{tmp_path / "checkpoints"}"'))
    return config


class _TaskInstance:
    """What FinalizeFailoverOperator asks of its task instance: no stream task runs; its report."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def get_task_states(self, dag_id: str, task_ids: list[str]) -> dict[str, Any]:
        return {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value


@pytest.mark.parametrize("job_ends", [True, False])
def test_finalize_waits_for_a_job_still_on_the_checkpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          job_ends: bool) -> None:
    """No task of the stream DAG runs, but a job still holds the group's checkpoint (its task died, or it was
    started by hand): finalize waits for it and says the stream stopped once it has; if it holds on past the
    wait, finalize fails saying the job is still running."""
    from airflow.sdk.exceptions import AirflowFailException
    from mirrorflow_airflow import operators

    from mirror_core import joblock
    from tests.dags import support

    config = _own_checkpoint_config(tmp_path)
    lock = joblock.lock_path(str(tmp_path / "checkpoints"), "demo")
    assert lock is not None
    from mirror_core import failover

    # no clusters here: the offsets' second sync (tested on real clusters in test_failover_cli) stands in
    synced = []
    boards = fake_boards(monkeypatch)
    monkeypatch.setattr(failover, "resync", lambda cfg, group, params: synced.append(params.consumer_groups) or
                        failover.StepReport("resync", group.name, True, "2 partition offsets synced", {"offsets": []}))
    with support.job_holding(lock, 3 if job_ends else 600) as job:
        monkeypatch.setattr(operators, "pause_dag", lambda dag_id, log: True)
        op = operators.FinalizeFailoverOperator(task_id="finalize", config_path=str(config), group_name="demo",
                                                stream_dag_id="mirrorflow__demo__stream",
                                                stop_timeout=15 if job_ends else 3)
        ti = _TaskInstance()
        context = {"ti": ti, "params": {"consumer_groups": ["demo-app"]}}
        if job_ends:
            op.execute(context)
            assert job.poll() is not None  # finalize ended its wait only once the job had
            assert ti.pushed["step_report"]["details"]["stream_stopped"] is True
            assert ti.pushed["step_report"]["summary"].startswith("consumer offsets synced again")
            assert synced == [("demo-app",)]
            assert list(boards["dst"].stops) == [f"{tmp_path / 'checkpoints'}/demo"]  # stopped for good
        else:
            with pytest.raises(AirflowFailException, match="the stream job is still running"):
                op.execute(context)
            assert ti.pushed["step_report"]["details"]["stream_stopped"] is False


def test_finalize_stops_nothing_while_a_consumer_still_runs_on_the_source(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """The operator's half of what test_failover_cli checks on real clusters for the CLI: the resync finds members
    on the source, and the task fails naming them before it writes the stop or pauses the stream DAG."""
    from airflow.sdk.exceptions import AirflowFailException
    from mirrorflow_airflow import operators

    from mirror_core import failover

    boards = fake_boards(monkeypatch)
    monkeypatch.setattr(failover, "source_members", lambda _cfg, _g, gids: dict.fromkeys(gids, 2))
    paused: list[str] = []
    monkeypatch.setattr(operators, "pause_dag", lambda dag_id, log: paused.append(dag_id) or True)
    op = operators.FinalizeFailoverOperator(task_id="finalize", config_path=str(_own_checkpoint_config(tmp_path)),
                                            group_name="demo", stream_dag_id="mirrorflow__demo__stream")
    with pytest.raises(AirflowFailException, match="consumers still run on the source src: 'demo-app' has 2 active"):
        op.execute({"ti": _TaskInstance(), "params": {"consumer_groups": ["demo-app"]}})
    assert sum(b.writes for b in boards.values()) == 0 and paused == []


def test_a_stream_job_counts_as_running_only_while_its_task_runs() -> None:
    from mirrorflow_airflow.operators import stream_jobs_running

    class FakeTI:
        def __init__(self, states: dict[str, dict[str, str]]) -> None:
            self.states = states

        def get_task_states(self, dag_id: str, task_ids: list[str]) -> dict[str, dict[str, str]]:
            assert task_ids == ["mirror_stream"]
            return self.states

    assert stream_jobs_running(FakeTI({"r1": {"mirror_stream": "success"}, "r2": {"mirror_stream": "running"}}),
                               "d") == 1
    # a drain that skips, one about to see the stop, one that waits for the stop's removal: not a job
    assert stream_jobs_running(FakeTI({"r1": {"mirror_stream": "skipped"}, "r2": {"mirror_stream": "queued"},
                                       "r3": {"mirror_stream": "deferred"}}), "d") == 0
