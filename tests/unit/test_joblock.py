"""One job per checkpoint (mirror_core.joblock) and the owner a job watches (mirror_core.process.owner_*)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import psutil
import pytest

from mirror_core import joblock, process
from mirror_core.joblock import CheckpointBusy, Holder, JobLock


class Clock:
    """A monotonic clock that moves only when the waiter sleeps."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def holder(once: bool, pid: int = 4242) -> Holder:
    return Holder(pid=pid, host="worker-3", once=once, since="2026-12-07T03:00:00Z")


def test_lock_paths_are_beside_local_checkpoints_only(tmp_path):
    assert joblock.lock_path(str(tmp_path), "g1") == tmp_path / "g1.lock"
    assert joblock.lock_path(f"file://{tmp_path}/a%20b", "g1") == tmp_path / "a b" / "g1.lock"
    assert joblock.lock_path("s3a://bucket/ckpt", "g1") is None
    assert joblock.lock_path("hdfs://nn:8020/ckpt", "g1") is None


def test_a_taken_lock_names_its_holder_and_is_free_once_released(tmp_path):
    first, second = JobLock(tmp_path / "g.lock"), JobLock(tmp_path / "g.lock")
    assert first.try_take(holder(once=False)) is None and first.held
    assert second.try_take(holder(once=True, pid=1)) == holder(once=False)
    assert not second.held
    first.release()
    assert second.try_take(holder(once=True, pid=1)) is None
    # a third reads the new holder, not what the first had written
    assert JobLock(tmp_path / "g.lock").try_take(holder(once=False)) == holder(once=True, pid=1)


def test_the_kernel_releases_the_lock_of_a_killed_process(tmp_path):
    path = tmp_path / "g.lock"
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from mirror_core.joblock import Holder, JobLock
assert JobLock(__import__('pathlib').Path({str(path)!r})).try_take(Holder.me(once=False)) is None
print('taken', flush=True)
time.sleep(600)
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "taken"
        mine = JobLock(path)
        seen = mine.try_take(Holder.me(once=True))
        assert seen is not None and seen.pid == child.pid and not seen.once
        child.kill()
        child.wait(10)
        assert mine.try_take(Holder.me(once=True)) is None
    finally:
        child.kill()


def test_waiting_for_a_drain_lasts_until_it_ends(tmp_path, caplog):
    clock = Clock()
    lock = JobLock(tmp_path / "g.lock")
    answers = iter([holder(once=True)] * 200 + [None])  # 100 s of a drain, then free
    lock.try_take = lambda me: next(answers)  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="mirror_core.joblock"):
        assert joblock.take(lock, holder(once=False, pid=7), group="g", patience=30, clock=clock, sleep=clock.sleep)
    assert clock.now - 100.0 == pytest.approx(100.0)
    lines = [r.getMessage() for r in caplog.records]
    assert "waiting for the job already running on its checkpoint to end: a drain (--once), pid 4242 on worker-3" \
        in lines[0]
    assert sum("still waiting" in line for line in lines) == 3  # every 30 s, not every poll
    assert "free after 100s" in lines[-1]


def test_a_streaming_job_that_does_not_stop_within_the_patience_is_one_clear_error(tmp_path):
    clock = Clock()
    lock = JobLock(tmp_path / "g.lock")
    lock.try_take = lambda me: holder(once=False)  # type: ignore[method-assign]
    with pytest.raises(CheckpointBusy) as err:
        joblock.take(lock, holder(once=True, pid=7), group="g", patience=30, clock=clock, sleep=clock.sleep)
    assert clock.now - 100.0 == pytest.approx(30.0)
    assert str(err.value) == (f"g: the checkpoint is in use by a streaming job, pid 4242 on worker-3, since "
                              f"2026-12-07T03:00:00Z, still running after 30s (lock {tmp_path / 'g.lock'}); "
                              "stop that job first")


