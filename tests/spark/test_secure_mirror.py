"""The whole mirror on secured clusters, as least-privilege principals, with planted passwords looked for
everywhere they could leak.

The clusters (``local up --secure``: SASL_SSL SCRAM-SHA-512, a CA made at start-up, StandardAuthorizer with
``allow.everyone.if.no.acl.found=false``, registries over HTTPS) are this module's own. The mirror's two
principals get exactly the ACLs :func:`mirror_core.acls.required_acls` lists (what the README tells a user to
grant) and nothing else; provision, both delivery modes, checkpoint, lag and verify run through the CLI.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from fastavro import parse_schema, schemaless_writer

from mirror_core.acls import apply_acls, required_acls
from mirror_core.config import SchemaRegistryConfig, parse_config
from mirror_core.registry import RegistryClient
from mirror_core.topics import create_topics

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
SCHEMA = {"type": "record", "name": "Order", "namespace": "sec", "fields": [{"name": "id", "type": "long"}]}
RECORDS = 400
PARTITIONS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config_text(sc, groups: list[tuple[str, str, str, str, str, int]], tmp: Path) -> str:
    """The mirrors YAML: clusters reached as the two mirror principals (passwords and CA only by ${ENV}), one
    group per ``(name, delivery, read_path, topic, application group, metrics port)``."""
    (tmp / "events").mkdir(exist_ok=True)
    text = "clusters:" + sc.cluster_yaml("src") + sc.cluster_yaml("dst") + "\ngroups:\n"
    for name, delivery, read_path, topic, app_group, metrics_port in groups:
        text += f"""  - name: {name}
    source: src
    destination: dst
    delivery: {delivery}
    serdes: {{key: string, value: avro}}
    offset_syncs_topic: "{name}.syncs.internal"
    stops_topic: "{name}.stops.internal"
    dead_letter_topic: "{name}.dlq"
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    offsets: {{sync_group_offsets: true, groups: {{include: "{app_group}"}}}}
    heartbeats: {{enabled: false}}
    spark:
      master: "local[2]"
      checkpoint_dir: "{tmp / 'ckpt'}"
      read_path: {read_path}
      driver_batch_max_records: {0 if read_path == "executors" else 50000}
      metrics_port: {metrics_port}
      conf: {{spark.eventLog.enabled: "true", spark.eventLog.compress: "false", spark.eventLog.dir: "file://{tmp / 'events'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
"""
    return text


class Snapshots:
    """``ps`` command lines of every process on the machine and the job's metrics page, sampled while it runs."""

    def __init__(self, metrics_ports: list[int]):
        self.lines: set[str] = set()
        self.metrics: list[str] = []
        self._ports = metrics_ports
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Snapshots:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            ps = subprocess.run(["ps", "-eww", "-o", "args="], capture_output=True, text=True)
            self.lines.update(ps.stdout.splitlines())
            for port in self._ports:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as r:
                        self.metrics.append(r.read().decode())
                except OSError:
                    pass
            self._stop.wait(0.3)


def produce(sc, topic: str, schema_id: int, keys: range) -> None:
    parsed = parse_schema(SCHEMA)
    p = Producer(sc.admin_config(sc.src_bootstrap) | {"enable.idempotence": True, "log_level": 3})
    for i in keys:
        buf = BytesIO()
        schemaless_writer(buf, parsed, {"id": i})
        p.produce(topic, key=f"k{i}".encode(), value=b"\x00" + struct.pack(">I", schema_id) + buf.getvalue(),
                  partition=i % PARTITIONS)
    assert p.flush(30) == 0


def read_ids(sc, topic: str) -> list[int]:
    """Independent reader (super user, read_committed): the ``k<i>`` keys on the destination topic."""
    c = Consumer(sc.admin_config(sc.dst_bootstrap) | {
        "group.id": f"check-{time.time_ns()}", "isolation.level": "read_committed", "enable.partition.eof": True,
        "auto.offset.reset": "earliest", "log_level": 3})
    try:
        parts = c.list_topics(topic, timeout=20).topics[topic].partitions
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out: list[int] = []
        deadline = time.monotonic() + 60
        while len(done) < len(parts) and time.monotonic() < deadline:
            m = c.poll(1.0)
            if m is None:
                continue
            if m.error():
                done.add(m.partition())
                continue
            out.append(int(m.key().decode()[1:]))
        return out
    finally:
        c.close()


def cli(*args: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_secured_mirror_least_privilege_both_modes_no_password_leaks(secure_clusters, unique, tmp_path):
    """Both delivery modes on SASL_SSL clusters with exactly the documented ACLs; the at_least_once group
    reads with ``spark.read_path: direct`` (the writer processes' own consumers, the source cluster's librdkafka
    security settings), one exactly_once group through Spark's source (the Java options), another with
    ``read_path: executors`` and ``driver_batch_max_records: 0`` (Spark's tasks read every batch with
    librdkafka, the source's settings shipped in the task)."""
    sc = secure_clusters
    sec = sc.security
    admin_src = AdminClient(sc.admin_config(sc.src_bootstrap) | {"log_level": 3})
    reg_cfg = SchemaRegistryConfig.model_validate({"url": sc.src_registry, "ssl.ca.location": str(sec.ca_file)})
    with RegistryClient.from_config(reg_cfg) as reg:
        runs = []
        for delivery, read_path in (("exactly_once", "spark"), ("at_least_once", "direct"),
                                    ("exactly_once", "executors")):
            topic, name, app_group = unique("sec"), unique("sg").replace("-", "_"), unique("secapp")
            create_topics(admin_src, [NewTopic(topic, PARTITIONS, 1)])
            schema_id = reg.register(f"{topic}-value", json.dumps(SCHEMA))
            produce(sc, topic, schema_id, range(RECORDS))
            runs.append((name, delivery, read_path, topic, app_group, free_port()))
    cfg_path = tmp_path / "secure.yaml"
    cfg_path.write_text(config_text(sc, runs, tmp_path))
    env = sc.principal_env(ROOT)
    cfg = parse_config(yaml.safe_load(cfg_path.read_text()), env=env)

    # exactly the documented grants, nothing more
    for g in cfg.groups:
        grants = required_acls(cfg, g)
        for bootstrap, cluster in ((sc.src_bootstrap, "src"), (sc.dst_bootstrap, "dst")):
            admin = AdminClient(sc.admin_config(bootstrap) | {"log_level": 3})
            apply_acls(admin, [x for x in grants if x.cluster == cluster])

    outputs: list[str] = []

    def mirror_and_check(name: str, delivery: str, read_path: str, topic: str, app_group: str) -> None:
        job = subprocess.run([sys.executable, "-m", "spark_jobs.mirror_stream", str(cfg_path), "--group", name,
                              "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        outputs.extend([job.stdout, job.stderr])
        assert job.returncode == 0, job.stderr[-4000:]
        # who read and wrote: Spark's source (collected to the driver), the writer processes, or mirrorflow's
        # reader in Spark's tasks
        by = {"spark": ("driver", "spark"), "direct": ("driver", "direct"), "executors": ("tasks", "direct")}
        written_by, read_by = by[read_path]
        assert f"'written_by': '{written_by}', 'read_by': '{read_by}'" in job.stderr + job.stdout
        ids = read_ids(sc, f"{topic}.mirror")
        assert len(ids) == RECORDS, f"{delivery}, {read_path}: {len(ids)} mirrored of {RECORDS}"
        assert sorted(ids) == list(range(RECORDS)), f"{delivery}, {read_path}: lost or duplicated records"

        # an application's group on the source, checkpointed and written to the destination
        app = Consumer(sc.admin_config(sc.src_bootstrap) | {"group.id": app_group, "log_level": 3})
        app.commit(offsets=[TopicPartition(topic, p, 100) for p in range(PARTITIONS)], asynchronous=False)
        app.close()
        res = cli("checkpoint", str(cfg_path), "--group", name, env=env)
        outputs.extend([res.stdout, res.stderr])
        assert res.returncode == 0, res.stderr[-3000:]
        res = cli("lag", str(cfg_path), "--group", name, "--json", env=env)
        outputs.extend([res.stdout, res.stderr])
        assert res.returncode == 0, res.stderr[-3000:]
        lag = json.loads(res.stdout)[0]
        assert sum(p["lag_records"] for p in lag["partitions"]) == 0
        assert [(g["consumer_group"], g["translated"]) for g in lag["consumer_groups"]] == \
            [(app_group, 100)] * PARTITIONS
        res = cli("verify", str(cfg_path), "--group", name, "--json", env=env)
        outputs.extend([res.stdout, res.stderr])
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert all(r["ok"] for r in json.loads(res.stdout))

    with Snapshots([r[5] for r in runs]) as snaps:
        for name, *_ in runs:  # one group after the other: each provisions the destination's shared topics
            res = cli("provision", str(cfg_path), "--group", name, env=env)
            outputs += [res.stdout, res.stderr]
            assert res.returncode == 0, res.stderr[-3000:]
        # the groups' jobs (and their checkpoint, lag, verify) side by side; a failed check fails the test
        with ThreadPoolExecutor(len(runs)) as pool:
            done = [pool.submit(mirror_and_check, name, delivery, read_path, topic, app_group)
                    for name, delivery, read_path, topic, app_group, _ in runs]
            for fut in done:
                fut.result()
    # the translated offsets reached the destination group (written by the destination principal)
    dst_admin = AdminClient(sc.admin_config(sc.dst_bootstrap) | {"log_level": 3})
    for *_, app_group, _ in runs:
        got = dst_admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(app_group)])[app_group].result(30)
        assert sorted(tp.offset for tp in got.topic_partitions) == [100] * PARTITIONS

    # the planted passwords: nowhere in logs, command lines, Spark's configuration dump (event log), metrics
    events = "".join(p.read_text(errors="replace") for p in (tmp_path / "events").rglob("*") if p.is_file())
    assert "SparkListenerEnvironmentUpdate" in events and "spark.jars" in events  # the dump is there to search
    logs = "".join(p.read_text(errors="replace") for p in Path(sc.env.state_dir, "logs").glob("*.log"))
    assert logs and snaps.lines and snaps.metrics
    assert any("spark" in line.lower() and "java" in line for line in snaps.lines)  # Spark's JVM was seen
    places = {"cli and job output": "\n".join(outputs), "ps command lines": "\n".join(sorted(snaps.lines)),
              "spark event log (configuration dump, plans)": events, "cluster logs": logs,
              "metrics": "\n".join(snaps.metrics)}
    leaks = [(where, user) for where, text in places.items() for user, pw in sec.passwords if pw in text]
    assert leaks == []


def one_error_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in res.stderr.splitlines() if line.strip() and "WARN" not in line
             and not line.startswith(("WARNING: Using incubator", "%"))]
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "\tat " not in res.stderr, res.stderr[-3000:]
    errors = [line for line in lines if "error" in line.lower() or "cannot start" in line]
    assert len(errors) == 1, res.stderr[-3000:]
    return errors[0]


def test_wrong_password_untrusted_certificate_and_missing_acl_are_one_line_each(secure_clusters, unique, tmp_path):
    """Each refusal: exit 1 within seconds, one line naming the cluster, the principal and what was refused."""
    sc = secure_clusters
    topic, name = unique("refused"), unique("rg").replace("-", "_")
    admin_src = AdminClient(sc.admin_config(sc.src_bootstrap) | {"log_level": 3})
    create_topics(admin_src, [NewTopic(topic, 1, 1)])
    cfg_path = tmp_path / "refused.yaml"
    cfg_path.write_text(config_text(sc, [(name, "exactly_once", "spark", topic, unique("app"), 0)], tmp_path))
    base = sc.principal_env(ROOT)

    t0 = time.monotonic()
    line = one_error_line(cli("lag", str(cfg_path), "--group", name, env=base | {"MIRRORFLOW_SRC_PASSWORD": "nope"}))
    assert time.monotonic() - t0 < 30  # refused, not waited out
    assert "cluster 'src'" in line and "'mirror-source'" in line and "authentication failed" in line

    line = one_error_line(cli("provision", str(cfg_path), "--group", name,
                              env=base | {"MIRRORFLOW_LOCAL_CA": "/etc/ssl/certs/ca-certificates.crt"}))
    assert "cluster 'src'" in line and "'mirror-source'" in line and "certificate is not trusted" in line
    assert "schema registry of cluster 'dst'" in line  # the registries' TLS refusal is in the same line

    # no ACL granted yet: the destination refuses to create the group's topics
    line = one_error_line(cli("provision", str(cfg_path), "--group", name, env=base))
    assert "cluster 'dst'" in line and "'mirror-destination'" in line and "TOPIC_AUTHORIZATION_FAILED" in line
    # nor to read a failover's stops there: the job does not start, since not knowing is not "no stop"
    job = subprocess.run([sys.executable, "-m", "spark_jobs.mirror_stream", str(cfg_path), "--group", name, "--once"],
                         cwd=ROOT, env=base, capture_output=True, text=True, timeout=120)
    line = one_error_line(job)
    assert f"{name}: cannot start the mirror: cannot read the failover stops from topic {name}.stops.internal " \
           "on dst: cluster 'dst'" in line and "'mirror-destination'" in line and "AUTHORIZATION_FAILED" in line, line
    cfg = parse_config(yaml.safe_load(cfg_path.read_text()), env=base)
    grants = required_acls(cfg, cfg.groups[0])
    for bootstrap, cluster in ((sc.src_bootstrap, "src"), (sc.dst_bootstrap, "dst")):
        admin = AdminClient(sc.admin_config(bootstrap) | {"log_level": 3})
        apply_acls(admin, [x for x in grants if x.cluster == cluster and x.resource_type != "TRANSACTIONAL_ID"])
    res = cli("provision", str(cfg_path), "--group", name, env=base)
    assert res.returncode == 0, res.stderr[-2000:]
    # everything but the transactional ids: the job stops before Spark's tasks run, in one line
    job = subprocess.run([sys.executable, "-m", "spark_jobs.mirror_stream", str(cfg_path), "--group", name, "--once"],
                         cwd=ROOT, env=base, capture_output=True, text=True, timeout=300)
    line = one_error_line(job)
    assert "cluster 'dst'" in line and "'mirror-destination'" in line
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in line or "Transactional Id authorization failed" in line
    assert f"mirrorflow.{name}:" in line
