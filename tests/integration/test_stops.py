"""A failover's stop of a group's stream on real clusters: a record in a compacted topic on the destination,
which any host that reaches the destination reads (an Airflow worker, a Spark driver elsewhere), whatever its
checkpoint is (an S3 one included, whose stop was a local file before 7 December)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from mirror_core import failover, stops
from mirror_core.config import MirrorsConfig, parse_config

pytestmark = pytest.mark.integration


def stops_topic(unique: Any) -> str:
    return f"{unique('stops')}.internal"  # a name no mirror copies, as the config requires


def make_config(clusters: Any, topic: str, checkpoint_dir: str, dst_bootstrap: str | None = None) -> MirrorsConfig:
    # the group and the reverse one (destination -> source), both on the test's stops topic and checkpoint
    groups = "".join(f"""
  - name: {name}
    source: {source}
    destination: {destination}
    stops_topic: {topic}
    spark: {{checkpoint_dir: "{checkpoint_dir}"}}
    mirrors: [{{source_topic: orders}}]""" for name, source, destination in (("orders", "src", "dst"), ("back", "dst", "src")))
    raw = yaml.safe_load(clusters.config_yaml(f"groups:{groups}\n"))
    if dst_bootstrap is not None:
        raw["clusters"]["dst"]["kafka"]["bootstrap.servers"] = dst_bootstrap
    return parse_config(raw, env={})


def test_a_stop_is_a_compacted_record_any_host_reads(clusters: Any, unique: Any, tmp_path: Path) -> None:
    topic = stops_topic(unique)
    cfg = make_config(clusters, topic, "s3a://bucket/checkpoints")  # no local file could carry it
    group = cfg.group("orders")
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    assert failover.stream_stop_requested(cfg, group) is None
    assert topic not in admin.list_topics(timeout=30).topics  # reading made nothing
    assert not failover.clear_stream_stop(cfg, group)

    running = stops.Watch(cfg, group, every=0.05)  # a job's view, kept from before the failover
    assert running.first() is None
    where = failover.request_stream_stop(cfg, group, "failover of group orders to dst")
    assert where == f"key 's3a://bucket/checkpoints/orders' of topic {topic} on dst"
    md = admin.list_topics(topic, timeout=30).topics[topic]
    assert len(md.partitions) == 1
    conf = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    assert next(iter(conf.values())).result(30)["cleanup.policy"].value == "compact"
    reason = failover.stream_stop_requested(cfg, group)
    assert reason is not None and reason.startswith("failover of group orders to dst at ")
    assert wait_for(running) == reason  # the running job sees it at its next look
    running.close()
    failover.request_stream_stop(cfg, group, "a second finalize")
    assert failover.stream_stop_requested(cfg, group) == reason  # kept as it was

    # a group of the same name on another checkpoint (another deployment) is not stopped
    other = make_config(clusters, topic, "s3a://bucket/elsewhere")
    assert failover.stream_stop_requested(other, other.group("orders")) is None
    # a record that is not ours counts as a stop, its text the reason
    p = Producer({"bootstrap.servers": clusters.dst_bootstrap})
    p.produce(topic, key=b"s3a://bucket/elsewhere/orders", value=b"stopped by hand", partition=0)
    assert p.flush(30) == 0
    assert failover.stream_stop_requested(other, other.group("orders")) == "stopped by hand"

    kept = stops.KafkaBoard(cfg.cluster("dst"), "dst", topic)  # one consumer across reads, as the job's
    assert kept.read()[stops.key(group)] == reason
    assert failover.clear_stream_stop(cfg, group)
    assert failover.stream_stop_requested(cfg, group) is None and stops.key(group) not in kept.read()  # a tombstone
    assert failover.stream_stop_requested(other, other.group("orders")) == "stopped by hand"

    # the topic deleted and made again (fewer records than before): the kept reader starts over
    admin.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_for(lambda: topic not in admin.list_topics(timeout=30).topics)
    failover.request_stream_stop(cfg, group, "failover again")
    again = failover.stream_stop_requested(cfg, group)
    assert again is not None and again.startswith("failover again at ")
    assert wait_for(lambda: settled(kept) == {stops.key(group): again})
    kept.close()


def settled(board: stops.KafkaBoard) -> dict[str, str] | None:
    """What the board reads, or None while its metadata still names a topic just deleted."""
    try:
        return board.read()
    except stops.StopSignalError:
        return None


def wait_for(check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
    return got


def test_finalize_readies_the_reverse_group_on_the_other_cluster(clusters: Any, unique: Any, tmp_path: Path) -> None:
    """The reverse group's stop (an earlier failback's) lives on its own destination, the source here."""
    topic = stops_topic(unique)
    cfg = make_config(clusters, topic, str(tmp_path / "ckpt"))
    failover.request_stream_stop(cfg, cfg.group("back"), "failback of group back to src")
    src_admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    assert topic in src_admin.list_topics(timeout=30).topics
    rep = failover.finalize(cfg, cfg.group("orders"), stream_stopped=True)
    assert rep.ok and rep.details["reverse_stop_cleared"] is True, rep.summary
    assert failover.stream_stop_requested(cfg, cfg.group("back")) is None
    assert failover.stream_stop_requested(cfg, cfg.group("orders")) is not None


def test_no_stop_is_written_into_a_topic_that_would_expire_it(clusters: Any, unique: Any) -> None:
    """A stops topic someone made with the default policy (or compacted and deleted): the stop is refused,
    saying why, rather than written to expire with the retention; provisioning compacts such a topic."""
    from confluent_kafka.admin import NewTopic

    from mirror_core.topics import ClusterState, TopicInfo, create_topics, plan_topics

    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    for policy in ("delete", "compact,delete"):
        topic = stops_topic(unique)
        create_topics(admin, [NewTopic(topic, 1, 1, config={"cleanup.policy": policy})])
        cfg = make_config(clusters, topic, "s3a://bucket/checkpoints")
        with pytest.raises(stops.StopSignalError) as err:
            failover.request_stream_stop(cfg, cfg.group("orders"), "failover")
        assert str(err.value) == (f"topic {topic} on dst has cleanup.policy={policy}: a failover's stop written "
                                  "there would expire with its retention, and the stopped stream start again; set "
                                  "it to compact")
        assert failover.stream_stop_requested(cfg, cfg.group("orders")) is None
        dst = ClusterState({topic: TopicInfo(topic, 1, 1, {"cleanup.policy": policy})}, 1)
        action = next(a for a in plan_topics(cfg.group("orders"), ClusterState({}, 1), dst).actions if a.topic == topic)
        assert action.kind == "alter_configs" and action.configs == {"cleanup.policy": "compact"}


def test_an_unanswered_destination_is_one_line_naming_it(clusters: Any, unique: Any) -> None:
    cfg = make_config(clusters, stops_topic(unique), "s3a://bucket/checkpoints", dst_bootstrap="127.0.0.1:1")
    board = stops.KafkaBoard(cfg.cluster("dst"), "dst", cfg.group("orders").stops, timeout=2)
    t0 = time.monotonic()
    with pytest.raises(stops.StopSignalError) as err:
        board.read()
    board.close()
    assert time.monotonic() - t0 < 10
    assert str(err.value).startswith(f"cannot read the failover stops from topic {cfg.group('orders').stops} on dst: ")
    assert "\n" not in str(err.value)
