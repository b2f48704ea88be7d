"""One job at a time per checkpoint.

A group's Spark checkpoint belongs to one running job. Two jobs on it — an Airflow retry while the job of
a SIGKILLed worker still runs, the failover's ``final_drain`` while a scheduled drain is under way, a
``mirrorflow run`` beside the stream DAG — would both plan micro-batches from the same offsets log, and
Spark only notices when one of them fails to write its next entry. So a job takes an exclusive lock
beside its checkpoint before anything else (``<checkpoint_dir>/<group>.lock``, an ``flock``: the kernel
releases it when the process ends, however it ends) and keeps it until it exits.

A job that finds the lock taken waits, saying for whom: for a drain (``--once``), which ends by itself,
as long as it runs; for a streaming job, at most :func:`patience` (one and a half stop timeouts and 5 s: long
enough for a job being stopped to end), then it fails with one line naming the holder. The lock's file is never
removed: a job that removed it would let the next one lock a new file while a waiter holds the old one.

Only checkpoints on this machine's file system are locked (no scheme, or ``file:``); on HDFS or an
object store, the guard is Spark's own.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from mirror_core.config import location_scheme
from mirror_core.errors import MirrorError

log = logging.getLogger(__name__)

#: seconds between two tries while waiting, and between two "still waiting" lines
POLL = 0.5
REMIND_EVERY = 30.0


class CheckpointBusy(MirrorError):
    """Another job runs on the checkpoint and did not end within the wait."""


class CheckpointLockError(MirrorError):
    """The lock's file cannot be made or opened (a checkpoint directory this process may not write)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a checkpoint's lock, as written into the lock's file."""

    pid: int
    host: str
    once: bool
    since: str

    @classmethod
    def me(cls, once: bool) -> Holder:
        return cls(pid=os.getpid(), host=socket.gethostname(), once=once,
                   since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def describe(self) -> str:
        what = "a drain (--once)" if self.once else "a streaming job"
        return f"{what}, pid {self.pid} on {self.host}, since {self.since}"


def local_path(location: str) -> Path | None:
    """``location`` as a path on this machine (no scheme, a drive letter, or ``file:``), or None."""
    scheme = location_scheme(location)
    if scheme is None:
        return Path(location)
    if scheme == "file":
        return Path(unquote(urlparse(location).path))
    return None


def lock_path(checkpoint_dir: str, group: str) -> Path | None:
    """The lock's file for ``group``'s checkpoint (beside it), or None when
    the checkpoint is not on this machine's file system."""
    base = local_path(checkpoint_dir)
    return None if base is None else base / f"{group}.lock"


class JobLock:
    """The exclusive lock of one checkpoint, held by this process from :meth:`try_take` until :meth:`release`
    or its exit. Its file descriptor is not inherited (Python's default), so a JVM this process started
    does not keep it after the process ends."""

    def __init__(self, path: Path):
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_take(self, me: Holder) -> Holder | None:
        """Take the lock if it is free and write ``me`` into its file: None. Taken: who holds it (a holder
        that has not written itself yet, or a file no one can read, reads as an unknown streaming job).
        Raises :class:`CheckpointLockError` when the file cannot be made, locked or written."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _lock_error(self.path, exc) from None
        try:
            if not _flock(fd, fcntl.LOCK_EX):
                # a probe (:func:`holder`) holds it for a moment: the file would name whoever ran before
                time.sleep(PROBE_GRACE)
                if not _flock(fd, fcntl.LOCK_EX):
                    return _read_holder(fd)
            text = json.dumps(asdict(me)).encode() + b"\n"
            os.pwrite(fd, text, 0)
            os.ftruncate(fd, len(text))  # written first: a reader never meets an empty file
        except OSError as exc:
            os.close(fd)
            raise _lock_error(self.path, exc) from None
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor releases the flock
            self._fd = None


#: how long a job that finds the lock taken gives a probe to let it go before it reads who holds it
PROBE_GRACE = 0.05


def _flock(fd: int, kind: int) -> bool:
    """``flock`` without waiting: False when another process holds a lock that excludes ``kind``."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _lock_error(path: Path, exc: OSError) -> CheckpointLockError:
    return CheckpointLockError(f"cannot lock the checkpoint ({path}): {exc.strerror or exc}")


def holder(path: Path) -> Holder | None:
    """Who holds the lock at ``path`` now, or None when no job does. A probe: it takes a shared lock and lets it
    go at once (a job starting at that moment waits :data:`PROBE_GRACE`). Raises :class:`CheckpointLockError`
    when the file cannot be read or locked (a missing file is no job)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _lock_error(path, exc) from None
    try:
        if not _flock(fd, fcntl.LOCK_SH):
            return _read_holder(fd)
    except OSError as exc:
        raise _lock_error(path, exc) from None
    finally:
        os.close(fd)
    return None


def _read_holder(fd: int) -> Holder:
    try:
        raw = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return Holder(pid=int(raw["pid"]), host=str(raw["host"]), once=bool(raw["once"]), since=str(raw["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return Holder(pid=0, host="?", once=False, since="?")


def patience(stop_timeout: float) -> float:
    """How long a job waits for a streaming job that holds its checkpoint: a job asked to stop (its task's process
    gone, a failover's stop) notices within a second or a micro-batch, ends within its stop timeout, then exits."""
    return 1.5 * stop_timeout + 5.0


def take(lock: JobLock, me: Holder, *, group: str, patience: float, stop: Callable[[], bool] = lambda: False,
         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Take ``lock`` for ``me``, waiting for the job that holds it: as long as a drain holds it, at most
    ``patience`` seconds while a streaming job does (from when one is first seen). Returns False if ``stop()``
    turned true while waiting (this job was asked to stop; the lock is not taken); raises :class:`CheckpointBusy`
    when a streaming job still holds it after ``patience``."""
    t0 = clock()
    stream_seen: float | None = None
    reminded = t0
    last: Holder | None = None
    while True:
        holder = lock.try_take(me)
        if holder is None:
            if last is not None:
                log.info("%s: the checkpoint is free after %.0fs; starting", group, clock() - t0)
            return True
        now = clock()
        if holder != last:
            if holder.once:
                log.info("%s: waiting for the job already running on its checkpoint to end: %s (lock %s)",
                         group, holder.describe(), lock.path)
            else:
                log.info("%s: the checkpoint is in use by %s; waiting up to %.0fs for it to stop (lock %s)",
                         group, holder.describe(), patience, lock.path)
            last = holder
            reminded = now
        elif now - reminded >= REMIND_EVERY:
            log.info("%s: still waiting (%.0fs) for %s", group, now - t0, holder.describe())
            reminded = now
        if holder.once:
            stream_seen = None
        else:
            stream_seen = now if stream_seen is None else stream_seen
            if now - stream_seen >= patience:
                raise CheckpointBusy(
                    f"{group}: the checkpoint is in use by {holder.describe()}, still running after {patience:.0f}s "
                    f"(lock {lock.path}); stop that job first")
        if stop():
            return False
        sleep(POLL)
