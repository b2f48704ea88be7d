"""Pure parts of the failover: params, the lag sample contract, the report, the group's stop."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirror_core import failover, stops
from mirror_core.config import parse_config
from mirror_core.errors import ConfigError
from mirror_core.health import LagReport
from tests.fakes import FakeBoard, fake_boards


def _cfg(tmp_path: Path, reverse: bool = True):  # noqa: ANN202
    raw = {"clusters": {"a": {"kafka": {"bootstrap.servers": "a:1"}}, "b": {"kafka": {"bootstrap.servers": "b:1"}}},
           "groups": [{"name": "ab", "source": "a", "destination": "b", "mirrors": [{"source_topic": "t"}],
                       "spark": {"checkpoint_dir": str(tmp_path / "ckpt")}}]}
    if reverse:
        raw["groups"].append({"name": "ba", "source": "b", "destination": "a", "enabled": False,
                              "mirrors": [{"source_topic": "u"}], "spark": {"checkpoint_dir": str(tmp_path / "ckpt")}})
    return parse_config(yaml.safe_load(yaml.safe_dump(raw)), env={})


def test_params_are_validated_with_their_names() -> None:
    p = failover.FailoverParams.from_mapping({"consumer_groups": "g1, g2", "max_lag_records": "5", "quiet_seconds": 2})
    assert p.consumer_groups == ("g1", "g2") and p.max_lag_records == 5 and p.quiet_seconds == 2.0
    with pytest.raises(ConfigError) as err:
        failover.FailoverParams.from_mapping({"consumer_groups": [], "max_lag_seconds": -1, "quiet_seconds": "x"})
    assert [str(i) for i in err.value.issues] == [
        "consumer_groups: give at least one consumer group id", "max_lag_seconds: must be >= 0, got -1",
        "quiet_seconds: not a number: 'x'"]


def test_report_says_where_a_rejected_run_stopped(tmp_path: Path) -> None:
    group = _cfg(tmp_path).group("ab")
    reps = [failover.StepReport("preflight", "ab", True, "ready"), failover.StepReport("lag", "ab", True, "lag 0")]
    md, summary = failover.render_report(group, reps, "approve_stop_producers", "rejected by admin")
    assert "Stopped at `approve_stop_producers`**: rejected by admin. Nothing was changed after that point." in md
    assert summary["completed"] is False and summary["stopped_at"] == "approve_stop_producers"
    done = reps + [failover.StepReport("sync", "ab", True, "1 synced", {"offsets": [
        {"consumer_group": "c", "destination_topic": "t", "partition": 0, "source_committed": 5,
         "destination_committed": 5}]}), failover.StepReport("verify", "ab", True, "ok", {"records_verified": 9}),
        failover.StepReport("finalize", "ab", True, "stream stopped")]
    md, summary = failover.render_report(group, done)
    assert summary["completed"] and summary["records_verified"] == 9
    assert "| c | t | 0 | 5 | 5 |" in md


def wait_for(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
    return got


@pytest.fixture
def boards(monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeBoard]:
    return fake_boards(monkeypatch)


def test_a_stop_is_idempotent_and_finalize_readies_the_reverse_group(tmp_path: Path, boards) -> None:
    cfg = _cfg(tmp_path)
    ab, ba = cfg.group("ab"), cfg.group("ba")
    failover.request_stream_stop(cfg, ba, "an earlier failback")
    assert boards["a"].stops == {f"{tmp_path / 'ckpt'}/ba": boards["a"].stops[f"{tmp_path / 'ckpt'}/ba"]}
    assert failover.reverse_group(cfg, ab) == ba
    rep = failover.finalize(cfg, ab, stream_stopped=True)
    assert rep.ok and rep.details["reverse_group"] == "ba" and rep.details["reverse_stop_cleared"] is True
    assert rep.details["stop"] == f"key '{tmp_path / 'ckpt'}/ab' of topic mirrorflow-stops.internal on b"
    first = failover.stream_stop_requested(cfg, ab)
    assert first and first.startswith("failover of group ab to b at ")
    writes = boards["b"].writes
    assert failover.finalize(cfg, ab, stream_stopped=True).ok
    assert failover.stream_stop_requested(cfg, ab) == first and boards["b"].writes == writes  # not rewritten
    assert failover.stream_stop_requested(cfg, ba) is None
    assert not failover.finalize(cfg, ab, stream_stopped=False).ok
    assert failover.reverse_group(_cfg(tmp_path, reverse=False), ab) is None
    assert not list((tmp_path / "ckpt").glob("*stopped-by-failover"))  # nothing on this host's disk


def test_a_stop_belongs_to_the_checkpoint_not_to_the_group_name(tmp_path: Path, boards) -> None:
    """Two deployments mirroring into one cluster under one group name keep their stops apart; a process that
    reaches the same local checkpoint through a link finds its stop; a remote checkpoint's key is its URI."""
    cfg = _cfg(tmp_path, reverse=False)
    failover.request_stream_stop(cfg, cfg.group("ab"), "failover")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "ckpt")
    other = yaml.safe_load(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)))
    for where, stopped in ((str(tmp_path / "elsewhere"), False), (str(tmp_path / "link"), True),
                           (f"file://{tmp_path}/ckpt", True), ("s3a://bucket/ckpt", False)):
        other["groups"][0]["spark"]["checkpoint_dir"] = where
        o = parse_config(other, env={})
        assert (failover.stream_stop_requested(o, o.group("ab")) is not None) is stopped, where
    # written through the link, found through the directory itself (and removed from there)
    failover.clear_stream_stop(cfg, cfg.group("ab"))
    other["groups"][0]["spark"]["checkpoint_dir"] = str(tmp_path / "link")
    o = parse_config(other, env={})
    failover.request_stream_stop(o, o.group("ab"), "failover")
    assert list(boards["b"].stops) == [f"{tmp_path / 'link'}/ab"]
    assert failover.stream_stop_requested(cfg, cfg.group("ab")) is not None
    assert failover.clear_stream_stop(cfg, cfg.group("ab")) and boards["b"].stops == {}
    other["groups"][0]["spark"]["checkpoint_dir"] = "s3a://bucket/ckpt/"
    o = parse_config(other, env={})
    failover.request_stream_stop(o, o.group("ab"), "failover")
    assert "s3a://bucket/ckpt/ab" in boards["b"].stops


