"""Data-path features on real clusters: regex flows discovered while running, metrics, heartbeats,
two-way provenance, schema ids in headers, oversized records, on_error: fail, at-least-once."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from test_mirror_e2e import ROOT, counted, create_topic, read_all, run_once  # tests/spark is on sys.path

from mirror_core import clients
from mirror_core.config import ClusterConfig, parse_config
from mirror_core.offsets import Heartbeat, OffsetSync
from mirror_core.replicate import (
    PROVENANCE_HEADER,
    PartitionWriter,
    SchemaIdTranslator,
    WriterSettings,
    last_committed_sync,
)
from mirror_core.topics import create_topics, wait_for_leaders

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def write_config(clusters, tmp_path: Path, groups: str, name: str = "mirrors.yaml"):
    text = clusters.config_yaml(groups)
    path = tmp_path / name
    path.write_text(text)
    return path, parse_config(yaml.safe_load(text), env={})


def produce(bootstrap: str, topic: str, records: list[tuple[int, bytes | None, bytes | None, list]]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 0})
    for part, key, value, headers in records:
        p.produce(topic, key=key, value=value, partition=part, headers=headers or None)
    assert p.flush(30) == 0


def flat(got: dict) -> list:
    return [m for ms in got.values() for m in ms]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check, timeout: float = 120.0, proc: subprocess.Popen | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"job exited ({proc.returncode}) while waiting for {what}")
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def syncs_of(bootstrap: str, syncs_topic: str, topic: str) -> list[OffsetSync]:
    out = [OffsetSync.from_record(m.key(), m.value()) for m in flat(read_all(bootstrap, syncs_topic, timeout=30))]
    return [s for s in out if s.topic == topic]


# --------------------------------------------------------------------------- continuous job


@pytest.mark.parametrize("read_path", ["spark", "direct"])
def test_regex_flow_discovers_new_topics_while_running_and_serves_metrics(clusters, unique, tmp_path, read_path):
    """One long-running job: a topic created after start is provisioned and mirrored, /metrics counts it.
    With ``read_path: direct`` the new topic's partitions (no start in the offset log) are read from their
    first offset, as Spark's source reads a new partition from ``earliest``."""
    prefix = unique("flow").replace("-", "")
    first, later = f"{prefix}.a", f"{prefix}.b"
    create_topic(clusters.src_bootstrap, first, 2)
    produce(clusters.src_bootstrap, first, [(i % 2, f"a{i}".encode(), b"v", []) for i in range(20)])
    port = free_port()
    path, cfg = write_config(clusters, tmp_path, f"""
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
    spark: {{master: "local[2]", trigger: "1 second", metrics_port: {port}, read_path: {read_path},
             checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - topics: {{include: "{prefix}\\\\..*"}}
""")
    job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", prefix],
                           cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        wait_for(f"src.{first} mirrored",
                 lambda: len(flat(read_all(clusters.dst_bootstrap, f"src.{first}", timeout=10))) == 20
                 if _exists(clusters.dst_bootstrap, f"src.{first}") else False, proc=job)
        # a new matching topic, created while the job runs
        create_topic(clusters.src_bootstrap, later, 3)
        produce(clusters.src_bootstrap, later, [(i % 3, f"b{i}".encode(), f"{i}".encode(), [("h", b"1")])
                                                for i in range(30)])
        wait_for(f"src.{later} provisioned and mirrored",
                 lambda: _exists(clusters.dst_bootstrap, f"src.{later}")
                 and len(flat(read_all(clusters.dst_bootstrap, f"src.{later}", timeout=10))) == 30, proc=job)
        got = read_all(clusters.dst_bootstrap, f"src.{later}")
        assert sorted(len(v) for v in got.values()) == [10, 10, 10]
        assert all(m.headers() == [("h", b"1")] for m in flat(got))

        mirror = f"{prefix}__{later}__src.{later}"

        def scrape() -> str | None:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            line = f'mirrorflow_records_mirrored_total{{group="{prefix}",mirror="{mirror}"}} 30.0'
            return text if line in text else None

        text = wait_for("metrics for the new topic", scrape, timeout=30, proc=job)
        # samples, not only their "# HELP" lines: the mirror's own, with the values this run gives them
        labels = f'{{group="{prefix}",mirror="{mirror}"}}'
        for name in ("mirrorflow_records_dead_lettered_total", "mirrorflow_records_replay_skipped_total",
                     "mirrorflow_records_loop_skipped_total", "mirrorflow_schema_id_cache_misses_total"):
            assert f"{name}{labels} 0.0" in text.splitlines(), name
        assert f"mirrorflow_bytes_mirrored_total{labels} 130.0" in text.splitlines()  # keys + values
        for sample in (f"mirrorflow_replication_latency_ms_count{labels}",
                       f'mirrorflow_batch_duration_seconds_count{{group="{prefix}"}}'):
            counts = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(f"{sample} ")]
            assert len(counts) == 1 and counts[0] >= 1, (sample, counts)
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)  # the driver only: it stops the query, then Spark
        try:
            rc = job.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            raise
        err = job.stderr.read() if job.stderr else ""
    assert rc == 0, err[-3000:]


