"""What one view of the Mirrors page reads from Airflow's database: Airflow's own tables, in SQLite in memory,
filled the way the ``record_lag`` task and the scheduler fill them."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from airflow.models import import_all_models
from sqlalchemy import create_engine, insert
from sqlalchemy.orm import Session

import_all_models()

from airflow.models.dag import DagModel  # noqa: E402 - after every model is imported (their foreign keys)
from airflow.models.dagrun import DagRun  # noqa: E402
from airflow.models.taskinstance import TaskInstance  # noqa: E402
from airflow.models.xcom import XComModel  # noqa: E402
from mirrorflow_airflow.web import store  # noqa: E402
from mirrorflow_airflow.web.app import page_model  # noqa: E402

from mirror_core.lag_samples import totals  # noqa: E402

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


class Airflow:
    """Rows as the scheduler and the record_lag task write them."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.runs = 0

    def dags(self, group: str, stale: bool = False) -> None:
        for purpose in ("offset_sync", "stream"):
            self.session.execute(insert(DagModel.__table__).values(
                dag_id=f"mirrorflow__{group}__{purpose}", bundle_name="dags-folder", is_stale=stale,
                max_active_tasks=16, max_consecutive_failed_dag_runs=0, has_task_concurrency_limits=False))

    def run(self, dag_id: str, state: str = "success") -> tuple[int, str]:
        return self.runs_of(dag_id, 1, state)[0]

    def runs_of(self, dag_id: str, count: int, state: str = "success") -> list[tuple[int, str]]:
        ids = [(self.runs + i, f"scheduled__{self.runs + i}") for i in range(1, count + 1)]
        self.runs += count
        self.session.execute(insert(DagRun.__table__), [
            {"id": pk, "dag_id": dag_id, "run_id": run_id, "run_type": "scheduled", "state": state,
             "logical_date": None, "data_interval_end": None} for pk, run_id in ids])
        return ids

    def samples(self, group: str, count: int, since: timedelta, partitions: int = 3,
                whole_in_every_run: bool = False) -> None:
        """``count`` record_lag runs over the last ``since``: each run's totals, the newest whole sample (every
        run's with ``whole_in_every_run``, as when the task could not delete them), and the whole sample each
        run kept as its return value before the totals existed."""
        dag = f"mirrorflow__{group}__offset_sync"
        rows = []
        for i, (pk, run_id) in enumerate(self.runs_of(dag, count)):
            at = NOW - since + since * (i + 1) / count
            sample = {"group": group, "taken_at": at.isoformat(), "lag_records": i, "max_lag_seconds": 1.0,
                      "throughput": 2.0, "last_checkpoint_at": None, "stream_stopped": None,
                      "partitions": [{"source_topic": "t", "destination_topic": "t", "partition": p,
                                      "lag_records": i, "lag_seconds": 1.0, "source_end": 10 * i,
                                      "destination_end": 9 * i, "throughput": 2.0} for p in range(partitions)]}
            values = {"lag_totals": totals(sample), "return_value": sample}
            if whole_in_every_run or i == count - 1:
                values["lag_sample"] = sample
            rows += [{"dag_run_id": pk, "task_id": "record_lag", "map_index": -1, "key": key, "dag_id": dag,
                      "run_id": run_id, "value": XComModel.serialize_value(v), "timestamp": at}
                     for key, v in values.items()]
        self.session.execute(insert(XComModel.__table__), rows)

    def stream(self, group: str, run_state: str, task_state: str | None) -> None:
        dag = f"mirrorflow__{group}__stream"
        _, run_id = self.run(dag, run_state)
        self.session.execute(insert(TaskInstance.__table__).values(
            id=uuid.uuid4(), dag_id=dag, run_id=run_id, task_id="mirror_stream", map_index=-1,
            pool="default_pool", state=task_state))


@pytest.fixture
def airflow() -> Iterator[Airflow]:
    engine = create_engine("sqlite://")
    XComModel.metadata.create_all(engine)
    with Session(engine) as session:
        yield Airflow(session)