def test_a_stop_file_from_before_is_honoured_and_resume_removes_it(tmp_path: Path, boards) -> None:
    cfg = _cfg(tmp_path, reverse=False)
    group = cfg.group("ab")
    old = tmp_path / "ckpt" / "ab.stopped-by-failover"
    old.parent.mkdir()
    old.write_text("failover of group ab to b at 2026-12-01T10:00:00Z\n")
    assert stops.legacy_file(group) == old
    assert failover.stream_stop_requested(cfg, group) == (
        f"failover of group ab to b at 2026-12-01T10:00:00Z (the file {old}, from before 7 December; "
        "`--step resume` removes it)")
    assert failover.clear_stream_stop(cfg, group) and not old.exists()
    assert failover.stream_stop_requested(cfg, group) is None
    assert not failover.clear_stream_stop(cfg, group)


def test_an_unanswered_destination_is_not_permission_to_run(tmp_path: Path, boards, caplog) -> None:
    """Launching, the job and the DAG refuse when the stops cannot be read; a running job goes on with one
    warning line; finalize says when the reverse group's stop could not be removed."""
    cfg = _cfg(tmp_path)
    ab, ba = cfg.group("ab"), cfg.group("ba")
    watch = stops.Watch(cfg, ab, every=0.01)
    try:
        assert watch.first() is None  # the job started; a thread looks from now on
        boards["b"].down = True
        with pytest.raises(stops.StopSignalError, match="cannot read the failover stops from topic"):
            failover.stream_stop_requested(cfg, ab)
        with pytest.raises(stops.StopSignalError):
            stops.Watch(cfg, ab).first()  # the first look decides whether a job starts
        with caplog.at_level("WARNING", logger="mirror_core.stops"):
            wait_for(lambda: caplog.records)
            time.sleep(0.1)  # ten looks more, all failing
            assert watch() is None
        assert len(caplog.records) == 1 and "the job goes on" in caplog.records[0].getMessage()
        boards["b"].down = False
        failover.request_stream_stop(cfg, ab, "failover")
        assert wait_for(watch) == boards["b"].stops[stops.key(ab)]
    finally:
        watch.close()
    failover.request_stream_stop(cfg, ba, "an earlier failback")
    boards["a"].down = True
    rep = failover.finalize(cfg, ab, stream_stopped=True)
    assert not rep.ok and rep.details["reverse_stop_cleared"] is None
    assert "reverse group 'ba' NOT ready: cannot read the failover stops" in rep.summary
    assert "mirrorflow failover --group ba --step resume" in rep.summary
    # finalize on its own, the destination down: it says the stop is not written, does not pass, and leaves
    # the reverse group's stop where it is (the forward stream is not stopped for good)
    boards["a"].down = False
    failover.clear_stream_stop(cfg, ab)
    boards["b"].down = True
    rep = failover.finalize(cfg, ab, stream_stopped=True)
    assert not rep.ok and rep.details["stop"].startswith("NOT written: cannot read the failover stops")
    assert rep.summary.startswith("the stream's stop NOT written: cannot read") and rep.summary.endswith(
        "stream stopped; reverse group 'ba' left as it was (the stream is not stopped for good)")
    assert failover.stream_stop_requested(cfg, ba) is not None
    # the adapters write the stop before their wait and hand it over: finalize does not read it again
    rep = failover.finalize(cfg, ab, stream_stopped=True, stop="key 'k' of topic t on b")
    assert rep.ok and rep.details["stop"] == "key 'k' of topic t on b" and rep.details["reverse_stop_cleared"]


