"""Issue 11 item 7 on real clusters: a topic mirrored into fewer destination partitions (records placed by
key hash) has no exact offset translation, and checkpoints, group offset sync and lag say so."""

from __future__ import annotations

import pytest
import yaml
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import checkpoint, clients, health
from mirror_core.config import parse_config
from mirror_core.provision import provision_group
from mirror_core.replicate import PartitionWriter, SchemaIdTranslator, SourceRecord, WriterSettings, last_committed_sync
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def test_item7_checkpoint_refuses_repartitioned_topic(clusters, unique):
    topic = unique("repart")
    name = topic.replace("-", "")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(topic, 4, 1)])
    p = Producer({"bootstrap.servers": clusters.src_bootstrap, "enable.idempotence": True})
    for i in range(80):
        p.produce(topic, key=f"k{i}".encode(), value=b"v", partition=i % 4)
    assert p.flush(30) == 0
    text = clusters.config_yaml(f"""
groups:
  - name: {name}
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{name}.syncs.internal"
    offsets: {{groups: {{include: "{name}-app"}}}}
    heartbeats: {{enabled: false}}
    topics_mirroring:
      partition_count: {{type: fix, value: 2}}
      replication_factor: {{type: fix, value: 1}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    cfg = parse_config(yaml.safe_load(text), env={})
    g = cfg.groups[0]
    assert not provision_group(cfg, g).errors
    src, dst = cfg.cluster("src"), cfg.cluster("dst")
    s = WriterSettings(group=g.name, mirror=f"{g.name}__{topic}", source_alias="src", destination_alias="dst",
                       source_topic=topic, destination_topic=f"{topic}.m", source_partitions=4,
                       destination_partitions=2, delivery="exactly_once", key_serde="bytes", value_serde="bytes",
                       on_error="dead_letter", dlq_topic=g.dlq_topic, offset_syncs_topic=g.offset_syncs,
                       provenance=False, producer_config=clients.kafka_config(dst))
    cc = clients.kafka_config(dst)
    w = PartitionWriter(s, SchemaIdTranslator({}), lambda t, part: last_committed_sync(cc, g.offset_syncs, t, part))
    for part, (low, high) in clients.end_offsets(src, topic).items():
        recs = [SourceRecord(topic, part, m.offset(), m.key(), m.value(), (), m.timestamp()[1])
                for m in clients.read_partition(src, topic, part, low, high)]
        w.write(part, recs, high)
    c = Consumer({"bootstrap.servers": clusters.src_bootstrap, "group.id": f"{name}-app"})
    c.commit(offsets=[TopicPartition(topic, part, 7) for part in range(4)], asynchronous=False)
    c.close()

    report = checkpoint.run_round(cfg, g)
    assert report.groups, "the source group was not looked at"
    rep = report.groups[0]
    assert rep.checkpoints == 0 and rep.written == []
    assert sorted(part for t, part, why in rep.skipped if "fewer partitions" in why) == [0, 1, 2, 3]
    assert [k for k in checkpoint.load_checkpoints(cfg, g) if k[1] == f"{topic}.m"] == []
    dadmin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    res = dadmin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(f"{name}-app")])[f"{name}-app"].result(30)
    assert [tp for tp in res.topic_partitions if tp.offset >= 0] == []
    lag = [x for x in health.consumer_group_lag(cfg, g) if x.consumer_group == f"{name}-app"]
    assert len(lag) == 4 and all(x.translated is None and x.lag_records is None for x in lag)
    assert all("fewer partitions" in x.note for x in lag)