@pytest.fixture
def values_read(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every XCom value the page parses."""
    seen: list[Any] = []
    parse = XComModel.deserialize_value

    def counted(result: Any) -> Any:
        value = parse(result)
        seen.append(value)
        return value
    monkeypatch.setattr(XComModel, "deserialize_value", staticmethod(counted))
    return seen


def test_a_views_read_is_bounded_and_each_groups_history_spans_the_window(airflow: Airflow,
                                                                          values_read: list[Any]) -> None:
    """A busy group (6,000 runs in the last hour, every whole sample left behind) takes nothing from a quiet
    one (a run every 5 minutes for 6 hours): one whole sample per group and at most MAX_POINTS totals each."""
    airflow.dags("busy")
    airflow.dags("quiet")
    airflow.samples("busy", 6000, timedelta(hours=1), whole_in_every_run=True)
    airflow.samples("quiet", 72, timedelta(hours=6))
    page = page_model(airflow.session, hours=6, now=NOW)
    by = {g.group: g for g in page.groups}
    assert sorted(by) == ["busy", "quiet"]
    quiet, busy = by["quiet"].series, by["busy"].series
    assert len(quiet) == 72 and quiet[0][0] == NOW - timedelta(minutes=355) and quiet[-1][0] == NOW
    assert len(busy) <= store.MAX_POINTS and busy[-1][0] == NOW and busy[0][0] <= NOW - timedelta(minutes=59)
    assert [r.lag_records for r in by["busy"].rows] == [5999] * 3  # the newest sample's rows
    whole = [v for v in values_read if "partitions" in v and isinstance(v["partitions"], list)]
    assert len(whole) == 2
    assert len(values_read) <= 2 + 2 * store.MAX_POINTS


def test_the_read_does_not_grow_with_the_history(airflow: Airflow, values_read: list[Any]) -> None:
    airflow.dags("g")
    airflow.samples("g", 3 * store.MAX_POINTS, timedelta(hours=6), partitions=50)
    page_model(airflow.session, hours=6, now=NOW)
    first = len(values_read)
    airflow.samples("g", 3 * store.MAX_POINTS, timedelta(hours=5), partitions=50)  # twice the history
    values_read.clear()
    page_model(airflow.session, hours=24 * 14, now=NOW)
    assert len(values_read) == first <= store.MAX_POINTS + 1


def test_the_stream_shows_its_task_state_not_its_runs(airflow: Airflow) -> None:
    """A crashed Spark job waiting for its next try: the run is running, the task is up_for_retry."""
    for g in ("crashing", "fresh", "idle"):
        airflow.dags(g)
    airflow.stream("crashing", "running", "up_for_retry")
    airflow.stream("fresh", "queued", None)
    states = {g.group: g.stream_state for g in page_model(airflow.session, hours=6, now=NOW).groups}
    assert states == {"crashing": "up_for_retry", "fresh": "no_status", "idle": None}


def test_groups_no_longer_in_the_config_are_left_out(airflow: Airflow) -> None:
    airflow.dags("kept")
    airflow.dags("removed", stale=True)
    for g in ("kept", "removed"):
        airflow.samples(g, 3, timedelta(minutes=3))
        airflow.stream(g, "running", "running")
    page = page_model(airflow.session, hours=6, now=NOW)
    assert [g.group for g in page.groups] == ["kept"]


def test_a_group_gone_from_the_config_while_its_stream_ran_is_named_with_the_configs_import_errors(
        airflow: Airflow) -> None:
    """A group left out of the config (or removed) while its continuous stream ran keeps a Spark job that nothing
    relaunches or stops: the page names it, with its task's state, and says how many of the config's DAG files
    fail to import (where the groups left out are named). A group gone with its stream done is not named."""
    from airflow.models.errors import ParseImportError
    from mirrorflow_airflow.web.render import as_json, render

    airflow.dags("kept")
    for g, state in (("broken", "running"), ("retrying", "up_for_retry"), ("finished", "success")):
        airflow.dags(g, stale=True)
        airflow.stream(g, "running", state)
    assert page_model(airflow.session, hours=6, now=NOW).config_errors == 0
    airflow.session.execute(insert(ParseImportError.__table__).values(
        filename="mirrorflow_config_check.py", bundle_name="dags-folder", stacktrace="x"))  # relative to its bundle
    airflow.session.execute(insert(ParseImportError.__table__).values(
        filename="mirrors/someone_elses.py", bundle_name="dags-folder", stacktrace="x"))
    airflow.session.execute(insert(ParseImportError.__table__).values(
        filename="mirrors/mirrorflow_dags.py", bundle_name="dags-folder", stacktrace="x"))
    page = page_model(airflow.session, hours=6, now=NOW)
    assert [g.group for g in page.groups] == ["kept"]
    assert page.unmanaged == (("broken", "running"), ("retrying", "up_for_retry")) and page.config_errors == 2
    html = render(page, 6)
    assert "<b>broken</b> (mirror_stream running)" in html and "2 of its DAG" in html
    assert "finished" not in html
    shown = as_json(page)
    assert shown["unmanaged_streams"] == [{"group": "broken", "stream_state": "running"},
                                          {"group": "retrying", "stream_state": "up_for_retry"}]
    assert shown["config_import_errors"] == 2
    assert page_model(airflow.session, hours=6, now=NOW, readable={"kept", "retrying"}).unmanaged == (
        ("retrying", "up_for_retry"),)


def test_a_user_sees_only_the_groups_they_may_read(airflow: Airflow) -> None:
    for g in ("mine", "theirs"):
        airflow.dags(g)
        airflow.samples(g, 3, timedelta(minutes=3))
        airflow.stream(g, "running", "running")
    page = page_model(airflow.session, hours=6, now=NOW, readable={"mine"})
    assert [(g.group, g.stream_state, len(g.series)) for g in page.groups] == [("mine", "running", 3)]
