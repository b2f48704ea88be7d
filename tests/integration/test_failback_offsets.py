"""A failback's consumer groups on real clusters: positions among the copies the failover's flow made go to
their originals, not past them.

Both flows are written by the partition writer directly (no Spark), exactly once, in uneven chunks, as the
Spark job does per micro-batch, with the loop guard on (identity naming). The failover's flow copied the
source's records to the destination (with commit markers among them there); after the failover the destination
got records of its own; the failback's flow then skips the copies (their provenance names its destination) and
mirrors only those. A consumer group still among the copies on the destination goes, by the failback's sync step,
to where their originals are on the source.
"""

from __future__ import annotations

import random

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import clients, failover, replicate
from mirror_core.config import parse_config
from mirror_core.provision import provision_group
from mirror_core.replicate import PartitionWriter, SchemaIdTranslator, WriterSettings, last_committed_position
from mirror_core.topics import create_topics
from tests.integration.test_offsets_real import commit_source_group, produce

pytestmark = pytest.mark.integration

PARTITIONS = 2


def two_way_config(clusters, tmp_path, name, topic):  # noqa: ANN001, ANN201
    group = """
  - name: {name}{suffix}
    source: {src}
    destination: {dst}
    delivery: exactly_once
    offsets: {{groups: {{include: "{name}-.*"}}}}
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    mirrors:
      - {{source_topic: {topic}}}
"""
    text = clusters.config_yaml("groups:" + group.format(name=name, suffix="", src="src", dst="dst", topic=topic)
                                + group.format(name=name, suffix="-back", src="dst", dst="src", topic=topic))
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    cfg = parse_config(yaml.safe_load(text), env={})
    for g in cfg.groups:
        res = provision_group(cfg, g)
        assert not res.errors, res.errors
    return cfg


def mirror(cfg, g, topic, seed, max_bytes=None, synced_positions=False):  # noqa: ANN001, ANN201
    """Everything committed on ``g``'s source, in random chunks, with the loop guard on (records larger than
    ``max_bytes`` go to the dead-letter topic). ``synced_positions``: the writer resumes from its newest sync,
    downstream offset included, as the Spark job's does (else from its upstream offset alone)."""
    dst = cfg.cluster(g.destination)
    s = WriterSettings(
        group=g.name, mirror=f"{g.name}__{topic}", source_alias=g.source, destination_alias=g.destination,
        source_topic=topic, destination_topic=topic, source_partitions=PARTITIONS, destination_partitions=PARTITIONS,
        delivery="exactly_once", key_serde="bytes", value_serde="bytes", on_error="dead_letter",
        dlq_topic=g.dlq_topic, offset_syncs_topic=g.offset_syncs, provenance=True,
        producer_config=clients.kafka_config(dst), destination_max_message_bytes=max_bytes)
    cc = clients.kafka_config(dst)
    writer = PartitionWriter(s, SchemaIdTranslator({}), None if synced_positions else
                             lambda t, p: last_committed_position(cc, g.offset_syncs, t, p))
    rnd = random.Random(seed)
    src = cfg.cluster(g.source)
    for p, (low, high) in clients.end_offsets(src, topic).items():
        records = [replicate.SourceRecord(topic, p, m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                          m.timestamp()[1])
                   for m in clients.read_partition(src, topic, p, low, high)]
        i = 0
        while i < len(records):
            n = rnd.randint(1, 60)
            writer.write(p, records[i:i + n], records[i + n].offset if i + n < len(records) else high)
            i += n


