"""Checkpoints, group offset sync, lag and parity on real clusters.

The mirroring itself is done by the partition writer directly (no Spark), in exactly-once mode and in
uneven chunks, which is what the Spark job does per micro-batch.
"""

from __future__ import annotations

import json
import random
import time

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from mirror_core import clients, replicate
from mirror_core.cli import app
from mirror_core.config import parse_config
from mirror_core.offsets import Checkpoint
from mirror_core.provision import provision_group
from mirror_core.replicate import PartitionWriter, SchemaIdTranslator, WriterSettings, last_committed_position
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration

#: record timestamps an hour before the session: inside the topics' retention (days-old timestamps are
#: deleted by the brokers' retention check, which runs every 5 minutes)
RECENT_MS = int(time.time() * 1000) - 3_600_000


def make_config(clusters, tmp_path, name, topic, group_include, config_exclude="[]"):
    text = clusters.config_yaml(f"""
groups:
  - name: {name}
    source: src
    destination: dst
    delivery: exactly_once
    offset_syncs_topic: "{name}.syncs.internal"
    offsets: {{groups: {{include: "{group_include}"}}}}
    heartbeats: {{enabled: false}}
    topics_mirroring:
      replication_factor: {{type: fix, value: 1}}
      config_exclude: {config_exclude}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    cfg = parse_config(yaml.safe_load(text), env={})
    res = provision_group(cfg, cfg.groups[0])
    assert not res.errors, res.errors
    return path, cfg


def mirror_now(cfg, topic, partitions, seed=1, tamper_offset=None):
    """Mirror everything committed on the source, in random chunks, with the exactly-once writer."""
    g = cfg.groups[0]
    src, dst = cfg.cluster("src"), cfg.cluster("dst")
    settings = WriterSettings(
        group=g.name, mirror=f"{g.name}__{topic}", source_alias="src", destination_alias="dst", source_topic=topic,
        destination_topic=f"{topic}.m", source_partitions=partitions, destination_partitions=partitions,
        delivery="exactly_once", key_serde="bytes", value_serde="bytes", on_error="dead_letter",
        dlq_topic=g.dlq_topic, offset_syncs_topic=g.offset_syncs, provenance=False,
        producer_config=clients.kafka_config(dst),
    )
    cc = clients.kafka_config(dst)
    writer = PartitionWriter(settings, SchemaIdTranslator({}),
                             lambda t, p: last_committed_position(cc, g.offset_syncs, t, p))
    rnd = random.Random(seed)
    snapshot = {}
    for p, (low, high) in clients.end_offsets(src, topic).items():
        records = [replicate.SourceRecord(topic, p, m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                          m.timestamp()[1])
                   for m in clients.read_partition(src, topic, p, low, high)]
        if tamper_offset is not None and p == 0:
            records = [r if r.offset != tamper_offset else replicate.SourceRecord(
                r.topic, r.partition, r.offset, r.key, b"tampered", r.headers, r.timestamp_ms) for r in records]
        snapshot[p] = [(r.offset, r.key) for r in records]
        i = 0
        last = None
        while i < len(records):
            n = rnd.randint(1, 3000)
            chunk = records[i:i + n]
            res = writer.write(p, chunk, None)
            last = res.last_downstream if res.last_downstream is not None else last
            i += n
        if records and high > records[-1].offset + 1 and last is not None:
            writer.advance(p, high, last)
    return snapshot


def produce(bootstrap, topic, partitions, per_partition, start=0, timestamp_ms=None):
    """``per_partition`` records to each partition, timestamped ``RECENT_MS + i`` (all ``timestamp_ms`` if given)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 10})
    for i in range(start, start + per_partition):
        for part in range(partitions):
            while True:
                try:
                    p.produce(topic, key=f"{part}:{i}".encode(), value=f"v{i}".encode(), partition=part,
                              timestamp=RECENT_MS + i if timestamp_ms is None else timestamp_ms)
                    break
                except BufferError:
                    p.poll(0.05)
    assert p.flush(60) == 0


