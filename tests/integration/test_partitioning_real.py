"""Fewer destination partitions than source partitions, on real brokers: records are placed by the key
hash a Java producer uses (checked against librdkafka's Java-compatible ``murmur2_random``
partitioner, an independent implementation), key-less records by ``source partition % n``, and each
key's records keep their order."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import clients
from mirror_core.config import ClusterConfig
from mirror_core.replicate import PartitionWriter, SchemaIdTranslator, SourceRecord, WriterSettings
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def test_fewer_destination_partitions_place_keys_like_a_java_producer(clusters, unique):
    name = unique("fewer")
    dst_topic, ref_topic, syncs = f"{name}.m", f"{name}.ref", f"{name}.syncs"
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    create_topics(admin, [NewTopic(dst_topic, 3, 1), NewTopic(ref_topic, 3, 1), NewTopic(syncs, 1, 1)])
    dst = ClusterConfig(kafka={"bootstrap.servers": clusters.dst_bootstrap})
    keys = [f"key-{i}".encode() for i in range(40)] + [b"21", b"foobar"]  # the last two hash negative
    # where librdkafka's Java-compatible partitioner puts each key in a 3-partition topic (with 2, abs()
    # and Java's toPositive would agree on every key: same parity)
    ref = Producer({"bootstrap.servers": clusters.dst_bootstrap, "partitioner": "murmur2_random"})
    for k in keys:
        ref.produce(ref_topic, key=k, value=b"")
    assert ref.flush(30) == 0
    java_placement = {m.key(): m.partition() for m in clients.read_topic(dst, ref_topic)}
    assert set(java_placement.values()) == {0, 1, 2} and len(java_placement) == len(keys)

    settings = WriterSettings(
        group=name, mirror=f"{name}__t__{dst_topic}", source_alias="src", destination_alias="dst", source_topic="t",
        destination_topic=dst_topic, source_partitions=4, destination_partitions=3, delivery="exactly_once",
        key_serde="bytes", value_serde="bytes", on_error="dead_letter", dlq_topic=f"{name}.dlq",
        offset_syncs_topic=syncs, provenance=False, producer_config=clients.kafka_config(dst))
    writer = PartitionWriter(settings, SchemaIdTranslator({}), lambda t, p: None, downstream_end=lambda t, p: 0)
    now_ms = int(time.time() * 1000)  # inside retention (days-old records are deleted by the broker)
    for p in range(4):
        recs = [SourceRecord("t", p, o, k, f"{p}:{o}".encode(), (), now_ms + o)
                for o, k in enumerate(keys + [None, None] + keys)]  # every key twice, in order
        assert writer.write(p, recs).mirrored == len(recs)

    got = {p: list(clients.read_partition(dst, dst_topic, p, lo, hi))
           for p, (lo, hi) in clients.end_offsets(dst, dst_topic).items()}
    placed = {(m.key(), m.partition()) for ms in got.values() for m in ms if m.key() is not None}
    assert placed == set(java_placement.items())  # each key where a Java producer would put it
    nulls = sorted((m.value().decode().split(":")[0], m.partition()) for ms in got.values() for m in ms
                   if m.key() is None)
    assert nulls == [("0", 0)] * 2 + [("1", 1)] * 2 + [("2", 2)] * 2 + [("3", 0)] * 2  # source partition % 3
    for ms in got.values():  # per source partition and key, the destination keeps the source order
        seen: dict[tuple[str, bytes | None], int] = {}
        for m in ms:
            src_p, off = (int(x) for x in m.value().decode().split(":"))
            assert seen.get((src_p, m.key()), -1) < off
            seen[(src_p, m.key())] = off
    assert sum(len(ms) for ms in got.values()) == 4 * (2 * len(keys) + 2)
