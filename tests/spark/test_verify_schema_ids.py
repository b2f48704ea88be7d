"""Item 13 of issue 11: `verify` neutralises every registry-local schema reference, not only the value's."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from io import BytesIO
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from fastavro import parse_schema, schemaless_writer

from mirror_core.topics import create_topics

pytestmark = [pytest.mark.spark, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
KEY = {"type": "record", "name": "K", "namespace": "item13", "fields": [{"name": "id", "type": "long"}]}
VALUE = {"type": "record", "name": "V", "namespace": "item13", "fields": [{"name": "n", "type": "string"}]}


def avro(schema: dict, rec: dict) -> bytes:
    buf = BytesIO()
    schemaless_writer(buf, parse_schema(schema), rec)
    return buf.getvalue()


def mirrorflow(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=os.environ.copy())


def first_record(bootstrap: str, topic: str):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"item13-{os.getpid()}", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        for _ in range(30):
            m = c.poll(1.0)
            if m is not None and not m.error():
                return m
        raise AssertionError(f"no record in {topic}")
    finally:
        c.close()


def test_item13_verify_ok_with_avro_keys_and_header_ids(clusters, unique, tmp_path):
    topic = unique("item13")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 1)])
    sr = SchemaRegistryClient({"url": clusters.src_registry})
    key_id = sr.register_schema(f"{topic}-key", Schema(json.dumps(KEY), "AVRO"))
    value_id = sr.register_schema(f"{topic}-value", Schema(json.dumps(VALUE), "AVRO"))
    # the destination registry hands out its own ids; make sure they cannot coincide with the source's: new
    # schemas there (each its own content: a registry hands a schema it has seen its old id) until its next id is
    # past both source ids, whatever ran before on these registries
    dst_sr = SchemaRegistryClient({"url": clusters.dst_registry})
    for _ in range(5000):
        pad = Schema(json.dumps({**VALUE, "name": unique("Pad").replace("-", "_")}), "AVRO")
        if dst_sr.register_schema(unique("item13-pad"), pad) > max(key_id, value_id):
            break
    else:
        raise AssertionError(f"the destination registry's ids did not pass {max(key_id, value_id)}")

    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for i in range(40):
        key = b"\x00" + struct.pack(">I", key_id) + avro(KEY, {"id": i})
        body = avro(VALUE, {"n": f"v{i}"})
        if i % 2:  # the id in a header (the Confluent clients' header serializer), payload unframed
            p.produce(topic, body, key, partition=i % 2,
                      headers=[("__value_schema_id", b"\x00" + struct.pack(">I", value_id)), ("app", b"x")])
        else:
            p.produce(topic, b"\x00" + struct.pack(">I", value_id) + body, key, partition=i % 2)
    assert p.flush(30) == 0

    group = unique("g13").replace("-", "_")
    cfg = tmp_path / "m.yaml"
    cfg.write_text(clusters.config_yaml(f"""
groups:
  - name: {group}
    source: src
    destination: dst
    serdes: {{key: avro, value: avro}}
    offset_syncs_topic: "{topic}.syncs.internal"
    dead_letter_topic: "{topic}.dlq"
    topics_mirroring:
      replication_factor: {{type: fix, value: 1}}
    spark: {{master: "local[2]", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
"""))
    res = mirrorflow("run", str(cfg), "--group", group, "--once")
    assert res.returncode == 0, res.stderr[-3000:]

    # precondition: the mirror really rewrote the key's and the header's ids (else this proves nothing)
    m = first_record(clusters.dst_bootstrap, f"{topic}.mirror")
    assert m.key()[1:5] != struct.pack(">I", key_id)

    res = mirrorflow("verify", str(cfg), "--json")
    rows = json.loads(res.stdout)
    assert res.returncode == 0, res.stdout[-3000:]
    assert len(rows) == 2 and all(r["ok"] for r in rows), rows
    assert sum(r["source_count"] for r in rows) == 40 and sum(r["destination_count"] for r in rows) == 40