def aborted_transaction(bootstrap, topic, partitions, txid):
    tp = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid})
    tp.init_transactions(30)
    tp.begin_transaction()
    for part in range(partitions):
        for _ in range(5):
            tp.produce(topic, key=b"aborted", value=b"x", partition=part)
    tp.flush(30)
    tp.abort_transaction(30)


def commit_source_group(bootstrap, group, topic, offsets):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    c.close()


def source_keys_from(bootstrap, topic, p, start):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r-{time.time_ns()}", "isolation.level":
                  "read_committed", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, start)])
    keys = []
    while True:
        m = c.poll(5)
        assert m is not None, "source read stalled"
        if m.error():
            break
        keys.append(m.key())
    c.close()
    return keys


def resume_on_destination(bootstrap, group, topic, partitions):
    """What a consumer of ``group`` reads on the destination from its synced offsets to the end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                  "auto.offset.reset": "latest", "enable.auto.commit": False, "enable.partition.eof": True})
    c.subscribe([topic])
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    eof: set[int] = set()
    deadline = time.monotonic() + 120
    while len(eof) < partitions and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is None:
            continue
        if m.error():
            eof.add(m.partition())
            continue
        out[m.partition()].append(m.key())
    c.close()
    assert len(eof) == partitions
    return out


def test_groups_resume_exactly_on_destination_and_lag(clusters, unique, tmp_path):
    topic = unique("cp")
    name = unique("og")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 3, 1)])
    produce(clusters.src_bootstrap, topic, 3, 6000)
    aborted_transaction(clusters.src_bootstrap, topic, 3, unique("tx"))  # upstream gaps
    produce(clusters.src_bootstrap, topic, 3, 6000, start=6000)
    path, cfg = make_config(clusters, tmp_path, name, topic, f"{name}-.*")
    mirror_now(cfg, topic, 3)

    ends = {p: hi for p, (_, hi) in clients.end_offsets(cfg.cluster("src"), topic).items()}
    groups = {
        f"{name}-partial": {p: ends[p] * 2 // 5 + p for p in range(3)},
        f"{name}-far-behind": {p: 100 + p for p in range(3)},  # > 10,000 records behind the head
        f"{name}-in-gap": {p: 6001 + p for p in range(3)},  # inside the aborted transaction's offsets
        f"{name}-done": dict(ends),
    }
    for g, offs in groups.items():
        commit_source_group(clusters.src_bootstrap, g, topic, offs)
    res = CliRunner().invoke(app, ["checkpoint", str(path)])
    assert res.exit_code == 0, res.output
    for g in groups:
        assert g in res.stdout

    for g, offs in groups.items():
        got = resume_on_destination(clusters.dst_bootstrap, g, f"{topic}.m", 3)
        for p in range(3):
            want = source_keys_from(clusters.src_bootstrap, topic, p, offs[p])
            assert got[p] == want, f"{g} partition {p}: {len(got[p])} read vs {len(want)} expected"
    assert ends[0] - groups[f"{name}-far-behind"][0] > 10_000

    # a second round writes no new checkpoints and does not move anything
    dst, cp_topic = cfg.cluster("dst"), cfg.groups[0].checkpoints_topic
    cp_end = {p: hi for p, (_, hi) in clients.end_offsets(dst, cp_topic).items()}
    positions = {g: destination_offsets(clusters.dst_bootstrap, g, f"{topic}.m", 3) for g in groups}
    assert all(None not in offs.values() for offs in positions.values()), positions
    res2 = CliRunner().invoke(app, ["checkpoint", str(path)])
    assert res2.exit_code == 0, res2.output
    again = [Checkpoint.from_record(m.key(), m.value())
             for p, (_, hi) in clients.end_offsets(dst, cp_topic).items()
             for m in clients.read_partition(dst, cp_topic, p, cp_end.get(p, 0), hi)]
    assert [c for c in again if c.group in groups] == []  # the topic is shared: only ours count
    assert {g: destination_offsets(clusters.dst_bootstrap, g, f"{topic}.m", 3) for g in groups} == positions

    lag = json.loads(CliRunner().invoke(app, ["lag", str(path), "--json"]).stdout)[0]
    assert [p["lag_records"] for p in lag["partitions"]] == [0, 0, 0]
    # caught up, heartbeats off: 0 s (with heartbeats, the newest mirrored heartbeat's age)
    assert [p["lag_seconds"] for p in lag["partitions"]] == [0.0, 0.0, 0.0]
    assert lag["totals"][f"group {name}"] == {"lag_records": 0, "max_lag_seconds": 0.0}
    # the mirror is "stopped" and records written 120 s ago wait: the lag in seconds is the oldest one's age,
    # what the failover's lag step compares with max_lag_seconds
    produce(clusters.src_bootstrap, topic, 3, 250, start=20_000, timestamp_ms=int(time.time() * 1000) - 120_000)
    lag = json.loads(CliRunner().invoke(app, ["lag", str(path), "--json"]).stdout)[0]
    assert [p["lag_records"] for p in lag["partitions"]] == [250, 250, 250]
    assert all(p["lag_seconds"] is not None and 115 < p["lag_seconds"] < 180 for p in lag["partitions"]), lag
    assert 115 < lag["totals"][f"group {name}"]["max_lag_seconds"] < 180
    cg = {(x["consumer_group"], x["partition"]): x for x in lag["consumer_groups"]}
    assert cg[(f"{name}-done", 0)]["lag_records"] == 0

    res = CliRunner().invoke(app, ["verify", str(path)])
    assert res.exit_code == 0, res.output


def destination_offsets(bootstrap, group, topic, partitions):
    """{partition: committed offset or None} of ``group`` on the destination."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}
    finally:
        c.close()


