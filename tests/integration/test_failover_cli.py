"""`mirrorflow failover` by hand, step by step, without Airflow: the group moves with no gap and no re-read."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mirror_core import clients, joblock, stops
from mirror_core.cli import app
from mirror_core.config import load_config
from tests.dags import support

pytestmark = [pytest.mark.integration, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


def step(s: support.Scenario, name: str, *extra: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", name, "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


def test_failover_by_hand(clusters: Any, unique: Any, tmp_path: Path) -> None:
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=40)
    support.commit_source_group(s, {0: 5, 1: 12})
    cg = ["--consumer-group", s.consumer_group]
    res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "preflight", *cg])
    assert res.exit_code == 1 and "not mirrored yet" in res.output  # nothing mirrored yet: not ready
    assert step(s, "drain")["ok"]
    # a consumer of the group already reads on the destination: not ready
    with support.group_member(s.dst, s.consumer_group, f"{s.topic}.mirror"):
        res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "preflight", *cg])
    assert res.exit_code == 1, res.output
    assert f"consumer group {s.consumer_group!r} has 1 active member(s) on the destination" in res.output, res.output
    assert step(s, "preflight", *cg)["ok"]
    assert step(s, "lag", "--max-lag-records", "0")["details"]["lag_records"] == 0
    assert step(s, "quiet", "--quiet-seconds", "1", "--no-stream")["ok"]
    sync = step(s, "sync", *cg)
    assert sorted((o["partition"], o["source_committed"]) for o in sync["details"]["offsets"]) == [(0, 5), (1, 12)]
    assert step(s, "verify")["details"]["records_verified"] == 40
    # the consumers read on until they were stopped on the source: finalize moves their offsets after them
    support.commit_source_group(s, {0: 9, 1: 15})
    # ... but one still reads there: finalize stops nothing, moves no offset, and says who
    cfg = load_config(s.config)
    with support.group_member(s.src, s.consumer_group, s.topic):
        res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "finalize", "--json",
                                       *cg])
    assert res.exit_code == 1, res.output
    early = json.loads(res.output[res.output.index("{"):])
    assert early["details"]["source_members"] == {s.consumer_group: 1}
    assert f"consumers still run on the source src: {s.consumer_group!r} has 1 active member(s)" in early["summary"]
    assert stops.requested(cfg, cfg.group(s.name)) is None
    assert support.committed(s.dst, s.consumer_group, f"{s.topic}.mirror", 2) == {0: 5, 1: 12}  # where sync put them
    # a job still on the group's checkpoint (one started by hand, say): finalize waits until it has ended
    lock = joblock.lock_path(load_config(s.config).group(s.name).spark.checkpoint_dir, s.name)
    assert lock is not None
    with support.job_holding(lock, 3) as job:
        res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "finalize", "--json",
                                       *cg])
        assert res.exit_code == 0, res.output
        assert job.poll() is not None  # finalize returned only once the job had ended
    assert f"waiting for the job still running on the group's checkpoint to end: a streaming job, pid {job.pid}" \
        in res.output
    fin = json.loads(res.output[res.output.index("{"):])
    assert fin["details"]["stream_stopped"] is True and "stream stopped" in fin["summary"]
    assert fin["details"]["resync"]["ok"] and sorted(
        (o["partition"], o["source_committed"]) for o in fin["details"]["resync"]["offsets"]) == [(0, 9), (1, 15)]
    assert fin["details"]["stop"] == stops.where(cfg, cfg.group(s.name))
    assert (stops.requested(cfg, cfg.group(s.name)) or "").startswith(f"failover of group {s.name} to dst at ")
    assert not list(Path(cfg.group(s.name).spark.checkpoint_dir).glob("*stopped-by-failover"))
    resumed = support.resume_on_destination(s, f"{s.topic}.mirror")
    assert resumed[0] == support.keys(s.src, s.topic, 0, start=9)  # not from 5: no re-read
    assert resumed[1] == support.keys(s.src, s.topic, 1, start=15)
    lag = CliRunner().invoke(app, ["lag", str(s.config), "--group", s.name, "--json"])
    assert lag.exit_code == 0, lag.output
    lagged = json.loads(lag.output[lag.output.index("["):])[0]
    assert lagged["stream_stopped"].startswith(f"failover of group {s.name} to dst at ")
    assert lagged["stream_stop_error"] is None
    lag = CliRunner().invoke(app, ["lag", str(s.config), "--group", s.name])
    assert f"{s.name}: the stream is stopped for good: failover of group {s.name} to dst at " in lag.output
    from mirror_core.lag_samples import lag_sample  # what the Mirrors page shows, from the offset_sync DAG

    assert lag_sample(cfg, cfg.group(s.name))["stream_stopped"].startswith(f"failover of group {s.name} to dst")
    # a stopped group's stream does not start again (it reads its stop on the destination) until resumed
    job = subprocess.run([sys.executable, "-m", "spark_jobs.mirror_stream", str(s.config), "--group", s.name, "--once"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, cwd=ROOT)
    assert job.returncode == 0 and f"{s.name}: not started: failover of group {s.name} to dst at " in job.stdout, \
        job.stdout[-3000:]
    out = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "resume"])
    assert out.exit_code == 0 and f"{s.name}: stop removed (key " in out.output, out.output
    assert stops.requested(cfg, cfg.group(s.name)) is None
    lag = CliRunner().invoke(app, ["lag", str(s.config), "--group", s.name, "--json"])
    assert json.loads(lag.output[lag.output.index("["):])[0]["stream_stopped"] is None


def test_a_sync_places_positions_before_the_first_record_and_moves_only_its_own_groups(
        clusters: Any, unique: Any, tmp_path: Path) -> None:
    """Two things a failover's sync met on real topics. (1) Positions no offset sync covers although nothing
    lies between them and the mirrored records: a group at 0 on a partition that starts with an aborted
    transaction (its first record at 4), on a partition that holds only an aborted transaction, and on an
    empty partition. All three were untranslatable (the sync refused the failover), and the aborted-only
    partition counted as lag that never went (preflight: "not mirrored yet"). (2) The checkpoints topic also
    holds another group's checkpoint (an earlier failover's): the sync of this group must not move that
    group's destination offsets."""
    from confluent_kafka import Producer

    s = support.scenario(clusters, unique, tmp_path, partitions=4, records=0)
    p = Producer({"bootstrap.servers": s.src, "transactional.id": unique("aborted")})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        for part in (0, 2):
            p.produce(s.topic, key=b"gone-%d" % i, value=b"never committed", partition=part)
    assert p.flush(30) == 0  # on the log, then aborted (an abort purges what was not sent yet)
    p.abort_transaction(30)
    s.partitions = 2  # records on partitions 0 and 1 only: 2 holds the aborted records, 3 nothing
    support.produce(s, 40)
    s.partitions = 4
    # the destination topic holds records of its own on partitions 0 and 3 before the mirror writes: the
    # positions placed below are then not all 0
    dst_topic = f"{s.topic}.mirror"
    from confluent_kafka.admin import AdminClient, NewTopic

    from mirror_core.topics import create_topics

    create_topics(AdminClient({"bootstrap.servers": s.dst}), [NewTopic(dst_topic, 4, 1)])
    own = Producer({"bootstrap.servers": s.dst, "enable.idempotence": True})
    for part, n in ((0, 2), (3, 3)):
        for i in range(n):
            own.produce(dst_topic, key=b"own-%d" % i, value=b"written on the destination", partition=part)
    assert own.flush(30) == 0
    assert step(s, "drain")["ok"]
    ends = clients.end_offsets(load_config(s.config).cluster("src"), s.topic)
    assert ends == {0: (0, 24), 1: (0, 20), 2: (0, 4), 3: (0, 0)}  # 3 aborted records and their marker
    assert step(s, "lag", "--max-lag-records", "0")["details"]["lag_records"] == 0

    # another group moved earlier, then rewound on the destination on purpose (to read again)
    other = f"{s.consumer_group}-earlier"
    support.commit(s.src, other, s.topic, {0: 7, 1: 9})
    assert step(s, "sync", "--consumer-group", other)["ok"]
    support.commit(s.dst, other, dst_topic, {0: 0, 1: 0})

    support.commit(s.src, s.consumer_group, s.topic, {0: 0, 1: 12, 2: 0, 3: 0})
    assert step(s, "preflight", "--consumer-group", s.consumer_group)["ok"]
    sync = step(s, "sync", "--consumer-group", s.consumer_group)
    assert sync["ok"], sync["summary"]
    got = {o["partition"]: o["destination_committed"] for o in sync["details"]["offsets"]}
    # 0: the mirror's first record, after the destination's own two; 3: the destination's end
    assert got == {0: 2, 1: 12, 2: 0, 3: 3}, sync["details"]["offsets"]
    resumed = support.resume_on_destination(s, dst_topic)
    assert resumed[0] == support.keys(s.src, s.topic, 0) and len(resumed[0]) == 20  # no aborted record
    assert resumed[1] == support.keys(s.src, s.topic, 1, start=12)
    assert resumed[2] == resumed[3] == []
    assert support.committed(s.dst, other, dst_topic, 2) == {0: 0, 1: 0}  # left where it was put


