"""A Spark standalone cluster on this machine (a master and N workers), from pyspark's own distribution.

``mirrorflow local spark-up`` starts it for users who want to see the mirror's tasks run in separate
executor JVMs (``spark.master: spark://127.0.0.1:<port>``), and the scale-out test uses it to kill a
worker mid-run. Like :mod:`mirror_core.local`, everything started is recorded with its pid in
``<state>/spark.json`` so ``spark-down`` stops exactly those processes. Small heaps: the machine is shared.
pyspark is located, never imported (``mirror_core`` stays free of it).
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import shutil
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mirror_core import local
from mirror_core.errors import LocalClusterError, PrerequisiteError
from mirror_core.redaction import is_secret_key

STATE_FILE = "spark.json"
_DAEMON_HEAP = os.environ.get("MIRRORFLOW_SPARK_DAEMON_HEAP", "-Xmx256m")


@dataclass(frozen=True)
class SparkCluster:
    """A running standalone cluster: its master URL and the processes that make it."""

    master_url: str
    master_ui: str
    master_pid: int
    worker_pids: tuple[int, ...]
    worker_uis: tuple[str, ...]
    logs: str


def spark_home() -> Path:
    """pyspark's distribution directory (jars/, bin/): the Spark home of the master and the workers."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise PrerequisiteError("pyspark is not installed in this environment (pip install -e .[spark])")
    home = Path(spec.origin).parent
    if not (home / "jars").is_dir():
        raise PrerequisiteError(f"pyspark at {home} has no jars/ directory")
    return home


def _daemon_cmd(java: str, home: Path, main: str, *args: str) -> list[str]:
    return [java, *_DAEMON_HEAP.split(), "-XX:+UseSerialGC", "-cp", f"{home}/conf:{home}/jars/*", main, *args]


#: environment variables of Spark's and Hadoop's own, which the daemons keep whatever their names
_DAEMONS_OWN = ("SPARK_", "_SPARK_", "HADOOP_")


def daemon_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the master and workers (and so every executor they launch) start with: the caller's,
    without the variables whose names look secret (``MIRRORFLOW_SOURCE_PASSWORD`` sourced for
    ``config/local-secure.yaml``, ``AWS_SECRET_ACCESS_KEY``...). Nothing there needs them: the config is
    interpolated on the driver, and the executors get what they need inside their tasks."""
    return {k: v for k, v in environ.items() if k.startswith(_DAEMONS_OWN) or not is_secret_key(k)}


def up(env: local.LocalEnv, workers: int = 2, cores_per_worker: int = 1, memory_per_worker: str = "1g",
       timeout: float = 120.0) -> SparkCluster:
    """Start a master and ``workers`` workers on free loopback ports; returns when every worker has
    registered with the master."""
    state_file = env.state_dir / STATE_FILE
    if state_file.exists():
        raise PrerequisiteError(f"a local Spark cluster is already recorded in {state_file} (spark-down first)")
    java = local.find_java(17)
    home = spark_home()
    logs = env.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    work = env.state_dir / "spark-work"
    work.mkdir(parents=True, exist_ok=True)
    scratch = scratch_dir(env)  # left over only by a cluster that was killed: nothing reads it any more
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    taken: set[int] = set()  # below the ephemeral range, as the brokers' (see local.server_ports)
    port, ui = local.server_ports(1, taken), local.server_ports(1, taken)
    # pyspark's distribution has no build directories to tell the Scala version from: the workers' executor
    # launcher needs it said (as Spark's own load-spark-env.sh does). The executors' block managers and fetched
    # files go under the state directory, not the machine's temporary one: a worker stopped before its
    # executors clean up (a stop, a killed worker) would leave them there
    spawn_env = {**daemon_env(os.environ), "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
                 "SPARK_SCALA_VERSION": os.environ.get("SPARK_SCALA_VERSION", "2.13"),
                 "SPARK_LOCAL_DIRS": str(scratch)}
    pids: list[int] = []

    def spawn(cmd: list[str], log: Path) -> int:
        log.parent.mkdir(parents=True, exist_ok=True)
        import subprocess

        with log.open("ab") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=work, env=spawn_env, start_new_session=True)
        pids.append(proc.pid)
        return proc.pid

    master_url = f"spark://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        master = spawn(_daemon_cmd(java, home, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                   "--port", str(port), "--webui-port", str(ui)), logs / "spark-master.log")
        # the workers start once the master leads: a worker's registration that reaches it before then gets no
        # answer, and the worker asks again only 8-13 s later (seen on 7 December, one start in two)
        wait_master(f"http://127.0.0.1:{ui}", master, deadline - time.monotonic(), str(logs))
        worker_pids, worker_uis = [], []
        for i in range(workers):
            wui = local._free_port()
            worker_pids.append(spawn(_daemon_cmd(
                java, home, "org.apache.spark.deploy.worker.Worker", master_url, "--host", "127.0.0.1",
                "--cores", str(cores_per_worker), "--memory", memory_per_worker, "--webui-port", str(wui),
                "--work-dir", str(work / f"worker-{i + 1}")), logs / f"spark-worker-{i + 1}.log"))
            worker_uis.append(f"http://127.0.0.1:{wui}")
        cluster = SparkCluster(master_url, f"http://127.0.0.1:{ui}", master, tuple(worker_pids), tuple(worker_uis),
                               str(logs))
        _write(state_file, cluster)
        wait_workers(cluster, workers, deadline - time.monotonic())
    except BaseException:
        local._stop_records([{"role": "spark", "pid": p, "address": "127.0.0.1:0"} for p in pids])
        state_file.unlink(missing_ok=True)
        raise
    return cluster


def _status(master_ui: str) -> dict[str, Any]:
    """The master's JSON status page."""
    with urllib.request.urlopen(f"{master_ui}/json/", timeout=5) as resp:
        info: dict[str, Any] = json.load(resp)
    return info


