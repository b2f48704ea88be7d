"""One place that turns a cluster definition into client configurations.

confluent-kafka (librdkafka) property names are the YAML's native dialect; the
Spark Kafka source runs the Java client, so :func:`java_kafka_options` maps the
common security settings across. Values returned here may contain secrets:
hand them to a client, never to a log.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from mirror_core.config import ClusterConfig
from mirror_core.errors import KafkaOperationError
from mirror_core.logs import LIBRDKAFKA_LOG

#: librdkafka logs through ``logging`` (``librdkafka`` logger; connection failures at DEBUG)
_QUIET: dict[str, Any] = {"log_level": 3, "logger": LIBRDKAFKA_LOG}


def kafka_config(cluster: ClusterConfig, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = dict(cluster.kafka_properties())
    conf.update(extra)
    return conf


def admin(cluster: ClusterConfig, **extra: Any) -> AdminClient:
    return AdminClient(kafka_config(cluster, **(_QUIET | extra)))


def producer(cluster: ClusterConfig, **extra: Any) -> Producer:
    return Producer(kafka_config(cluster, **(_QUIET | extra)))


def consumer(cluster: ClusterConfig, group_id: str, **extra: Any) -> Consumer:
    base = {"group.id": group_id, "enable.auto.commit": False, "auto.offset.reset": "earliest"}
    return Consumer(kafka_config(cluster, **(_QUIET | base | extra)))


#: librdkafka property -> Java client property, where the names differ or need translating.
_PASS_THROUGH = (
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "client.id",
    "ssl.endpoint.identification.algorithm",
)


def java_kafka_options(cluster: ClusterConfig) -> dict[str, str]:
    """Java Kafka client properties for the same cluster (used by Spark's Kafka source and MM2)."""
    props = cluster.kafka_properties()
    out = {k: props[k] for k in _PASS_THROUGH if k in props}
    user, password = props.get("sasl.username"), props.get("sasl.password")
    mech = props.get("sasl.mechanism", "PLAIN").upper()
    if "sasl.jaas.config" in props:
        out["sasl.jaas.config"] = props["sasl.jaas.config"]
    elif user is not None and password is not None:
        module = (
            "org.apache.kafka.common.security.plain.PlainLoginModule"
            if mech == "PLAIN"
            else "org.apache.kafka.common.security.scram.ScramLoginModule"
        )
        esc_user = user.replace('"', '\\"')
        esc_pass = password.replace('"', '\\"')
        out["sasl.jaas.config"] = f'{module} required username="{esc_user}" password="{esc_pass}";'
    if "ssl.ca.location" in props:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = props["ssl.ca.location"]
    if "ssl.certificate.location" in props and "ssl.key.location" in props:
        out["ssl.keystore.type"] = "PEM"
        out["ssl.keystore.location"] = props["ssl.certificate.location"]
    return out


def read_partition(cluster: ClusterConfig, topic: str, partition: int, start: int, end: int,
                   timeout: float = 60.0) -> Iterator[Any]:
    """Committed records of ``topic``/``partition`` with offsets in [start, end), in order (read_committed).

    ``end`` should come from :func:`end_offsets`; transaction markers and aborted records occupy offsets
    without being returned, so reading stops at the end position, not at a record count.
    """
    if end <= start:
        return
    c = consumer(cluster, f"mirrorflow-reader-{uuid.uuid4().hex[:8]}", **{
        "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        yield from scan(c, topic, partition, start, end, timeout)
    finally:
        c.close()


def scan(c: Consumer, topic: str, partition: int, start: int, end: int, timeout: float = 60.0) -> Iterator[Any]:
    """Records of ``topic``/``partition`` in [start, end), in order, read with the consumer ``c`` (which
    must have ``enable.partition.eof``); stops at ``end`` whether or not a record sits there."""
    from confluent_kafka import KafkaError, TopicPartition

    if end <= start:
        return
    c.assign([TopicPartition(topic, partition, start)])
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msgs = c.consume(5000, 1.0)
        for m in msgs:
            err = m.error()
            offset = m.offset() or 0
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if offset >= end or (c.position([TopicPartition(topic, partition)])[0].offset or 0) >= end:
                        return
                    continue
                raise KafkaOperationError(f"reading {topic}[{partition}]: {err.str()}", err.name())
            if offset >= end:
                return
            yield m
        if (c.position([TopicPartition(topic, partition)])[0].offset or 0) >= end:
            return
    raise KafkaOperationError(f"timed out reading {topic}[{partition}] up to offset {end}")


def end_offsets(cluster: ClusterConfig, topic: str, committed: bool = True,
                timeout: float = 30.0) -> dict[int, tuple[int, int]]:
    """{partition: (low, high)}; with ``committed`` the high mark is the last stable offset."""
    from confluent_kafka import TopicPartition

    c = consumer(cluster, "mirrorflow-offsets", **({"isolation.level": "read_committed"} if committed else {}))
    try:
        md = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            raise KafkaOperationError(f"topic {topic!r} does not exist", "UNKNOWN_TOPIC_OR_PART")
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout) for p in sorted(md.partitions)}
    finally:
        c.close()


def read_topic(cluster: ClusterConfig, topic: str, timeout: float = 60.0) -> Iterator[Any]:
    """Every committed record of ``topic`` from the beginning to the current end, partition by partition."""
    for p, (low, high) in end_offsets(cluster, topic, timeout=timeout).items():
        yield from read_partition(cluster, topic, p, low, high, timeout)