def _exists(bootstrap: str, topic: str) -> bool:
    """The topic is there and its leaders serve every partition (the mirror may have created it a moment ago:
    until they do, a reader's offset requests fail with NOT_LEADER_FOR_PARTITION)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    t = admin.list_topics(timeout=10).topics.get(topic)
    if t is None or t.error:
        return False
    return not wait_for_leaders(admin, [TopicPartition(topic, p) for p in t.partitions], timeout=0.5)


# --------------------------------------------------------------------------- one drain, many mirrors


@pytest.mark.parametrize("read_path", ["spark", "direct, transactions: per_partition", "direct"])
def test_dead_letters_header_ids_passthrough_heartbeats_and_at_least_once(clusters, unique, tmp_path, read_path):
    g = unique("feat").replace("-", "")
    big, hdr, txt, alo = (f"{g}.big", f"{g}.hdr", f"{g}.txt", f"{g}.alo")
    for t, n in ((big, 2), (hdr, 1), (txt, 1), (alo, 2)):
        create_topic(clusters.src_bootstrap, t, n)
    # the destination accepts at most 2000-byte batches (its own setting: config_exclude keeps it, else provisioning
    # would delete it, the source having Kafka's default)
    dst_admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    create_topics(dst_admin, [NewTopic(f"{big}.m", 2, 1, config={"max.message.bytes": "2000"})])
    # partition 0: small, 10 KB, small; partition 1: only a 10 KB record (a chunk that is all dead letters)
    produce(clusters.src_bootstrap, big, [(0, f"s{i}".encode(), b"x" * 100, []) for i in range(30)]
            + [(0, b"huge", b"y" * 10_000, [("h", b"1")])]
            + [(0, f"t{i}".encode(), b"x" * 100, []) for i in range(30)]
            + [(1, b"huge1", b"z" * 10_000, [])])

    src_sr = SchemaRegistryClient({"url": clusters.src_registry})
    src_sr.register_schema(unique("pad") + "-value", Schema(json.dumps({"type": "string"}), "AVRO"))
    sid = src_sr.register_schema(f"{hdr}-value", Schema(json.dumps({"type": "long"}), "AVRO"))
    guid = b"\x01" + bytes(range(16))
    produce(clusters.src_bootstrap, hdr, [
        (0, b"id", b"\x02", [("__value_schema_id", b"\x00" + struct.pack(">i", sid)), ("o", b"1")]),
        (0, b"guid", b"\x04", [("__value_schema_id", guid)]),
    ])
    looks_framed = b"\x00" + struct.pack(">i", sid) + b"not avro"
    produce(clusters.src_bootstrap, txt, [(0, b"k", looks_framed, [("__value_schema_id", b"\x00\x00\x00\x00\x09")])])
    produce(clusters.src_bootstrap, alo, [(i % 2, f"{i}".encode(), b"v", []) for i in range(40)])

    src_admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    # another test (or the offsets DAG) may have created it
    create_topics(src_admin, [NewTopic("heartbeats", 1, 1, config={"cleanup.policy": "compact"})], exist_ok=True)
    beats = [Heartbeat(g, "dst", 1_700_000_000_000 + i) for i in range(3)]
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for hb in beats:
        p.produce("heartbeats", key=hb.key_bytes(), value=hb.value_bytes(), partition=0)
    assert p.flush(30) == 0

    def group_yaml(ckpt: str) -> str:
        return f"""