def test_an_idle_partition_keeps_its_position_past_the_sync_topics_retention(clusters: Any, unique: Any,
                                                                             tmp_path: Path) -> None:
    """A writer syncs a partition only when it writes it, and the sync topic keeps 7 days. The offset round
    writes the newest sync of an idle partition again (here: any age), so when retention removes everything
    before those copies the partition still counts as mirrored and its groups' positions still translate.
    The copies are never a writer's position, and one older than the newest sync changes no history."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    from mirror_core import checkpoint, positions
    from mirror_core.offsets import OffsetSync

    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=40)
    assert step(s, "drain")["ok"]
    cfg = load_config(s.config)
    g = cfg.group(s.name)
    dst_topic = f"{s.topic}.mirror"
    support.produce(s, 1, start=1000)  # a record on partition 0 not mirrored yet: that partition is not idle
    mappings = checkpoint.topic_mappings(cfg, g)
    assert checkpoint.refresh_idle_syncs(cfg, g, mappings, age_s=3600) == 0  # syncs of seconds ago: kept as they are
    assert checkpoint.refresh_idle_syncs(cfg, g, mappings, age_s=0) == 1  # partition 1 only
    # retention takes everything the writer wrote: only the copy is left
    admin = AdminClient({"bootstrap.servers": s.dst})
    end = clients.end_offsets(cfg.cluster("dst"), g.offset_syncs)[0][1]
    admin.delete_records([TopicPartition(g.offset_syncs, 0, end - 1)])[TopicPartition(g.offset_syncs, 0, end - 1)] \
        .result(30)
    support.commit(s.src, s.consumer_group, s.topic, {1: 20})
    # partition 0 (no sync left) counts from its log start: its 21 records; partition 1 (the copy) nothing
    assert step(s, "lag", "--max-lag-records", "100")["details"]["lag_records"] == 21
    store = checkpoint.load_sync_store(cfg, g)
    assert store.latest(s.topic, 1) == OffsetSync(s.topic, 1, 20, 20) and store.latest(s.topic, 0) is None
    assert checkpoint.SourceTranslator(cfg, g, store).translate(s.topic, 1, 20, dst_topic).downstream_offset == 20
    # a writer's lookup passes over the copy: its position was a writer's own, or none
    consumer_config = clients.kafka_config(cfg.cluster("dst"))
    assert positions.last_committed_sync(consumer_config, g.offset_syncs, s.topic, 1, destination=dst_topic) is None
    # a copy of an older sync landing after a newer one (a record arrived meanwhile) rewrites no history
    p = Producer({"bootstrap.servers": s.dst, "enable.idempotence": True})
    old = OffsetSync(s.topic, 1, 5, 5)
    p.produce(g.offset_syncs, key=old.key_bytes(), value=old.value_bytes(), partition=0,
              headers=positions.sync_headers(dst_topic) + [(positions.REFRESH_HEADER, b"1")])
    assert p.flush(30) == 0
    assert checkpoint.load_sync_store(cfg, g).latest(s.topic, 1) == OffsetSync(s.topic, 1, 20, 20)
    # a newest sync beyond the source's end (written for an earlier incarnation of a re-created topic) is not
    # kept alive: the old history goes with the retention
    ahead = OffsetSync(s.topic, 1, 50, 50)
    p.produce(g.offset_syncs, key=ahead.key_bytes(), value=ahead.value_bytes(), partition=0,
              headers=positions.sync_headers(dst_topic))
    assert p.flush(30) == 0
    assert checkpoint.load_sync_store(cfg, g).latest(s.topic, 1) == ahead
    assert checkpoint.refresh_idle_syncs(cfg, g, mappings, age_s=0) == 0
