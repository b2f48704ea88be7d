"""A stream stopped by a failover, without clusters (the stops topic in memory): a continuous stream's task waits,
deferred, until its stop is removed and then starts the job, instead of skipping (its ``@continuous`` DAG started the
next run at once, which skipped too, for good); a drain is skipped as before. The wait looks quietly, rides out a
destination that does not answer, and says what it waits for and what ends it. On real clusters:
tests/dags/test_stream_continuous.py."""

from __future__ import annotations

import asyncio
import re
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.dags.test_dagbag import _dagbag
from tests.fakes import FakeBoard, fake_boards

REASON = "failover of group ba to a at 2025-01-01T12:00:00Z"


class CountingBoard(FakeBoard):
    """A :class:`FakeBoard` that counts its reads (each one is a look of the wait)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self) -> dict[str, str]:
        self.reads += 1
        return super().read()


def _config(tmp_path: Path) -> Path:
    """``ab`` drains (available_now), its reverse ``ba`` streams continuously."""
    cfg = tmp_path / "two-way.yaml"
    cfg.write_text(textwrap.dedent(f"""
        clusters:
          a: {{kafka: {{bootstrap.servers: "a:9092"}}}}
          b: {{kafka: {{bootstrap.servers: "b:9092"}}}}
        groups:
          - name: ab
            source: a
            destination: b
            spark: {{mode: available_now, checkpoint_dir: "{tmp_path / 'ckpt'}"}}
            mirrors: [{{source_topic: orders}}]
          - name: ba
            source: b
            destination: a
            spark: {{mode: continuous, checkpoint_dir: "{tmp_path / 'ckpt'}"}}
            mirrors: [{{source_topic: orders}}]
    """))
    return cfg


def _stop(config: Path, boards: dict[str, FakeBoard], group: str) -> str:
    """Write the group's stop on its destination's (fake) board; returns its key."""
    from mirror_core import stops
    from mirror_core.config import load_config

    g = load_config(config).group(group)
    key = stops.key(g)
    boards.setdefault(g.destination, CountingBoard()).stops[key] = REASON
    return key


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """What reached spark-submit (nothing runs)."""
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    out: list[Any] = []
    monkeypatch.setattr(SparkSubmitOperator, "execute", lambda self, context: out.append(self.application_args))
    return out


def test_a_stopped_continuous_stream_waits_deferred_and_a_stopped_drain_is_skipped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, submitted: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    from airflow.sdk.exceptions import AirflowSkipException, TaskDeferred
    from mirrorflow_airflow.triggers import StreamStopTrigger

    config = _config(tmp_path)
    bag = _dagbag(config, monkeypatch)
    boards = fake_boards(monkeypatch)
    _stop(config, boards, "ba")
    _stop(config, boards, "ab")

    stream = bag.dags["mirrorflow__ba__stream"]
    assert stream.max_active_runs == 1 and type(stream.timetable).__name__ == "ContinuousTimetable"
    task = stream.get_task("mirror_stream")
    capsys.readouterr()
    with pytest.raises(TaskDeferred) as deferred:
        task.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, StreamStopTrigger) and deferred.value.method_name == "resume_after_stop"
    assert deferred.value.timeout is None  # it waits as long as the stop stays
    assert trigger.serialize() == ("mirrorflow_airflow.triggers.StreamStopTrigger", {
        "config_path": str(config), "group_name": "ba", "reason": REASON, "poll_interval": 60.0})
    said = [line for line in capsys.readouterr().out.splitlines() if "ba: " in line]  # the task log's lines
    assert len(said) == 1, said
    # what it waits for, and what ends the wait
    assert REASON in said[0] and "of topic mirrorflow-stops.internal on a" in said[0]
    assert f"`mirrorflow failover {config} --group ba --step resume`" in said[0]
    assert "the finalize of a failover of the reverse group 'ab'" in said[0]
    assert "one look every 60 s" in said[0]

    drain = bag.dags["mirrorflow__ab__stream"]
    assert drain.max_active_runs == 1  # a drain that is skipped ends its run: none piles up behind it
    with pytest.raises(AirflowSkipException, match=f"not started: {REASON}"):
        drain.get_task("mirror_stream").execute({})
    final_drain = bag.dags["mirrorflow__ab__failover"].get_task("final_drain")
    with pytest.raises(AirflowSkipException, match=f"not started: {REASON}"):
        final_drain.execute({})
    assert submitted == []


def test_back_from_the_wait_the_job_starts_unless_stopped_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 submitted: list[Any]) -> None:
    from airflow.sdk.exceptions import AirflowException, TaskDeferred

    config = _config(tmp_path)
    bag = _dagbag(config, monkeypatch)
    boards = fake_boards(monkeypatch)
    key = _stop(config, boards, "ba")
    task = bag.dags["mirrorflow__ba__stream"].get_task("mirror_stream")
    with pytest.raises(TaskDeferred):  # written again between the trigger's look and the task's
        task.resume_after_stop({}, event={"status": "lifted"})
    assert submitted == []
    del boards["a"].stops[key]
    task.resume_after_stop({}, event={"status": "lifted"})
    assert submitted == [[str(config), "--group", "ba"]]
    with pytest.raises(AirflowException, match="cannot read the stream's stop: no group named 'ba'"):
        task.resume_after_stop({}, event={"status": "error", "message": "cannot read the stream's stop: no group "
                                                                          "named 'ba' (have: ab)"})


async def _until(what: str, check: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The trigger's lines about group ba (Airflow's structured log, on stdout), as ``LEVEL message``."""
    found = re.findall(r"\[(\w+) *\] (ba: .*?) +\[mirrorflow_airflow", capsys.readouterr().out)
    return [f"{level.upper()} {text}" for level, text in found]


