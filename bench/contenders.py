"""The contenders: how each is configured and launched, and how mirrorflow's log is read.

The ``*_yaml`` / ``*_properties`` / ``*_cmd`` functions are pure (they return text or a command
line); :class:`Running` is the one place that starts and stops a process. Every contender runs
in its own session so :class:`bench.observe.TreeMemory` can find all of its processes and
``stop`` can signal exactly that process group.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.observe import SummedCpu, TreeMemory

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
MM2_MAIN = "org.apache.kafka.connect.mirror.MirrorMaker"
KCAT_KEY_DELIM = "|~K~|"
KCAT_MSG_DELIM = "|~M~|"


# --------------------------------------------------------------------------- configuration (pure)


@dataclass(frozen=True)
class Endpoints:
    src_bootstrap: str
    dst_bootstrap: str
    src_registry: str | None = None
    dst_registry: str | None = None


def mirrorflow_yaml(ep: Endpoints, *, group: str, source_topic: str, destination_topic: str, delivery: str,
                    value_serde: str, trigger: str, checkpoint_dir: Path, master: str = "local[2]",
                    driver_batch_max_records: int | None = None, read_path: str = "spark",
                    transactions: str = "per_partition", writer_producers: int | None = None,
                    overlap_writes: bool | None = None, spark_conf: dict[str, str] | None = None,
                    max_offsets_per_trigger: int | None = None, keep_writing_for: str | None = None,
                    direct_processes: int | None = None, destination_kafka: dict[str, str] | None = None) -> str:
    """A mirrors YAML with one group mirroring ``source_topic`` to ``destination_topic`` (``destination_kafka``:
    more librdkafka properties of the destination cluster, e.g. its producers' tuning)."""
    def reg(url: str | None) -> str:
        return f"\n    schema_registry: {{url: \"{url}\"}}" if url else ""

    driver_max = "" if driver_batch_max_records is None else \
        f"\n      driver_batch_max_records: {driver_batch_max_records}"
    producers = "" if writer_producers is None else f"\n      writer_producers: {writer_producers}"
    if max_offsets_per_trigger is not None:
        producers += f"\n      max_offsets_per_trigger: {max_offsets_per_trigger}"
    if overlap_writes is not None:
        producers += f"\n      overlap_writes: {str(overlap_writes).lower()}"
    if keep_writing_for is not None:
        producers += f"\n      keep_writing_for: \"{keep_writing_for}\""
    if direct_processes is not None:
        producers += f"\n      direct_processes: {direct_processes}"
    conf = ", ".join(f'{k}: "{v}"' for k, v in {"spark.ui.showConsoleProgress": "false", **(spark_conf or {})}.items())
    dst_more = "".join(f', {k}: "{v}"' for k, v in (destination_kafka or {}).items())
    return f"""clusters:
  src:
    kafka: {{bootstrap.servers: "{ep.src_bootstrap}"}}{reg(ep.src_registry)}
  dst:
    kafka: {{bootstrap.servers: "{ep.dst_bootstrap}"{dst_more}}}{reg(ep.dst_registry)}
groups:
  - name: {group}
    source: src
    destination: dst
    delivery: {delivery}
    serdes: {{key: bytes, value: {value_serde}}}
    offset_syncs_topic: "bench.{group}.syncs.internal"
    dead_letter_topic: "bench.{group}.dlq"
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    spark:
      master: "{master}"
      trigger: "{trigger}"
      checkpoint_dir: "{checkpoint_dir}"{driver_max}
      read_path: {read_path}
      transactions: {transactions}{producers}
      conf: {{{conf}}}
    mirrors:
      - source_topic: {source_topic}
        destination_topic: {destination_topic}
"""


def mirrorflow_cmd(config: Path, group: str, *, once: bool) -> list[str]:
    return [sys.executable, "-m", "spark_jobs.mirror_stream", str(config), "--group", group,
            *(["--once"] if once else [])]


def mm2_aliases(tuned: bool, exactly_once: bool = False) -> tuple[str, str]:
    """The cluster aliases of an MM2 contender. Each contender has its own, so its Connect internal topics
    (``mm2-offsets.<alias>.internal`` holds the source positions) are not another one's: sharing them,
    the second MM2 on a topic resumed at the first one's end and mirrored nothing."""
    if exactly_once:
        return ("esrc", "edst")
    return ("tsrc", "tdst") if tuned else ("src", "dst")


def mm2_properties(ep: Endpoints, topic: str, tasks: int = 2, *, tuned: bool = False,
                   exactly_once: bool = False, rest_port: int | None = None) -> str:
    """Dedicated-mode MirrorMaker 2, source -> destination only.

    Every topic MM2 creates (remote topic, offset syncs, checkpoints, heartbeats and the Connect
    config/offset/status topics) gets replication factor 1: the local clusters have one broker.

    ``tuned=False`` is MM2 as shipped: default replication policy (``src.<topic>``), default producer,
    checkpoints, heartbeats and topic-config sync on. ``tuned=True`` is MM2 as a performance-minded
    operator runs a pure data mirror: identity policy, the producer batching more (``linger.ms`` 20,
    ``batch.size`` 256 KB), and checkpoints, heartbeats, group-offset and topic-config sync off.

    ``exactly_once=True`` (with ``tuned``) adds what MM2 needs to write exactly once: exactly-once source
    support on the target (its source tasks write each batch they poll in a transaction, with their
    source offsets) and the dedicated mode's internal REST server on ``rest_port``, which that requires.
    """
    a, b = mm2_aliases(tuned, exactly_once)
    props = {
        "clusters": f"{a}, {b}",
        f"{a}.bootstrap.servers": ep.src_bootstrap,
        f"{b}.bootstrap.servers": ep.dst_bootstrap,
        f"{a}->{b}.enabled": "true",
        f"{b}->{a}.enabled": "false",
        f"{b}->{a}.emit.heartbeats.enabled": "false",
        f"{a}->{b}.topics": topic,
        "tasks.max": str(tasks),
        "refresh.topics.interval.seconds": "5",
        "sync.topic.acls.enabled": "false",
        "replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "dedicated.mode.enable.internal.rest": "false",
        # what MM2 itself advises at startup: skips ~15 s of classpath scanning for plugins
        "plugin.discovery": "service_load",
        # the source consumer: read only committed data, like the other contenders
        f"{a}->{b}.consumer.isolation.level": "read_committed",
    }
    if tuned:
        props.update({
            # the exactly-once contender keeps the default policy (``esrc.<topic>``): under the identity
            # policy it would write into the tuned contender's destination topic
            **({} if exactly_once else {
                "replication.policy.class": "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"}),
            f"{b}.producer.linger.ms": "20",
            f"{b}.producer.batch.size": "262144",
            f"{a}->{b}.emit.checkpoints.enabled": "false",
            f"{a}->{b}.emit.heartbeats.enabled": "false",
            f"{a}->{b}.sync.group.offsets.enabled": "false",
            f"{a}->{b}.sync.topic.configs.enabled": "false",
        })
    if exactly_once:
        props.update({
            f"{b}.exactly.once.source.support": "enabled",
            "dedicated.mode.enable.internal.rest": "true",
            "listeners": f"http://127.0.0.1:{rest_port or 0}",
        })
    return "".join(f"{k} = {v}\n" for k, v in props.items())


def mm2_remote_topic(topic: str, *, tuned: bool = False, exactly_once: bool = False) -> str:
    """Where MM2 puts ``topic``: the default policy's ``<source alias>.<topic>``, or the topic's own name
    under the tuned contender's identity policy."""
    if exactly_once:
        return f"{mm2_aliases(tuned, exactly_once)[0]}.{topic}"
    return topic if tuned else f"src.{topic}"


def java_cmd(java: str, lib: Path, main: str, *args: str, heap: str = "-Xms256m -Xmx1g") -> list[str]:
    """A JVM command over the cached Kafka jars, with the bench's own log4j2 config (INFO for MM2)."""
    return [java, *heap.split(), "-XX:+UseG1GC", "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={BENCH / 'mm2-log4j2.yaml'}", "-cp", f"{lib}/*", main, *args]


def raw_pipe_cmd(ep: Endpoints, topic: str, to: str, transaction_records: int = 0) -> list[str]:
    """The raw pipe (bench/raw_pipe.py); with ``transaction_records``, writing in transactions of that many."""
    return [sys.executable, str(BENCH / "raw_pipe.py"), "--src", ep.src_bootstrap, "--dst", ep.dst_bootstrap,
            "--topic", topic, "--to", to, "--transaction-records", str(transaction_records)]


def kcat_cmd(kcat: str, ep: Endpoints, topic: str, to: str, *, exit_at_end: bool) -> list[str]:
    """``kcat -C | kcat -P`` through a shell; keys and values are split by multi-byte delimiters.

    kcat cannot carry headers or timestamps through a pipe and does not keep partitions (the
    producer hashes the key), so it is a speed proxy for C, not a faithful mirror.
    """
    consume = [kcat, "-C", "-b", ep.src_bootstrap, "-t", topic, "-o", "beginning", "-u", "-q",
               "-X", "isolation.level=read_committed", "-f", f"%k{KCAT_KEY_DELIM}%s{KCAT_MSG_DELIM}",
               *(["-e"] if exit_at_end else [])]
    produce = [kcat, "-P", "-b", ep.dst_bootstrap, "-t", to, "-K", KCAT_KEY_DELIM, "-D", KCAT_MSG_DELIM,
               "-X", "linger.ms=5", "-X", "enable.idempotence=true"]
    return ["bash", "-c", "set -o pipefail; " + shlex.join(consume) + " | " + shlex.join(produce)]


# --------------------------------------------------------------------------- mirrorflow's log (pure)


# Spark's console progress bar may share the line (it ends with \r, not \n): search, not match
_BATCH_RE = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO mirrorflow\.stream (\S+) batch (\d+): (\{.*\})\s*$")


@dataclass(frozen=True)
class BatchLine:
    """One ``<group> batch N: {...}`` line: when it was logged (epoch s) and the job's own summary."""

    logged_at: float
    batch_id: int
    summary: dict[str, Any]

    @property
    def started_at(self) -> float:
        """The batch's start: logged time minus the duration the job measured for it."""
        return self.logged_at - float(self.summary.get("seconds") or 0.0)


def parse_batches(log_text: str) -> list[BatchLine]:
    """Every batch summary line of a ``spark_jobs.mirror_stream`` log (local-time stamps)."""
    out = []
    for line in log_text.splitlines():
        m = _BATCH_RE.search(line)
        if not m:
            continue
        try:
            summary = ast.literal_eval(m.group(4))
        except (ValueError, SyntaxError):
            continue
        at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append(BatchLine(at, int(m.group(3)), summary))
    return out


# --------------------------------------------------------------------------- processes


class Running:
    """A launched contender: its own session, its log (opening with the command and the environment it was
    given beyond the bench's own, ``env_extra``), its memory and CPU sampler; and, for a mirror on a Spark
    cluster, a sampler of the cluster's sessions (``cluster``: the master, the workers, and the executors and
    their Python workers the workers start for the job), whose CPU is the mirror's too."""

    def __init__(self, name: str, cmd: list[str], log: Path, cwd: Path | None = None,
                 env_extra: dict[str, str] | None = None, cluster_sessions: tuple[int, ...] = ()):
        self.name = name
        self.cmd = cmd
        self.log = log
        self.env_extra = dict(env_extra or {})
        log.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ) | self.env_extra
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        self.started_at = time.time()
        self.t0 = time.monotonic()
        with log.open("ab") as fh:
            given = "".join(f"{k}={shlex.quote(v)} " for k, v in sorted(self.env_extra.items()))
            fh.write(("$ " + given + shlex.join(cmd) + "\n").encode())
            fh.flush()
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=cwd or ROOT, env=env, start_new_session=True)
        self.mem = TreeMemory(self.proc.pid).start()
        self.cluster = TreeMemory(*cluster_sessions).start() if cluster_sessions else None
        #: the contender's CPU: its own processes', and on a cluster the cluster's (where its tasks run)
        self.cpu = self.mem.cpu if self.cluster is None else SummedCpu(self.mem.cpu, self.cluster.cpu)
        self.exited_at: float | None = None

    def alive(self) -> bool | None:
        """True while running, None once it exited with 0, False if it failed."""
        rc = self.proc.poll()
        if rc is None:
            return True
        if self.exited_at is None:
            self.exited_at = time.time()
        return None if rc == 0 else False

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the contender's process group, SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(10)
        # stragglers of the session (e.g. Spark's Python daemon) go with the group
        self._signal(signal.SIGKILL)
        if self.exited_at is None:
            self.exited_at = time.time()
        self.mem.stop()
        if self.cluster is not None:
            self.cluster.stop()
        return self.proc.returncode

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def log_tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class _NoMemory:
    def summary(self) -> dict[str, object]:
        return {"peak_rss_mb": None}


class NoProcess:
    """The measurement floor's stand-in for a contender: nothing runs, the watcher reads the source."""

    def __init__(self, name: str):
        self.name = name
        self.started_at = time.time()
        self.t0 = time.monotonic()
        self.log = Path(os.devnull)
        self.env_extra: dict[str, str] = {}
        self.mem = _NoMemory()
        self.cluster = None

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        return None

    def log_tail(self, lines: int = 25) -> str:
        return ""
