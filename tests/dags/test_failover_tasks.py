"""The failover DAG's tasks around the steps, without clusters: one failover of a flow at a time, approval texts
that render whatever upstream left, a report that names the step that stopped it, a pause that cannot fail
finalize, and waits that outlast a broker's restart."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.dags.test_dagbag import dagbag_of


def _two_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    return dagbag_of(tmp_path, monkeypatch, """
        clusters:
          a: {kafka: {bootstrap.servers: "a:9092"}}
          b: {kafka: {bootstrap.servers: "b:9092"}}
        groups:
          - {name: ab, source: a, destination: b, spark: {mode: available_now}, mirrors: [{source_topic: orders}]}
          - {name: ba, source: b, destination: a, mirrors: [{source_topic: orders}]}
    """, name="two-way.yaml")


def test_two_dags_that_move_one_flow_know_each_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With both directions in the config, ab's failback and ba's failover both move ba's consumers: each one's
    preflight refuses while the other runs."""
    bag = _two_way(tmp_path, monkeypatch)
    sib = {d: bag.dags[d].get_task("preflight").sibling_dag_ids
           for d in ("mirrorflow__ab__failover", "mirrorflow__ab__failback", "mirrorflow__ba__failover",
                     "mirrorflow__ba__failback")}
    assert sib == {"mirrorflow__ab__failover": ["mirrorflow__ba__failback"],
                   "mirrorflow__ab__failback": ["mirrorflow__ba__failover"],
                   "mirrorflow__ba__failover": ["mirrorflow__ab__failback"],
                   "mirrorflow__ba__failback": ["mirrorflow__ab__failover"]}
    from mirrorflow_airflow import operators

    from mirror_core import failover

    # the DAG runs Airflow knows, by state: only a sibling's run that is going on stops the preflight (not the
    # runs of the DAG itself, not a sibling's finished runs)
    runs: dict[str, list[str]] = {}

    def get_dr_count(dag_id: str, states: list[str]) -> int:
        return sum(state in states for state in runs.get(dag_id, []))

    ti = SimpleNamespace(get_dr_count=get_dr_count, get_task_states=lambda dag_id, task_ids: {},
                         xcom_push=lambda key, value: None)
    monkeypatch.setattr(failover, "preflight", lambda cfg, group, params, stream_running: failover.StepReport(
        "preflight", group.name, True, "ready", {}))
    task = bag.dags["mirrorflow__ab__failback"].get_task("preflight")
    runs.update({"mirrorflow__ba__failover": ["success", "failed", "running"], "mirrorflow__ab__failback": ["running"]})
    with pytest.raises(operators.AirflowFailException, match="a run of mirrorflow__ba__failover moves the consumers"):
        task.execute({"params": {"consumer_groups": ["g1"]}, "ti": ti})
    runs.update({"mirrorflow__ba__failover": ["success", "failed"], "mirrorflow__ab__failover": ["running"]})
    assert task.execute({"params": {"consumer_groups": ["g1"]}, "ti": ti})["ok"] is True


