"""What the harness observes: records arriving on the destination, and a process tree's memory.

The destination is read ``read_committed``, so a transactional mirror's records count only once
committed: record by record for latency, by its last stable offsets for a drain (:class:`DrainCounter`). Memory comes from ``/proc/<pid>/status`` of every process
in the contender's session (the launcher starts each contender in a new session, so the JVM,
Spark's Python workers and a shell pipeline's members all share its session id).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any, Self

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from bench.workload import parse_measured_key


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def latency_windows(measured: dict[int, float], rate: float, window_s: float) -> list[list[float]]:
    """The measured window cut by produce time into ``window_s``-second pieces (record ``seq`` was produced at
    about ``seq / rate`` s into it): per piece ``[start s, records, p50 ms, p99 ms, max ms]``, so a tail can be
    placed in time (periodic, at the start, one stall). Pieces without a record are left out. Pure."""
    pieces: dict[int, list[float]] = {}
    for seq, ms in measured.items():
        pieces.setdefault(int(seq / rate / window_s), []).append(ms)
    out = []
    for i in sorted(pieces):
        v = pieces[i]
        out.append([round(i * window_s, 3), len(v), round(percentile(v, 50) or 0.0, 1),
                    round(percentile(v, 99) or 0.0, 1), round(max(v), 1)])
    return out


@dataclass
class Arrivals:
    """What the watcher saw: counts and wall-clock (epoch seconds) of the first and the last record."""

    count: int = 0
    first_at: float | None = None
    last_at: float | None = None
    measured: dict[int, float] = field(default_factory=dict)  # seq -> latency ms (first delivery)
    duplicates: int = 0
    # epoch seconds at which the count first reached 10 % / 90 % of the expected records (drains only):
    # the window the throughput figure is taken over, free of start-up and of the last straggling batch
    at_10: float | None = None
    at_90: float | None = None
    #: the count at ``first_at``: what the first look that saw records found already there. A contender the
    #: watcher times (no log of its own start) is measured from that look, so these records, which became
    #: visible before its clock started, are not counted in its steady figure (see bench.run)
    first_count: int = 0
    #: the most records that became visible at once (between two looks at the destination): a transaction
    #: that commits a large share of the drain makes the 10 %/90 % window a measure of when its commits
    #: landed, not of the pace (see bench.report.rate)
    largest_step: int = 0


#: librdkafka stops fetching for ``fetch.queue.backoff.ms`` (default 1000) whenever its prefetch queue is
#: over ``queued.min.messages`` (100,000): a consumer that is behind then reads in bursts one second apart.
#: Measured on a pre-loaded topic of 2,000,000 x 100 B: 170-230k records/s with the default, 1.9M with 10 ms.
#: (Drains are now counted by :class:`DrainCounter`; the latency watcher and the raw pipe keep this.)
FAST_FETCH = {"fetch.queue.backoff.ms": 10}


class DstWatcher:
    """Tails one destination topic (waiting for it to exist) and counts what becomes visible."""

    def __init__(self, bootstrap: str, topic: str, *, latency: bool = False, expected: int | None = None):
        self.topic = topic
        self.latency = latency
        self.expected = expected
        self.c = Consumer({
            "bootstrap.servers": bootstrap, "group.id": f"bench-watch-{time.time_ns()}",
            "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 10, "log_level": 0, **FAST_FETCH,
        })
        self.assigned = False
        self.seen = Arrivals()

    def _try_assign(self) -> None:
        md = self.c.list_topics(self.topic, timeout=5).topics.get(self.topic)
        if md is None or md.error is not None or not md.partitions:
            return
        self.c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in md.partitions])
        self.assigned = True

    def poll(self, timeout: float = 0.1) -> int:
        """Consume what is there; returns how many records arrived in this call."""
        if not self.assigned:
            self._try_assign()
            if not self.assigned:
                time.sleep(timeout)
                return 0
        # poll() returns with the first record (consume(n, t) would wait for n records or t seconds,
        # adding up to t to every measured latency); then take whatever else is already fetched
        first = self.c.poll(timeout)
        msgs = [first, *self.c.consume(10000, 0)] if first is not None else []
        now = time.time()
        now_ns = time.time_ns()
        got = 0
        for m in msgs:
            if m.error():
                continue
            got += 1
            if self.latency:
                parsed = parse_measured_key(m.key())
                if parsed is not None:
                    seq, ns = parsed
                    if seq in self.seen.measured:
                        self.seen.duplicates += 1
                    else:
                        self.seen.measured[seq] = (now_ns - ns) / 1e6
        if got:
            self._mark(self.seen.count + got, now)
        return got

    def _mark(self, count: int, now: float) -> None:
        """The count seen at ``now`` (epoch seconds): first/last arrival and the 10 %/90 % marks."""
        if count <= self.seen.count:
            return
        self.seen.largest_step = max(self.seen.largest_step, count - self.seen.count)
        self.seen.count = count
        if self.seen.first_at is None:
            self.seen.first_at, self.seen.first_count = now, count
        self.seen.last_at = now
        if self.expected:
            if self.seen.at_10 is None and count >= 0.1 * self.expected:
                self.seen.at_10 = now
            if self.seen.at_90 is None and count >= 0.9 * self.expected:
                self.seen.at_90 = now

    def wait_for(self, done: Callable[[Arrivals], bool], deadline: float, alive: Callable[[], bool | None],
                 tick: Callable[[Arrivals], None] | None = None) -> bool:
        """Poll until ``done`` (True), the monotonic ``deadline`` or ``alive()`` returns False (False).

        ``alive`` returning None means "exited normally": keep reading for a short grace period.
        """
        grace: float | None = None
        while time.monotonic() < deadline:
            self.poll()
            if tick:
                tick(self.seen)
            if done(self.seen):
                return True
            state = alive()
            if state is False:
                return False
            if state is None:
                grace = grace or time.monotonic() + 20
                if time.monotonic() > grace:
                    return False
        return False

    def close(self) -> None:
        self.c.close()


class DrainCounter(DstWatcher):
    """A drain's watcher: follows the destination's last stable offsets (ListOffsets, read_committed, every
    ``interval`` seconds) instead of reading every record, then counts the records once the drain is over.

    Reading every record as it arrives cost the 2-core machine about 1.3 µs of CPU per record (0.65 in the
    watcher's consume loop, as much again in the destination broker serving its 10 ms long polls): at
    400k records/s half a core taken from the contender being measured. ListOffsets costs the same however
    fast the contender goes. The offsets count a transactional mirror's commit markers too (one per
    partition per transaction: about a hundred in a drain of millions), so the 10 %/90 % marks are as
    good as exact, and :meth:`count_records` (after the measured window) decides whether every record is
    there, by reading them.
    """

    #: the watcher sleeps at least this many times as long as its recent ListOffsets took (the quickest of the
    #: last :attr:`BUSY_LOOKS`), so that it and the broker answering it take a small share of the machine
    #: whatever the partition count. Asked every 20 ms for 9,000 partitions, the watcher alone kept a third of
    #: a core busy for the whole drain, and the destination broker answering it as busy again
    IDLE_PER_BUSY = 9
    #: how many of the last looks :attr:`IDLE_PER_BUSY` takes the quickest of. At 6 partitions a broker busy
    #: writing 1 KB records answered one ListOffsets in 0.12 s now and then (5 December, 23:03): slept after
    #: by itself, that one look left the watcher blind for 1.1 s, and its next look found 10-30 % of a raw-pipe
    #: drain at once (a coarse window, and a steady clock started late). A slow answer costs the watcher and
    #: the broker no more than a quick one; thousands of partitions make every look slow
    BUSY_LOOKS = 5

    def __init__(self, bootstrap: str, topic: str, *, expected: int, interval: float = 0.02):
        super().__init__(bootstrap, topic, expected=expected)
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import AdminClient, OffsetSpec

        self._admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
        self._latest = OffsetSpec.latest
        self._committed = IsolationLevel.READ_COMMITTED
        self._interval = interval
        self._parts: list[int] = []
        self.offsets_count = 0
        self._polled_at: float | None = None  # epoch seconds of the last answered ListOffsets
        #: every answered look: (epoch seconds, count, seconds the look took); see :meth:`looks_summary`
        self.looks: list[tuple[float, int, float]] = []

    def poll(self, timeout: float = 0.1) -> int:
        t0 = time.monotonic()
        if not self._parts:
            md = self._admin.list_topics(self.topic, timeout=5).topics.get(self.topic)
            if md is not None and md.error is None and md.partitions:
                self._parts = sorted(md.partitions)
        if self._parts:
            asked = {TopicPartition(self.topic, p): self._latest() for p in self._parts}
            t1 = time.monotonic()
            try:
                got = self._admin.list_offsets(asked, isolation_level=self._committed, request_timeout=5)
                total = sum(f.result().offset for f in got.values())
            except Exception:  # noqa: BLE001 - a broker busy or restarting: ask again next round
                total = self.offsets_count
            busy = time.monotonic() - t1
            before, self.offsets_count = self.offsets_count, total
            now = time.time()
            self.looks.append((now, total, busy))
            self._mark(total, now)
            self._between_polls(before, total, now)
            self._polled_at = now
            grew = total - before
        else:
            grew = 0
        # the first look also connects to the partitions' leaders: not what a look costs
        recent = self.looks[max(1, len(self.looks) - self.BUSY_LOOKS):]
        quickest = min((took for _, _, took in recent), default=0.0)
        time.sleep(max(self._interval - (time.monotonic() - t0), self.IDLE_PER_BUSY * quickest))
        return grew

    def _between_polls(self, before: int, count: int, now: float) -> None:
        """A 10 %/90 % mark crossed since the last poll is put between the two polls, as if the records in
        between arrived at an even pace (polls far apart, at thousands of partitions, would otherwise put it
        late by up to their interval)."""
        if self._polled_at is None or count <= before or not self.expected:
            return
        for name, share in (("at_10", 0.1), ("at_90", 0.9)):
            mark = share * self.expected
            if before < mark <= count:
                setattr(self.seen, name, self._polled_at + (now - self._polled_at) * (mark - before) / (count - before))

    def looks_summary(self) -> dict[str, Any]:
        """How closely the drain was watched: the looks, the longest time between two of them and the slowest
        one, and the first look that saw records: how many it saw and how long after the look before it.
        A first look that finds a large share of the drain already there starts a watcher-timed contender's
        clock late (see bench.run's steady figure)."""
        out: dict[str, Any] = {"looks": len(self.looks)}
        if not self.looks:
            return out
        gaps = [b[0] - a[0] for a, b in pairwise(self.looks)]
        out["largest_gap_s"] = round(max(gaps), 3) if gaps else None
        out["slowest_look_s"] = round(max(busy for _, _, busy in self.looks), 3)
        first = next((i for i, (_, count, _) in enumerate(self.looks) if count), None)
        if first is not None:
            out["first_count"] = self.looks[first][1]
            out["first_after_s"] = round(self.looks[first][0] - self.looks[first - 1][0], 3) if first else None
        return out

    def count_records(self, deadline: float) -> int:
        """Read the destination from the beginning (read_committed): how many records it holds, once that
        reaches ``expected`` or the monotonic ``deadline`` passes."""
        self.c.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in self._parts])
        n = 0
        while n < (self.expected or 0) and time.monotonic() < deadline:
            n += sum(1 for m in self.c.consume(10000, 0.5) if not m.error())
        return n


