"""plan / provision against real clusters: creates, filtered configs, idempotence, grow, prefix cycles."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic, ResourceType
from typer.testing import CliRunner

from mirror_core.cli import app
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def test_plan_provision_idempotent_and_grow(clusters, unique, tmp_path):
    prefix = unique("prov").replace("-", "_")
    src = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(src, [
        NewTopic(f"{prefix}.a", 6, 1, config={"retention.ms": "3600000", "min.insync.replicas": "1"}),
        NewTopic(f"{prefix}.b", 1, 1, config={"cleanup.policy": "compact", "retention.ms": "7200000"}),
        NewTopic(f"{prefix}.c", 24, 1),
        NewTopic(f"dst.{prefix}.loop", 1, 1),
    ])
    cfg = tmp_path / "m.yaml"
    cfg.write_text(clusters.config_yaml(f"""
groups:
  - name: {prefix}
    source: src
    destination: dst
    replication_policy: prefix
    topics_mirroring:
      partition_count: {{type: mirror_source, min: 2, max: 12}}
      replication_factor: {{type: fix, value: 1}}
    mirrors:
      - topics: {{include: "{prefix}\\\\..*|dst\\\\.{prefix}\\\\..*"}}
"""))
    runner = CliRunner()
    res = runner.invoke(app, ["plan", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)[0]
    acts = {a["topic"]: a for a in plan["topics"]}
    assert acts[f"src.{prefix}.a"]["kind"] == "create" and acts[f"src.{prefix}.a"]["partitions"] == 6
    assert acts[f"src.{prefix}.b"]["partitions"] == 2 and acts[f"src.{prefix}.c"]["partitions"] == 12
    assert acts[f"src.{prefix}.b"].get("configs") == {"cleanup.policy": "compact", "retention.ms": "7200000"}
    assert acts[f"src.{prefix}.a"].get("configs") == {"retention.ms": "3600000"}
    assert f"src.dst.{prefix}.loop" not in acts  # came from dst: not mirrored back
    assert any(s["source_topic"] == f"dst.{prefix}.loop" for s in plan["skipped"])

    res = runner.invoke(app, ["provision", str(cfg)])
    assert res.exit_code == 0, res.output
    assert f"created src.{prefix}.a (6 partitions, RF 1)" in res.stdout
    res = runner.invoke(app, ["provision", str(cfg)])
    assert res.exit_code == 0 and "nothing to do" in res.stdout, res.output

    src.create_partitions([NewPartitions(f"{prefix}.a", 8)])[f"{prefix}.a"].result(30)
    res = runner.invoke(app, ["plan", str(cfg), "--json"])
    acts = {a["topic"]: a for a in json.loads(res.stdout)[0]["topics"]}
    assert acts[f"src.{prefix}.a"]["kind"] == "grow" and acts[f"src.{prefix}.a"]["partitions"] == 8
    res = runner.invoke(app, ["provision", str(cfg)])
    assert res.exit_code == 0, res.output

    # what the destination now holds, read from the destination itself
    dst = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    listed = dst.list_topics(timeout=30).topics
    ours = {t: len(md.partitions) for t, md in listed.items() if prefix in t}
    assert ours == {f"src.{prefix}.a": 8, f"src.{prefix}.b": 2, f"src.{prefix}.c": 12, f"{prefix}.mirrorflow.dlq": 1}
    res_b = ConfigResource(ResourceType.TOPIC, f"src.{prefix}.b")
    b_cfg = dst.describe_configs([res_b])[res_b].result(30)
    assert (b_cfg["cleanup.policy"].value, b_cfg["retention.ms"].value) == ("compact", "7200000")


def test_per_mirror_schema_rules_apply(clusters, unique, tmp_path):
    """A mirror's own force_subject_compatibility_level wins over the group's."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    a, b = unique("sa"), unique("sb")
    src = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(src, [NewTopic(a, 1, 1), NewTopic(b, 1, 1)])
    sr = SchemaRegistryClient({"url": clusters.src_registry})
    for t in (a, b):
        sr.register_schema(f"{t}-value", Schema(json.dumps({"type": "record", "name": "R", "fields": [
            {"name": "x", "type": "long"}]}), "AVRO"))
    cfg = tmp_path / "s.yaml"
    cfg.write_text(clusters.config_yaml(f"""
groups:
  - name: {unique("sg")}
    source: src
    destination: dst
    serdes: {{key: bytes, value: avro}}
    force_subject_compatibility_level: FORWARD
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    mirrors:
      - {{source_topic: {a}}}
      - {{source_topic: {b}, force_subject_compatibility_level: FULL_TRANSITIVE}}
"""))
    res = CliRunner().invoke(app, ["provision", str(cfg)])
    assert res.exit_code == 0, res.output
    dst = SchemaRegistryClient({"url": clusters.dst_registry})
    assert dst.get_compatibility(f"{a}-value") == "FORWARD"
    assert dst.get_compatibility(f"{b}-value") == "FULL_TRANSITIVE"
    assert dst.get_versions(f"{a}-value") == [1] and dst.get_versions(f"{b}-value") == [1]


