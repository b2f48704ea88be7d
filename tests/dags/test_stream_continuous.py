"""The continuous stream DAG: kill the Spark job while its DAG runs; Airflow relaunches it (a retry)
and the mirror catches up with nothing lost and nothing duplicated. A failover's stop, which the running job
reads on the destination, ends it; a run that finds the stop waits in its task until the stop is removed."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mirror_core.config import load_config
from mirror_core.failover import request_stream_stop
from spark_jobs.jvm_archive import SUBMIT_TMP_PREFIX
from tests.dags import support

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]


def driver_pids(group: str) -> set[int]:
    """The Python driver processes of the group's mirror job (what spark-submit runs)."""
    out = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [c.decode(errors="replace") for c in cmd]
        if any(a.endswith("mirror_stream.py") for a in args) and group in args and "python" in args[0]:
            out.add(int(pid))
    return out


def submit_tmp() -> list[Path]:
    """The private temporary directories of this process's spark-submit JVMs (dag.test() runs tasks here)."""
    return list(Path(tempfile.gettempdir()).glob(f"{SUBMIT_TMP_PREFIX}{os.getpid()}-*"))


def mirrored(s: support.Scenario) -> int:
    return sum(len(support.keys(s.dst, f"{s.topic}.mirror", p, timeout=20)) for p in range(s.partitions))


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


def run_beside(dag: Any, cfg: Any, group: Any, act: Callable[[dict[str, Any]], None]) -> tuple[Any, dict[str, Any]]:
    """One run of the stream DAG (``dag.test()``) while a thread does ``act(events)``, then ends the run: the
    group's stop, which the running job reads on the destination (it stops after its batch, and the run ends), then
    a watchdog that never leaves a job behind. Returns the run and ``events``, which has ``error`` (what failed in
    the thread), ``stop_took`` and the ``watchdog``'s kills besides what ``act`` put there."""
    events: dict[str, Any] = {}

    def beside() -> None:
        try:
            act(events)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            events["error"] = exc
        try:
            request_stream_stop(cfg, group, "test over")
        except BaseException as exc:  # noqa: BLE001 - reported by the test; the watchdog still runs
            events.setdefault("error", exc)
        stop_at = time.monotonic()
        while driver_pids(group.name) and time.monotonic() < stop_at + 180:
            time.sleep(1)
        events["stop_took"] = time.monotonic() - stop_at
        events["watchdog"] = driver_pids(group.name)
        for pid in events["watchdog"]:
            os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=beside, daemon=True)
    t.start()
    dr = dag.test()
    t.join(60)
    return dr, events


def test_a_killed_job_is_relaunched_and_catches_up(clusters: Any, unique: Any, tmp_path: Path, airflow_db: Path,
                                                    monkeypatch: Any) -> None:
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=50, mode="continuous", retries=3)
    cfg = load_config(s.config)
    group = cfg.group(s.name)
    dag = support.load_dags(s.config, monkeypatch)[s.dag_id("stream")]

    def chaos(events: dict[str, Any]) -> None:
        wait_for("the first job to mirror the backlog", lambda: mirrored(s) == 50, 420)
        (first,) = wait_for("the job's driver", lambda: driver_pids(s.name), 60)
        events["submit_tmp"] = submit_tmp()  # spark-submit's JVM keeps its temporary files there
        support.produce(s, 30)
        os.kill(first, signal.SIGKILL)
        events["killed"] = first
        support.produce(s, 20)  # while no job runs
        events["relaunched"] = wait_for("a relaunched job", lambda: driver_pids(s.name) - {first}, 300)
        wait_for("the relaunched job to catch up", lambda: mirrored(s) >= 100, 420)
        support.produce(s, 10)  # and it keeps mirroring
        wait_for("new records", lambda: mirrored(s) >= 110, 300)

    dr, events = run_beside(dag, cfg, group, chaos)
    assert "error" not in events, events.get("error")
    assert events["watchdog"] == set(), "the job did not stop by itself on the failover's stop"
    print(f"the running job ended {events['stop_took']:.1f}s after its stop was written")
    assert events["submit_tmp"] and not submit_tmp()  # removed when each try's task ended
    assert events["killed"] not in events["relaunched"]
    assert dr.state == "success", support.task_states(dr)
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.query(TaskInstance).filter_by(dag_id=dag.dag_id, run_id=dr.run_id, task_id="mirror_stream").one()
        assert ti.try_number >= 2  # Airflow relaunched the job
    for p in range(s.partitions):  # nothing lost, nothing duplicated, same order
        assert support.keys(s.dst, f"{s.topic}.mirror", p) == support.keys(s.src, s.topic, p)
    assert sum(s.produced.values()) == 110


def test_a_stopped_stream_waits_in_one_run_and_mirrors_once_its_stop_is_removed(
        clusters: Any, unique: Any, tmp_path: Path, airflow_db: Path, monkeypatch: Any) -> None:
    """A failover stopped the group and its DAG could not be paused (no ``mirrorflow_airflow_api`` connection):
    a run of the continuous stream DAG does not end at once, skipped (Airflow then started the next one at once,
    which skipped too, for good): its task waits, deferred, looking at the stop, and no job runs. Once the stop is
    removed (``--step resume``, or a failover back), the same run starts the job, which mirrors the backlog."""
    from mirrorflow_airflow.triggers import StreamStopTrigger

    from mirror_core.failover import clear_stream_stop

    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=40, mode="continuous")
    cfg = load_config(s.config)
    group = cfg.group(s.name)
    request_stream_stop(cfg, group, f"failover of group {s.name} to dst")
    dag = support.load_dags(s.config, monkeypatch)[s.dag_id("stream")]
    dag.get_task("mirror_stream").stop_poll_interval = 1  # a look a second (a minute in a deployment)
    looks: list[str | None] = []
    look = StreamStopTrigger.look
    monkeypatch.setattr(StreamStopTrigger, "look", lambda self: looks.append(look(self)) or looks[-1])

    def operator(events: dict[str, Any]) -> None:
        wait_for("the waiting task's looks at its stop", lambda: len(looks) >= 3, 180)
        events["while_stopped"] = (list(looks), driver_pids(s.name), mirrored(s))
        clear_stream_stop(cfg, group)  # what `--step resume` does
        wait_for("the job to mirror the backlog", lambda: mirrored(s) == 40, 420)

    dr, events = run_beside(dag, cfg, group, operator)
    assert "while_stopped" in events or "error" in events, f"the run did not wait: {support.task_states(dr)}"
    assert "error" not in events, (events.get("error"), support.task_states(dr))
    reasons, drivers, copied = events["while_stopped"]
    assert all(r is not None and r.startswith(f"failover of group {s.name} to dst at ") for r in reasons)
    assert drivers == set() and copied == 0  # no job while the stop was in force
    assert events["watchdog"] == set()
    assert dr.state == "success" and support.task_states(dr) == {"mirror_stream": "success"}
    assert looks[-1] is None  # the wait ended on a look that found no stop
    for p in range(s.partitions):
        assert support.keys(s.dst, f"{s.topic}.mirror", p) == support.keys(s.src, s.topic, p)