def test_the_watch_goes_on_looking_whatever_a_look_raised(tmp_path: Path, boards, caplog) -> None:
    cfg = _cfg(tmp_path, reverse=False)
    ab = cfg.group("ab")
    watch = stops.Watch(cfg, ab, every=0.01)
    try:
        assert watch.first() is None
        boards["b"].read = lambda: 1 / 0  # type: ignore[method-assign]
        with caplog.at_level("WARNING", logger="mirror_core.stops"):
            wait_for(lambda: caplog.records)
        assert "cannot read the failover stops: ZeroDivisionError" in caplog.records[0].getMessage()
        del boards["b"].read  # the class's again
        failover.request_stream_stop(cfg, ab, "failover")
        assert wait_for(watch).startswith("failover at ")
        assert watch.first() == watch()  # asked again: the thread's answer, no second reader of the board
    finally:
        watch.close()


def test_a_reason_from_someone_elses_record_is_one_printable_bounded_line() -> None:
    """A stop's reason reaches terminals, XComs and the Mirrors page: a foreign record's escape codes and
    length do not."""
    assert stops._reason(b'{"reason": "failover of group ab to b at 09:00", "by": "host"}') == \
        "failover of group ab to b at 09:00"
    assert stops._reason(b"\x1b]0;owned\x07stopped\r\nby hand") == "]0;owned stopped  by hand"
    long = stops._reason(b"x" * 100_000)
    assert len(long) == stops.REASON_MAX + 3 and long.endswith("...")
    assert stops._reason(b"  \x00 ") == "stopped"