def test_provisioned_partitions_are_served_when_provision_returns(clusters, unique, tmp_path):
    """Right after CreateTopics / CreatePartitions return, the broker's metadata already names a leader that
    still answers NOT_LEADER_FOR_PARTITION for a moment (for most of 200 partitions on one local broker). So
    that a job's writers do not start with a failure per partition, provisioning returns only once every
    partition it created or added answers: a consumer asked at once gets every partition's offsets."""
    from confluent_kafka import Consumer, TopicPartition

    topic = unique("served")
    src = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(src, [NewTopic(topic, 160, 1)])
    cfg = tmp_path / "w.yaml"
    cfg.write_text(clusters.config_yaml(f"""
groups:
  - name: {unique("wg")}
    source: src
    destination: dst
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
"""))

    def provision_then_ask(partitions: int) -> None:
        res = CliRunner().invoke(app, ["provision", str(cfg)])
        assert res.exit_code == 0, res.output
        c = Consumer({"bootstrap.servers": clusters.dst_bootstrap, "group.id": "served", "log_level": 3})
        try:
            for p in range(partitions):  # raises NOT_LEADER_FOR_PARTITION on a partition not served yet
                assert c.get_watermark_offsets(TopicPartition(f"{topic}.mirror", p), timeout=10) == (0, 0)
        finally:
            c.close()

    provision_then_ask(160)
    src.create_partitions([NewPartitions(topic, 200)])[topic].result(30)
    provision_then_ask(200)


def test_create_topics_returns_once_every_partition_is_served(clusters, unique):
    """``topics.create_topics`` is what the demo, the heartbeats topics and these tests create topics with
    before writing to them: a producer that writes while a partition comes online can lose records it was
    told were written (see ``wait_for_leaders``). When it returns, every partition answers at once."""
    from confluent_kafka import Consumer, TopicPartition

    from mirror_core.errors import KafkaOperationError

    topic = unique("ready")
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    create_topics(admin, [NewTopic(topic, 200, 1)])
    c = Consumer({"bootstrap.servers": clusters.dst_bootstrap, "group.id": "ready", "log_level": 3})
    try:
        for p in range(200):  # raises NOT_LEADER_FOR_PARTITION on a partition not served yet
            assert c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) == (0, 0)
    finally:
        c.close()
    create_topics(admin, [NewTopic(topic, 200, 1)], exist_ok=True)  # there already: fine when asked
    with pytest.raises(KafkaOperationError, match=f"create topic {topic} failed: .*TOPIC_ALREADY_EXISTS"):
        create_topics(admin, [NewTopic(topic, 200, 1)])


