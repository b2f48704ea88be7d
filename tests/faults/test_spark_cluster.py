"""Scale-out: the mirror on a Spark standalone cluster (a master and two workers from pyspark's own
distribution, executors in their own JVMs, the writing in Spark tasks), one worker killed mid-run with
its executors. Exactly-once: the destination ends with every record once. Own clusters, stopped here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import local, local_spark
from mirror_core.topics import create_topics
from tests.faults.harness import ROOT, figures, read_keys

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 4
BACKLOG = 40000


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[local.ClusterSpec]:
    """The module's Kafka clusters (each test's topic is its own)."""
    env = local.LocalEnv.from_environment(tmp_path_factory.mktemp("scale-out-clusters"))
    spec = local.free_spec(registries=False)
    try:
        local.up(env, spec, progress=lambda m: print(f"[scale-out] {m}", flush=True))
        yield spec
    finally:
        local.down(env)


@pytest.fixture
def kafka_and_spark(kafka: local.ClusterSpec, tmp_path: Path
                    ) -> Iterator[tuple[local.ClusterSpec, local_spark.SparkCluster, local.LocalEnv]]:
    """A Spark standalone cluster of each test's own (a test kills one of its workers), in its own state
    directory, beside the module's Kafka clusters."""
    env = local.LocalEnv.from_environment(tmp_path / "spark")
    try:
        cluster = local_spark.up(env, workers=2, cores_per_worker=1, memory_per_worker="1g")
        # the master's ports lie where the brokers' do: below the ephemeral range, so nothing outgoing takes them
        ports = [int(cluster.master_url.rsplit(":", 1)[1]), int(cluster.master_ui.rstrip("/").rsplit(":", 1)[1])]
        assert all(p in local._SERVER_PORTS for p in ports), ports
        yield kafka, cluster, env
    finally:
        local_spark.down(env)


@pytest.mark.parametrize(("read_path", "transactions"), [("spark", "auto"), ("executors", "auto"),
                                                          ("executors", "per_writer")])
def test_backlog_on_a_standalone_cluster_survives_a_worker_kill(kafka_and_spark, tmp_path, unique, read_path,
                                                                transactions):
    """Spark's read path (Spark's Kafka source in the tasks) and ``read_path: executors`` (each task reads its
    share of the batch's ranges with mirrorflow's reader; a transaction per partition, or with ``transactions:
    per_writer`` one per share): a worker killed mid-run loses and duplicates nothing."""
    spec, cluster, cluster_env = kafka_and_spark
    src, dst = spec.sides
    topic = unique("scaleout")
    admin = AdminClient({"bootstrap.servers": src.bootstrap})
    create_topics(admin, [NewTopic(topic, PARTITIONS, 1)])
    p = Producer({"bootstrap.servers": src.bootstrap, "enable.idempotence": True, "linger.ms": 20, "log_level": 0})
    for i in range(BACKLOG):
        p.produce(topic, key=str(i).encode(), value=b"v" * 200, partition=i % PARTITIONS)
        if i % 10000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"""clusters:
  src: {{kafka: {{bootstrap.servers: "{src.bootstrap}"}}}}
  dst: {{kafka: {{bootstrap.servers: "{dst.bootstrap}"}}}}
groups:
  - name: scaleout
    source: src
    destination: dst
    delivery: exactly_once
    serdes: {{key: bytes, value: bytes}}
    heartbeats: {{enabled: false}}
    offsets: {{sync_group_offsets: false, emit_checkpoints: false}}
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    spark:
      master: "{cluster.master_url}"
      checkpoint_dir: "{tmp_path / 'ckpt'}"
      read_path: {read_path}
      transactions: {transactions}
      driver_batch_max_records: 0        # every batch written by Spark tasks on the executors
      max_offsets_per_trigger: 8000      # several batches, so the kill lands mid-run
      conf:
        spark.executor.memory: 512m
        spark.executor.cores: "1"
        spark.cores.max: "2"
        spark.driver.host: 127.0.0.1
        spark.driver.bindAddress: 127.0.0.1
        spark.executorEnv.PYTHONPATH: "{ROOT}:{ROOT / 'plugins'}"
        spark.task.maxFailures: "8"
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
""")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'plugins'}", "SPARK_LOCAL_IP": "127.0.0.1"}
    log = (tmp_path / "job.log").open("wb")
    job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(cfg), "--group", "scaleout",
                            "--once"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed_at = None
    try:
        deadline = time.monotonic() + 600
        watcher = AdminClient({"bootstrap.servers": dst.bootstrap})
        while job.poll() is None and time.monotonic() < deadline:
            if killed_at is None and f"{topic}.mirror" in watcher.list_topics(timeout=10).topics:
                have = len(read_keys(dst.bootstrap, f"{topic}.mirror", timeout=30))
                if have > 0:  # the first batch is in: a worker and its executors die now
                    killed_at = have
                    local_spark.kill_worker(cluster, 0)
            time.sleep(1)
        assert job.poll() is not None, "the mirror did not finish within 10 minutes"
    finally:
        if job.poll() is None:
            job.kill()
        log.close()
    text = (tmp_path / "job.log").read_text(errors="replace")
    assert job.returncode == 0, text[-4000:]
    assert killed_at is not None and killed_at < BACKLOG, "the worker was not killed mid-run"
    mirrored = read_keys(dst.bootstrap, f"{topic}.mirror")
    fig = figures(f"standalone cluster, one worker killed mid-run (exactly_once, read_path: {read_path}, "
                  f"transactions: {transactions})",
                  list(range(BACKLOG)), mirrored)
    print(f"  worker killed when {killed_at} of {BACKLOG} were mirrored", flush=True)
    assert fig["lost"] == 0 and fig["duplicated"] == 0
    # the writing (and with read_path: executors, the reading with mirrorflow's reader) ran in Spark tasks on the
    # executors
    per = "per_writer" if transactions == "per_writer" else "per_partition"
    assert (f"'written_by': 'tasks', 'read_by': '{'direct' if read_path == 'executors' else 'spark'}', "
            f"'transactions': '{per}'") in text
    # the executors' block managers and fetched files were under the state directory, and go with the cluster:
    # a killed worker's executors never clean theirs up, which used to leave them in the machine's /tmp
    scratch = local_spark.scratch_dir(cluster_env)
    assert list(scratch.glob("spark-*/executor-*")), f"no executor's local directory under {scratch}"
    local_spark.down(cluster_env)
    assert not scratch.exists()
