"""One place that turns a cluster definition into client configurations.

confluent-kafka (librdkafka) property names are the YAML's native dialect; the
Spark Kafka source runs the Java client, so :func:`java_kafka_options` maps the
common security settings across. Values returned here may contain secrets:
hand them to a client, never to a log.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from mirror_core.config import ClusterConfig

_QUIET = {"log_level": 3}


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
