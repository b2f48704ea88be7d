"""What the fault tests share: a record stream into the source, the mirror as a real Spark job, an
independent reader of the destination, and a progress monitor that measures stalls.

Every test starts its own clusters with ``mirror_core.local`` on free ports and stops them (also when
it fails); the shared clusters are never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[2]


class RecordStream:
    """Produces keys ``0, 1, 2, ...`` (value = key) to ``topic`` at about ``rate`` records/s, round-robin over
    its partitions, idempotent with acks=all; ``acked`` holds what the source confirmed."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: float = 200.0,
                 value: Callable[[int], bytes] = lambda i: str(i).encode(), **conf: Any):
        self.topic, self.partitions, self.rate = topic, partitions, rate
        #: the value of record ``i`` (swap it mid-stream to change what is produced)
        self.value = value
        self.acked: list[int] = []
        self.failed: list[str] = []
        self._p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                            "message.timeout.ms": 600000, "linger.ms": 5, "log_level": 0, **conf})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.next = 0

    def _ack(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append(int(msg.key()))
        else:
            self.failed.append(err.str())

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while self.next < due:
                i = self.next
                try:
                    self._p.produce(self.topic, key=str(i).encode(), value=self.value(i),
                                    partition=i % self.partitions, on_delivery=self._ack)
                except BufferError:
                    break
                self.next += 1
            self._p.poll(0.02)

    def start(self) -> RecordStream:
        self._thread.start()
        return self

    def halt(self) -> None:
        """Stop producing, without waiting for what is in flight (a test's cleanup after a failure)."""
        self._stop.set()

    def stop(self, timeout: float = 600.0, give_up_after: float | None = None) -> None:
        """Stop producing and wait for the source to acknowledge what is in flight. ``give_up_after``: a
        test about the mirror, not this producer, drops what the source has not acknowledged by then (after
        a source broker's restart, librdkafka's idempotent producer was once seen never to send again, while
        the mirror read the restarted broker); ``acked`` keeps only what the source confirmed."""
        self.halt()
        self._thread.join(30)
        if give_up_after is not None and self._p.flush(give_up_after) > 0:
            self._p.purge()
            self._p.flush(30)
            print(f"[faults] the source producer did not deliver {self.next - len(self.acked)} records after "
                  f"{give_up_after:.0f}s; dropped (not counted as acknowledged)", flush=True)
            return
        left = self._p.flush(timeout)
        assert left == 0, f"{left} records not acknowledged by the source"


@dataclass
class Progress:
    """Destination end offsets sampled twice a second; ``stall`` is the longest time nothing new arrived."""

    bootstrap: str
    topic: str
    samples: list[tuple[float, int]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Progress:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def _run(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "fault-progress", "log_level": 0,
                      "socket.timeout.ms": 2000})
        parts: list[int] = []
        while not self._stop.is_set():
            try:
                if not parts:
                    md = c.list_topics(self.topic, timeout=2).topics.get(self.topic)
                    parts = sorted(md.partitions) if md is not None and md.partitions else []
                total = sum(c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=2)[1] for p in parts)
                self.samples.append((time.monotonic(), total))
            except Exception:  # noqa: BLE001 - the destination may be down: that is the point
                pass
            self._stop.wait(0.5)
        c.close()

    def stop(self) -> None:
        self._stop.set()

    def stall_after(self, t: float) -> float:
        """The longest time after ``t`` during which the destination did not grow (unanswered samples
        while it was down count as no growth)."""
        last_growth, base, longest = t, None, 0.0
        for ts, n in self.samples:
            if ts < t:
                base = n
                continue
            if base is None or n > base:
                longest = max(longest, ts - last_growth)
                last_growth, base = ts, n
        return longest


class MirrorJob:
    """``python -m spark_jobs.mirror_stream CONFIG --group G --verbose`` (continuous) with its output in a log
    file (the debug lines give each batch's offsets per partition, for :func:`wait_for_keys`)."""

    def __init__(self, config: Path, group: str, log: Path):
        self.log = log
        self._fh = log.open("wb")
        env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'plugins'}"}
        self.proc = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(config), "--group", group,
                                      "--verbose"],
                                     cwd=ROOT, env=env, stdout=self._fh, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 180.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self._fh.close()
        return int(self.proc.returncode)

    def tail(self, n: int = 30) -> str:
        """The last ``n`` lines of the log, without the debug lines."""
        lines = [ln for ln in self.log.read_text(errors="replace").splitlines() if " DEBUG " not in ln]
        return "\n".join(lines[-n:])

    def batch_ranges(self, partition: int) -> list[str]:
        """The debug lines giving each batch's offsets of source partition ``partition``."""
        return [ln for ln in self.log.read_text(errors="replace").splitlines()
                if " DEBUG " in ln and f"[{partition}]: " in ln and "records read" in ln]