def alive_workers(cluster: SparkCluster) -> int:
    """How many workers the master counts as ALIVE (from its JSON status page)."""
    return sum(1 for w in _status(cluster.master_ui).get("workers", []) if w.get("state") == "ALIVE")


def wait_master(master_ui: str, pid: int, timeout: float, logs: str) -> None:
    """Until the master at ``master_ui`` (process ``pid``, its log in ``logs``) leads: its status ALIVE."""
    def leads() -> str | None:
        status = _status(master_ui).get("status")
        return None if status == "ALIVE" else f"master status {status}"

    _wait(leads, (pid,), timeout, f"Spark master {master_ui}", logs)


def wait_workers(cluster: SparkCluster, want: int, timeout: float) -> None:
    def registered() -> str | None:
        n = alive_workers(cluster)
        return None if n >= want else f"{n} of {want} workers registered"

    _wait(registered, (cluster.master_pid, *cluster.worker_pids), timeout, f"Spark master {cluster.master_url}",
          cluster.logs)


def _wait(ready: Callable[[], str | None], pids: tuple[int, ...], timeout: float, what: str, logs: str) -> None:
    """Ask ``ready`` (None when it is, else what it lacks) every 0.2 s until ``timeout``, as long as ``pids``
    live (the daemons' logs are in ``logs``)."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        for pid in pids:
            if not local._alive(pid):
                raise LocalClusterError(f"a Spark daemon (pid {pid}) exited during startup; see {logs}")
        try:
            lack = ready()
            if lack is None:
                return
            last = lack
        except (OSError, ValueError, http.client.HTTPException) as exc:
            # a master still starting may refuse, drop the connection or answer before its status is JSON
            last = f"{type(exc).__name__}: {exc}"
        time.sleep(0.2)
    raise LocalClusterError(f"{what} not ready before the deadline ({last})")


def kill_worker(cluster: SparkCluster, index: int) -> None:
    """SIGKILL one worker and the executor JVMs it launched (its process group): a lost machine."""
    import signal

    pid = cluster.worker_pids[index]
    for child in _children(pid):
        _kill(child, signal.SIGKILL)
    _kill(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            child = int(stat.parent.name)
            out += [child, *_children(child)]
    return out


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def load(env: local.LocalEnv) -> SparkCluster | None:
    path = env.state_dir / STATE_FILE
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    return SparkCluster(raw["master_url"], raw["master_ui"], raw["master_pid"], tuple(raw["worker_pids"]),
                        tuple(raw["worker_uis"]), raw["logs"])


def down(env: local.LocalEnv) -> list[str]:
    """Stop the recorded master and workers (and their executors)."""
    cluster = load(env)
    if cluster is None:
        return []
    import signal

    for pid in cluster.worker_pids:
        for child in _children(pid):
            _kill(child, signal.SIGTERM)
    recs = [{"role": "spark worker", "pid": p, "address": u.removeprefix("http://")}
            for p, u in zip(cluster.worker_pids, cluster.worker_uis, strict=True)]
    recs.append({"role": "spark master", "pid": cluster.master_pid, "address": cluster.master_url[8:]})
    stopped = local._stop_records(recs)
    (env.state_dir / STATE_FILE).unlink(missing_ok=True)
    shutil.rmtree(scratch_dir(env), ignore_errors=True)
    return stopped


def scratch_dir(env: local.LocalEnv) -> Path:
    """The executors' local directories (``SPARK_LOCAL_DIRS``: block managers, fetched files), removed by
    :func:`down`; the executors' logs stay in the workers' work directories."""
    return env.state_dir / "spark-work" / "local"


def _write(path: Path, cluster: SparkCluster) -> None:
    path.write_text(json.dumps(asdict(cluster), indent=2))
