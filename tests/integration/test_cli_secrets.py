"""Item 14 of issue 11: registry credentials carried in a URL never reach a log, an error or a repr.

Issue 15 ("Secrets") widens it: the same password is planted in every secret a cluster setting can hold
(Kafka ``sasl.password`` and ``ssl.key.password``, the registry's ``basic.auth.user.info`` and URL
userinfo) and looked for in the output of every CLI command (and of the Spark job that ``run`` starts),
and in the reprs of the settings objects that carry client configs to the writers. ``run`` and the failover
steps run with ``-v`` (DEBUG logging: a superset of what they print without it), the steps with ``--json``
(printed as it is, past the logging's redaction) and ``finalize`` last: it stops the group's stream for good."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from mirror_core import clients
from mirror_core.config import load_config
from mirror_core.stream import MirrorRuntime
from mirror_core.topics import create_topics
from tests.groups import commit_offsets

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-pw"


def with_userinfo(url: str) -> str:
    scheme, rest = url.split("://", 1)
    return f"{scheme}://alice:{PASSWORD}@{rest}"


def mirrorflow(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it: a separate process, its own logging set-up."""
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=os.environ | env)


def planted_kafka(bootstrap: str) -> str:
    """A cluster's kafka block with the password in every secret property (the test clusters are
    PLAINTEXT, so the clients keep working: librdkafka and the Java client use them only with SASL/SSL)."""
    return (f'{{bootstrap.servers: "{bootstrap}", sasl.username: mf-user, sasl.password: "{PASSWORD}", '
            f'ssl.key.password: "{PASSWORD}"}}')


def test_item14_registry_password_never_logged(clusters, unique, tmp_path):
    topic, group = unique("item14"), unique("g14").replace("-", "_")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 1, 1)])
    schema = json.dumps({"type": "record", "name": "R", "namespace": "item14", "fields": [
        {"name": "x", "type": "long"}]})
    sid = SchemaRegistryClient({"url": clusters.src_registry}).register_schema(f"{topic}-value", Schema(schema, "AVRO"))
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for i in range(3):
        p.produce(topic, b"\x00" + struct.pack(">I", sid) + bytes([i * 2]))
    assert p.flush(30) == 0
    consumers = unique("cg14")  # a consumer group half-way through the topic: what the failover steps move
    commit_offsets(clusters.src_bootstrap, consumers, [TopicPartition(topic, 0, 2)])
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"""
clusters:
  src:
    kafka: {planted_kafka(clusters.src_bootstrap)}
    schema_registry: {{url: "{with_userinfo(clusters.src_registry)}", basic.auth.user.info: "mf-user:{PASSWORD}"}}
  dst:
    kafka: {planted_kafka(clusters.dst_bootstrap)}
    schema_registry: {{url: "{with_userinfo(clusters.dst_registry)}", basic.auth.user.info: "mf-user:{PASSWORD}"}}
groups:
  - name: {group}
    source: src
    destination: dst
    serdes: {{key: bytes, value: avro}}
    offset_syncs_topic: "{topic}.syncs.internal"
    dead_letter_topic: "{topic}.dlq"
    topics_mirroring:
      replication_factor: {{type: fix, value: 1}}
    spark: {{master: "local[1]", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
""")
    loaded = load_config(cfg)
    reg = loaded.cluster("src").schema_registry
    assert reg is not None
    for shown in (repr(loaded), str(loaded), repr(reg), str(reg.url), reg.model_dump_json(), f"{reg.url}"):
        assert PASSWORD not in shown and "alice" not in shown, shown
    assert reg.url.get_secret_value() == with_userinfo(clusters.src_registry).rstrip("/")
    # the objects that carry client configs to the writers and to Spark's source (issue 15)
    rt = MirrorRuntime(loaded, loaded.groups[0])
    list(rt.prepare())
    settings = rt.settings[topic]
    assert settings.producer_config["sasl.password"] == PASSWORD  # what the client gets
    for shown in (repr(settings), str(settings), repr(rt.writer_plan(-1)), repr(rt.source_options(once=True)),
                  repr(clients.kafka_config(loaded.cluster("dst"))), repr(clients.java_kafka_options(loaded.cluster("src")))):
        assert PASSWORD not in shown, shown

    def step(name: str) -> list[str]:
        return ["-v", "failover", str(cfg), "--group", group, "--step", name, "-c", consumers, "--json", "--wait", "10"]

    commands = {
        "validate": ["validate", str(cfg)], "plan": ["plan", str(cfg)], "provision": ["provision", str(cfg)],
        "run": ["-v", "run", str(cfg), "--group", group, "--once"], "checkpoint": ["checkpoint", str(cfg)],
        "lag": ["lag", str(cfg)], "verify": ["verify", str(cfg)], "plan --json": ["-v", "plan", str(cfg), "--json"],
        "lag --json": ["lag", str(cfg), "--json"], "verify --json": ["verify", str(cfg), "--json"],
        "plan (no such group)": ["plan", str(cfg), "--group", "no-such-group"],
        "preflight": step("preflight"), "sync": step("sync"), "finalize": step("finalize"),
    }
    outputs = {}
    for name, args in commands.items():
        res = mirrorflow(*args)
        outputs[name] = res
        assert PASSWORD not in res.stdout + res.stderr, (args, res.stdout[-3000:], res.stderr[-3000:])
    # an error about a cluster that cannot be reached names it, and nothing secret
    down = tmp_path / "down.yaml"
    down.write_text(cfg.read_text().replace(f'"{clusters.dst_bootstrap}"', '"127.0.0.1:1"'))
    res = mirrorflow("lag", str(down), MIRRORFLOW_CONNECT_TIMEOUT="2")
    assert res.returncode == 1 and "127.0.0.1:1" in res.stdout + res.stderr, res.stderr[-3000:]
    assert PASSWORD not in res.stdout + res.stderr, res.stderr[-3000:]
    # the commands did talk to the registries through those URLs (the credentials were usable)
    for name in ("provision", "run", "verify", "preflight", "sync", "finalize"):
        assert outputs[name].returncode == 0, (name, outputs[name].stdout[-3000:], outputs[name].stderr[-3000:])
    assert " DEBUG mirrorflow.stream " in outputs["run"].stderr  # -v reached the Spark job: its debug lines were read
    # the failover steps did their work: finalize synced the group's offsets again (resync) and stopped the stream
    reports = {name: json.loads(outputs[name].stdout) for name in ("preflight", "sync", "finalize")}
    assert all(r["ok"] for r in reports.values()), reports
    assert reports["finalize"]["details"]["resync"]["ok"] and reports["finalize"]["details"]["stop"]
    # and no request log line reached the output by default, even with -v
    assert "HTTP Request" not in "".join(r.stderr for r in outputs.values())