def test_the_patience_is_one_and_a_half_stop_timeouts_and_5_s_50_s_by_default():
    """README: "at most one and a half spark.stop_timeout and 5 s (50 s by default ...)"."""
    from mirror_core.config import SparkConfig

    assert joblock.patience(SparkConfig().stop_timeout) == 50.0
    assert joblock.patience(30.0) == 50.0
    assert joblock.patience(10.0) == 20.0


def test_a_streaming_job_that_stops_within_the_patience_is_waited_for(tmp_path):
    clock = Clock()
    lock = JobLock(tmp_path / "g.lock")
    answers = iter([holder(once=False)] * 40 + [None])  # stops after 20 s of a 30 s patience
    lock.try_take = lambda me: next(answers)  # type: ignore[method-assign]
    assert joblock.take(lock, holder(once=False, pid=7), group="g", patience=30, clock=clock, sleep=clock.sleep)


def test_a_stop_request_ends_the_wait_without_the_lock(tmp_path):
    clock = Clock()
    lock = JobLock(tmp_path / "g.lock")
    lock.try_take = lambda me: holder(once=True)  # type: ignore[method-assign]
    assert not joblock.take(lock, holder(once=False, pid=7), group="g", patience=30, clock=clock,
                            sleep=clock.sleep, stop=lambda: clock.now >= 105.0)
    assert clock.now == pytest.approx(105.0)


def test_an_unreadable_lock_file_reads_as_an_unknown_streaming_job(tmp_path):
    path = tmp_path / "g.lock"
    first = JobLock(path)
    assert first.try_take(holder(once=True)) is None
    path.write_text("not json")
    assert JobLock(path).try_take(holder(once=False)) == Holder(pid=0, host="?", once=False, since="?")


def test_the_owner_token_names_a_running_process_and_not_its_successor():
    mine = process.owner_token()
    assert process.owner_alive(mine) is True
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    token = process.owner_token(child.pid)
    assert process.owner_alive(token) is True
    child.kill()
    child.wait(10)
    assert process.owner_alive(token) is False
    # the same pid started later (another start time) is not the owner
    machine, pid, started = mine.rsplit(":", 2)
    assert process.owner_alive(f"{machine}:{pid}:{int(started) - 500}") is False
    assert psutil.pid_exists(int(pid))


def test_the_owner_token_holds_the_kernels_start_ticks_not_a_wall_clock_time():
    """A clock step (NTP, a laptop waking) moves every process's start time on the wall clock (psutil's
    create_time); a token that held one said a live owner had ended, and stopped its job. The kernel's start
    (clock ticks since boot) does not move."""
    from pathlib import Path

    stat = Path("/proc/self/stat").read_text()
    ticks = stat[stat.rindex(")") + 2:].split()[19]
    assert process.owner_token().rsplit(":", 2)[1:] == [str(os.getpid()), ticks]


@pytest.mark.parametrize("token", ["", "garbage", "otherhost:boot-id:1:123.00", "::1:1.00", "::1:1",
                                   "otherhost:boot-id:pid:[4026531836]:1:123"])
def test_an_owner_this_machine_cannot_see_is_not_taken_as_ended(token):
    assert process.owner_alive(token) is None


def test_a_probe_names_the_holder_and_does_not_keep_the_lock(tmp_path):
    path = tmp_path / "g.lock"
    assert joblock.holder(path) is None  # no file: no job ever ran here
    first = JobLock(path)
    assert first.try_take(holder(once=True)) is None
    assert joblock.holder(path) == holder(once=True)
    first.release()
    assert joblock.holder(path) is None
    assert JobLock(path).try_take(holder(once=False)) is None  # the probe let it go


def test_a_checkpoint_directory_this_process_cannot_write_is_one_clear_error(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the checkpoint directory should be")
    with pytest.raises(joblock.CheckpointLockError) as err:
        JobLock(blocked / "g.lock").try_take(holder(once=False))
    assert str(err.value).startswith(f"cannot lock the checkpoint ({blocked / 'g.lock'}): ")
