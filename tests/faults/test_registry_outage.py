"""The source schema registry hangs for 60 s while records with a schema id the mirror has not cached
yet arrive: they wait for it (up to ``outage_deadline``), nothing is dead-lettered, nothing is lost.
This test's own clusters and registries, started and stopped here."""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import local
from mirror_core.registry import RegistryClient
from mirror_core.topics import create_topics
from tests.faults.harness import MirrorJob, Progress, RecordStream, figures, read_keys, wait_for_count, wait_for_keys

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 2
V1 = {"type": "record", "name": "R", "namespace": "outage", "fields": [{"name": "n", "type": "long"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "t", "type": "string", "default": ""}]}


@pytest.fixture
def own_clusters(tmp_path: Path) -> Iterator[tuple[local.LocalEnv, local.ClusterSpec]]:
    env = local.LocalEnv.from_environment(tmp_path / "clusters")
    spec = local.free_spec(registries=True)
    try:
        local.up(env, spec, progress=lambda m: print(f"[faults] {m}", flush=True))
        yield env, spec
    finally:
        local.pause_registry(env, "src", paused=False)
        local.down(env)


def framed(schema_id: int, i: int) -> bytes:
    # an Avro long is a zig-zag varint; the payload's bytes do not matter to the mirror, its framing does
    n, out = (i << 1) ^ (i >> 63), bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return b"\x00" + struct.pack(">I", schema_id) + bytes(out)


def test_source_registry_hangs_60s_while_new_schema_ids_arrive(own_clusters, tmp_path, unique):
    env, spec = own_clusters
    src, dst = spec.sides
    topic = unique("regdown")
    admin = AdminClient({"bootstrap.servers": src.bootstrap})
    create_topics(admin, [NewTopic(topic, PARTITIONS, 1)])
    with RegistryClient(str(src.registry_url)) as reg:
        v1 = reg.register(f"{topic}-value", json.dumps(V1))
        cfg = tmp_path / "mirror.yaml"
        cfg.write_text(f"""clusters:
  src:
    kafka: {{bootstrap.servers: "{src.bootstrap}"}}
    schema_registry: {{url: "{src.registry_url}", timeout: 3s, retries: 1, breaker_reset: 5s, outage_deadline: 240s}}
  dst:
    kafka: {{bootstrap.servers: "{dst.bootstrap}"}}
    schema_registry: {{url: "{dst.registry_url}"}}
groups:
  - name: regdown
    source: src
    destination: dst
    delivery: exactly_once
    serdes: {{key: bytes, value: avro}}
    dead_letter_topic: "{topic}.dlq"
    heartbeats: {{enabled: false}}
    offsets: {{sync_group_offsets: false, emit_checkpoints: false}}
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    spark: {{master: "local[2]", trigger: "1 second", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
""")
        stream = RecordStream(src.bootstrap, topic, PARTITIONS, rate=100, value=lambda i: framed(v1, i))
        job = MirrorJob(cfg, "regdown", tmp_path / "job.log")
        progress = Progress(dst.bootstrap, f"{topic}.mirror")
        try:
            stream.start()
            wait_for_count(dst.bootstrap, f"{topic}.mirror", 200, job, timeout=300)
            v2 = reg.register(f"{topic}-value", json.dumps(V2))  # a new id the mirror has not seen
            progress.start()
            local.pause_registry(env, "src")
            t_down = time.monotonic()
            first_v2 = stream.next
            stream.value = lambda i: framed(v2, i)
            time.sleep(60)  # the outage
            assert job.alive(), "the mirror job exited during the registry outage:\n" + job.tail()
            local.pause_registry(env, "src", paused=False)
            t_up = time.monotonic()
            time.sleep(10)
            stream.stop()
            mirrored = wait_for_keys(src.bootstrap, topic, dst.bootstrap, f"{topic}.mirror", stream.acked, job,
                                      timeout=300)
            progress.stop()
            fig = figures("source registry hung 60 s, new schema id (exactly_once)", stream.acked, mirrored,
                          progress.stall_after(t_down))
            print(f"  {stream.next - first_v2} records produced with the new id; mirror resumed "
                  f"{progress.stall_after(t_up):.1f}s after the registry was back", flush=True)
            assert fig["lost"] == 0 and fig["duplicated"] == 0
            md = AdminClient({"bootstrap.servers": dst.bootstrap}).list_topics(timeout=10).topics
            dlq = read_keys(dst.bootstrap, f"{topic}.dlq") if f"{topic}.dlq" in md else []
            assert dlq == []  # waited, not dead-lettered
            assert "waiting up to 240s" in job.log.read_text()  # it did hit the outage
        finally:
            progress.stop()
            job.stop()