def test_a_client_that_asked_for_a_topic_before_it_existed_still_sees_it_served(clusters, unique):
    """A job reads the destination's state before it creates its topics, and two jobs starting together
    create topics the other has just asked about. librdkafka answers ListOffsets from its metadata cache,
    which kept such a topic as missing: the wait for leaders then failed provisioning after its timeout
    although the partitions were served within a second. Creating with that client must return at once."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    topic = unique("asked")
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap, "log_level": 3})
    admin.list_topics(timeout=10)  # the cluster's topics, as a job's look at the destination asks
    for fut in admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()}, request_timeout=5).values():
        with pytest.raises(KafkaException):
            fut.result()  # not there yet: now the client's cache says so
    create_topics(admin, [NewTopic(topic, 6, 1)], timeout=15)  # NOT_SERVED after 15 s when the cache is trusted


def test_a_topic_the_destination_refuses_does_not_stop_the_others(clusters, unique, tmp_path):
    """One topic whose create the destination refuses (its name collides with a topic there: Kafka takes '.' and
    '_' for the same in metric names) beside topics to create, grow and reconfigure: those are done, the refusal
    is reported with the topic and Kafka's reason, the exit status says it failed, and so does a second run."""
    prefix = unique("part").replace("-", "_")
    src = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    dst = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    create_topics(src, [NewTopic(f"{prefix}.clash", 1, 1), NewTopic(f"{prefix}.new", 2, 1,
                                                                      config={"retention.ms": "3600000"}),
                        NewTopic(f"{prefix}.grown", 4, 1, config={"retention.ms": "7200000"})])
    create_topics(dst, [NewTopic(f"{prefix}_clash", 1, 1), NewTopic(f"{prefix}.grown", 2, 1, config={
        "retention.ms": "60000", "cleanup.policy": "compact", "min.insync.replicas": "1"})])
    cfg = tmp_path / "p.yaml"
    cfg.write_text(clusters.config_yaml(f"""
groups:
  - name: {prefix}
    source: src
    destination: dst
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    mirrors:
      - topics: {{include: "{prefix}\\\\..*"}}
"""))
    runner = CliRunner()
    res = runner.invoke(app, ["plan", str(cfg), "--json"])
    assert res.exit_code == 0, res.output
    grown = [a for a in json.loads(res.stdout)[0]["topics"] if a["topic"] == f"{prefix}.grown"]
    assert [a["kind"] for a in grown] == ["grow", "alter_configs"]
    assert grown[1]["configs"] == {"retention.ms": "7200000"} and grown[1]["deletes"] == ["cleanup.policy"]
    res = runner.invoke(app, ["provision", str(cfg)])
    assert res.exit_code == 1, res.output
    assert f"created {prefix}.new (2 partitions, RF 1)" in res.stdout
    assert f"grew {prefix}.grown to 4 partitions" in res.stdout
    assert f"set retention.ms=7200000 on {prefix}.grown" in res.stdout
    assert f"deleted cleanup.policy on {prefix}.grown (Kafka's default on the source)" in res.stdout
    assert f"create topic {prefix}.clash failed" in res.stderr and "collides" in res.stderr, res.stderr
    assert "TOPIC_EXCEPTION" in res.stderr

    listed = dst.list_topics(timeout=30).topics
    assert len(listed[f"{prefix}.new"].partitions) == 2 and len(listed[f"{prefix}.grown"].partitions) == 4
    assert f"{prefix}.clash" not in listed
    res_g = ConfigResource(ResourceType.TOPIC, f"{prefix}.grown")
    g_cfg = dst.describe_configs([res_g])[res_g].result(30)
    assert (g_cfg["retention.ms"].value, g_cfg["cleanup.policy"].value) == ("7200000", "delete")  # broker default
    assert g_cfg["min.insync.replicas"].value == "1" and not g_cfg["min.insync.replicas"].is_default  # excluded

    res = runner.invoke(app, ["provision", str(cfg)])  # only the refused topic is left, and fails again
    assert res.exit_code == 1 and f"create topic {prefix}.clash failed" in res.stderr, res.output
    assert "created" not in res.stdout and "grew" not in res.stdout
