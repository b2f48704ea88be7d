"""The embedded clusters are real: records and schemas round-trip on both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError

from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration

AVRO_V1 = json.dumps({"type": "record", "name": "Order", "namespace": "t", "fields": [{"name": "id", "type": "long"}]})
AVRO_V2 = json.dumps({
    "type": "record", "name": "Order", "namespace": "t",
    "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}],
})


@pytest.mark.parametrize("side", ["src", "dst"])
def test_record_round_trip(clusters, unique, side):
    bootstrap = clusters.src_bootstrap if side == "src" else clusters.dst_bootstrap
    topic = unique("roundtrip")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 1)])
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    ts = int(time.time() * 1000)  # a days-old timestamp is deleted by the broker's retention check
    p.produce(topic, key=b"k", value=b"v", partition=1, headers=[("h", b"1")], timestamp=ts)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    try:
        msg = None
        for _ in range(60):
            msg = c.poll(1.0)
            if msg is not None and not msg.error():
                break
        assert msg is not None and msg.error() is None
        assert (msg.key(), msg.value(), msg.partition(), msg.headers(), msg.timestamp()[1]) == (
            b"k", b"v", 1, [("h", b"1")], ts,
        )
    finally:
        c.close()


@pytest.mark.parametrize("side", ["src", "dst"])
def test_schema_register_lookup_compatibility(clusters, unique, side):
    url = clusters.src_registry if side == "src" else clusters.dst_registry
    sr = SchemaRegistryClient({"url": url})
    subject = unique("orders") + "-value"
    id1 = sr.register_schema(subject, Schema(AVRO_V1, "AVRO"))
    id2 = sr.register_schema(subject, Schema(AVRO_V2, "AVRO"))
    assert id1 != id2
    assert sr.get_versions(subject) == [1, 2]
    assert sr.lookup_schema(subject, Schema(AVRO_V1, "AVRO")).schema_id == id1
    assert json.loads(sr.get_schema(id2).schema_str)["fields"][1]["name"] == "note"
    sr.set_compatibility(subject, "FULL")
    assert sr.get_compatibility(subject) == "FULL"
    assert sr.get_compatibility() == "BACKWARD"  # set by `local up`, as a fresh Confluent registry
    with pytest.raises(SchemaRegistryError) as exc:
        sr.get_version(unique("missing") + "-value", 1)
    assert exc.value.error_code == 40401


def test_cli_up_status_down_leaves_nothing_behind(tmp_path: Path):
    """`local up` on free ports, `status --json`, `down`: every recorded pid is gone afterwards."""
    state = tmp_path / "state"
    cli = [sys.executable, "-m", "mirror_core.cli", "local"]
    env = dict(os.environ)
    up = subprocess.run(cli + ["up", "--free-ports", "--state-dir", str(state)], capture_output=True, text=True,
                        timeout=300, env=env)
    assert up.returncode == 0, up.stderr[-3000:]
    assert "local clusters up in" in up.stdout
    try:
        st = subprocess.run(cli + ["status", "--json", "--state-dir", str(state)], capture_output=True, text=True,
                            timeout=60)
        status = json.loads(st.stdout)
        assert status["running"] is True
        assert set(status["sides"]) == {"src", "dst"}
        pids = []
        for side in status["sides"].values():
            assert [b["state"] for b in side["brokers"]] == ["running"]
            assert side["registry"]["state"] == "running"
            assert side["registry"]["url"].endswith("/apis/ccompat/v7")
            pids += [b["pid"] for b in side["brokers"]] + [side["registry"]["pid"]]
    finally:
        down = subprocess.run(cli + ["down", "--state-dir", str(state)], capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stderr
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    st2 = subprocess.run(cli + ["status", "--json", "--state-dir", str(state)], capture_output=True, text=True)
    assert json.loads(st2.stdout)["running"] is False


def test_up_refuses_taken_port(tmp_path: Path, clusters):
    """A port already in use is a clear error (exit 2) naming the port, not a Java stack trace."""
    if clusters.external:
        pytest.skip("needs the session's own clusters")
    from mirror_core import local
    from mirror_core.errors import PrerequisiteError

    taken = int(clusters.src_bootstrap.split(",")[0].rsplit(":", 1)[1])
    spec = local.ClusterSpec((local.SideSpec("src", taken, 1, None, None),))
    with pytest.raises(PrerequisiteError, match=f"src broker 1 port {taken}"):
        local.up(local.LocalEnv.from_environment(tmp_path / "st"), spec)