def read_records(bootstrap: str, topic: str, timeout: float = 120.0, committed_only: bool = True) -> list[Any]:
    """Independent reader: every record on ``topic`` from the start, to each partition's end (read_committed
    unless ``committed_only`` is False)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"fault-check-{time.time_ns()}", "log_level": 0,
                  "isolation.level": "read_committed" if committed_only else "read_uncommitted",
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out: list[Any] = []
        deadline = time.monotonic() + timeout
        while len(done) < len(parts) and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                done.add(m.partition())
                continue
            out.append(m)
        return out
    finally:
        c.close()


def read_keys(bootstrap: str, topic: str, timeout: float = 120.0) -> list[int]:
    """Every committed record's key on ``topic`` (read_committed, from the start)."""
    return [int(m.key()) for m in read_records(bootstrap, topic, timeout)]


def wait_for_count(bootstrap: str, topic: str, want: int, job: MirrorJob, timeout: float = 300.0) -> None:
    """Poll the destination until it holds ``want`` committed records (the mirror caught up)."""
    deadline = time.monotonic() + timeout
    have = -1
    while time.monotonic() < deadline:
        assert job.alive(), "the mirror job exited:\n" + job.tail()
        have = len(read_keys(bootstrap, topic, timeout=60))
        if have >= want:
            return
        time.sleep(2)
    raise AssertionError(f"destination holds {have} of {want} records after {timeout:.0f}s:\n" + job.tail())


def wait_for_keys(src: str, source_topic: str, dst: str, topic: str, acked: list[int], job: MirrorJob,
                  timeout: float = 300.0) -> list[int]:
    """Poll the destination until every key in ``acked`` is on it (not a count: duplicates must not hide a
    missing record); returns the destination's keys. On timeout, fails naming the missing records' source
    partitions and offsets, with the batches that covered them."""
    want = set(acked)
    deadline = time.monotonic() + timeout
    have: list[int] = []
    while time.monotonic() < deadline:
        assert job.alive(), "the mirror job exited:\n" + job.tail()
        have = read_keys(dst, topic, timeout=60)
        if want <= set(have):
            return have
        time.sleep(2)
    missing = sorted(want - set(have))
    where = {int(m.key()): (m.partition(), m.offset()) for m in read_records(src, source_topic)}
    lines = [f"destination {topic} lacks {len(missing)} of {len(want)} acknowledged records after {timeout:.0f}s "
             f"({len(have)} records there):"]
    for k in missing[:20]:
        p, off = where.get(k, (None, None))
        lines.append(f"  key {k}: " + (f"source {source_topic}[{p}]@{off}" if p is not None
                                          else "not on the source either"))
    for p in sorted({where[k][0] for k in missing if k in where}):
        lines.append(f"  batches over {source_topic}[{p}]:")
        lines += [f"    {ln}" for ln in job.batch_ranges(p)[-40:]]
    raise AssertionError("\n".join(lines) + "\n" + job.tail())


def figures(name: str, produced: list[int], mirrored: list[int], stall: float | None = None) -> dict[str, Any]:
    """produced / mirrored / lost / duplicated (and stall seconds), printed for the report."""
    got = set(mirrored)
    out = {"fault": name, "produced": len(produced), "mirrored": len(mirrored),
           "lost": len(set(produced) - got), "duplicated": len(mirrored) - len(got),
           "stall_s": None if stall is None else round(stall, 1)}
    print(f"FAULT FIGURES {out}", flush=True)
    return out


def group_yaml(src: str, dst: str, name: str, topic: str, tmp: Path, delivery: str = "exactly_once",
               extra: str = "") -> str:
    return f"""clusters:
  src: {{kafka: {{bootstrap.servers: "{src}"}}}}
  dst: {{kafka: {{bootstrap.servers: "{dst}"}}}}
groups:
  - name: {name}
    source: src
    destination: dst
    delivery: {delivery}
    serdes: {{key: bytes, value: bytes}}
    heartbeats: {{enabled: false}}
    offsets: {{sync_group_offsets: false, emit_checkpoints: false}}
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    spark: {{master: "local[2]", trigger: "1 second", checkpoint_dir: "{tmp / 'ckpt'}"}}
{extra}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
"""