def test_a_stops_topic_must_be_one_no_mirror_copies(tmp_path: Path) -> None:
    raw = yaml.safe_load(yaml.safe_dump(_cfg(tmp_path, reverse=False).model_dump(mode="json", exclude_none=True)))
    raw["groups"][0]["stops_topic"] = "team.stops"
    with pytest.raises(ConfigError, match=r"groups\[0\]\.stops_topic.*must end in '\.internal' or '-internal'"):
        parse_config(raw, env={})
    raw["groups"][0]["stops_topic"] = "team.mirrorflow-stops.internal"
    assert parse_config(raw, env={}).group("ab").stops == "team.mirrorflow-stops.internal"


def test_the_wait_for_the_stream_job_tells_only_what_the_checkpoint_shows(tmp_path: Path) -> None:
    """No lock file (no job of this version ran there, or the checkpoint is not where this process looks): the
    checkpoint proves nothing, so the CLI's finalize says "asked to stop", not "stopped"; with Airflow's task count
    that count decides. A lock left by a job that has ended is free: stopped."""
    from mirror_core import joblock

    group = _cfg(tmp_path).group("ab")
    said: list[str] = []
    assert failover.wait_stream_ended(group, 1, say=said.append) is None
    assert said == [f"no lock at {tmp_path / 'ckpt' / 'ab.lock'}: cannot tell from the checkpoint whether a job runs"]
    assert failover.wait_stream_ended(group, 1, tasks_running=lambda: 0) is True
    assert failover.wait_stream_ended(group, 0, tasks_running=lambda: 1) is False
    ended = joblock.JobLock(tmp_path / "ckpt" / "ab.lock")
    assert ended.try_take(joblock.Holder.me(once=True)) is None
    assert failover.wait_stream_ended(group, 0) is False  # held, by this process's own job here
    ended.release()
    assert failover.wait_stream_ended(group, 1) is True


# --------------------------------------------------------------------------- the steps' own checks, on fakes


def test_a_transaction_open_on_the_source_is_not_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A producer not really stopped holds a transaction open: the source's last stable offset stays put, so it
    looked quiet with lag 0, and records it commits after the stream stopped are never mirrored."""
    cfg = _cfg(tmp_path)
    ends = {"t:0": (100, 120), "t:1": (7, 7)}
    monkeypatch.setattr(failover, "_source_ends", lambda _cfg, _g: dict(ends))
    monkeypatch.setattr(failover, "replication_lag", lambda _cfg, _g: LagReport())
    params = failover.FailoverParams(("g1",), quiet_seconds=5)
    first = failover.quiet_check(cfg, cfg.groups[0], params, now=1000.0)
    later = failover.quiet_check(cfg, cfg.groups[0], params, first.details, now=1010.0)
    assert not later.ok and later.details["open_transactions"] == ["t:0"]
    assert "a transaction is open on the source in t:0" in later.summary
    # once it ends (committed or aborted), the quiet period starts from there
    ends["t:0"] = (121, 121)
    settled = failover.quiet_check(cfg, cfg.groups[0], params, later.details, now=1011.0)
    quiet = failover.quiet_check(cfg, cfg.groups[0], params, settled.details, now=1017.0)
    assert not settled.ok and quiet.ok and quiet.details["open_transactions"] == []


def test_finalize_stops_nothing_while_consumers_still_run_on_the_source(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(tmp_path)
    monkeypatch.setattr(failover, "source_members", lambda _cfg, _g, gids: {"g1": 2, "g2": 0})

    def no_sync(*_a: Any) -> None:
        raise AssertionError("offsets synced while their consumers still read the source")
    monkeypatch.setattr(failover, "final_sync", no_sync)
    rep = failover.resync(cfg, cfg.groups[0], failover.FailoverParams(("g1", "g2")))
    assert not rep.ok and failover.stop_blocked(rep) is not None
    assert rep.summary == ("consumers still run on the source a: 'g1' has 2 active member(s); stop them there, then "
                           "run finalize again")
    # stopped: the offsets follow them
    monkeypatch.setattr(failover, "source_members", lambda _cfg, _g, gids: dict.fromkeys(gids, 0))
    monkeypatch.setattr(failover, "final_sync", lambda *_a: failover.StepReport("sync", "ab", True, "2 synced", {}))
    rep = failover.resync(cfg, cfg.groups[0], failover.FailoverParams(("g1", "g2")))
    assert rep.ok and failover.stop_blocked(rep) is None


def test_finalize_stops_nothing_when_the_offsets_could_not_be_synced_again(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A resync that fails for any reason keeps the stream running: records still to mirror (a producer wrote
    after the quiet period) would never reach the destination once the stream stops for good, and a group not
    placed where its consumers stopped would read again on the destination. Until 7 December only consumers
    still on the source kept finalize from writing the stop."""
    cfg = _cfg(tmp_path)
    monkeypatch.setattr(failover, "source_members", lambda _cfg, _g, gids: dict.fromkeys(gids, 0))
    for answer in (failover.StepReport("sync", "ab", False, "not drained: 500 records still to mirror",
                                       {"lag_records": 500}),
                   failover.StepReport("sync", "ab", False, "g1 t[0]: destination at 40, expected 45", {})):
        monkeypatch.setattr(failover, "final_sync", lambda *_a, _r=answer: _r)
        rep = failover.resync(cfg, cfg.groups[0], failover.FailoverParams(("g1",)))
        blocked = failover.stop_blocked(rep)
        assert blocked is not None and blocked.startswith(answer.summary) and "nothing stopped" in blocked

    def unreachable(*_a: Any) -> None:
        raise OSError("destination cluster b unreachable")
    monkeypatch.setattr(failover, "final_sync", unreachable)
    blocked = failover.stop_blocked(failover.resync(cfg, cfg.groups[0], failover.FailoverParams(("g1",))))
    assert blocked is not None and "could not sync them again: destination cluster b unreachable" in blocked
    assert failover.stop_blocked(None) is None  # no consumer groups given: nothing to sync, nothing blocks


