"""Item 10 of issue 11 on the real clusters: a GUID-framed record is resolved through the registries or
dead-lettered with its reason; it never reaches the destination with a GUID the destination cannot decode."""

from __future__ import annotations

import json
import struct
import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from mirror_core.config import SchemaRegistryConfig
from mirror_core.replicate import PartitionWriter, SchemaIdTranslator, SourceRecord, WriterSettings
from mirror_core.stream import make_resolver
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def read_all(bootstrap: str, topic: str, expect: int) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"guid-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    try:
        for _ in range(60):
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m)
            if len(out) >= expect:
                # one more short poll: nothing beyond what was expected may be there
                extra = c.poll(1.0)
                if extra is not None and not extra.error():
                    out.append(extra)
                break
    finally:
        c.close()
    return out


def test_item10_guid_record_resolved_or_dead_lettered_never_passed_through(clusters, unique):
    topic = unique("item10")
    dst_topic, dlq, syncs = f"{topic}.mirror", f"{topic}.dlq", f"{topic}.syncs"
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    create_topics(admin, [NewTopic(t, 1, 1) for t in (dst_topic, dlq, syncs)])
    schema = json.dumps({"type": "record", "name": "G", "namespace": "item10", "fields": [
        {"name": "x", "type": "long"}]})
    sid = SchemaRegistryClient({"url": clusters.src_registry}).register_schema(f"{topic}-value",
                                                                                Schema(schema, "AVRO"))
    registries = (SchemaRegistryConfig(url=clusters.src_registry, not_found_retries=1, not_found_backoff=0.05),
                  SchemaRegistryConfig(url=clusters.dst_registry))
    s = WriterSettings(group="g10", mirror="g10__m", source_alias="src", destination_alias="dst", source_topic=topic,
                       destination_topic=dst_topic, source_partitions=1, destination_partitions=1,
                       delivery="at_least_once", key_serde="bytes", value_serde="avro", on_error="dead_letter",
                       dlq_topic=dlq, offset_syncs_topic=syncs, provenance=False,
                       producer_config={"bootstrap.servers": clusters.dst_bootstrap})
    writer = PartitionWriter(s, SchemaIdTranslator({}, make_resolver(registries, topic, dst_topic)),
                             lambda t, p: None)
    guid = uuid.uuid4().bytes
    records = [
        SourceRecord(topic, 0, 0, b"k0", b"\x00" + struct.pack(">i", sid) + b"\x02", (), int(time.time() * 1000)),
        SourceRecord(topic, 0, 1, b"k1", b"\x01" + guid + b"\x04", (), int(time.time() * 1000)),
        SourceRecord(topic, 0, 2, b"k2", b"\x04", (("__value_schema_id", b"\x01" + guid),), int(time.time() * 1000)),
    ]
    result = writer.write(0, records)
    assert result.mirrored == 1 and result.dead_lettered == 2, result

    mirrored = read_all(clusters.dst_bootstrap, dst_topic, 1)
    assert [m.key() for m in mirrored] == [b"k0"]  # the GUID records are not on the destination topic
    letters = read_all(clusters.dst_bootstrap, dlq, 2)
    assert [m.key() for m in letters] == [b"k1", b"k2"]
    for m in letters:
        headers = dict(m.headers())
        assert headers["mirrorflow.error.reason"] == b"unknown_schema_guid"
        assert str(uuid.UUID(bytes=guid)) in headers["mirrorflow.error.detail"].decode() or \
            guid.hex() in headers["mirrorflow.error.detail"].decode()
