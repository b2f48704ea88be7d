"""Broker failures under a running mirror, on this module's own clusters (started and stopped here; the
3-broker test starts its own).

A record stream keeps flowing into the source while a broker goes away; at the end an independent
reader counts what reached the destination. Figures (produced / mirrored / lost / duplicated, stall)
are printed as ``FAULT FIGURES {...}``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import local
from mirror_core.config import load_config
from mirror_core.provision import provision_group
from mirror_core.topics import create_topics
from tests.faults.harness import (
    MirrorJob,
    Progress,
    RecordStream,
    figures,
    group_yaml,
    wait_for_count,
    wait_for_keys,
)

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]
PARTITIONS = 3


@pytest.fixture(scope="module")
def own_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[local.LocalEnv, local.ClusterSpec]]:
    """A source and a destination of one broker each, no registries, for this module's tests (each test
    brings back the broker it stopped, also when it fails; its topics and mirror groups are its own)."""
    env = local.LocalEnv.from_environment(tmp_path_factory.mktemp("faults") / "clusters")
    spec = local.free_spec(registries=False)
    try:
        local.up(env, spec, progress=lambda m: print(f"[faults] {m}", flush=True))
        yield env, spec
    finally:
        local.down(env)


def restart_stopped_brokers(env: local.LocalEnv) -> None:
    """Any broker a failed test left stopped runs again: the module's next test finds both clusters whole."""
    for side, state in local.status(env)["sides"].items():
        for b in state["brokers"]:
            if b["state"] == "stopped":
                local.start_broker(env, side, b["node_id"])


def mirror_config(tmp_path: Path, src: str, dst: str, topic: str, delivery: str, name: str = "faults") -> Path:
    """The config of mirror group ``name`` of ``topic`` (created here); the group's files under ``tmp_path``."""
    admin = AdminClient({"bootstrap.servers": src})
    create_topics(admin, [NewTopic(topic, PARTITIONS, 1)])
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(group_yaml(src, dst, name, topic, tmp_path, delivery))
    return cfg


def start_mirror(tmp_path: Path, src: str, dst: str, topic: str, delivery: str) -> MirrorJob:
    """The mirror group ``faults`` of ``topic`` (created here) as a continuous job; its files under ``tmp_path``."""
    return MirrorJob(mirror_config(tmp_path, src, dst, topic, delivery), "faults", tmp_path / "job.log")


def test_destination_broker_down_30s_then_back(own_clusters, tmp_path, unique):
    """One outage of the destination's only broker under two running mirrors, exactly_once and at_least_once
    (each its own topic, record stream, group and job): neither loses a record, exactly_once duplicates none,
    and neither pauses more than 90 s once the broker is back; each one's stall is measured."""
    env, spec = own_clusters
    src, dst = spec.sides
    deliveries = ("exactly_once", "at_least_once")
    topics = {d: unique(f"dstdown-{d.replace('_', '')}") for d in deliveries}
    streams = {d: RecordStream(src.bootstrap, topics[d], PARTITIONS, rate=150) for d in deliveries}
    progress = {d: Progress(dst.bootstrap, f"{topics[d]}.mirror") for d in deliveries}
    jobs: dict[str, MirrorJob] = {}
    try:
        # the groups are provisioned one after the other (two jobs creating topics on one destination at the
        # same moment is not what this test is about), then both jobs start
        for d in deliveries:
            path = mirror_config(tmp_path / d, src.bootstrap, dst.bootstrap, topics[d], d, name=f"faults_{d}")
            cfg = load_config(path)
            provisioned = provision_group(cfg, cfg.group(f"faults_{d}"))
            assert provisioned.errors == [], provisioned.errors
        for d in deliveries:
            jobs[d] = MirrorJob(tmp_path / d / "mirror.yaml", f"faults_{d}", tmp_path / d / "job.log")
            streams[d].start()
        for d in deliveries:  # both mirrors are flowing
            wait_for_count(dst.bootstrap, f"{topics[d]}.mirror", 300, jobs[d], timeout=240)
        for d in deliveries:
            progress[d].start()
        t_stop = time.monotonic()
        local.stop_broker(env, "dst", 1)
        time.sleep(30)  # the fault itself: the destination is away for 30 s
        local.start_broker(env, "dst", 1)
        t_back = time.monotonic()
        # a little more traffic after the return, then the source is quiet and the mirrors drain
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for d in deliveries:
                assert jobs[d].alive(), f"the {d} mirror job exited during the outage:\n" + jobs[d].tail()
            time.sleep(1)
        for d in deliveries:
            streams[d].stop()
        figs = {}
        for d in deliveries:
            mirrored = wait_for_keys(src.bootstrap, topics[d], dst.bootstrap, f"{topics[d]}.mirror",
                                     streams[d].acked, jobs[d], timeout=300)
            progress[d].stop()
            figs[d] = figures(f"destination broker down 30 s ({d})", streams[d].acked, mirrored,
                              progress[d].stall_after(t_stop))
            figs[d]["pause_after_back_s"] = progress[d].stall_after(t_back)
            print(f"  {d}: after the broker was back, the longest pause was "
                  f"{figs[d]['pause_after_back_s']:.1f}s", flush=True)
        # back within a minute and a half (1-2 s in most runs): records in flight when the broker went down
        # held an at-least-once mirror for librdkafka's whole 300 s delivery timeout once
        # (replicate.GAPLESS_MESSAGE_TIMEOUT_S)
        for d in deliveries:
            assert figs[d]["pause_after_back_s"] < 90, (d, figs[d])
        assert figs["exactly_once"]["lost"] == 0
        assert figs["exactly_once"]["duplicated"] == 0
        assert figs["at_least_once"]["lost"] == 0
    finally:
        for d in deliveries:
            progress[d].stop()
            streams[d].halt()
        for job in jobs.values():
            job.stop()
        restart_stopped_brokers(env)


