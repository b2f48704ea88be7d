"""dag.test() of the failover DAG on the real clusters, approvals answered through Airflow's public API.

One group, three runs in a row: Reject at the first approval (nothing changes), Reject at the second
(offsets were synced before it; the stream is left running), then Approve twice: the consumer group
that was half-way through the topic on the source continues on the destination with no gap and no
re-read (also of what it read on the source while the second approval waited, after the final sync: finalize
syncs its offsets again), and the stream is stopped for good.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mirror_core.config import load_config
from mirror_core.failover import stream_stop_requested
from tests.dags import support

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow]

PARAMS = {"max_lag_records": 100000, "max_lag_seconds": 86400, "quiet_seconds": 2}


def run_failover(dag: Any, cg: str, answers: dict[str, str],
                 before: dict[str, Callable[[str, int], None]] | None = None) -> tuple[Any, support.Approver]:
    approver = support.Approver(dag.dag_id, answers, timeout=600, before=before)
    with approver.running():
        dr = dag.test(run_conf={"consumer_groups": [cg], **PARAMS})
    assert not approver.errors and not approver.watchdog_fired, approver.errors
    return dr, approver


def ended_at_first_approval(dag: Any, cg: str, answer: tuple[str, int], reason: str,
                            before: Callable[[str, int], None] | None = None) -> Any:
    """A run whose first approval gets ``answer`` (choice, HTTP status), after ``before`` while it waits: it ends
    there, and the report says ``reason``."""
    dr, approver = run_failover(dag, cg, {"approve_stop_producers": answer[0]},
                                {"approve_stop_producers": before} if before else None)
    assert dr.state == "success", support.task_states(dr)
    assert approver.answered == [("approve_stop_producers", *answer)]
    report = support.xcom(dr.dag_id, dr.run_id, "report")
    assert report["completed"] is False and report["stopped_at"] == "approve_stop_producers"
    assert report["reason"] == reason
    return dr


def set_paused(dag_id: str, paused: bool) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=paused))


def is_paused(dag_id: str) -> bool | None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    with create_session() as session:
        dm = session.get(DagModel, dag_id)
        return None if dm is None else bool(dm.is_paused)


def test_failover_reject_reject_then_approve(clusters: Any, unique: Any, tmp_path: Path, airflow_db: Path,
                                             monkeypatch: Any) -> None:
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=80)
    support.commit_source_group(s, {0: 15, 1: 25})
    dags = support.load_dags(s.config, monkeypatch)
    dst_topic = f"{s.topic}.mirror"
    cfg = load_config(s.config)
    group = cfg.group(s.name)
    dr = dags[s.dag_id("stream")].test()
    assert dr.state == "success", support.task_states(dr)
    set_paused(s.dag_id("stream"), False)  # switched on, as a user does (new DAGs start paused)
    failover = dags[s.dag_id("failover")]

    # 1. Reject "stop the producers": the run ends cleanly, nothing anywhere changed
    dr = ended_at_first_approval(failover, s.consumer_group, ("Reject", 200), "rejected at the approval")
    states = support.task_states(dr)
    assert {t: states[t] for t in ("wait_for_quiet", "final_drain", "final_sync", "verify_parity", "finalize")} == {
        t: "skipped" for t in ("wait_for_quiet", "final_drain", "final_sync", "verify_parity", "finalize")}
    assert support.committed(s.dst, s.consumer_group, dst_topic, 2) == {0: -1001, 1: -1001}
    assert stream_stop_requested(cfg, group) is None

    # 2. Reject "switch consumers": offsets were synced before it, nothing after (stream left running)
    support.produce(s, 10)  # new records while the producers "still run": the final drain mirrors them
    dr, approver = run_failover(failover, s.consumer_group, {"approve_stop_producers": "Approve",
                                                             "approve_switch_consumers": "Reject"})
    assert dr.state == "success", support.task_states(dr)
    report = support.xcom(dr.dag_id, dr.run_id, "report")
    assert report["stopped_at"] == "approve_switch_consumers" and report["steps"]["verify"]["ok"]
    assert support.task_states(dr)["finalize"] == "skipped"
    assert stream_stop_requested(cfg, group) is None
    assert is_paused(s.dag_id("stream")) is not True
    assert support.committed(s.dst, s.consumer_group, dst_topic, 2) == {
        p: o["destination_committed"] for p, o in ((o["partition"], o) for o in report["offsets"])}

    # 3. Approve both: the group moves; the stream is stopped and stays stopped
    support.commit_source_group(s, {0: 20, 1: 28})  # the consumers went on reading on the source meanwhile
    # ... and on, after final_sync, until they were stopped there just before "switch consumers" was approved:
    # finalize's resync moves their destination offsets after them
    dr, approver = run_failover(failover, s.consumer_group, {"approve_stop_producers": "Approve",
                                                             "approve_switch_consumers": "Approve"},
                                before={"approve_switch_consumers": lambda _run, _index: support.commit_source_group(
                                    s, {0: 30, 1: 33})})
    assert dr.state == "success", support.task_states(dr)
    assert [a[:2] for a in approver.answered] == [("approve_stop_producers", "Approve"),
                                                  ("approve_switch_consumers", "Approve")]
    report = support.xcom(dr.dag_id, dr.run_id, "report")
    assert report["completed"] is True and report["stopped_at"] is None
    assert report["records_verified"] == sum(s.produced.values()) == 90
    synced = {o["partition"]: (o["source_committed"], o["destination_committed"]) for o in report["offsets"]}
    assert {p: src for p, (src, _dst) in synced.items()} == {0: 20, 1: 28}  # final_sync's, before the approval
    finalize = support.xcom(dr.dag_id, dr.run_id, "finalize", key="step_report")
    assert finalize["details"]["resync"]["ok"], finalize["summary"]
    resynced = {o["partition"]: o for o in finalize["details"]["resync"]["offsets"]}
    assert {p: o["source_committed"] for p, o in resynced.items()} == {0: 30, 1: 33}
    moved = {p: o["translated"] for p, o in resynced.items()}
    assert all(moved[p] > synced[p][1] for p in (0, 1)), (moved, synced)  # forward, past where final_sync put them
    assert {p: o["destination_committed"] for p, o in resynced.items()} == moved
    assert support.committed(s.dst, s.consumer_group, dst_topic, 2) == moved
    resumed = support.resume_on_destination(s, dst_topic)
    assert resumed[0] == support.keys(s.src, s.topic, 0, start=30)  # 0 gaps, 0 re-reads
    assert resumed[1] == support.keys(s.src, s.topic, 1, start=33)
    assert resumed[0] and resumed[1]
    assert (stream_stop_requested(cfg, group) or "").startswith(f"failover of group {s.name} to dst at ")
    assert is_paused(s.dag_id("stream")) is True
    assert finalize["details"]["stream_stopped"] is True
    dr = dags[s.dag_id("stream")].test()  # a stream run after the failover launches no job
    assert support.task_states(dr) == {"mirror_stream": "skipped"}


def test_an_approval_nobody_may_or_does_answer_ends_the_run(clusters: Any, unique: Any, tmp_path: Path,
                                                             airflow_db: Path, monkeypatch: Any) -> None:
    """failover.approvers are the approvals' assigned users: Airflow lets only them answer (the other tests run in
    the simple auth manager's all-admins mode, where everyone may; here, while the approval waits, two users who
    may both act on the run try). failover.approval_timeout: unanswered, the approval is answered Reject when it
    passes (by the scheduler's sweep), the run ends where it was (nothing changed), and the report says nobody
    answered."""
    s = support.scenario(clusters, unique, tmp_path, partitions=1, records=20,
                         group_yaml="    failover: {approvers: [sre-oncall], approval_timeout: 3s}\n")
    support.commit_source_group(s, {0: 5})
    dags = support.load_dags(s.config, monkeypatch)
    assert dags[s.dag_id("stream")].test().state == "success"
    failover = dags[s.dag_id("failover")]
    stop = failover.get_task("approve_stop_producers")
    assert stop.assigned_users == [{"id": "sre-oncall", "name": "sre-oncall"}] and stop.defaults == ["Reject"]
    assert "Unanswered for 3 s, this is answered Reject." in stop.body

    def others_may_not(run_id: str, map_index: int) -> None:
        from mirrorflow_airflow import hitl

        path = f"/api/v2/dags/{failover.dag_id}/dagRuns/{run_id}/taskInstances/approve_stop_producers/{map_index}/" \
            "hitlDetails"
        with support.signed_in({"sre-oncall": "USER", "dev": "USER"}, tmp_path / "passwords.json") as users:
            r = users["dev"].patch(path, json={"chosen_options": ["Reject"]})
            assert r.status_code == 403 and "(id=dev) is not a respondent for the task" in r.text, r.text[:300]
            # the approver gets past that check (here only to be refused an answer that is not one of the options)
            r = users["sre-oncall"].patch(path, json={"chosen_options": ["Maybe"]})
            assert r.status_code == 400 and "Invalid options" in r.text, r.text[:300]
            r = users["dev"].get(path)
            assert r.status_code == 200 and r.json()["response_received"] is False, r.text[:300]
        assert ("approve_stop_producers", run_id, map_index) in hitl.awaiting_input(failover.dag_id)  # still waits

    dr = ended_at_first_approval(failover, s.consumer_group, ("timeout", 0),
                                 "no answer before the approval's timeout: rejected", before=others_may_not)
    assert support.task_states(dr)["final_sync"] == "skipped"
    assert support.committed(s.dst, s.consumer_group, f"{s.topic}.mirror", 1) == {0: -1001}