def test_verify_pinpoints_a_tampered_record(clusters, unique, tmp_path):
    topic = unique("vt")
    name = unique("vg")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 2, 1)])
    produce(clusters.src_bootstrap, topic, 2, 500)
    path, cfg = make_config(clusters, tmp_path, name, topic, "none")
    mirror_now(cfg, topic, 2, tamper_offset=321)
    res = CliRunner().invoke(app, ["verify", str(path), "--json"])
    assert res.exit_code == 1
    rows = {r["partition"]: r for r in json.loads(res.stdout)}
    assert rows[0]["ok"] is False and rows[0]["first_mismatch_offset"] == 321
    assert rows[1]["ok"] is True and rows[1]["source_count"] == 500


def test_compacted_source_with_gaps(clusters, unique, tmp_path):
    """Compaction leaves offset gaps upstream: resumed groups see 0 gaps, re-reads bounded by one batch."""
    topic = unique("cmp")
    name = unique("cg")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 1, 1, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
        "delete.retention.ms": "0", "min.compaction.lag.ms": "0"})])
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    deadline = time.monotonic() + 120
    rnd = random.Random(3)
    compacted = False
    i = 0
    while not compacted:
        assert time.monotonic() < deadline, "the broker did not compact the topic in time"
        for _ in range(200):
            p.produce(topic, key=f"k{rnd.randint(0, 40)}".encode(), value=f"v{i}".encode(), partition=0)
            i += 1
        p.flush(10)
        low, high = clients.end_offsets(clients_cluster(clusters), topic)[0]
        n = sum(1 for _ in clients.read_partition(clients_cluster(clusters), topic, 0, low, high))
        compacted = n < high - low
        time.sleep(0.2)  # segments roll on time (segment.ms) only when new records arrive
    # the destination keeps cleanup.policy=compact but not the test's aggressive cleaner settings, so the
    # comparison below is against what the source held when it was mirrored
    path, cfg = make_config(clusters, tmp_path, name, topic, f"{name}-.*", config_exclude=(
        '["segment\\\\.ms", "min\\\\.cleanable\\\\.dirty\\\\.ratio", "delete\\\\.retention\\\\.ms"]'))
    snapshot = mirror_now(cfg, topic, 1)[0]
    present = [o for o, _ in snapshot]
    gaps = [a + 1 for a, b in zip(present, present[1:], strict=False) if b - a > 1]  # first missing offsets
    assert gaps, "expected compaction gaps"
    groups = {f"{name}-g{k}": off for k, off in enumerate(gaps[:5] + [present[len(present) // 2]])}
    for g, off in groups.items():
        commit_source_group(clusters.src_bootstrap, g, topic, {0: off})
    res = CliRunner().invoke(app, ["checkpoint", str(path)])
    assert res.exit_code == 0, res.output
    for g, off in groups.items():
        got = resume_on_destination(clusters.dst_bootstrap, g, f"{topic}.m", 1)[0]
        want = [k for o, k in snapshot if o >= off]
        assert got[-len(want):] == want  # nothing skipped
        assert len(got) - len(want) <= 3000  # re-reads bounded by one batch (here: none)
        assert len(got) == len(want)


def clients_cluster(clusters):
    from mirror_core.config import ClusterConfig

    return ClusterConfig(kafka={"bootstrap.servers": clusters.src_bootstrap})


def test_group_offset_sync_respects_active_members_and_never_moves_back(clusters, unique, tmp_path):
    topic = unique("gs")
    name = unique("gsg")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 1, 1)])
    produce(clusters.src_bootstrap, topic, 1, 300)
    path, cfg = make_config(clusters, tmp_path, name, topic, f"{name}-.*")
    mirror_now(cfg, topic, 1)
    active, ahead = f"{name}-active", f"{name}-ahead"
    commit_source_group(clusters.src_bootstrap, active, topic, {0: 100})
    commit_source_group(clusters.src_bootstrap, ahead, topic, {0: 100})
    # on the destination, `ahead` already sits further than the translation; `active` has a live member
    commit_source_group(clusters.dst_bootstrap, ahead, f"{topic}.m", {0: 250})
    member = Consumer({"bootstrap.servers": clusters.dst_bootstrap, "group.id": active})
    member.subscribe([f"{topic}.m"])
    deadline = time.monotonic() + 60
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.5)
    try:
        res = CliRunner().invoke(app, ["checkpoint", str(path)])
        assert res.exit_code == 0, res.output
        assert "active member" in res.stdout and "is ahead of 100" in res.stdout
    finally:
        member.close()

    def dst_offset(g):
        c = Consumer({"bootstrap.servers": clusters.dst_bootstrap, "group.id": g})
        off = c.committed([TopicPartition(f"{topic}.m", 0)], timeout=10)[0].offset
        c.close()
        return off

    assert dst_offset(ahead) == 250
    res = CliRunner().invoke(app, ["checkpoint", str(path), "--force"])
    assert res.exit_code == 0, res.output
    assert dst_offset(ahead) == 100 and dst_offset(active) == 100  # the member left; exact translation


def test_heartbeats_are_mm2_records_on_the_source(clusters, unique, tmp_path):
    from mirror_core.checkpoint import emit_heartbeat
    from mirror_core.offsets import Heartbeat

    topic = unique("hb")
    name = unique("hbg")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 1, 1)])
    _, cfg = make_config(clusters, tmp_path, name, topic, "none")
    g = cfg.groups[0].model_copy(update={"heartbeats": cfg.groups[0].heartbeats.model_copy(
        update={"enabled": True, "topic": unique("heartbeats")})})
    before = time.time() * 1000
    assert emit_heartbeat(cfg, g) and emit_heartbeat(cfg, g)
    recs = list(clients.read_topic(cfg.cluster("src"), g.heartbeats.topic))
    hbs = [Heartbeat.from_record(m.key(), m.value()) for m in recs]
    assert len(hbs) == 2 and all((h.source_cluster_alias, h.target_cluster_alias) == ("src", "dst") for h in hbs)
    assert all(h.timestamp_ms >= before - 1000 for h in hbs)