def test_the_wait_fires_once_the_stop_is_removed_and_says_only_what_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mirrorflow_airflow.triggers import StreamStopTrigger

    config = _config(tmp_path)
    boards = fake_boards(monkeypatch)
    key = _stop(config, boards, "ba")
    board = boards["a"]
    assert isinstance(board, CountingBoard)

    async def scenario() -> Any:
        events = StreamStopTrigger(str(config), "ba", REASON, poll_interval=0).run()
        first = asyncio.ensure_future(events.__anext__())
        await _until("20 looks", lambda: board.reads >= 20)
        assert not first.done()  # still stopped: no event, so the task stays deferred
        board.stops[key] = "stopped by hand"
        await _until("a look at the new reason", lambda: board.reads >= 25)
        board.down = True  # the destination stops answering: the wait goes on
        await _until("20 more looks", lambda: board.reads >= 45)
        assert not first.done()
        board.down = False
        await _until("a look that is answered", lambda: board.reads >= 50)
        assert not first.done()
        del board.stops[key]
        event = await asyncio.wait_for(first, 30)
        await events.aclose()
        return event.payload

    assert asyncio.run(scenario()) == {"status": "lifted"}
    # one line per change, none per look
    assert _lines(capsys) == [
        "INFO ba: still stopped, now by: stopped by hand",
        "WARNING ba: whether the stream's stop is still in force is not known: cannot read the failover stops from "
        "topic mirrorflow-stops.internal on b: Local: All broker connections are down (waiting on; looking again "
        "every 0 s)",
        "INFO ba: the stops are read again",
        "INFO ba: the stop is removed"]


def test_a_wait_warns_again_about_a_silent_destination_only_every_ten_minutes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from mirrorflow_airflow import triggers

    from mirror_core import stops

    class Silent(CountingBoard):
        """Does not answer for its first 30 looks (half an hour, a look a minute); then the stop is gone."""

        def read(self) -> dict[str, str]:
            self.reads += 1
            if self.reads <= 30:
                raise stops.StopSignalError("cannot read the failover stops from topic mirrorflow-stops.internal "
                                            "on a: Local: All broker connections are down")
            return {}

    config = _config(tmp_path)
    board = Silent()
    fake_boards(monkeypatch)["a"] = board
    monkeypatch.setattr(triggers.StreamStopTrigger, "clock", staticmethod(lambda: 60.0 * board.reads))

    async def first() -> Any:
        async for event in triggers.StreamStopTrigger(str(config), "ba", REASON, poll_interval=0).run():
            return event.payload

    assert asyncio.run(first()) == {"status": "lifted"}
    lines = _lines(capsys)
    assert [line.split(":")[0] for line in lines] == ["WARNING ba"] * 3 + ["INFO ba"] * 2, lines  # minutes 1, 11, 21
    assert lines[-2:] == ["INFO ba: the stops are read again", "INFO ba: the stop is removed"]


def test_a_wait_on_a_group_the_config_no_longer_has_ends_with_why(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from mirrorflow_airflow.triggers import StreamStopTrigger

    config = _config(tmp_path)
    fake_boards(monkeypatch)

    async def first() -> Any:
        async for event in StreamStopTrigger(str(config), "gone", REASON, poll_interval=0).run():
            return event.payload

    event = asyncio.run(first())
    assert event["status"] == "error" and "no group named 'gone'" in event["message"], event


def test_a_waiting_stream_task_is_no_job_for_finalize_to_wait_for() -> None:
    """finalize waits until no stream task runs: a deferred one (a run that waits for the stop's removal) runs no
    job, and counting it would keep finalize waiting until its timeout."""
    from mirrorflow_airflow.operators import stream_jobs_running

    class FakeTI:
        def get_task_states(self, dag_id: str, task_ids: list[str]) -> dict[str, dict[str, str]]:
            return {"r1": {"mirror_stream": "success"}, "r2": {"mirror_stream": "deferred"}}

    assert stream_jobs_running(FakeTI(), "mirrorflow__ba__stream") == 0