def test_the_sync_step_takes_only_an_exact_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A translation "ahead of mirror" (inexact: records the mirror has not written yet) does not pass the step,
    even where the destination group sits at it; the destination's end where nothing was mirrored does."""
    from mirror_core import checkpoint
    from mirror_core.offsets import AHEAD, Translation

    cfg = _cfg(tmp_path)
    answers = {0: Translation(40, False, AHEAD), 1: Translation(9, False, checkpoint.NOTHING_TO_MIRROR),
               2: Translation(12, True, "exact sync")}

    class _Translator:
        def __init__(self, *_a: Any) -> None: ...

        def translate(self, _topic: str, p: int, _committed: int, _dst: str) -> Translation:
            return answers[p]
    monkeypatch.setattr(failover, "SourceTranslator", _Translator)
    monkeypatch.setattr(failover, "topic_mappings", lambda *_a: [checkpoint.TopicMapping("t", "t", "ab__t__t", None)])
    monkeypatch.setattr(failover, "load_sync_store", lambda *_a: None)
    monkeypatch.setattr(failover, "replication_lag", lambda *_a: LagReport())
    monkeypatch.setattr(failover, "emit_checkpoints", lambda *_a: [])
    monkeypatch.setattr(failover, "sync_selected_groups", lambda *_a: None)
    monkeypatch.setattr(failover, "source_group_offsets", lambda *_a: {"g1": {("t", 0): 50, ("t", 1): 3, ("t", 2): 8}})
    monkeypatch.setattr(failover, "destination_group_offsets", lambda *_a: {"g1": {("t", 0): 40, ("t", 1): 9,
                                                                                  ("t", 2): 12}})
    rep = failover.final_sync(cfg, cfg.groups[0], failover.FailoverParams(("g1",)))
    assert [o["ok"] for o in rep.details["offsets"]] == [False, True, True]
    assert not rep.ok and rep.summary == f"g1 t[0]: destination at 40, expected 40 ({AHEAD})"
