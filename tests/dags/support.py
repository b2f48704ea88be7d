"""Helpers of the dag.test() runs: data on the real clusters, the generated DAGs, XComs, approvals."""

from __future__ import annotations

import json
import logging
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from mirrorflow_airflow import hitl

from mirror_core.topics import create_topics
from tests.groups import commit_offsets

ROOT = Path(__file__).resolve().parents[2]
ORDER = {"type": "record", "name": "Order", "namespace": "dagtest",
         "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}]}


@dataclass
class Scenario:
    """One test's group on the shared clusters: a topic with Avro records and a half-consumed group."""

    name: str
    topic: str
    consumer_group: str
    config: Path
    checkpoint_dir: Path
    partitions: int
    src: str
    dst: str
    src_registry: str
    dst_registry: str
    produced: dict[int, int] = field(default_factory=dict)

    def dag_id(self, purpose: str) -> str:
        return f"mirrorflow__{self.name}__{purpose}"


def write_config(clusters: Any, tmp_path: Path, name: str, topic: str, cg: str, mode: str = "available_now",
                 extra_clusters: str = "", clusters_yaml: str | None = None, retries: int = 3,
                 group_yaml: str = "", spark_yaml: str = "") -> tuple[Path, Path]:
    """The scenario's mirrors YAML and checkpoint directory. ``spark_yaml``: more keys of the group's ``spark``
    mapping (flow style, each after a ``, ``)."""
    ckpt = tmp_path / "ckpt"
    groups = f"""groups:
  - name: {name}
    source: src
    destination: dst
    delivery: exactly_once
    serdes: {{key: string, value: avro}}
    offset_syncs_topic: "{topic}.syncs.internal"
    dead_letter_topic: "{topic}.dlq"
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    offsets: {{groups: {{include: "{cg}"}}, interval: 30s}}
    heartbeats: {{enabled: true, topic: "{topic}.heartbeats"}}
    spark: {{mode: {mode}, master: "local[2]", trigger: "1 second", checkpoint_dir: "{ckpt}", retries: {retries},
             retry_delay: 1s, airflow_conn_id: mirrorflow_spark_{name}{spark_yaml}}}
{group_yaml}    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
"""
    text = (clusters_yaml + groups) if clusters_yaml is not None else clusters.config_yaml(groups)
    path = tmp_path / "mirrors.yaml"
    path.write_text(text)
    return path, ckpt


def scenario(clusters: Any, unique: Callable[[str], str], tmp_path: Path, partitions: int = 2, records: int = 60,
             mode: str = "available_now", **kw: Any) -> Scenario:
    name = unique("dt").replace("-", "")
    topic = unique("dagtest")
    cg = unique("dagtest-consumer")
    config, ckpt = write_config(clusters, tmp_path, name, topic, cg, mode, **kw)
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, partitions, 1)])
    s = Scenario(name, topic, cg, config, ckpt, partitions, clusters.src_bootstrap, clusters.dst_bootstrap,
                 clusters.src_registry, clusters.dst_registry)
    produce(s, records)
    return s


def produce(s: Scenario, records: int, start: int | None = None) -> None:
    """Avro orders spread over the partitions (keys ``k<i>``), registering the value schema once."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from fastavro import parse_schema, schemaless_writer

    sid = SchemaRegistryClient({"url": s.src_registry}).register_schema(f"{s.topic}-value",
                                                                        Schema(json.dumps(ORDER), "AVRO"))
    parsed = parse_schema(ORDER)
    first = sum(s.produced.values()) if start is None else start
    p = Producer({"bootstrap.servers": s.src, "enable.idempotence": True, "linger.ms": 5})
    for i in range(first, first + records):
        buf = BytesIO()
        schemaless_writer(buf, parsed, {"id": i, "note": f"n{i}"})
        part = i % s.partitions
        p.produce(s.topic, key=f"k{i}".encode(), value=b"\x00" + struct.pack(">I", sid) + buf.getvalue(),
                  partition=part)
        s.produced[part] = s.produced.get(part, 0) + 1
    assert p.flush(30) == 0


def commit_source_group(s: Scenario, offsets: dict[int, int]) -> None:
    commit(s.src, s.consumer_group, s.topic, offsets)


def commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``group``'s ``offsets`` of ``topic`` (partition -> offset) on the cluster at ``bootstrap`` (once it
    has a coordinator for the group: a test run alone may be the first on a fresh cluster)."""
    commit_offsets(bootstrap, group, [TopicPartition(topic, p, o) for p, o in offsets.items()])


