"""Issue 11 on the Spark data path: checkpoints that are not plain local paths, re-created source topics,
source partitions that grow while a mirror runs. Real clusters, Spark ``local[2]``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from test_mirror_e2e import create_topic, read_all  # tests/spark is on sys.path
from test_mirror_features import _exists  # tests/spark is on sys.path

from mirror_core.config import parse_config
from mirror_core.topics import create_topics, wait_for_leaders

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def produce(bootstrap: str, topic: str, n: int, partitions: int, tag: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for i in range(n):
        p.produce(topic, key=f"{tag}{i}".encode(), value=f"{tag}-{i}".encode(), partition=i % partitions)
    assert p.flush(30) == 0


def flow_config(clusters, tmp_path: Path, prefix: str, checkpoint: str):
    text = clusters.config_yaml(f"""
groups:
  - name: {prefix}
    source: src
    destination: dst
    replication_policy: prefix
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{prefix}.syncs.internal"
    dead_letter_topic: "{prefix}.dlq"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    spark: {{master: "local[2]", checkpoint_dir: "{checkpoint}"}}
    mirrors:
      - topics: {{include: "{prefix}\\\\..*"}}
""")
    return parse_config(yaml.safe_load(text), env={})


def test_item1_regex_flow_on_a_uri_checkpoint_mirrors_a_new_topic(clusters, unique, tmp_path):
    """A checkpoint given as a URI (``file://`` here; ``s3a://``/``hdfs://`` in production) is read through
    Hadoop's file system: a topic that a regex flow discovers is provisioned and mirrored, not dropped."""
    from mirror_core.stream import MirrorRuntime
    from spark_jobs.mirror_stream import build_query, build_session

    prefix = unique("ckuri").replace("-", "")
    first, later = f"{prefix}.a", f"{prefix}.b"
    create_topic(clusters.src_bootstrap, first, 1)
    produce(clusters.src_bootstrap, first, 5, 1, "a")
    cfg = flow_config(clusters, tmp_path, prefix, (tmp_path / "ckpt").as_uri())
    group = cfg.groups[0]
    rt = MirrorRuntime(cfg, group)
    rt.prepare()  # the job starts and provisions what exists ...
    create_topic(clusters.src_bootstrap, later, 2)  # ... then the flow's next topic appears
    produce(clusters.src_bootstrap, later, 12, 2, "b")
    spark = build_session(group, app_name=f"mirrorflow-{prefix}")
    try:
        query = build_query(spark, cfg, group, once=True, runtime=rt, prepared=True)
        query.awaitTermination(240)
        assert not query.isActive and query.exception() is None
    finally:
        spark.stop()
    assert _exists(clusters.dst_bootstrap, f"src.{later}"), "the new topic was never provisioned"
    got = read_all(clusters.dst_bootstrap, f"src.{later}", timeout=30)
    assert sorted(m.value() for ms in got.values() for m in ms) == sorted(f"b-{i}".encode() for i in range(12))
    assert len([m for ms in read_all(clusters.dst_bootstrap, f"src.{first}", timeout=30).values() for m in ms]) == 5


def test_item8_source_partitions_added_while_running_are_mirrored_to_the_same_numbers(clusters, unique, tmp_path):
    """Partitions added to a source topic while the job runs: the destination grows with it and the new
    partitions' records land in the same partition numbers; the job keeps running."""
    import os
    import signal
    import subprocess
    import sys

    from confluent_kafka.admin import NewPartitions
    from test_mirror_e2e import ROOT
    from test_mirror_features import wait_for

    topic = unique("grow")
    name = topic.replace("-", "")
    create_topic(clusters.src_bootstrap, topic, 2)
    produce(clusters.src_bootstrap, topic, 10, 2, "a")
    text = clusters.config_yaml(f"""
groups:
  - name: {name}
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{name}.syncs.internal"
    dead_letter_topic: "{name}.dlq"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    spark: {{master: "local[2]", trigger: "1 second", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    path = tmp_path / "mirrors.yaml"
    path.write_text(text)

    def mirrored() -> dict:
        if not _exists(clusters.dst_bootstrap, f"{topic}.m"):
            return {}
        try:
            return read_all(clusters.dst_bootstrap, f"{topic}.m", timeout=10)
        except KafkaException as exc:
            # a partition the mirror has just added to the destination topic may have no leader yet: not read yet
            if exc.args[0].code() in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE):
                return {}
            raise

    job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", name],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        wait_for("the first records", lambda: sum(len(v) for v in mirrored().values()) == 10, proc=job)
        admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
        admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        assert wait_for_leaders(admin, [TopicPartition(topic, p) for p in (2, 3)]) == []  # served before written
        produce(clusters.src_bootstrap, topic, 20, 4, "b")  # 5 records in each of the 4 partitions
        def all_30() -> dict | None:
            m = mirrored()
            return m if sum(len(v) for v in m.values()) == 30 else None

        got = wait_for("records of the new partitions", all_30, proc=job)
        assert sorted(got) == [0, 1, 2, 3]
        for p in (2, 3):
            assert [m.key() for m in got[p]] == [f"b{i}".encode() for i in range(p, 20, 4)]
        assert job.poll() is None, "the job stopped"
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)
        try:
            rc = job.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            raise
        err = job.stderr.read() if job.stderr else ""
    assert rc == 0, err[-3000:]


@pytest.mark.slow  # three --once runs of the job (about 1.5 minutes each read path on 2 cores)
@pytest.mark.parametrize("read_path", ["spark", "direct"])
def test_item5_expired_records_are_reported_and_a_recreated_topic_is_mirrored_from_its_start(
        clusters, unique, tmp_path, read_path):
    """Records that retention removed before they were mirrored are reported (log line with the counts);
    a source topic deleted and re-created is detected (its end moved back) and mirrored from its start.
    On the direct path (two writer processes here) the re-created partition is a range of the batch, read
    from its first offset by the process that owns it."""
    import time

    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import NewTopic
    from test_mirror_e2e import counted, run_once

    topic = unique("recreate")
    name = topic.replace("-", "")
    create_topic(clusters.src_bootstrap, topic, 1)
    produce(clusters.src_bootstrap, topic, 20, 1, "a")
    text = clusters.config_yaml(f"""
groups:
  - name: {name}
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{name}.syncs.internal"
    dead_letter_topic: "{name}.dlq"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    spark: {{master: "local[2]", checkpoint_dir: "{tmp_path / 'ckpt'}", read_path: {read_path}, direct_processes: 2}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    path = tmp_path / "mirrors.yaml"
    path.write_text(text)

    def keys() -> list[bytes]:
        return [m.key() for ms in read_all(clusters.dst_bootstrap, f"{topic}.m", timeout=30).values() for m in ms]

    run_once(path, name)
    assert keys() == [f"a{i}".encode() for i in range(20)]

    # retention: offsets 20-24 are removed before the mirror runs again
    produce(clusters.src_bootstrap, topic, 10, 1, "b")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    admin.delete_records([TopicPartition(topic, 0, 25)])[TopicPartition(topic, 0, 25)].result(30)
    proc = run_once(path, name)
    assert "5 records (offsets 20-24) expired on the source" in proc.stderr, proc.stderr[-3000:]
    mirror = f"{name}__{topic}__{topic}.m"
    expired, rewound = ("mirrorflow_records_expired_total", mirror), ("mirrorflow_source_offsets_rewound_total", mirror)
    runs = counted(proc, name)  # what /metrics served at the end
    assert (runs.get(expired), runs.get(rewound, 0.0)) == (5.0, 0.0), runs
    assert keys()[20:] == [f"b{i}".encode() for i in range(5, 10)]

    # the topic is deleted and created again with 5 new records
    admin.delete_topics([topic])[topic].result(30)
    deadline = time.monotonic() + 60
    while True:
        try:
            create_topics(admin, [NewTopic(topic, 1, 1)])
            break
        except KafkaException:
            assert time.monotonic() < deadline, "the topic could not be created again"
            time.sleep(0.5)
    produce(clusters.src_bootstrap, topic, 5, 1, "c")
    proc = run_once(path, name)
    assert "moved back from 30 to 5" in proc.stderr, proc.stderr[-3000:]
    runs = counted(proc, name)
    assert (runs.get(rewound), runs.get(expired, 0.0)) == (25.0, 0.0), runs  # offsets the end moved back by
    assert keys()[25:] == [f"c{i}".encode() for i in range(5)]