def offsets_of_keys(bootstrap, topic, p):  # noqa: ANN001, ANN201
    """key -> offset of every committed record of the partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "isolation.level": "read_committed",
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0)])
    out = {}
    while True:
        m = c.poll(10)
        assert m is not None, "read stalled"
        if m.error():
            break
        out[m.key()] = m.offset()
    c.close()
    return out


def committed(bootstrap, group, topic):  # noqa: ANN001, ANN201
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    got = c.committed([TopicPartition(topic, p) for p in range(PARTITIONS)], timeout=30)
    c.close()
    return {tp.partition: tp.offset for tp in got}


def test_a_failbacks_consumers_among_the_copies_go_to_their_originals(clusters, unique, tmp_path) -> None:
    topic, name = unique("fb"), unique("fbg")
    create_topics(AdminClient({"bootstrap.servers": clusters.src_bootstrap}), [NewTopic(topic, PARTITIONS, 1)])
    cfg = two_way_config(clusters, tmp_path, name, topic)
    fwd, back = cfg.groups
    produce(clusters.src_bootstrap, topic, PARTITIONS, 300)
    mirror(cfg, fwd, topic, seed=1)  # the failover's flow: the destination holds copies (and commit markers)
    produce(clusters.dst_bootstrap, topic, PARTITIONS, 40, start=1000)  # after the failover, on the destination
    mirror(cfg, back, topic, seed=2)  # the failback's flow: copies skipped, the destination's own 40 mirrored

    on_dst = {p: offsets_of_keys(clusters.dst_bootstrap, topic, p) for p in range(PARTITIONS)}
    on_src = {p: offsets_of_keys(clusters.src_bootstrap, topic, p) for p in range(PARTITIONS)}
    # a consumer group on the destination: partition 0 among the copies (has read the copies of 0-119),
    # partition 1 among the destination's own records (has read 10 of them)
    group = f"{name}-app"
    at = {0: on_dst[0][b"0:120"], 1: on_dst[1][b"1:1010"]}
    commit_source_group(clusters.dst_bootstrap, group, topic, at)

    rep = failover.final_sync(cfg, back, failover.FailoverParams((group,)))
    assert rep.ok, rep.summary
    # on the source: partition 0 at the original of the copy it had not read (before, at the first of the
    # destination's own records: 180 records skipped); partition 1 at the copy of 1:1010
    assert committed(clusters.src_bootstrap, group, topic) == {0: on_src[0][b"0:120"], 1: on_src[1][b"1:1010"]}
    assert on_src[0][b"0:120"] == 120


def test_a_second_failovers_consumers_past_the_copies_go_past_their_originals(clusters, unique, tmp_path) -> None:
    """The flow out resumes after a failback from its position before the failover: the source now ends with
    copies of the destination's own records (written during the failover), which it skips. A consumer group at
    the source's end has read them: on the destination it goes past their originals. Until 7 December the sync
    after the copies held the flow's own position there (before the destination's own records), called exact:
    the group read 30 records a partition again."""
    topic, name = unique("fb2"), unique("fb2g")
    create_topics(AdminClient({"bootstrap.servers": clusters.src_bootstrap}), [NewTopic(topic, PARTITIONS, 1)])
    cfg = two_way_config(clusters, tmp_path, name, topic)
    fwd, back = cfg.groups
    produce(clusters.src_bootstrap, topic, PARTITIONS, 60)
    mirror(cfg, fwd, topic, seed=6, synced_positions=True)
    produce(clusters.dst_bootstrap, topic, PARTITIONS, 30, start=1000)  # during the failover
    mirror(cfg, back, topic, seed=7, synced_positions=True)  # the failback: the source ends with their copies
    mirror(cfg, fwd, topic, seed=8, synced_positions=True)  # the flow out again: copies only, all skipped

    group = f"{name}-app"
    src_ends = {p: high for p, (_low, high) in clients.end_offsets(cfg.cluster(fwd.source), topic).items()}
    commit_source_group(clusters.src_bootstrap, group, topic, src_ends)  # has read everything, the copies too
    rep = failover.final_sync(cfg, fwd, failover.FailoverParams((group,)))
    assert rep.ok, rep.summary
    on_dst = {p: offsets_of_keys(clusters.dst_bootstrap, topic, p) for p in range(PARTITIONS)}
    assert committed(clusters.dst_bootstrap, group, topic) == {p: on_dst[p][f"{p}:1029".encode()] + 1
                                                              for p in range(PARTITIONS)}


def test_parity_of_both_flows_leaves_out_the_copies_and_the_destinations_own_records(clusters, unique,
                                                                                     tmp_path) -> None:
    """The failback's verify_parity step: the flow back skipped the copies (loop guard) and the destination's
    topic holds records of its own among the mirrored ones. Both flows' parity holds, saying what it left out;
    until 7 December the flow back's failed (every copy counted as missing), so a failback never got past it."""
    topic, name = unique("fbv"), unique("fbv")
    create_topics(AdminClient({"bootstrap.servers": clusters.src_bootstrap}), [NewTopic(topic, PARTITIONS, 1)])
    cfg = two_way_config(clusters, tmp_path, name, topic)
    fwd, back = cfg.groups
    produce(clusters.src_bootstrap, topic, PARTITIONS, 100)
    big = Producer({"bootstrap.servers": clusters.src_bootstrap})
    big.produce(topic, key=b"big", value=bytes(4000), partition=0)  # too large for the flow out: a dead letter
    big.flush(30)
    mirror(cfg, fwd, topic, seed=3, max_bytes=3000)
    produce(clusters.dst_bootstrap, topic, PARTITIONS, 30, start=1000)
    mirror(cfg, back, topic, seed=4)  # the source now ends with copies of the destination's 30
    produce(clusters.src_bootstrap, topic, PARTITIONS, 20, start=2000)
    mirror(cfg, fwd, topic, seed=5, max_bytes=3000)  # the flow out again: skips those copies, mirrors the new 20

    for g, mirrored, left_out in ((back, 30, "100 copies skipped by the loop guard left out"),
                                  (fwd, 120, "30 copies skipped by the loop guard left out")):
        rep = failover.verify(cfg, g)
        assert rep.ok, rep.summary
        rows = rep.details["partitions"]
        assert [(r["partition"], r["source_count"], r["destination_count"]) for r in rows] == [
            (p, mirrored, mirrored) for p in range(PARTITIONS)]
        assert all(left_out in r["note"] for r in rows), rows
    # the destination's own 30 a partition sit among the flow out's records: not counted against it; the record
    # the flow out routed to the dead-letter topic is not missing
    notes = [r["note"] for r in failover.verify(cfg, fwd).details["partitions"]]
    assert all("30 destination records the flow did not write left out" in n for n in notes), notes
    assert "1 dead letters left out" in notes[0] and "dead letters" not in notes[1], notes