groups:
  - name: {g}
    source: src
    destination: dst
    replication_policy: prefix
    serdes: {{key: bytes, value: avro}}
    offset_syncs_topic: "{g}.syncs.internal"
    dead_letter_topic: "{g}.dlq"
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    spark: {{master: "local[2]", trigger: "1 second", checkpoint_dir: "{tmp_path / ckpt}", read_path: {read_path}}}
    mirrors:
      - {{source_topic: {big}, destination_topic: {big}.m, serdes: {{key: bytes, value: bytes}},
          topics_mirroring: {{config_exclude: ['max\\.message\\.bytes']}}}}
      - {{source_topic: {hdr}, destination_topic: {hdr}.m}}
      - {{source_topic: {txt}, destination_topic: {txt}.m, serdes: {{key: string, value: string}}}}
      - {{source_topic: {alo}, destination_topic: {alo}.m, serdes: {{key: bytes, value: bytes}},
          delivery: at_least_once}}
"""
    path, cfg = write_config(clusters, tmp_path, group_yaml("ckpt1"))
    first_run = run_once(path, g)

    # 5. the oversized records are dead letters with their coordinates; everything else arrives once
    got = read_all(clusters.dst_bootstrap, f"{big}.m")
    assert [m.key() for m in got[0]] == [f"s{i}".encode() for i in range(30)] + [f"t{i}".encode() for i in range(30)]
    assert got[1] == []
    dead = flat(read_all(clusters.dst_bootstrap, f"{g}.dlq"))
    # the GUID-framed record (item 10 of issue 11): Apicurio has no GUIDs, so it is dead-lettered with its reason
    assert sorted(m.key() for m in dead) == [b"guid", b"huge", b"huge1"]
    hg = dict(dead[[m.key() for m in dead].index(b"guid")].headers())
    assert hg["mirrorflow.error.reason"] == b"unknown_schema_guid" and hg["__value_schema_id"] == guid
    h = dict(dead[[m.key() for m in dead].index(b"huge")].headers())
    assert h["mirrorflow.error.reason"] == b"record_too_large" and h["h"] == b"1"
    assert (h["mirrorflow.source.topic"], h["mirrorflow.source.partition"], h["mirrorflow.source.offset"]) == \
        (big.encode(), b"0", b"30")
    # ... and counted, per mirror, in the samples /metrics served (mirrorflow_records_dead_lettered_total)
    dead_total, mirrored_total = "mirrorflow_records_dead_lettered_total", "mirrorflow_records_mirrored_total"
    mirror_of = {t: f"{g}__{t}__{t}.m" for t in (big, hdr, txt, alo)}
    runs = counted(first_run, g)
    assert {t: runs.get((dead_total, mirror_of[t]), 0.0) for t in mirror_of} == {big: 2.0, hdr: 1.0, txt: 0.0,
                                                                                 alo: 0.0}  # zeros: not in the line
    assert {t: runs.get((mirrored_total, mirror_of[t])) for t in (big, hdr, txt)} == {big: 60.0, hdr: 1.0, txt: 1.0}
    # 9. the all-dead-letters partition still has a position sync at its end
    syncs = syncs_of(clusters.dst_bootstrap, f"{g}.syncs.internal", big)
    assert any(s.partition == 1 and s.upstream_offset == 1 for s in syncs), syncs

    # 4. ids in headers are translated, payloads untouched; string serde passes through
    dst_sr = SchemaRegistryClient({"url": clusters.dst_registry})
    hm = {m.key(): m for m in flat(read_all(clusters.dst_bootstrap, f"{hdr}.m"))}
    dst_id = struct.unpack(">i", dict(hm[b"id"].headers())["__value_schema_id"][1:])[0]
    assert json.loads(dst_sr.get_schema(dst_id).schema_str) == "long"
    assert hm[b"id"].value() == b"\x02" and hm[b"id"].headers()[1] == ("o", b"1")
    assert b"guid" not in hm  # never passed through with a GUID the destination cannot decode
    tm = flat(read_all(clusters.dst_bootstrap, f"{txt}.m"))
    assert [(m.value(), m.headers()) for m in tm] == [(looks_framed, [("__value_schema_id", b"\x00\x00\x00\x00\x09")])]

    # 7. at-least-once: every record, in order, with offset syncs
    am = read_all(clusters.dst_bootstrap, f"{alo}.m")
    for part in (0, 1):
        assert [int(m.key()) for m in am[part]] == list(range(part, 40, 2))
    alo_syncs = syncs_of(clusters.dst_bootstrap, f"{g}.syncs.internal", alo)
    assert {(s.partition, s.upstream_offset, s.downstream_offset) for s in alo_syncs} >= {(0, 20, 20), (1, 20, 20)}

    # 2. heartbeats are mirrored under the policy's name
    hbs = [Heartbeat.from_record(m.key(), m.value())
           for m in flat(read_all(clusters.dst_bootstrap, "src.heartbeats"))]
    assert [b for b in hbs if b.source_cluster_alias == g] == beats

    # 9. a restart that has lost Spark's checkpoint (a new worker, from the earliest offsets): the
    # exactly-once writers resume from their syncs, nothing is dead-lettered or mirrored twice
    path2, _ = write_config(clusters, tmp_path, group_yaml("ckpt2"), name="again.yaml")
    again_run = run_once(path2, g)
    assert len(flat(read_all(clusters.dst_bootstrap, f"{g}.dlq"))) == 3
    runs = counted(again_run, g)
    assert {t: runs.get((dead_total, mirror_of[t]), 0.0) for t in mirror_of} == dict.fromkeys(mirror_of, 0.0)
    assert {t: runs.get((mirrored_total, mirror_of[t]), 0.0) for t in (big, hdr)} == {big: 0.0, hdr: 0.0}
    again = read_all(clusters.dst_bootstrap, f"{big}.m")
    assert [m.key() for m in again[0]] == [m.key() for m in got[0]] and again[1] == []
    assert len(flat(read_all(clusters.dst_bootstrap, f"{hdr}.m"))) == 1


def test_broker_size_rejection_is_retried_record_by_record(clusters, unique):
    """The destination's limit is unknown to the writer (altered after provisioning): the broker rejects
    whole batches, the transaction is aborted, the limit learned, and only the big record is dead."""
    t = unique("tl")
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    for name, conf in ((f"{t}.m", {"max.message.bytes": "2000"}), (f"{t}.dlq", {}), (f"{t}.syncs", {})):
        create_topics(admin, [NewTopic(name, 1, 1, config=conf)])
    s = WriterSettings(
        group="g", mirror="g__tl", source_alias="src", destination_alias="dst", source_topic=t,
        destination_topic=f"{t}.m", source_partitions=1, destination_partitions=1, delivery="exactly_once",
        key_serde="bytes", value_serde="bytes", on_error="dead_letter", dlq_topic=f"{t}.dlq",
        offset_syncs_topic=f"{t}.syncs", provenance=False,
        producer_config={"bootstrap.servers": clusters.dst_bootstrap})
    from mirror_core.replicate import SourceRecord

    cc = {"bootstrap.servers": clusters.dst_bootstrap}
    w = PartitionWriter(s, SchemaIdTranslator({}), lambda tt, p: last_committed_sync(cc, f"{t}.syncs", tt, p))
    recs = [SourceRecord(t, 0, i, str(i).encode(), b"x" * 10_000 if i == 50 else b"y" * 50, (), int(time.time() * 1000))
            for i in range(100)]
    r = w.write(0, recs)
    assert (r.mirrored, r.dead_lettered) == (99, 1)
    keys = [int(m.key()) for m in read_all(clusters.dst_bootstrap, f"{t}.m")[0]]
    assert keys == [i for i in range(100) if i != 50]
    dead = flat(read_all(clusters.dst_bootstrap, f"{t}.dlq"))
    assert [(m.key(), dict(m.headers())["mirrorflow.error.reason"]) for m in dead] == [(b"50", b"record_too_large")]


# --------------------------------------------------------------------------- failures and loops


def fail_once(clusters, tmp_path: Path, g: str, topic: str, value_serde: str, rf: int,
              on_error: str = "dead_letter") -> subprocess.CompletedProcess:
    """Run a one-mirror group (``topic`` -> ``topic.m``) with ``--once``; it must exit 1."""
    path, _cfg = write_config(clusters, tmp_path, f"""