def keys(bootstrap: str, topic: str, partition: int, start: int = 0, timeout: float = 60) -> list[bytes]:
    """Keys of the committed records of ``topic[partition]`` from ``start`` to the end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.time_ns()}", "isolation.level":
                  "read_committed", "enable.partition.eof": True, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, partition, start)])
    out: list[bytes] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            break
        out.append(m.key())
    c.close()
    return out


def resume_on_destination(s: Scenario, topic: str) -> dict[int, list[bytes]]:
    """What a consumer of the scenario's group reads on the destination from its committed offsets
    (``auto.offset.reset: error``: a group without a committed offset fails instead of guessing)."""
    c = Consumer({"bootstrap.servers": s.dst, "group.id": s.consumer_group, "isolation.level": "read_committed",
                  "auto.offset.reset": "error", "enable.auto.commit": False, "enable.partition.eof": True})
    c.subscribe([topic])
    out: dict[int, list[bytes]] = {p: [] for p in range(s.partitions)}
    eof: set[int] = set()
    deadline = time.monotonic() + 120
    while len(eof) < s.partitions and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            assert m.error().code() == -191, m.error()  # _PARTITION_EOF
            eof.add(m.partition())
            continue
        out[m.partition()].append(m.key())
    c.close()
    assert len(eof) == s.partitions
    return out


@contextmanager
def group_member(bootstrap: str, group: str, topic: str, timeout: float = 60.0) -> Iterator[None]:
    """A live consumer of ``group`` on the cluster at ``bootstrap``, subscribed to ``topic`` and polling (in a
    thread) for as long as the block runs: entered once the group has assigned it partitions, left once the
    group has no member again. It commits nothing."""
    joined, done = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def member() -> None:
        try:
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                          "log_level": 3})
            try:
                c.subscribe([topic])
                while not done.is_set():
                    c.poll(0.2)
                    if c.assignment():
                        joined.set()
            finally:
                c.close()  # leaves the group
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            failed.append(exc)
            joined.set()

    t = threading.Thread(target=member, name=f"member-{group}", daemon=True)
    t.start()
    try:
        assert joined.wait(timeout) and not failed, failed or f"{group} not assigned {topic} in {timeout} s"
        yield
    finally:
        done.set()
        t.join(timeout)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while admin.describe_consumer_groups([group])[group].result(30).members:
        assert time.monotonic() < deadline, f"{group} still has members {timeout} s after its consumer closed"
        time.sleep(0.2)


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    c.close()
    return {tp.partition: tp.offset for tp in got}


# --------------------------------------------------------------------------- Airflow side


def load_dags(config: Path, monkeypatch: Any) -> dict[str, Any]:
    from airflow.dag_processing.dagbag import DagBag

    monkeypatch.setenv("MIRRORFLOW_CONFIG", str(config))
    bag = DagBag(str(ROOT / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def xcom(dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(select(XComModel).where(
            XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id,
            XComModel.key == key)).first()
        return None if row is None else XComModel.deserialize_value(row)


def task_states(dr: Any) -> dict[str, str]:
    from airflow.utils.session import create_session

    with create_session() as session:
        return {ti.task_id: str(ti.state) for ti in dr.get_task_instances(session=session)}


class Approver:
    """Answers a run's approvals through Airflow's public API, in process, from a thread.

    ``answers`` maps an approval task id to "Approve" / "Reject", or to "timeout": then nobody answers, and once
    the approval's response timeout has passed the approver runs the scheduler's sweep of such approvals (what
    a scheduler does every loop; it is ``answered`` with status 0). A watchdog fails whatever still waits for
    input after ``timeout`` seconds, so a missing answer ends the run instead of hanging the test. ``before`` maps
    an approval task id to what happens while it waits, just before it is answered (called with its run id and
    map index; what it raises fails the run like a wrong answer)."""

    def __init__(self, dag_id: str, answers: dict[str, str], timeout: float = 600.0,
                 before: dict[str, Callable[[str, int], None]] | None = None) -> None:
        self.dag_id = dag_id
        self.answers = dict(answers)
        self.before = dict(before or {})
        self.timeout = timeout
        self.answered: list[tuple[str, str, int]] = []
        self.errors: list[str] = []
        self.watchdog_fired = False
        self._stop = threading.Event()

    def _run(self) -> None:
        try:
            client = hitl.api_client()
            deadline = time.monotonic() + self.timeout
            while not self._stop.is_set():
                if time.monotonic() > deadline:
                    self.watchdog_fired = True
                    hitl.fail_awaiting_input(self.dag_id)
                    return
                for task_id, run_id, map_index in hitl.awaiting_input(self.dag_id):
                    choice = self.answers.get(task_id)
                    if choice is None:
                        self.errors.append(f"unexpected approval {task_id}")
                        hitl.fail_awaiting_input(self.dag_id)
                        return
                    if task_id in self.before:
                        self.before.pop(task_id)(run_id, map_index)
                    if choice == "timeout":
                        sweep_timed_out_approvals(self.dag_id, task_id, run_id)
                        self.answered.append((task_id, choice, 0))
                        self.answers.pop(task_id)
                        continue
                    r = client.patch(f"/api/v2/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/"
                                     f"{map_index}/hitlDetails", json={"chosen_options": [choice]})
                    if r.status_code != 200:
                        self.errors.append(f"{task_id}: HTTP {r.status_code} {r.text[:300]}")
                        hitl.fail_awaiting_input(self.dag_id)
                        return
                    self.answered.append((task_id, choice, r.status_code))
                    self.answers.pop(task_id)
                self._stop.wait(0.5)
        except Exception as exc:  # noqa: BLE001 - reported to the test, which fails on it
            self.errors.append(f"{type(exc).__name__}: {exc}")
            hitl.fail_awaiting_input(self.dag_id)

    @contextmanager
    def running(self) -> Iterator[Approver]:
        from airflow.models import import_all_models

        import_all_models()  # a thread importing models while dag.test() does deadlocks on the import lock
        t = threading.Thread(target=self._run, name="approver", daemon=True)
        t.start()
        try:
            yield self
        finally:
            self._stop.set()
            t.join(30)


@contextmanager
def signed_in(users: dict[str, str], passwords_file: Path) -> Iterator[dict[str, Any]]:
    """Airflow's public API with real users instead of the all-admins mode the DAG tests run in: the simple auth
    manager's ``users`` (name -> role, e.g. ``USER``), each with a client signed in as them (their passwords in
    ``passwords_file``). The all-admins mode is back on the way out."""
    import os
    import secrets

    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    passwords = {u: secrets.token_urlsafe(16) for u in users}
    passwords_file.write_text(json.dumps(passwords) + "\n")
    env = {"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{role}" for u, role in users.items()),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        app = create_app()
        clients: dict[str, Any] = {}
        for user, password in passwords.items():
            client = TestClient(app)
            tok = client.post("/auth/token", json={"username": user, "password": password})
            tok.raise_for_status()
            client.headers["Authorization"] = f"Bearer {tok.json()['access_token']}"
            clients[user] = client
        yield clients
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def sweep_timed_out_approvals(dag_id: str, task_id: str, run_id: str, wait: float = 120.0) -> None:
    """Wait (up to ``wait`` seconds) for the response timeout of ``task_id`` in ``run_id`` to pass, then run the
    scheduler's sweep that answers timed-out approvals with their defaults (a scheduler runs it every loop;
    ``dag.test()`` runs none)."""
    from types import SimpleNamespace

    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.taskinstance import TaskInstance
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from sqlalchemy import select

    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        with create_session() as session:
            due = session.scalar(select(TaskInstance.trigger_timeout).where(
                TaskInstance.dag_id == dag_id, TaskInstance.task_id == task_id, TaskInstance.run_id == run_id))
        if due is not None and due < timezone.utcnow():
            break
        time.sleep(0.5)
    SchedulerJobRunner.check_awaiting_input_timeouts(SimpleNamespace(log=logging.getLogger("sweep")))  # type: ignore[arg-type]


@contextmanager
def job_holding(lock: Path, seconds: float, once: bool = False) -> Iterator[subprocess.Popen[str]]:
    """A stand-in for a streaming job (with ``once``, a drain): another process that holds ``lock`` (a
    checkpoint's, mirror_core.joblock) for ``seconds``, then ends; yielded once it holds it, killed on the way
    out."""
    job = subprocess.Popen([sys.executable, "-c", f"""
import pathlib, time
from mirror_core.joblock import Holder, JobLock
assert JobLock(pathlib.Path({str(lock)!r})).try_take(Holder.me(once={once})) is None
print('taken', flush=True)
time.sleep({seconds})
"""], stdout=subprocess.PIPE, text=True)
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "taken"
        yield job
    finally:
        job.kill()
        job.wait(10)
