"""`make demo`: the main job through Airflow, on the embedded clusters, with no Airflow server.

1. Two real Kafka clusters and schema registries (``mirror_core.local``; clusters given by the
   ``MIRRORFLOW_SRC_*`` / ``MIRRORFLOW_DST_*`` variables are used instead).
2. Sample Avro orders on the source (three schema versions) and a consumer group that has read half of
   each partition.
3. Airflow with SQLite in a temporary ``AIRFLOW_HOME``; the DAGs generated from ``config/local.yaml`` run
   with ``dag.test()``: provision, stream (``available_now``), offset_sync, then failover, whose two
   approvals the demo answers itself through Airflow's public API (and says so).
4. A summary table per topic: records on both sides, schema subjects and versions, the consumer group's
   offsets source -> destination, lag and parity.

Run as ``python -m mirrorflow_airflow.demo`` (Airflow reads its settings when first imported, so this
module imports it only after setting them).
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet

from mirror_core.logs import quiet_library_warnings

quiet_library_warnings()  # authlib's and starlette's httpx2 notices, printed when Airflow is imported

from mirrorflow_airflow import hitl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "local.yaml"
GROUP = "demo"
CONSUMER_GROUP = "demo-app"
Say = Callable[[str], None]


def airflow_environment(home: Path) -> dict[str, str]:
    """Settings for an Airflow that lives in ``home`` only: SQLite, these DAGs and plugins, no examples."""
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__CORE__AUTH_MANAGER": "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        # keys of this throw-away Airflow only, so it warns about neither (an empty key stores variables and
        # connections unencrypted; a short generated JWT secret is refused as too weak for SHA-512)
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
        "MIRRORFLOW_CONFIG": str(home / "mirrors.yaml"),
    }


def demo_config(home: Path) -> Path:
    """``config/local.yaml`` with the demo group's stream as a drain (``available_now``), so its DAG run ends.
    Its checkpoint directories are written out in full: a relative one would be relative to ``home``."""
    import yaml

    from mirror_core.config import load_config

    raw = yaml.safe_load(CONFIG.read_text())
    resolved = {g.name: g.spark.checkpoint_dir for g in load_config(CONFIG).groups}
    for g in raw["groups"]:
        spark = g.setdefault("spark", {})
        spark["checkpoint_dir"] = resolved[g["name"]]
        if g["name"] == GROUP:
            spark["mode"] = "available_now"
    path = home / "mirrors.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


class Approver:
    """Answers the failover's approvals through Airflow's public API, in this process, from a thread: what
    an on-call engineer does in the UI ("Required actions"). Prints each answer. A watchdog fails an
    approval still waiting after ``timeout`` seconds, so the demo never hangs."""

    def __init__(self, dag_id: str, say: Say, timeout: float = 600.0) -> None:
        self.dag_id = dag_id
        self.say = say
        self.timeout = timeout
        self.answered: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()

    def _subject(self, client: Any, run_id: str, task_id: str, map_index: int) -> str:
        r = client.get(f"/api/v2/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/hitlDetails")
        return str(r.json().get("subject", task_id)) if r.status_code == 200 else task_id

    def _run(self) -> None:
        try:
            client = hitl.api_client()
            deadline = time.monotonic() + self.timeout
            while not self._stop.is_set():
                if time.monotonic() > deadline:
                    self.errors.append(f"no approval answered within {self.timeout:.0f}s")
                    hitl.fail_awaiting_input(self.dag_id)
                    return
                for task_id, run_id, map_index in hitl.awaiting_input(self.dag_id):
                    subject = self._subject(client, run_id, task_id, map_index)
                    self.say(f"approval requested: \"{subject}\" -> the demo answers Approve (in the UI: "
                             "Required actions)")
                    r = client.patch(f"/api/v2/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/"
                                     f"{map_index}/hitlDetails", json={"chosen_options": ["Approve"]})
                    if r.status_code != 200:
                        self.errors.append(f"{task_id}: HTTP {r.status_code}")
                        hitl.fail_awaiting_input(self.dag_id)
                        return
                    self.answered.append(task_id)
                self._stop.wait(0.5)
        except Exception as exc:  # noqa: BLE001 - reported at the end; the waiting task is failed
            self.errors.append(f"{type(exc).__name__}: {exc}")
            hitl.fail_awaiting_input(self.dag_id)

    @contextmanager
    def running(self) -> Iterator[Approver]:
        from airflow.models import import_all_models

        import_all_models()  # a thread importing models while dag.test() does deadlocks on the import lock
        t = threading.Thread(target=self._run, name="demo-approver", daemon=True)
        t.start()
        try:
            yield self
        finally:
            self._stop.set()
            t.join(30)


def endpoints(say: Say) -> dict[str, dict[str, str | None]]:
    """Clusters named by the MIRRORFLOW_* variables, else the embedded ones (started when not running)."""
    src, dst = os.environ.get("MIRRORFLOW_SRC_BOOTSTRAP"), os.environ.get("MIRRORFLOW_DST_BOOTSTRAP")
    if src and dst:
        say(f"using the clusters given by MIRRORFLOW_SRC_BOOTSTRAP / MIRRORFLOW_DST_BOOTSTRAP ({src}, {dst})")
        return {"src": {"bootstrap": src, "registry": os.environ.get("MIRRORFLOW_SRC_REGISTRY")},
                "dst": {"bootstrap": dst, "registry": os.environ.get("MIRRORFLOW_DST_REGISTRY")}}
    from mirror_core import demo as core_demo

    return core_demo.ensure_clusters(say)


def seed(eps: dict[str, dict[str, str | None]], records: int, say: Say) -> None:
    """Sample Avro orders on the source and a consumer group half-way through each partition."""
    from confluent_kafka import Consumer, TopicPartition

    from mirror_core import demo as core_demo

    src = eps["src"]
    assert src["bootstrap"] and src["registry"], "the demo needs a schema registry on the source"
    core_demo.produce_sample(src["bootstrap"], src["registry"], records, say)
    ends = core_demo.count_per_partition(src["bootstrap"], core_demo.TOPIC)
    c = Consumer({"bootstrap.servers": src["bootstrap"], "group.id": CONSUMER_GROUP, "log_level": 3})
    offsets = [TopicPartition(core_demo.TOPIC, p, n // 2) for p, n in sorted(ends.items())]
    c.commit(offsets=offsets, asynchronous=False)
    c.close()
    say(f"consumer group {CONSUMER_GROUP} has read half of {core_demo.TOPIC} on src: "
        + ", ".join(f"p{tp.partition}@{tp.offset}" for tp in offsets))


def run_dag(dags: dict[str, Any], purpose: str, say: Say, **kw: Any) -> Any:
    dag_id = f"mirrorflow__{GROUP}__{purpose}"
    t0 = time.monotonic()
    say(f"dag.test() {dag_id} ...")
    dr = dags[dag_id].test(**kw)
    say(f"  {dag_id}: {dr.state} in {time.monotonic() - t0:.1f}s")
    if str(dr.state) != "success":
        raise SystemExit(f"{dag_id} ended {dr.state}: see the task logs above")
    return dr


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mirrorflow_airflow.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=30000, help="sample records to produce")
    ap.add_argument("--keep-airflow-home", action="store_true", help="keep the temporary AIRFLOW_HOME")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(f"[demo] {msg}", file=sys.stderr, flush=True)

    t0 = time.monotonic()
    os.chdir(ROOT)  # Spark's own scratch files and logs land under the repository, as with `make demo`
    home = Path(tempfile.mkdtemp(prefix="mirrorflow-demo-airflow-"))
    os.environ.update(airflow_environment(home))
    config = demo_config(home)
    try:
        eps = endpoints(say)
        for side in ("src", "dst"):  # config/local.yaml reads its endpoints from these
            os.environ[f"MIRRORFLOW_{side.upper()}_BOOTSTRAP"] = str(eps[side]["bootstrap"])
            if eps[side]["registry"]:
                os.environ[f"MIRRORFLOW_{side.upper()}_REGISTRY"] = str(eps[side]["registry"])
        seed(eps, args.records, say)
        from mirror_core.config import load_config
        from mirror_core.failover import clear_stream_stop

        demo_cfg = load_config(config)
        if clear_stream_stop(demo_cfg, demo_cfg.group(GROUP)):
            say(f"removed the stop a previous demo's failover left for group {GROUP}")

        say(f"Airflow (SQLite) in {home}; DAGs generated from {CONFIG.relative_to(ROOT)} (the stream as a drain)")
        from airflow.dag_processing.dagbag import DagBag
        from airflow.utils.db import initdb

        initdb()
        bag = DagBag(str(ROOT / "dags"))
        if bag.import_errors:
            for path, err in bag.import_errors.items():
                say(f"import error in {path}: {err}")
            return 1
        dags = bag.dags
        say(f"{len(dags)} DAGs: " + ", ".join(sorted(d for d in dags if f"__{GROUP}__" in d)))

        run_dag(dags, "provision", say)
        run_dag(dags, "stream", say)
        run_dag(dags, "offset_sync", say)
        failover = f"mirrorflow__{GROUP}__failover"
        with Approver(failover, say).running() as approver:
            # a drained (available_now) mirror's lag in seconds is the age of the last heartbeat it carried
            # over, which grows until the next drain: the demo gates on lag in records only
            run_dag(dags, "failover", say, run_conf={"consumer_groups": [CONSUMER_GROUP], "quiet_seconds": 3,
                                                     "max_lag_seconds": 86400})
        if approver.errors or len(approver.answered) != 2:
            say(f"approvals: {approver.answered}, errors: {approver.errors}")
            return 1

        from mirror_core import demo as core_demo

        cfg = load_config(config)
        rows = core_demo.summarize(cfg, cfg.group(GROUP), CONSUMER_GROUP)
        ok = core_demo.print_summary(rows, f"group {GROUP}: src -> dst after the failover "
                                           f"(consumer group {CONSUMER_GROUP})")
        say(f"demo {'OK' if ok else 'MISMATCH'} in {time.monotonic() - t0:.1f}s — the clusters keep running "
            "(`make down` stops them); `make airflow` shows the same DAGs and the Mirrors page in the UI")
        return 0 if ok else 1
    finally:
        if not args.keep_airflow_home:
            shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