groups:
  - name: {g}
    source: src
    destination: dst
    serdes: {{key: bytes, value: {value_serde}}}
    on_error: {on_error}
    offset_syncs_topic: "{g}.syncs.internal"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: {rf}}}}}
    spark: {{master: "local[2]", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    proc = subprocess.run([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", g, "--once"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    return proc


def test_on_error_fail_stops_the_job_naming_the_record(clusters, unique, tmp_path):
    g = unique("fail").replace("-", "")
    topic = f"{g}.t"
    create_topic(clusters.src_bootstrap, topic, 1)
    sr = SchemaRegistryClient({"url": clusters.src_registry})
    sid = sr.register_schema(f"{topic}-value", Schema(json.dumps({"type": "long"}), "AVRO"))
    ok = b"\x00" + struct.pack(">i", sid) + b"\x02"
    bad = b"\x00" + struct.pack(">i", 999_999) + b"\x02"  # an id the source registry does not know
    produce(clusters.src_bootstrap, topic, [(0, b"before", ok, []), (0, b"bad", bad, []), (0, b"after", ok, [])])
    proc = fail_once(clusters, tmp_path, g, topic, "avro", rf=1, on_error="fail")
    line = [x for x in proc.stderr.splitlines() if "mirror failed" in x]
    assert line and f"{topic}[0]@1" in line[-1] and "unknown_schema_id" in line[-1], proc.stderr[-3000:]
    # nothing of the chunk was committed: nothing after the bad record (nor before it in the chunk). Read
    # committed records up to the destination's end offset (not "until a slow consumer gives up"); whether
    # the records before the bad one were produced and aborted or never produced, none may be readable
    dst = ClusterConfig(kafka={"bootstrap.servers": clusters.dst_bootstrap})
    ((part, (low, end)),) = clients.end_offsets(dst, f"{topic}.m").items()
    assert [m.key() for m in clients.read_partition(dst, f"{topic}.m", part, low, end)] == []


def test_two_way_identity_does_not_loop(clusters, unique, tmp_path):
    topic = unique("loop")
    create_topic(clusters.src_bootstrap, topic, 1)
    create_topic(clusters.dst_bootstrap, topic, 1)
    produce(clusters.src_bootstrap, topic, [(0, f"s{i}".encode(), b"v", [("h", b"1")]) for i in range(5)])
    produce(clusters.dst_bootstrap, topic, [(0, b"local-dst", b"v", [])])
    g = topic.replace("-", "")

    def grp(name: str, src: str, dst: str) -> str:
        return f"""
  - name: {name}
    source: {src}
    destination: {dst}
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{name}.syncs.internal"
    dead_letter_topic: "{name}.dlq"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    spark: {{master: "local[2]", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}}}"""

    path, _ = write_config(clusters, tmp_path, "groups:" + grp(f"{g}f", "src", "dst") + grp(f"{g}r", "dst", "src"))
    run_once(path, f"{g}f")
    on_dst = read_all(clusters.dst_bootstrap, topic)[0]
    assert [m.key() for m in on_dst] == [b"local-dst"] + [f"s{i}".encode() for i in range(5)]
    assert all(m.headers() == [("h", b"1"), (PROVENANCE_HEADER, b"src")] for m in on_dst[1:])

    run_once(path, f"{g}r")
    on_src = read_all(clusters.src_bootstrap, topic)[0]
    # only the destination's own record came back, tagged; nothing mirrored from src went around
    assert [m.key() for m in on_src] == [f"s{i}".encode() for i in range(5)] + [b"local-dst"]
    assert on_src[-1].headers() == [(PROVENANCE_HEADER, b"dst")]
    # the reverse group's position passed the skipped records (a sync at the partition's end)
    rev = syncs_of(clusters.src_bootstrap, f"{g}r.syncs.internal", topic)
    _, end = _watermarks(clusters.dst_bootstrap, topic)
    assert rev and rev[-1].upstream_offset == end  # past the forward group's commit marker too


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(low), int(high)
    finally:
        c.close()


def test_a_plan_that_cannot_be_carried_out_stops_the_job_before_it_mirrors(clusters, unique, tmp_path):
    """Provisioning runs while Spark starts; its error still stops the job, in one line, before any record moves."""
    g = unique("plan").replace("-", "")
    topic = f"{g}.t"
    create_topic(clusters.src_bootstrap, topic, 1)
    produce(clusters.src_bootstrap, topic, [(0, b"k", b"v", [])])
    proc = fail_once(clusters, tmp_path, g, topic, "bytes", rf=3)
    line = [x for x in proc.stderr.splitlines() if "cannot start the mirror" in x]
    assert line and f"{topic}.m: replication factor 3 is above" in line[-1], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "ckpt" / g / "commits").exists()  # no micro-batch ran


# --------------------------------------------------------------------------- the driver's collect fails


def test_a_failed_collect_falls_back_to_the_tasks_without_duplicates(clusters, unique, tmp_path):
    """The job's documented fallback: when collecting a batch to the driver fails part-way (here after
    the first Arrow batch, which the driver has already written), the tasks write the batch; with
    exactly_once they skip what the driver committed, so every record arrives once."""
    g = unique("collect").replace("-", "")
    topic = f"{g}.t"
    create_topic(clusters.src_bootstrap, topic, 3)
    produce(clusters.src_bootstrap, topic, [(i % 3, f"{i}".encode(), b"v", []) for i in range(150)])
    path, _ = write_config(clusters, tmp_path, f"""
groups:
  - name: {g}
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{g}.syncs.internal"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}}}
    spark: {{master: "local[2]", checkpoint_dir: "{tmp_path / 'ckpt'}", read_path: spark}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    # the job as spark-submit runs it, with the collect stream cut after its first Arrow batch
    code = """
import sys
from spark_jobs import mirror_stream

real = mirror_stream.arrow_batches

def cut_after_first(df):
    it = real(df)
    try:
        yield next(it)
    finally:
        try:
            it.close()
        except Exception:
            pass
    raise OSError("connection reset (injected by the test)")

mirror_stream.arrow_batches = cut_after_first
sys.exit(mirror_stream.main(sys.argv[1:]))
"""
    proc = subprocess.run([sys.executable, "-c", code, str(path), "--group", g, "--once"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = proc.stderr + proc.stdout
    assert "collecting to the driver failed (connection reset (injected by the test)); the tasks write it" in log
    assert "'written_by': 'tasks'" in log and "'written_by': 'driver'" not in log
    got = read_all(clusters.dst_bootstrap, f"{topic}.m")
    assert {p: [int(m.key()) for m in ms] for p, ms in got.items()} == \
        {p: list(range(p, 150, 3)) for p in range(3)}  # all of them, once, in order
