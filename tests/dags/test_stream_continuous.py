"""The continuous stream DAG: kill the Spark job while its DAG runs; Airflow relaunches it (a retry)
and the mirror catches up with nothing lost and nothing duplicated. A failover's stop, which the running job
reads on the destination, ends it."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
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


def test_a_killed_job_is_relaunched_and_catches_up(clusters: Any, unique: Any, tmp_path: Path, airflow_db: Path,
                                                    monkeypatch: Any) -> None:
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=50, mode="continuous", retries=3)
    cfg = load_config(s.config)
    group = cfg.group(s.name)
    dag = support.load_dags(s.config, monkeypatch)[s.dag_id("stream")]
    events: dict[str, Any] = {}

    def chaos() -> None:
        try:
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
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            events["error"] = exc
        finally:
            try:  # the running job reads its stop on the destination, stops after its batch; the run ends
                request_stream_stop(cfg, group, "test over")
            except BaseException as exc:  # noqa: BLE001 - reported by the test below; the watchdog still runs
                events.setdefault("error", exc)
            stop_at = time.monotonic()
            while driver_pids(s.name) and time.monotonic() < stop_at + 180:
                time.sleep(1)
            events["stop_took"] = time.monotonic() - stop_at
            events["watchdog"] = driver_pids(s.name)
            for pid in events["watchdog"]:  # the watchdog: never leave a job behind
                os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=chaos, daemon=True)
    t.start()
    dr = dag.test()
    t.join(60)
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