def test_approval_texts_render_without_upstream_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sensor or step marked done by hand leaves no report: the approval still asks, and names the groups."""
    bag = _two_way(tmp_path, monkeypatch)
    dag = bag.dags["mirrorflow__ab__failover"]
    env = dag.get_template_env()
    ctx = {"ti": SimpleNamespace(xcom_pull=lambda **_kw: None), "params": {"consumer_groups": ["billing", "audit"]}}
    stop = env.from_string(dag.get_task("approve_stop_producers").body).render(**ctx)
    switch = env.from_string(dag.get_task("approve_switch_consumers").body).render(**ctx)
    assert "(no lag report: the sensor was marked done by hand)" in stop
    assert "Stop the consumers of billing, audit on `a`" in switch and "(no sync report" in switch


def test_the_report_names_a_final_drain_or_an_approval_that_failed(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from mirrorflow_airflow import operators

    from mirror_core.failover import StepReport

    bag = _two_way(tmp_path, monkeypatch)
    report = bag.dags["mirrorflow__ab__failover"].get_task("report")
    assert ("final_drain", "task") in report.steps
    ok = {t: StepReport(k, "ab", True, f"{k} ok", {}).as_dict() for t, k in report.steps if k not in ("task", "approval")}
    states = {t: "success" for t, _ in report.steps}

    class _Ti:
        dag_id, run_id = "mirrorflow__ab__failover", "r1"

        def xcom_pull(self, task_ids: str, key: str) -> Any:
            return ok.get(task_ids) if key == operators.STEP_REPORT_KEY else None

        def get_task_states(self, dag_id: str, task_ids: list[str], run_ids: list[str]) -> dict[str, Any]:
            return {"r1": {t: states[t] for t in task_ids}}

        def xcom_push(self, key: str, value: Any) -> None: ...

    for task_id, state, said in (("final_drain", "failed", "failover stopped at final_drain: did not complete "
                                                           "(failed)"),
                                 ("approve_switch_consumers", "upstream_failed", "failover stopped at "
                                  "approve_switch_consumers: the approval did not complete (upstream_failed)")):
        states[task_id] = state
        with pytest.raises(operators.AirflowFailException) as exc:
            report.execute({"ti": _Ti()})
        assert str(exc.value) == said
        states[task_id] = "success"
    assert report.execute({"ti": _Ti()})["completed"] is True


def test_a_pause_the_api_refuses_leaves_finalize_going(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    from airflow.sdk import BaseHook
    from mirrorflow_airflow import operators

    conn = SimpleNamespace(host="http://127.0.0.1", port=9, login="admin", password="s3cret-admin")
    monkeypatch.setattr(BaseHook, "get_connection", staticmethod(lambda _id: conn))
    log = logging.getLogger("test.pause")
    with caplog.at_level(logging.WARNING, logger="test.pause"):
        assert operators.pause_dag("mirrorflow__ab__stream", log) is None
    assert "could not pause mirrorflow__ab__stream through the API at http://127.0.0.1:9" in caplog.text
    assert "s3cret-admin" not in caplog.text


def test_a_wait_outlasts_a_cluster_that_does_not_answer_and_stops_on_a_bad_config() -> None:
    from confluent_kafka import KafkaError, KafkaException
    from mirrorflow_airflow.triggers import ReplicationLagTrigger

    from mirror_core.errors import ConfigError, ConfigIssue, KafkaOperationError
    from mirror_core.failover import StepReport

    answers: list[Any] = [KafkaException(KafkaError(KafkaError._TRANSPORT)), OSError("connection refused"),
                          StepReport("lag", "ab", False, "lag 5 records", {}), StepReport("lag", "ab", True, "lag 0", {})]

    class _Trigger(ReplicationLagTrigger):
        def check(self, previous: dict[str, Any] | None) -> Any:
            got = answers.pop(0)
            if isinstance(got, Exception):
                raise got
            return got

    async def first(trigger: Any) -> Any:
        async for event in trigger.run():
            return event.payload

    event = asyncio.run(first(_Trigger("c.yaml", "ab", {"consumer_groups": ["g"]}, poll_interval=0, timeout=60)))
    assert event["status"] == "ok" and not answers
    answers[:] = [ConfigError([ConfigIssue("consumer_groups", "give at least one consumer group id")])]
    event = asyncio.run(first(_Trigger("c.yaml", "ab", {}, poll_interval=0, timeout=60)))
    assert event["status"] == "error" and "consumer_groups" in event["message"]
    answers[:] = [OSError("connection refused")] * 3
    event = asyncio.run(first(_Trigger("c.yaml", "ab", {}, poll_interval=0, timeout=0)))
    assert event == {"status": "timeout", "message": "lag: not reached within 0 s; last: OSError: connection refused"}
    # a refusal, or a topic that is gone: no wait mends it
    for refused in (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)),
                    KafkaOperationError("topic 'orders' does not exist", "UNKNOWN_TOPIC_OR_PART")):
        answers[:] = [refused, StepReport("lag", "ab", True, "lag 0", {})]
        event = asyncio.run(first(_Trigger("c.yaml", "ab", {}, poll_interval=0, timeout=60)))
        assert event["status"] == "error" and len(answers) == 1, event


def test_a_lag_sample_does_not_wait_for_the_checkpoint_round_nor_hide_its_failure(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample is taken after the checkpoint round (it shows the round's checkpoint) and also when the round
    failed (that is when the page is looked at); the run fails then all the same (a run's state comes from its
    last tasks: checkpoint_failed runs only after a failed round, and fails)."""
    from mirrorflow_airflow import operators

    dag = _two_way(tmp_path, monkeypatch).dags["mirrorflow__ab__offset_sync"]
    assert {t.task_id for t in dag.leaves} == {"record_lag", "checkpoint_failed", "heartbeat"}
    lag, watch = dag.get_task("record_lag"), dag.get_task("checkpoint_failed")
    assert (lag.upstream_task_ids, lag.trigger_rule) == ({"checkpoint"}, "all_done")
    assert (watch.upstream_task_ids, watch.trigger_rule) == ({"checkpoint"}, "one_failed")
    with pytest.raises(operators.AirflowFailException, match="checkpoint failed: see its log"):
        watch.execute({})
