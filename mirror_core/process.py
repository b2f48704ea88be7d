"""Bounded stops of a mirror's process tree.

A streaming mirror is a tree of processes: ``mirrorflow run`` (or Airflow's ``spark-submit``) starts the
Python driver, the driver starts Spark's JVM, the JVM starts Python workers. Whoever stops a mirror —
a signal to the CLI, an Airflow task kill, the failover's finalize — must end all of them within a
bounded time: graceful first (the driver finishes its micro-batch, so the open transactions commit),
then forced (SIGKILL to every process left). A forced stop loses nothing and duplicates nothing under
exactly_once: an unfinished destination transaction is aborted by the broker when the next writer with
the same ``transactional.id`` starts (or at its timeout), and the next run skips what was committed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

#: how long a stop may take before the processes left are killed (``spark.stop_timeout``)
DEFAULT_STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class StopReport:
    """What a stop did: whether the tree ended by itself in time, how long it took, what was killed."""

    graceful: bool
    seconds: float
    killed: tuple[int, ...]


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every process below it (children first seen by the kernel's parent links)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The processes of ``procs`` still running (zombies count as ended: only their parent's wait is missing)."""
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


def kill_all(procs: list[psutil.Process], wait: float = 10.0) -> tuple[int, ...]:
    """SIGKILL each of ``procs`` still running and wait (bounded) until they are gone; returns their pids."""
    left = alive(procs)
    for p in left:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(left, timeout=wait)
    return tuple(p.pid for p in left)


def stop_tree(pid: int, timeout: float = DEFAULT_STOP_TIMEOUT, sig: int = signal.SIGTERM) -> StopReport:
    """Ask process ``pid`` to stop (``sig``), give it ``timeout`` seconds to end with everything it started,
    then SIGKILL whatever of its tree is left (including processes that appeared meanwhile)."""
    t0 = time.monotonic()
    seen = {p.pid: p for p in tree(pid)}
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        for p in tree(pid):
            seen.setdefault(p.pid, p)
        if not alive(list(seen.values())):
            return StopReport(True, time.monotonic() - t0, ())
        time.sleep(0.1)
    for p in tree(pid):
        seen.setdefault(p.pid, p)
    killed = kill_all(list(seen.values()))
    log.warning("process %d did not stop within %.0fs; killed %d processes", pid, timeout, len(killed))
    return StopReport(False, time.monotonic() - t0, killed)


#: names the process a job belongs to (``host:boot id:pid namespace:pid:start tick``, :func:`owner_token`): the
#: job stops when that process has ended. Airflow's task sets it: under ``spark-submit`` the job's parent is
#: spark-submit's JVM, which a SIGKILLed task leaves running, so watching the parent alone would leave the job
#: orphaned and streaming
OWNER_ENV = "MIRRORFLOW_OWNER"


def _machine() -> str:
    """This host's name, boot and process-id namespace: a pid names one process only within all three (containers
    on one host share its boot id, not their names or namespaces). Empty where there is no ``/proc``."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{socket.gethostname()}:{boot}:{namespace}"


def _stat(pid: int) -> tuple[str, int] | None:
    """Process ``pid``'s state letter and start (clock ticks since boot, ``/proc/<pid>/stat``'s 22nd field: unlike
    a start time on the wall clock, a clock step does not move it), or None when there is no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after the command, whatever it holds: field 3 on
    return fields[0], int(fields[19])


def owner_token(pid: int | None = None) -> str:
    """A name for process ``pid`` (this one by default) that a later process with the same pid does not share;
    where there is no ``/proc``, one without a machine or a start, which :func:`owner_alive` cannot tell by."""
    pid = os.getpid() if pid is None else pid
    stat = _stat(pid)
    return f"{_machine()}:{pid}:{stat[1] if stat else ''}"


def owner_alive(token: str) -> bool | None:
    """Whether the process ``token`` names still runs; None when this machine cannot tell (another machine, boot
    or pid namespace: a driver in cluster deploy mode; no ``/proc``; a token that does not parse), so it must not
    be taken as ended."""
    try:
        machine, pid, started = token.rsplit(":", 2)
        pid_n, ticks = int(pid), int(started)
    except ValueError:
        return None
    if not machine or machine != _machine():
        return None
    stat = _stat(pid_n)
    return stat is not None and stat[1] == ticks and stat[0] != "Z"