def session_members(*sids: int) -> list[int]:
    """Pids whose session id is one of ``sids`` (read from /proc/<pid>/stat)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        # after the command: state ppid pgrp session ...
        if int(fields[3]) in sids:
            out.append(int(entry.name))
    return out


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_times(pid: int) -> tuple[float, float] | None:
    """User and system CPU seconds ``pid`` has used so far (from /proc/<pid>/stat), or None if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # after the command: state(0) ... utime(11) stime(12)
    return int(fields[11]) / _TICKS, int(fields[12]) / _TICKS


def cpu_seconds(pid: int, system_only: bool = False) -> float | None:
    """User + system CPU seconds ``pid`` has used so far, or None if it is gone; ``system_only``: the kernel's
    part alone (system calls, page faults, reclaim)."""
    times = cpu_times(pid)
    return None if times is None else times[1] + (0.0 if system_only else times[0])


class CpuTimeline:
    """CPU seconds used by a set of processes, sampled over time: what a stretch of a run cost in cores.
    A process's last sample is kept after it exits (what it used after that is lost: at most one interval)."""

    def __init__(self) -> None:
        self.by_pid: dict[int, float] = {}
        self.series: list[tuple[float, float]] = []  # (time.time(), total CPU seconds)

    def add(self, pids: list[int]) -> None:
        self.record({pid: cpu_seconds(pid) for pid in pids})

    def record(self, used: dict[int, float | None]) -> None:
        """One sample: CPU seconds so far per pid (None: gone)."""
        for pid, seconds in used.items():
            if seconds is not None:
                self.by_pid[pid] = max(self.by_pid.get(pid, 0.0), seconds)
        self.series.append((time.time(), sum(self.by_pid.values())))

    def at(self, t: float) -> float | None:
        """Total CPU seconds at wall time ``t``, interpolated between samples (None outside them)."""
        s = self.series
        for (t0, c0), (t1, c1) in zip(s, s[1:], strict=False):
            if t0 <= t <= t1:
                return c0 if t1 == t0 else c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        return None

    def between(self, t0: float, t1: float) -> float | None:
        a, b = self.at(t0), self.at(t1)
        return None if a is None or b is None else b - a


