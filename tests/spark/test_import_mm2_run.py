"""Acceptance: an imported MirrorMaker 2 config mirrors a topic end to end (`mirrorflow run --once`), and
its consumer group's checkpoints land in `<source-alias>.checkpoints.internal`, the topic MM2 used."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core.offsets import Checkpoint
from mirror_core.topics import create_topics

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _cli(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)


def _ends(bootstrap: str, topic: str, partitions: int) -> list[int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-" + uuid.uuid4().hex[:6]})
    try:
        return [c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)]
    finally:
        c.close()


def _read_all(bootstrap: str, topic: str) -> list[Checkpoint]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-" + uuid.uuid4().hex[:6],
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    try:
        md = c.list_topics(topic, timeout=30).topics[topic]
        assert md.error is None, md.error
        parts = [TopicPartition(topic, p, 0) for p in md.partitions]
        c.assign(parts)
        ends = {p.partition: c.get_watermark_offsets(p, timeout=30)[1] for p in parts}
        done = {p for p, e in ends.items() if e == 0}
        out = []
        while len(done) < len(ends):
            m = c.poll(10)
            assert m is not None, "checkpoints topic read timed out"
            if m.error():
                done.add(m.partition())
                continue
            out.append(Checkpoint.from_record(m.key(), m.value()))
        return out
    finally:
        c.close()


def test_imported_mm2_config_mirrors_and_checkpoints_where_mm2_did(clusters, unique, tmp_path):
    west, east = f"west-{uuid.uuid4().hex[:6]}", f"east-{uuid.uuid4().hex[:6]}"
    topic, app = unique("imported"), unique("app")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 1)])
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for i in range(200):
        p.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), partition=i % 2)
    assert p.flush(30) == 0
    # a consumer group of the application, part-way through the topic
    c = Consumer({"bootstrap.servers": clusters.src_bootstrap, "group.id": app})
    c.commit(offsets=[TopicPartition(topic, 0, 40), TopicPartition(topic, 1, 60)], asynchronous=False)
    c.close()

    props = tmp_path / "mm2.properties"
    props.write_text(f"""clusters = {west}, {east}
{west}.bootstrap.servers = {clusters.src_bootstrap}
{east}.bootstrap.servers = {clusters.dst_bootstrap}
{west}->{east}.enabled = true
{west}->{east}.topics = {topic}
groups = {app}
sync.group.offsets.enabled = true
replication.factor = 1
emit.heartbeats.enabled = false
""")
    cfg = tmp_path / "mirrors.yaml"
    res = _cli("import", "mm2", str(props), "-o", str(cfg), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    group = f"{west}-to-{east}"
    # run from tmp_path: the imported spark.checkpoint_dir (.state/checkpoints) lands there
    res = _cli("run", str(cfg), "--group", group, "--once", cwd=tmp_path, timeout=480)
    assert res.returncode == 0, res.stderr[-4000:]

    remote = f"{west}.{topic}"  # MM2's default policy, kept by the import
    assert _ends(clusters.dst_bootstrap, remote, 2) == _ends(clusters.src_bootstrap, topic, 2) == [100, 100]

    res = _cli("checkpoint", str(cfg), "--group", group, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    cps = {(cp.topic, cp.partition): cp for cp in _read_all(clusters.dst_bootstrap, f"{west}.checkpoints.internal")
           if cp.group == app}
    assert {k: (v.upstream_offset, v.downstream_offset) for k, v in cps.items()} == {
        (remote, 0): (40, 40), (remote, 1): (60, 60)}
    # sync.group.offsets.enabled = true: the group can resume on the destination where it stopped
    dc = Consumer({"bootstrap.servers": clusters.dst_bootstrap, "group.id": app})
    committed = dc.committed([TopicPartition(remote, 0), TopicPartition(remote, 1)], timeout=30)
    dc.close()
    assert [tp.offset for tp in committed] == [40, 60]
