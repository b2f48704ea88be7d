"""An imported viooh-mirror config takes over where viooh stopped: positions seeded from viooh's consumer
group (`python -m mirror_core.handover`), then `mirrorflow run --once` copies only what viooh had not,
and the group's checkpoint translates its source position to the destination."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core.offsets import Checkpoint
from mirror_core.topics import create_topics

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _run(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    p = subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p


def _values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-" + uuid.uuid4().hex[:6],
                  "enable.partition.eof": True, "isolation.level": "read_committed"})
    out: list[bytes] = []
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        while True:
            m = c.poll(10)
            assert m is not None, "read timed out"
            if m.error():
                return out
            out.append(m.value())
    finally:
        c.close()


def _checkpoints(bootstrap: str, topic: str) -> list[Checkpoint]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "probe-" + uuid.uuid4().hex[:6],
                  "enable.partition.eof": True})
    try:
        parts = list(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, p, 0) for p in parts])
        done: set[int] = set()
        out = []
        while len(done) < len(parts):
            m = c.poll(10)
            assert m is not None, "checkpoints read timed out"
            if m.error():
                done.add(m.partition())
            else:
                out.append(Checkpoint.from_record(m.key(), m.value()))
        return out
    finally:
        c.close()


def test_viooh_handover_copies_only_what_viooh_had_not(clusters, unique, tmp_path):
    src_topic, dst_topic = unique("vsrc"), unique("vdst")
    prefix = "ho" + uuid.uuid4().hex[:6]
    viooh_group = f"local.viooh-mirror.{prefix}__{src_topic}__{dst_topic}"
    for bootstrap, topic in ((clusters.src_bootstrap, src_topic), (clusters.dst_bootstrap, dst_topic)):
        admin = AdminClient({"bootstrap.servers": bootstrap})
        create_topics(admin, [NewTopic(topic, 2, 1)])
    src = Producer({"bootstrap.servers": clusters.src_bootstrap})
    dst = Producer({"bootstrap.servers": clusters.dst_bootstrap})
    for p in (0, 1):
        for i in range(50):
            src.produce(src_topic, key=f"k{i}".encode(), value=f"p{p}-{i}".encode(), partition=p)
        for i in range(30):  # what viooh copied before it stopped (into the other partition: it re-hashed keys)
            dst.produce(dst_topic, key=f"k{i}".encode(), value=f"p{p}-{i}".encode(), partition=1 - p)
    assert src.flush(30) == 0 and dst.flush(30) == 0
    c = Consumer({"bootstrap.servers": clusters.src_bootstrap, "group.id": viooh_group})
    c.commit(offsets=[TopicPartition(src_topic, 0, 30), TopicPartition(src_topic, 1, 30)], asynchronous=False)
    c.close()

    edn = tmp_path / "viooh.edn"
    edn.write_text(f"""{{:groups [{{:group-id-prefix "{prefix}"
  :source {{:kafka {{:bootstrap.servers "{clusters.src_bootstrap}"}}}}
  :destination {{:kafka {{:bootstrap.servers "{clusters.dst_bootstrap}"}}}}
  :mirrors [{{:source {{:topic {{:topic-name "{src_topic}"}}}}
             :destination {{:topic {{:topic-name "{dst_topic}"}}}}
             :serdes [:string :string]}}]}}]
 :topics-mirroring {{:replication-factor {{:type :fix :value 1}}}}}}""")
    cfg = tmp_path / "mirrors.yaml"
    _run("-m", "mirror_core.cli", "import", "viooh", str(edn), "-o", str(cfg), cwd=tmp_path)
    assert viooh_group in cfg.read_text()
    _run("-m", "mirror_core.cli", "provision", str(cfg), cwd=tmp_path)
    dry = _run("-m", "mirror_core.handover", str(cfg), "--group", prefix, "--dry-run", cwd=tmp_path)
    assert f"would seed {src_topic}[0] at source offset 30 -> destination partition 0 offset 30" in dry.stdout
    out = _run("-m", "mirror_core.handover", str(cfg), "--group", prefix, cwd=tmp_path)
    assert out.stdout.count("seeded") == 2, out.stdout
    again = _run("-m", "mirror_core.handover", str(cfg), "--group", prefix, cwd=tmp_path)
    assert again.stdout.count("mirrorflow already has a position") == 2  # never seeded twice

    _run("-m", "mirror_core.cli", "run", str(cfg), "--group", prefix, "--once", cwd=tmp_path, timeout=480)
    for p in (0, 1):
        got = _values(clusters.dst_bootstrap, dst_topic, p)
        viooh_part = [f"p{1 - p}-{i}".encode() for i in range(30)]
        mirrored = [f"p{p}-{i}".encode() for i in range(30, 50)]
        assert got == viooh_part + mirrored  # nothing copied twice, the rest in order after viooh's
    # viooh's group, now the mirror's, translates exactly from the seeded position on:
    # source 50 -> destination 50 on each partition (30 of viooh's + 20 mirrored)
    _run("-m", "mirror_core.cli", "checkpoint", str(cfg), "--group", prefix, cwd=tmp_path)
    alias = yaml.safe_load(cfg.read_text())["groups"][0]["source"]
    cps = {(cp.topic, cp.partition): (cp.upstream_offset, cp.downstream_offset)
           for cp in _checkpoints(clusters.dst_bootstrap, f"{alias}.checkpoints.internal") if cp.group == viooh_group}
    assert cps == {(dst_topic, 0): (50, 50), (dst_topic, 1): (50, 50)}