class SummedCpu:
    """Several :class:`CpuTimeline` read as one (what :func:`cores_between` asks of a timeline)."""

    def __init__(self, *parts: CpuTimeline):
        self.parts = parts

    def between(self, t0: float, t1: float) -> float | None:
        got = [p.between(t0, t1) for p in self.parts]
        return None if any(g is None for g in got) else sum(g for g in got if g is not None)


def cores_between(timelines: dict[str, CpuTimeline | SummedCpu | None], t0: float,
                  t1: float) -> dict[str, float | None]:
    """Each timeline's CPU over wall times ``t0``..``t1`` in cores (CPU seconds per second; None where a
    timeline has no samples around both ends, or is None)."""
    out: dict[str, float | None] = {}
    for name, timeline in timelines.items():
        used = None if timeline is None or t1 <= t0 else timeline.between(t0, t1)
        out[name] = None if used is None else round(used / (t1 - t0), 2)
    return out


class _Sampler:
    """A background thread that calls :meth:`sample` every ``interval`` seconds until :meth:`stop`."""

    def __init__(self, name: str, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def start(self) -> Self:
        self._thread.start()
        return self

    def sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class PidsCpu(_Sampler):
    """A :class:`CpuTimeline` of fixed processes (the brokers and registries), sampled in the background, and
    one of their system CPU alone (``system``)."""

    def __init__(self, pids: list[int], interval: float = 0.25):
        self.pids = pids
        self.cpu = CpuTimeline()
        self.system = CpuTimeline()
        super().__init__("cpu-servers", interval)

    def sample(self) -> None:
        times = {pid: cpu_times(pid) for pid in self.pids}  # one read of each process's stat a sample
        self.cpu.record({pid: None if t is None else t[0] + t[1] for pid, t in times.items()})
        self.system.record({pid: None if t is None else t[1] for pid, t in times.items()})


#: the kinds of the whole machine's CPU time :class:`MachineCpu` follows (see :func:`machine_cpu_seconds`)
MACHINE_KINDS = ("busy", "iowait", "idle", "steal")


def machine_cpu_seconds(stat: str | None = None) -> dict[str, float] | None:
    """The whole machine's CPU seconds so far, all cores, by kind, from /proc/stat's ``cpu`` line: ``busy`` (user,
    nice, system, irq, softirq), ``iowait``, ``idle`` and ``steal`` (a core of this VM wanted to run and its host
    ran something else); ``stat`` instead of reading the file. None when it cannot be read."""
    try:
        stat = Path("/proc/stat").read_text() if stat is None else stat
    except OSError:
        return None
    line = next((ln for ln in stat.splitlines() if ln.startswith("cpu ")), None)
    if line is None:
        return None
    v = [int(x) / _TICKS for x in line.split()[1:]] + [0.0] * 10
    # user nice system idle iowait irq softirq steal (guest time is counted in user already)
    return {"busy": v[0] + v[1] + v[2] + v[5] + v[6], "iowait": v[4], "idle": v[3], "steal": v[7]}


def kernel_threads(prefix: str) -> list[int]:
    """The pids of the kernel's threads whose name starts with ``prefix`` (``kswapd``: the background memory
    reclaimer, one per memory node)."""
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith(prefix):
                pids.append(int(comm.parent.name))
        except (OSError, ValueError):
            continue
    return sorted(pids)


class MachineCpu(_Sampler):
    """A :class:`CpuTimeline` per kind of the whole machine's CPU time (:data:`MACHINE_KINDS`), sampled in the
    background: what the cores did besides the processes a run follows, and what the VM's host took."""

    def __init__(self, interval: float = 0.25):
        self.kinds = {kind: CpuTimeline() for kind in MACHINE_KINDS}
        super().__init__("cpu-machine", interval)

    def sample(self) -> None:
        now = machine_cpu_seconds()
        if now is not None:
            for kind, timeline in self.kinds.items():
                timeline.record({0: now[kind]})


def proc_numbers(path: str, text: str | None = None) -> dict[str, int] | None:
    """The ``name value`` lines of a /proc table (/proc/meminfo's ``Name:  123 kB``, /proc/vmstat's
    ``name 123``) as numbers; ``text`` instead of reading ``path``. None when the file cannot be read."""
    try:
        text = Path(path).read_text() if text is None else text
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        parts = line.replace(":", " ", 1).split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def unwritten_mb(meminfo: str | None = None) -> float | None:
    """Page-cache data not yet on disk (``Dirty`` + ``Writeback`` in /proc/meminfo), in MB."""
    kb = [v for k, v in (proc_numbers("/proc/meminfo", meminfo) or {}).items() if k in ("Dirty", "Writeback")]
    return round(sum(kb) / 1024, 1) if kb else None


#: :func:`fill_free_memory` leaves this much memory free (the kernel and new processes take it first)
FILL_LEAVE_MB = 2048
#: ... writes in pieces of this size (the progress callback's step)
FILL_CHUNK_MB = 64
#: ... and keeps at least this much of the file system free
FILL_DISK_LEAVE_MB = 10240


def meminfo_mb(key: str, meminfo: str | None = None) -> float | None:
    """One field of /proc/meminfo (``MemFree``, ``Cached``, ...), in MB."""
    kb = (proc_numbers("/proc/meminfo", meminfo) or {}).get(key)
    return None if kb is None else round(kb / 1024, 1)


def fill_free_memory(directory: Path, leave_mb: float = FILL_LEAVE_MB,
                     progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Turn the machine's free memory into clean page cache: write a file of zeros as large as the free memory
    less ``leave_mb`` into ``directory`` (a new file a call; the caller deletes the directory at the end), and
    write it to disk, so that the brokers' log appends and the contenders' own memory come from reclaimed
    page cache rather than from free memory.

    On the machine these figures come from (a VM whose host takes back free guest memory), writing into memory
    that has been free for a while costs several times the system CPU per byte of writing into memory freed
    moments before or reclaimed from the page cache (``dd`` of 4 GB: 6.4-9.1 s of system time, against
    0.8 s with the page cache filled first, 5 December). Whichever drain grew the brokers' page cache into
    free memory paid that, so a drain's place in the invocation decided its figure at 1 KB (bench/README.md).
    Returns what it wrote: MB, seconds, the free MB before and after."""
    free = meminfo_mb("MemFree") or 0.0
    disk = shutil.disk_usage(directory).free / 1024 / 1024 if directory.exists() else 0.0
    want = int(min(free - leave_mb, disk - FILL_DISK_LEAVE_MB) // FILL_CHUNK_MB)
    out: dict[str, Any] = {"free_mb_before": free, "mb": 0, "seconds": 0.0}
    if want <= 0:
        out["free_mb_after"] = free
        return out
    t0 = time.monotonic()
    chunk = bytes(FILL_CHUNK_MB * 1024 * 1024)
    fd, _ = tempfile.mkstemp(prefix="fill-", dir=directory)
    with os.fdopen(fd, "wb") as f:
        for i in range(want):
            f.write(chunk)
            if progress is not None:
                progress(i + 1, want)
        f.flush()
        os.fsync(f.fileno())  # clean pages: the kernel reclaims them without writing anything back
    out.update(mb=want * FILL_CHUNK_MB, seconds=round(time.monotonic() - t0, 1), free_mb_after=meminfo_mb("MemFree"))
    return out


def disk_read_mb(vmstat: str | None = None) -> float | None:
    """What the machine has read from its disks since boot (``pgpgin`` in /proc/vmstat, in KB), in MB: a drain
    whose source records are no longer in the page cache reads them from disk, and waits for it."""
    kb = (proc_numbers("/proc/vmstat", vmstat) or {}).get("pgpgin")
    return None if kb is None else round(kb / 1024, 1)


#: /proc/vmstat counters of the kernel reclaiming memory: ``allocstall`` a process stopped to free memory itself
#: before its allocation could go on (summed over the memory zones), ``pgscan_direct``/``pgsteal_direct`` the pages
#: such processes scanned and freed, ``pgscan_kswapd``/``pgsteal_kswapd`` those the background reclaimer did,
#: ``compact_stall`` waits for memory to be compacted, ``pgmajfault`` faults that read from disk
RECLAIM_COUNTERS = ("allocstall", "pgscan_direct", "pgsteal_direct", "pgscan_kswapd", "pgsteal_kswapd",
                    "compact_stall", "pgmajfault")


def reclaim_counts(vmstat: str | None = None) -> dict[str, int] | None:
    """The kernel's memory reclaim counters since boot (:data:`RECLAIM_COUNTERS`); None where /proc/vmstat
    cannot be read. A drain whose processes wait for the kernel to free page cache runs slower, whoever it is."""
    numbers = proc_numbers("/proc/vmstat", vmstat)
    if not numbers:
        return None
    counts = {name: 0 for name in RECLAIM_COUNTERS}
    for key, value in numbers.items():
        name = "allocstall" if key.startswith("allocstall_") else key
        if name in counts:
            counts[name] += value
    return counts


def reclaim_between(before: dict[str, int] | None, after: dict[str, int] | None) -> dict[str, int] | None:
    """What :func:`reclaim_counts` grew by between two readings."""
    if before is None or after is None:
        return None
    return {name: after[name] - before[name] for name in RECLAIM_COUNTERS}


#: a jump of the wall clock against the monotonic one of more than this many seconds during a measurement
#: means the machine stood still (a VM paused or snapshotted) and the wall clock was set right after it
PAUSE_JUMP_S = 1.0
#: the line a Linux guest's kernel logs when its VM is snapshotted ("forked") and goes on
VM_FORK_LINE = "virtual machine fork"


def vm_forks(dmesg: str | None = None) -> int | None:
    """How many times the kernel has logged that its VM was forked (snapshotted) since boot; None where the
    kernel log cannot be read."""
    if dmesg is None:
        try:
            dmesg = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=10, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
    return dmesg.count(VM_FORK_LINE)


class PauseWatch:
    """Whether the machine stood still while something ran: the wall clock jumped against the monotonic one
    (which does not count a pause), or the kernel logged a VM snapshot. On 5 December at 23:28-23:30 the
    development VM was snapshotted in the middle of a bench run: the page cache was dropped, free memory was
    handed back to its host, one drain's watcher saw nothing for 49 s, and the drains after it ran at half
    speed on memory the host had to give back."""

    def __init__(self) -> None:
        self._offset = time.time() - time.monotonic()
        self._forks = vm_forks()

    def result(self) -> dict[str, Any] | None:
        """None if nothing was seen, else what was: the clock's jump (s) and the snapshots logged."""
        jump = (time.time() - time.monotonic()) - self._offset
        forks_now = vm_forks()
        forks = None if forks_now is None or self._forks is None else forks_now - self._forks
        if abs(jump) <= PAUSE_JUMP_S and not forks:
            return None
        return {"clock_jump_s": round(jump, 1), "vm_snapshots": forks}


def settle_page_cache() -> dict[str, float | None]:
    """Write the page cache's dirty data to disk before a measurement (``sync``): the load's gigabyte (or what
    the contender before wrote) is then not written back by the kernel's threads on the cores the next
    contender runs on. It does not make the brokers' cost per record steady: on the machine these figures
    come from (a VM), writing into memory that has been free for more than a few seconds costs about ten
    times the system CPU per byte (``dd`` of 1 GB files: 0.30-0.34 s each right after 5 GB were deleted; 30 s
    after the deletion 0.3 s for each of the first two and 2.24 s for the third), and brokers appending their logs pay that whenever their page
    cache grows (see bench/README.md). Some dirty data stays through the sync (about 1 GB with a bench's
    brokers up); the JSON keeps the figures before and after."""
    before = unwritten_mb()
    t0 = time.monotonic()
    os.sync()
    return {"unwritten_mb_before": before, "sync_s": round(time.monotonic() - t0, 2), "unwritten_mb_after": unwritten_mb()}


def status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


class TreeMemory:
    """Samples the processes of one or more sessions (``sids``): per-pid VmHWM (kept after they exit), the peak
    summed VmRSS, and their CPU (``cpu``)."""

    def __init__(self, *sids: int, interval: float = 0.25):
        self.sids = sids
        self.interval = interval
        self.hwm_kb: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.peak_rss_kb = 0
        self.cpu = CpuTimeline()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"rss-{sids[0]}", daemon=True)

    def start(self) -> TreeMemory:
        self._thread.start()
        return self

    def sample(self) -> None:
        rss = 0
        members = session_members(*self.sids)
        self.cpu.add(members)
        for pid in members:
            hwm = status_kb(pid, "VmHWM")
            cur = status_kb(pid, "VmRSS")
            if hwm is not None:
                self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), hwm)
                try:  # the latest name: a launcher script (bash) may exec into java after the first sample
                    self.names[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
                except OSError:
                    self.names.setdefault(pid, "?")
            rss += cur or 0
        self.peak_rss_kb = max(self.peak_rss_kb, rss)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> None:
        self.sample()
        self._stop.set()
        self._thread.join(5)

    def summary(self) -> dict[str, object]:
        by_name: dict[str, int] = {}
        for pid, kb in self.hwm_kb.items():
            by_name[self.names.get(pid, "?")] = by_name.get(self.names.get(pid, "?"), 0) + kb
        return {
            "peak_rss_mb": round(sum(self.hwm_kb.values()) / 1024, 1),  # sum of per-process VmHWM
            "peak_sampled_rss_mb": round(self.peak_rss_kb / 1024, 1),  # max over samples of summed VmRSS
            "processes": len(self.hwm_kb),
            "hwm_mb_by_command": {k: round(v / 1024, 1) for k, v in sorted(by_name.items())},
        }
