"""The provision DAG's tasks without clusters: the plan task fails only on topic errors and logs why, one line
each (errors, schema errors, skipped topics, warnings); schema subjects are mirrored when a topic failed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mirror_core.provision import GroupPlan, ProvisionResult
from mirror_core.schemas import SchemaPlan
from mirror_core.topics import TopicAction, TopicPlan
from tests.dags.test_dagbag import dagbag_of

_UNAUTHORIZED = ("g__orders__orders", "schema registry http://dst: GET /subjects/orders-value/versions failed: "
                 "Unauthorized [subject 'orders-value', HTTP 401, error code 40101]")


def _plan(*actions: TopicAction, schema_errors: tuple[tuple[str, str], ...] = ()) -> GroupPlan:
    topics = TopicPlan("g", (TopicAction("unchanged", "orders", "g__orders__orders", "up to date",
                                         source_topic="orders", warnings=("orders: fewer partitions",)),
                             *actions),
                       skipped=(("ordrs", "g__ordrs__ordrs: source topic does not exist"),))
    return GroupPlan("g", topics, SchemaPlan([], list(schema_errors)), ())


def _task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, task_id: str) -> Any:
    bag = dagbag_of(tmp_path, monkeypatch, """
        clusters:
          a: {kafka: {bootstrap.servers: "a:9092"}}
          b: {kafka: {bootstrap.servers: "b:9092"}}
        groups:
          - {name: g, source: a, destination: b, mirrors: [{source_topic: orders}, {source_topic: ordrs}]}
    """)
    return bag.dags["mirrorflow__g__provision"].get_task(task_id)


def _logged(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The task log's lines (Airflow's structured logging writes them to stdout), stripped."""
    return [line.strip() for line in capsys.readouterr().out.splitlines()]


def test_a_schema_error_does_not_stop_the_topics_and_every_finding_is_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    task = _task(tmp_path, monkeypatch, "plan")
    monkeypatch.setattr("mirror_core.provision.plan_group", lambda cfg, g: _plan(schema_errors=(_UNAUTHORIZED,)))
    out = task.execute({})
    assert out["schema_errors"] == 1 and out["skipped"] == ["ordrs"]
    lines = _logged(capsys)
    for line in (f"schema error: {_UNAUTHORIZED[0]}: {_UNAUTHORIZED[1]}",
                 "skipped ordrs: g__ordrs__ordrs: source topic does not exist", "warning: orders: fewer partitions"):
        assert any(x.startswith(line) for x in lines), line


def test_a_topic_error_fails_the_plan_with_its_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    task = _task(tmp_path, monkeypatch, "plan")
    wide = TopicAction("error", "wide", "g__wide__wide", "replication factor 3 is above the destination's 1 "
                                                          "broker(s)", source_topic="wide")
    monkeypatch.setattr("mirror_core.provision.plan_group", lambda cfg, g: _plan(wide))
    with pytest.raises(AirflowFailException, match="wide: replication factor 3"):
        task.execute({})
    assert "error: g__wide__wide: wide: replication factor 3 is above the destination's 1 broker(s)" in \
        " ".join(_logged(capsys))


def test_apply_topics_logs_each_error_and_schemas_run_after_a_failed_topic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    task = _task(tmp_path, monkeypatch, "apply_topics")
    monkeypatch.setattr("mirror_core.provision.plan_group", lambda cfg, g: _plan())
    res = ProvisionResult("g", done=["created b (1 partitions, RF 1)"],
                          errors=["g__a__a: create topic a failed: Unknown topic config name: x (INVALID_CONFIG)"])
    monkeypatch.setattr("mirror_core.provision.apply_topics", lambda cfg, g, p: res)
    with pytest.raises(AirflowFailException, match="create topic a failed"):
        task.execute({})
    assert "g: error: g__a__a: create topic a failed: Unknown topic config name: x (INVALID_CONFIG)" in \
        " ".join(_logged(capsys))
    schemas = task.dag.get_task("mirror_schemas")
    assert schemas.trigger_rule == "all_done_min_one_success"
    assert schemas.upstream_task_ids == {"plan", "apply_topics"}