def test_source_broker_restarted(own_clusters, tmp_path, unique):
    env, spec = own_clusters
    src, dst = spec.sides
    topic = unique("srcrestart")
    stream = RecordStream(src.bootstrap, topic, PARTITIONS, rate=150)
    job = None
    progress = Progress(dst.bootstrap, f"{topic}.mirror")
    try:
        job = start_mirror(tmp_path, src.bootstrap, dst.bootstrap, topic, "exactly_once")
        stream.start()
        wait_for_count(dst.bootstrap, f"{topic}.mirror", 300, job, timeout=240)
        progress.start()
        t_stop = time.monotonic()
        local.stop_broker(env, "src", 1)
        local.start_broker(env, "src", 1)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            assert job.alive(), "the mirror job exited after the source restart:\n" + job.tail()
            time.sleep(1)
        stream.stop(give_up_after=120)
        # records that certainly exist only after the restart, from a producer of their own (the stream's may
        # have given up): the mirror must read the restarted broker, not only what it held before
        after = list(range(10_000_000, 10_000_000 + 200))
        late = Producer({"bootstrap.servers": src.bootstrap, "acks": "all", "log_level": 0})
        for k in after:
            late.produce(topic, key=str(k).encode(), value=str(k).encode(), partition=k % PARTITIONS)
        assert late.flush(60) == 0, "the restarted source broker did not take new records"
        expected = stream.acked + after
        mirrored = wait_for_keys(src.bootstrap, topic, dst.bootstrap, f"{topic}.mirror", expected, job,
                                  timeout=300)
        progress.stop()
        fig = figures("source broker restarted (exactly_once)", expected, mirrored, progress.stall_after(t_stop))
        assert fig["lost"] == 0 and fig["duplicated"] == 0
    finally:
        progress.stop()
        stream.halt()
        if job is not None:
            job.stop()
        restart_stopped_brokers(env)


def test_three_broker_destination_loses_a_broker_mid_stream(tmp_path, unique):
    """A 3-broker destination, topics RF 3 with min.insync.replicas=2; one broker SIGKILLed mid-stream."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    env = local.LocalEnv.from_environment(tmp_path / "clusters")
    spec = local.free_spec(src_brokers=1, dst_brokers=3, registries=False)
    job = None
    topic = unique("rf3")
    try:
        local.up(env, spec, progress=lambda m: print(f"[faults] {m}", flush=True))
        src, dst = spec.sides
        admin = AdminClient({"bootstrap.servers": src.bootstrap})
        create_topics(admin, [NewTopic(topic, PARTITIONS, 1)])
        cfg = tmp_path / "mirror.yaml"
        cfg.write_text(group_yaml(src.bootstrap, dst.bootstrap, "faults", topic, tmp_path).replace(
            "replication_factor: {type: fix, value: 1}", "replication_factor: {type: fix, value: 3}"))
        stream = RecordStream(src.bootstrap, topic, PARTITIONS, rate=150)
        job = MirrorJob(cfg, "faults", tmp_path / "job.log")
        stream.start()
        wait_for_count(dst.bootstrap, f"{topic}.mirror", 300, job, timeout=300)
        dadmin = AdminClient({"bootstrap.servers": dst.bootstrap})
        md = dadmin.list_topics(timeout=10).topics
        resources = [ConfigResource(ResourceType.TOPIC, t, incremental_configs=[
            ConfigEntry("min.insync.replicas", "2", incremental_operation=AlterConfigOpType.SET)])
            for t in (f"{topic}.mirror", "mirrorflow-offset-syncs.src.internal") if t in md]
        for fut in dadmin.incremental_alter_configs(resources).values():
            fut.result(30)
        assert all(len(p.replicas) == 3 for p in md[f"{topic}.mirror"].partitions.values())
        progress = Progress(dst.bootstrap, f"{topic}.mirror").start()
        t_kill = time.monotonic()
        local.stop_broker(env, "dst", 2, kill=True)  # a crash, not a controlled shutdown
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert job.alive(), "the mirror job exited after the broker died:\n" + job.tail()
            time.sleep(1)
        stream.stop()
        mirrored = wait_for_keys(src.bootstrap, topic, dst.bootstrap, f"{topic}.mirror", stream.acked, job,
                                  timeout=300)
        progress.stop()
        fig = figures("3-broker destination RF 3 min.insync 2, one broker killed (exactly_once)", stream.acked,
                      mirrored, progress.stall_after(t_kill))
        assert fig["lost"] == 0 and fig["duplicated"] == 0
        # the cluster lost one broker of three: the mirror goes on once the broker is fenced (about 10-20 s
        # here), not after the 5 minutes a client that took the dead broker for the controller waits
        assert fig["stall_s"] < 120, fig
    finally:
        if job is not None:
            job.stop()
        local.down(env)
