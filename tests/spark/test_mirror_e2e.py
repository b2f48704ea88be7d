"""The Spark mirror end to end on real clusters and registries."""

from __future__ import annotations

import ast
import json
import os
import signal
import struct
import subprocess
import sys
import time
from io import BytesIO
from pathlib import Path

import pytest
import yaml
from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from mirror_core.config import parse_config
from mirror_core.topics import create_topics

pytestmark = [pytest.mark.spark, pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]

V1 = {"type": "record", "name": "Evt", "namespace": "e2e", "fields": [{"name": "id", "type": "long"}]}
V2 = {**V1, "fields": V1["fields"] + [{"name": "tag", "type": "string", "default": ""}]}
V3 = {**V2, "fields": V2["fields"] + [{"name": "n", "type": ["null", "long"], "default": None}]}


def group_yaml(clusters, tmp_path, topic, delivery="exactly_once", value_serde="avro", extra="", spark=""):
    text = clusters.config_yaml(f"""
groups:
  - name: e2e{abs(hash(topic)) % 10**6}
    source: src
    destination: dst
    delivery: {delivery}
    serdes: {{key: bytes, value: {value_serde}}}
    offset_syncs_topic: "{topic}.syncs.internal"
    dead_letter_topic: "{topic}.dlq"
    topics_mirroring:
      partition_count: {{type: mirror_source}}
      replication_factor: {{type: fix, value: 1}}
    spark: {{master: "local[2]", trigger: "1 second", checkpoint_dir: "{tmp_path / 'ckpt'}"{spark}}}
{extra}
    mirrors:
      - source_topic: {topic}
        destination_topic: {topic}.mirror
""")
    path = tmp_path / "mirrors.yaml"
    path.write_text(text)
    return path, parse_config(yaml.safe_load(text), env={})


def create_topic(bootstrap, topic, partitions):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(topic, partitions, 1)])


def avro(schema_id, parsed, rec):
    buf = BytesIO()
    schemaless_writer(buf, parsed, rec)
    return b"\x00" + struct.pack(">I", schema_id) + buf.getvalue()


def read_all(bootstrap, topic, timeout=90):
    """Every committed record of ``topic``, per partition, in order (read_committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time_ns()}",
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    md = c.list_topics(topic, timeout=10).topics[topic]
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
    c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    out: dict[int, list] = {p: [] for p in md.partitions}
    deadline = time.monotonic() + timeout
    last_got = time.monotonic()
    while time.monotonic() < deadline:
        # consume() waits its whole timeout unless the 2000 records are there: a short wait, checked often
        batch = c.consume(2000, 0.2)
        got = [m for m in batch if not m.error()]
        for m in got:
            out[m.partition()].append(m)
        positions = {tp.partition: tp.offset for tp in c.position([TopicPartition(topic, p) for p in ends])}
        # a partition is done at its end; trailing transaction markers never show up as records,
        # so several idle seconds in a row also end the read
        if all(end == 0 or positions[p] >= end for p, end in ends.items()):
            break
        if got:
            last_got = time.monotonic()
        seen = any(out.values())
        if time.monotonic() - last_got >= (5 if seen else 30):  # a cold consumer may take a while to fetch
            break
    c.close()
    return out


def run_once(config_path, group_name, timeout=300):
    proc = subprocess.run([sys.executable, "-m", "spark_jobs.mirror_stream", str(config_path), "--group",
                           group_name, "--once"], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def counted(proc, group_name) -> dict[tuple[str, str], float]:
    """``{(counter, mirror): value}``: the samples the job's /metrics served when it ended, from the line the job
    logs then (``mirrorflow_records_dead_lettered_total{mirror="..."} 2.0; ...``)."""
    import re

    lines = re.findall(rf"{re.escape(group_name)}: counted by this run: (.*)", proc.stderr)
    assert len(lines) == 1, proc.stderr[-3000:]
    return {(name, mirror): float(value)
            for name, mirror, value in re.findall(r'(mirrorflow_\w+_total)\{mirror="([^"]+)"\} ([^;\s]+)', lines[0])}


@pytest.mark.parametrize("written_by", ["driver", "tasks", "direct", "executors", "executors-driver",
                                        "executors-share"])
def test_end_to_end_exact_copy_with_schema_translation_and_dead_letters(clusters, unique, tmp_path, written_by):
    """Both writing paths of Spark's read path (``read_path: spark``, a cluster master's default): small batches
    written by the driver, large ones by one task per partition (forced here with ``driver_batch_max_records:
    0``); the direct read path (the default on a local master: Spark plans, the driver reads the ranges
    itself, and each writer process commits one transaction per batch, ``transactions: auto``); and
    ``read_path: executors`` (what ``auto`` takes on a cluster master: Spark plans, its tasks read their shares of
    a large batch's ranges with mirrorflow's reader and write them; a small batch, as a running mirror's, the
    driver reads and writes; with ``transactions: per_writer``, a transaction per task share). Every copy must be
    the same byte for byte."""
    topic = unique("e2e")
    create_topic(clusters.src_bootstrap, topic, 3)
    src_sr = SchemaRegistryClient({"url": clusters.src_registry})
    # make the source ids differ from what the destination will assign
    src_sr.register_schema(unique("padding") + "-value", Schema(json.dumps({"type": "string"}), "AVRO"))
    ids = [src_sr.register_schema(f"{topic}-value", Schema(json.dumps(s), "AVRO")) for s in (V1, V2, V3)]
    parsed = [parse_schema(s) for s in (V1, V2, V3)]
    p = Producer({"bootstrap.servers": clusters.src_bootstrap, "enable.idempotence": True})
    # an hour ago: well inside the topics' retention (timestamps days old are deleted by the brokers'
    # retention check, every 5 minutes, whenever it runs between the produce and the read)
    base_ts = int(time.time() * 1000) - 3_600_000
    expected = []  # (partition, key, source value, timestamp, headers, the value's record as decoded)
    for i in range(300):
        v = i % 3
        rec = {"id": i, "tag": f"t{i}", "n": i}
        value = None if i % 50 == 49 else avro(ids[v], parsed[v], rec)  # tombstones
        key = None if i % 7 == 0 else f"k{i}".encode()
        headers = [("h", str(i).encode()), ("empty", b"")]
        ts = base_ts + i
        p.produce(topic, key=key, value=value, partition=i % 3, headers=headers, timestamp=ts)
        fields = [f["name"] for f in (V1, V2, V3)[v]["fields"]]
        expected.append((i % 3, key, value, ts, headers, {f: rec[f] for f in fields}))
    # a record whose schema id the source registry does not know: dead-lettered, the rest goes on
    bad = b"\x00" + struct.pack(">I", 987654) + b"\x02"
    p.produce(topic, key=b"bad", value=bad, partition=1, timestamp=base_ts + 1000)
    after_bad = avro(ids[0], parsed[0], {"id": 1000})
    p.produce(topic, key=b"after-bad", value=after_bad, partition=1, timestamp=base_ts + 1001)
    expected.append((1, b"after-bad", after_bad, base_ts + 1001, [], {"id": 1000}))
    assert p.flush(30) == 0
    # an aborted transaction on the source: none of it may reach the destination
    tp = Producer({"bootstrap.servers": clusters.src_bootstrap, "transactional.id": unique("tx")})
    tp.init_transactions(30)
    tp.begin_transaction()
    for i in range(10):
        tp.produce(topic, key=b"aborted", value=b"x", partition=i % 3)
    tp.flush(30)
    tp.abort_transaction(30)

    spark = {"driver": ", read_path: spark", "tasks": ", read_path: spark, driver_batch_max_records: 0",
             "direct": "",  # the direct path is the default (read_path: auto) on a local master
             "executors": ", read_path: executors, driver_batch_max_records: 0",
             "executors-driver": ", read_path: executors",
             "executors-share": ", read_path: executors, driver_batch_max_records: 0, transactions: per_writer"
             }[written_by]
    path, cfg = group_yaml(clusters, tmp_path, topic, spark=spark)
    proc = run_once(path, cfg.groups[0].name)
    if written_by == "direct":
        # the defaults on a local master: read directly, a transaction per writer process and batch
        assert "'written_by': 'driver', 'read_by': 'direct', 'transactions': 'per_writer'" in proc.stderr + proc.stdout
    elif written_by.startswith("executors"):
        # mirrorflow's reader (not Spark's source), in the tasks or the driver, and a transaction per partition
        # (or per task share)
        by = "driver" if written_by == "executors-driver" else "tasks"
        per = "per_writer" if written_by == "executors-share" else "per_partition"
        assert f"'written_by': '{by}', 'read_by': 'direct', 'transactions': '{per}'" in proc.stderr + proc.stdout
    else:
        assert (f"'written_by': '{written_by}', 'read_by': 'spark', 'transactions': 'per_partition'"
                in proc.stderr + proc.stdout)

    got = read_all(clusters.dst_bootstrap, f"{topic}.mirror")
    dst_sr = SchemaRegistryClient({"url": clusters.dst_registry})
    for part in range(3):
        want = [e for e in expected if e[0] == part]
        have = got[part]
        assert len(have) == len(want), f"partition {part}: {len(have)} != {len(want)}"
        for (wp, wkey, wvalue, wts, wheaders, wrecord), m in zip(want, have, strict=True):
            assert m.key() == wkey and m.timestamp()[1] == wts and m.partition() == wp
            assert (m.headers() or []) == wheaders  # the source's headers, in order, empty values kept
            if wvalue is None:
                assert m.value() is None
                continue
            src_id, dst_id = struct.unpack(">I", wvalue[1:5])[0], struct.unpack(">I", m.value()[1:5])[0]
            assert m.value()[5:] == wvalue[5:]  # only the id bytes changed
            src_schema = json.loads(src_sr.get_schema(src_id).schema_str)
            dst_schema = json.loads(dst_sr.get_schema(dst_id).schema_str)
            assert parse_schema(src_schema) == parse_schema(dst_schema)
            # a destination consumer decodes, with the destination's schema, exactly the record produced
            assert schemaless_reader(BytesIO(m.value()[5:]), parse_schema(dst_schema), None) == wrecord
    assert not any(m.key() == b"aborted" for ms in got.values() for m in ms)
    dlq = read_all(clusters.dst_bootstrap, f"{topic}.dlq")
    dead = [m for ms in dlq.values() for m in ms]
    assert len(dead) == 1 and dead[0].key() == b"bad" and dead[0].value() == bad
    h = dict(dead[0].headers())
    assert h["mirrorflow.error.reason"] == b"unknown_schema_id"
    assert h["mirrorflow.source.topic"] == topic.encode() and h["mirrorflow.source.partition"] == b"1"
    assert h["mirrorflow.source.offset"] == str(300 // 3).encode()  # after partition 1's 100 records
    assert b"987654" in h["mirrorflow.error.detail"] and h["mirrorflow.mirror"] == \
        f"{cfg.groups[0].name}__{topic}__{topic}.mirror".encode()

    # the mirror's consumer group on the source shows it caught up
    c = Consumer({"bootstrap.servers": clusters.src_bootstrap, "group.id": f"{cfg.groups[0].name}.mirrorflow."
                  f"{topic}__{topic}.mirror"})
    committed = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    ends = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(3)]
    c.close()
    assert [tp.offset for tp in committed] == ends, (committed, ends)

    # a second drain mirrors nothing again (exactly once across runs)
    second = run_once(path, cfg.groups[0].name)
    assert _dst_count(clusters.dst_bootstrap, f"{topic}.mirror") == sum(len(v) for v in got.values()) + 3, \
        second.stderr[-3000:]  # + one commit marker per partition from the first run


def _reader(bootstrap, isolation, name, **conf):
    """A quiet consumer reading with ``isolation``, in a group of its own that it never joins or commits to."""
    return Consumer({"bootstrap.servers": bootstrap, "group.id": f"{name}-{time.time_ns()}",
                     "isolation.level": isolation, "enable.auto.commit": False, "log_level": 3, **conf})


def _watermarks(bootstrap, topic, isolation):
    """A consumer whose ``get_watermark_offsets`` gives the high watermark (read_uncommitted) or the last
    stable offset (read_committed) of ``topic``'s partitions."""
    return _reader(bootstrap, isolation, "marks")


def _open_transactions(hw_reader, lso_reader, topic):
    """{partition: last stable offset} of the partitions of ``topic`` where a transaction is open now (the
    LSO is the first offset of the oldest open transaction)."""
    md = hw_reader.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error:
        return {}
    out = {}
    for p in md.partitions:
        tp = TopicPartition(topic, p)
        try:
            lso = lso_reader.get_watermark_offsets(tp, timeout=10)[1]
            hw = hw_reader.get_watermark_offsets(tp, timeout=10)[1]
        except KafkaException:  # a topic just created (no leader yet): nothing known, ask again
            return {}
        if hw > lso:
            out[p] = lso
    return out


def _lso_sum(lso_reader, topic):
    """The sum of ``topic``'s partitions' last stable offsets (records committed so far); 0 while the topic
    does not exist. Raises KafkaException while a partition has no leader (a topic just created)."""
    md = lso_reader.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error:
        return 0
    return sum(lso_reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions)


def _committed_total(lso_reader, topic):
    """Records committed on ``topic`` so far; 0 while the topic does not exist or has no leader yet."""
    try:
        return _lso_sum(lso_reader, topic)
    except KafkaException:
        return 0


def _data_offsets(bootstrap, topic, isolation):
    """{partition: offsets of the data records} of ``topic`` read with ``isolation`` (transaction markers
    never show; read_uncommitted also returns the records of aborted transactions)."""
    c = _reader(bootstrap, isolation, "offsets", **{"enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in md.partitions}
        out: dict[int, set[int]] = {p: set() for p in md.partitions}
        c.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 180
        while len(done) < len(ends):
            assert time.monotonic() < deadline, f"reading {topic} ({isolation}) did not reach {ends}"
            for m in c.consume(5000, 1.0):
                if m.error():
                    continue
                out[m.partition()].add(m.offset())
            for tp in c.position([TopicPartition(topic, p) for p in ends]):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
        return out
    finally:
        c.close()


def _hold_foreign_transactions(bootstrap, topic, txid, stop, hold_s=8.0):
    """Another writer (as another group's job sharing the sync topic): a transaction with one sync of
    another topic open on ``topic``'s partition 0 for ``hold_s`` at a time, until ``stop`` is set."""
    from mirror_core.offsets import OffsetSync

    admin = AdminClient({"bootstrap.servers": bootstrap})
    while not stop.is_set() and topic not in admin.list_topics(timeout=10).topics:
        stop.wait(0.2)  # the first job provisions the sync topic
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid, "transaction.timeout.ms": 60000,
                  "log_level": 3})
    p.init_transactions(30)
    n = 0
    while not stop.is_set():
        p.begin_transaction()
        sync = OffsetSync(f"{txid}-other", 0, n, n)
        p.produce(topic, key=sync.key_bytes(), value=sync.value_bytes(), partition=0)
        p.flush(30)
        stop.wait(hold_s)  # the transaction stays open this long (or until the test ends)
        p.commit_transaction(30)
        n += 1


def _stream_source(bootstrap, topic, stop_file):
    """A steady stream into ``topic``'s 3 partitions (about 1,500 records/s, key = value = the record's number)
    until ``stop_file`` exists and at least 20,000 were written; the process prints how many it wrote."""
    script = f"""
import os, time
from confluent_kafka import Producer
p = Producer({{"bootstrap.servers": "{bootstrap}", "enable.idempotence": True, "linger.ms": 20}})
i = 0
while not os.path.exists({str(stop_file)!r}) or i < 20000:
    for _ in range(150):
        while True:
            try:
                p.produce("{topic}", key=str(i).encode(), value=str(i).encode() * 3, partition=i % 3)
                break
            except BufferError:
                p.poll(0.05)
        i += 1
    p.poll(0)
    time.sleep(0.1)
p.flush(60)
print(i)
"""
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def _stop_all(job, producer, stop_file):
    """After a kill test, pass or fail: the streaming job (if one still runs) and the source stream end."""
    if job is not None:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        job.wait(30)
    stop_file.touch()
    if producer.poll() is None:
        producer.kill()


def _written_against_spark(query_dir: Path) -> dict[tuple[str, int], tuple[int, int, int]]:
    """What a killed job left in Spark's checkpoint and in the mirror's written log: for each partition,
    ``(written up to, the end of the batch before Spark's newest recorded one, the end of that newest one)``.
    Without ``spark.overlap_writes`` the first is never below the last (Spark records a batch as done once
    written); with it, the newest batch's write may have been cut short, never the one before it (one batch
    is written at a time) unless the newest is a restarted job's first batch, which reads from where the log
    stood when the job started. Empty before the first batch or written-log entry."""
    from mirror_core.stream import LocalCheckpointFiles, WrittenLog, read_batch_end_offsets

    commits = [int(f.name) for f in (query_dir / "commits").glob("[0-9]*")]
    written = WrittenLog(str(query_dir), LocalCheckpointFiles()).last()  # the newest entry the kill did not tear
    if not commits or written is None:
        return {}
    newest = read_batch_end_offsets(str(query_dir), max(commits))
    before = read_batch_end_offsets(str(query_dir), max(commits) - 1)
    return {(t, p): (written[t][p], before.get(t, {}).get(p, 0), end) for t, parts in newest.items()
            for p, end in parts.items() if p in written.get(t, {})}


def _committed_past_spark(bootstrap, topic, query_dir):
    """{partition: (the source offset after the newest record committed on the destination ``topic``, the end
    of the newest batch Spark planned)}: a first value past the second means the job wrote and committed
    records beyond what Spark's offset log knows of (``spark.keep_writing_for``). The stream's record ``i``
    lies at source offset ``i // 3`` of partition ``i % 3`` (one idempotent producer, no transactions)."""
    from mirror_core.stream import read_batch_end_offsets

    planned = [int(f.name) for f in (query_dir / "offsets").glob("[0-9]*")]
    ends = read_batch_end_offsets(str(query_dir), max(planned)) if planned else {}
    if not ends:
        return {}
    c = _reader(bootstrap, "read_committed", "past", **{"enable.partition.eof": True})
    out = {}
    try:
        for p, end in next(iter(ends.values())).items():
            try:
                lso = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            except KafkaException:
                continue  # no leader yet: nothing committed there
            if lso == 0:
                continue
            c.assign([TopicPartition(topic, p, max(0, lso - 2000))])
            last, deadline = None, time.monotonic() + 10
            while time.monotonic() < deadline:
                m = c.poll(0.5)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        break
                    continue
                if m.offset() < lso:
                    last = m
            if last is not None:
                out[p] = (int(last.key()) // 3 + 1, end)
    finally:
        c.close()
    return out


def _open_for_a_second(hw_reader, lso_reader, topic):
    """{partition: first offset of the open transaction} of the transactions open on ``topic`` now and
    still open, at the same offset, a second later (a commit sent just before completes within
    milliseconds; one still open a second later is held open by its writer)."""
    open_now = _open_transactions(hw_reader, lso_reader, topic)
    settle = time.monotonic() + 1.0
    while open_now and time.monotonic() < settle:
        time.sleep(0.1)  # observing the offsets for a second
        again = _open_transactions(hw_reader, lso_reader, topic)
        open_now = {p: off for p, off in open_now.items() if again.get(p) == off}
    return open_now


def _kill_mid_transaction(clusters, path, gname, dst_topic, producer, stop_file, holder, query_dir,
                          past_spark=False, env=None):
    """Start the streaming job and SIGKILL it while a transaction of it is open on the destination, until
    3 kills are proven mid-transaction; then stop the source producer. Starts ``holder`` after the 2nd.

    A transaction of a short batch is open for milliseconds, less than it takes to ask the broker for every
    partition's offsets, so the job is caught first: the moment a read_uncommitted watcher sees a record
    just written, the job's processes are frozen (SIGSTOP); if a transaction of theirs is then open and
    stays open for a second, they are killed (SIGKILL) in that state — the state a kill at the moment of
    the freeze leaves — otherwise they go on (SIGCONT) and the watch goes on.
    ``past_spark``: kill only once the job has been seen with records committed past the newest batch Spark
    had planned (:func:`_committed_past_spark`). Returns (records produced, jobs started, {partition: first
    offset of the open transaction} per kill, seconds, and per kill :func:`_written_against_spark` of
    ``query_dir``, the query's checkpoint)."""
    hw_reader = _watermarks(clusters.dst_bootstrap, dst_topic, "read_uncommitted")
    lso_reader = _watermarks(clusters.dst_bootstrap, dst_topic, "read_committed")
    watcher = _reader(clusters.dst_bootstrap, "read_uncommitted", "watch", **{"fetch.wait.max.ms": 5})
    kills: list[dict[int, int]] = []
    checkpoints: list[dict[tuple[str, int], tuple[int, int, int]]] = []
    attempts = 0
    job = None
    t0 = time.monotonic()

    def watch_from_the_end():
        md = hw_reader.list_topics(dst_topic, timeout=10).topics[dst_topic]
        watcher.assign([TopicPartition(dst_topic, p, OFFSET_END) for p in md.partitions])

    try:
        while len(kills) < 3:
            attempts += 1
            assert attempts <= 6, f"only {len(kills)} kills in {attempts - 1} jobs"
            job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", gname],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True, env=env)
            # wait until this job has committed something, then catch it with a transaction open and kill it
            base = _committed_total(lso_reader, dst_topic)
            deadline = time.monotonic() + 180
            past = not past_spark  # once seen it holds for the batch's span (5 s): not asked again (slow)
            committed = False  # once this job has committed something (asked until then)
            freezes = 0
            while True:
                assert job.poll() is None, f"the streaming job exited with {job.returncode}"
                assert time.monotonic() < deadline, \
                    f"the job was not caught with a transaction open in 180 s ({freezes} freezes)"
                committed = committed or _committed_total(lso_reader, dst_topic) > base
                if not committed:
                    time.sleep(0.05)  # polling the brokers' offsets
                    continue
                past = past or any(w > e for w, e in _committed_past_spark(
                    clusters.dst_bootstrap, dst_topic, query_dir).values())
                if not past:
                    continue
                watch_from_the_end()
                written = None
                while written is None and time.monotonic() < deadline and job.poll() is None:
                    m = watcher.poll(0.5)
                    written = m if m is not None and not m.error() else None
                if written is None:
                    continue
                os.killpg(job.pid, signal.SIGSTOP)
                freezes += 1
                open_now = _open_for_a_second(hw_reader, lso_reader, dst_topic)
                if open_now:
                    break
                os.killpg(job.pid, signal.SIGCONT)
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
            job = None
            kills.append(open_now)
            checkpoints.append(_written_against_spark(query_dir))
            print(f"kill {len(kills)}: after {freezes} freezes, open at {open_now}", file=sys.stderr)
            if len(kills) == 2 and holder.ident is None:
                holder.start()
        stop_file.touch()
        out, _ = producer.communicate(timeout=300)
        assert producer.returncode == 0
        return int(out.strip()), attempts, kills, time.monotonic() - t0, checkpoints
    finally:
        _stop_all(job, producer, stop_file)
        hw_reader.close()
        lso_reader.close()
        watcher.close()


@pytest.mark.slow
@pytest.mark.parametrize("read_path", ["spark", "direct", "direct-per-writer", "direct-keep", "direct-per-writer-keep",
                                       "direct-per-writer-keep-through"])
def test_exactly_once_survives_sigkill(clusters, unique, tmp_path, read_path):
    """SIGKILL the streaming job 3 times, each time while one of its transactions is open on the
    destination, while records stream in; every record arrives exactly once and in order.

    Each kill is proven to have landed mid-transaction: right after it, a destination partition's last
    stable offset is below its high watermark (a transaction of the dead job is open there), and at the end
    the record at that offset is one a read_uncommitted reader sees and a read_committed reader does not
    (the transaction was aborted when the next job fenced it). The restart after the first kill is a plain
    one; from the second kill on, another writer keeps a transaction open on the offset-sync partition 8 s
    at a time (as another group's job sharing the sync topic does), hiding the job's newest syncs from a
    read_committed lookup (issue 11 item 6): the restarts after it, and the final drain, must still
    resume exactly. With ``read_path: direct`` (``direct``, ``direct-keep``: a transaction per partition) the
    driver reads each batch's ranges itself: a replayed
    batch re-reads the same range from Spark's offset log; with ``overlap_writes`` (on here) a batch's write
    runs on after Spark recorded it, so a kill cuts writes short that no replay would redo, and the restart
    must read them again from the written log: at least one kill must have left such a batch (read from the
    checkpoint's files after each kill), and without the overlap none may. ``direct-per-writer``: each writer
    process commits one transaction per batch for all its partitions (``transactions: per_writer``). The
    ``-keep`` ones run with ``spark.keep_writing_for``: each killed job had committed records past the newest
    batch Spark had planned, which the restart reads again from Spark's offset log and must skip;
    ``-keep-through`` with ``MIRRORFLOW_KEEP_THROUGH_SPARK=1`` (the writer processes write on while Spark plans
    the next batch)."""
    import threading

    topic = unique("eos")
    dst_topic = f"{topic}.mirror"
    create_topic(clusters.src_bootstrap, topic, 3)
    path, cfg = group_yaml(clusters, tmp_path, topic, value_serde="bytes",
                           spark={"spark": ", read_path: spark",
                                  "direct": ", read_path: direct, transactions: per_partition, overlap_writes: true",
                                  "direct-per-writer": ", read_path: direct, transactions: per_writer",
                                  "direct-keep": ", read_path: direct, transactions: per_partition, "
                                                 "keep_writing_for: 5 seconds",
                                  "direct-per-writer-keep": ", read_path: direct, transactions: per_writer, "
                                                            "keep_writing_for: 5 seconds",
                                  "direct-per-writer-keep-through": ", read_path: direct, transactions: per_writer, "
                                                                    "keep_writing_for: 5 seconds"}[read_path])
    gname = cfg.groups[0].name
    stop_file = tmp_path / "stop-producing"
    # a steady stream (about 1,500 records/s) until the kills are done, so every job has work in flight
    producer = _stream_source(clusters.src_bootstrap, topic, stop_file)
    stop_foreign = threading.Event()
    holder = threading.Thread(target=_hold_foreign_transactions, daemon=True,
                              args=(clusters.dst_bootstrap, f"{topic}.syncs.internal", unique("foreign"), stop_foreign))
    try:
        total, jobs, mid_transaction_kills, kills_s, checkpoints = _kill_mid_transaction(
            clusters, path, gname, dst_topic, producer, stop_file, holder, tmp_path / "ckpt" / gname,
            past_spark="-keep" in read_path,
            env=os.environ | {"MIRRORFLOW_KEEP_THROUGH_SPARK": "1"} if read_path.endswith("-through") else None)
        run_once(path, gname, timeout=600)  # the drain, with the foreign transaction still coming and going
    finally:
        stop_foreign.set()
        if holder.ident is not None:
            holder.join(60)
    cut_short = [{tp: w for tp, w in c.items() if w[0] < w[2]} for c in checkpoints]
    print(f"{jobs} jobs, {len(mid_transaction_kills)} killed mid-transaction, {total} records, "
          f"kills {kills_s:.0f} s; recorded by Spark but not written at each kill (written, batch before's "
          f"end, batch end): {cut_short}", file=sys.stderr)
    # one batch is written at a time: at a kill the written log lacks at most the batch being written, and a
    # restarted job's first batch, which reads from where the log stood when it started (the kill before)
    lagging = [{tp: w for tp, w in c.items() if w[0] < min(w[1], before.get(tp, (w[1],))[0])}
               for c, before in zip(checkpoints, [{}, *checkpoints[:-1]], strict=True)]
    assert not any(lagging), f"the written log was behind the batch before the one being written: {lagging}"
    # after the drain the log records everything Spark recorded as done
    drained = _written_against_spark(tmp_path / "ckpt" / gname)
    assert drained and all(w[0] == w[2] for w in drained.values()), f"the written log lags the drain: {drained}"
    if read_path == "direct":  # (the -keep ones write past Spark's batches, but Spark records each once written)
        # overlap_writes: a kill landed in the write of a batch Spark had already recorded as done, which no
        # replay of Spark's would redo; the restart had to read it again from the written log
        assert any(cut_short), f"no kill landed in a write Spark had already recorded: {checkpoints}"
    else:
        # without the overlap Spark records a batch only once it is written
        assert not any(cut_short), cut_short
    got = read_all(clusters.dst_bootstrap, dst_topic, timeout=180)
    keys = [int(m.key()) for ms in got.values() for m in ms]
    assert len(keys) == total, f"{len(keys)} records for {total} produced ({len(keys) - len(set(keys))} duplicates)"
    assert set(keys) == set(range(total))
    for part, ms in got.items():
        ks = [int(m.key()) for m in ms]
        assert ks == sorted(ks), f"partition {part} out of order"
    # every counted kill left an open transaction that was aborted: its first record is there uncommitted only
    committed = _data_offsets(clusters.dst_bootstrap, dst_topic, "read_committed")
    everything = _data_offsets(clusters.dst_bootstrap, dst_topic, "read_uncommitted")
    aborted = {p: everything[p] - committed[p] for p in everything}
    assert committed == {p: {m.offset() for m in ms} for p, ms in got.items()}
    for i, open_at_kill in enumerate(mid_transaction_kills):
        assert any(off in aborted[p] for p, off in open_at_kill.items()), \
            f"kill {i + 1}: the transaction open at {open_at_kill} was not aborted"



@pytest.mark.slow
def test_at_least_once_per_writer_loses_nothing_when_killed(clusters, unique, tmp_path):
    """``at_least_once`` with ``transactions: per_writer`` (the writer processes' partitions share one
    idempotent producer, flushed once for all of them): SIGKILL the streaming job twice while records stream
    in and it writes, then drain. Every record arrives (duplicates are allowed: at-least-once), and each
    partition's records first arrive in their source order."""
    topic = unique("alokill")
    dst_topic = f"{topic}.mirror"
    create_topic(clusters.src_bootstrap, topic, 3)
    path, cfg = group_yaml(clusters, tmp_path, topic, delivery="at_least_once", value_serde="bytes",
                           spark=", read_path: direct, transactions: per_writer")
    gname = cfg.groups[0].name
    stop_file = tmp_path / "stop-producing"
    producer = _stream_source(clusters.src_bootstrap, topic, stop_file)
    job = None
    try:
        for _kill in range(2):
            job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", gname],
                                   cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
            base = _dst_count(clusters.dst_bootstrap, dst_topic)
            deadline = time.monotonic() + 180
            while _dst_count(clusters.dst_bootstrap, dst_topic) < base + 1000:  # this job is writing
                assert job.poll() is None, f"the streaming job exited with {job.returncode}"
                assert time.monotonic() < deadline, "the job wrote nothing in 180 s"
                time.sleep(0.2)
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(30)
            job = None
        stop_file.touch()
        out, _ = producer.communicate(timeout=300)
        assert producer.returncode == 0
        total = int(out.strip())
        run_once(path, gname, timeout=600)
    finally:
        _stop_all(job, producer, stop_file)
    got = read_all(clusters.dst_bootstrap, dst_topic, timeout=180)
    keys = [int(m.key()) for ms in got.values() for m in ms]
    print(f"{total} records, {len(keys) - len(set(keys))} written twice", file=sys.stderr)
    assert set(keys) == set(range(total)), f"{len(set(range(total)) - set(keys))} records lost"
    for part, ms in got.items():
        seen: set[int] = set()
        first = [k for k in (int(m.key()) for m in ms) if not (k in seen or seen.add(k))]
        assert first == sorted(first), f"partition {part}: records first arrived out of order"
        assert all(k % 3 == part for k in first), f"partition {part} holds another partition's records"


def _dst_count(bootstrap, topic):
    """Records committed on ``topic`` (the sum of its last stable offsets); 0 while it does not exist. A topic
    the job has just created may have no leader yet for a moment: ask again until it has (30 s at most)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "count", "isolation.level": "read_committed",
                  "log_level": 3})
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                return _lso_sum(c, topic)
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        c.close()


def test_a_batch_recorded_but_cut_short_is_written_again_on_a_quiet_source(clusters, unique, tmp_path):
    """``spark.overlap_writes``: a job died during the write of a batch Spark had already recorded as done (its
    written log stops at offset 400 of 1,000), and the source then stays quiet. The next ``--once`` run must
    still run that batch again and end with every record on the destination once: waiting for a new record
    to make Spark run a batch would leave them missing. The state is planted after a complete drain, so
    the destination already holds them all and the exactly_once writer must skip, not double, them."""
    from mirror_core.stream import LocalCheckpointFiles, WrittenLog

    topic = unique("cutshort")
    create_topic(clusters.src_bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for i in range(1000):
        p.produce(topic, key=b"%d" % i, value=b"v%d" % i)
    p.flush(30)
    path, cfg = group_yaml(clusters, tmp_path, topic, value_serde="bytes",
                           spark=", read_path: direct, overlap_writes: true")
    gname = cfg.groups[0].name
    run_once(path, gname)
    assert [m.offset() for m in read_all(clusters.dst_bootstrap, f"{topic}.mirror")[0]] == list(range(1000))

    WrittenLog(str(tmp_path / "ckpt" / gname), LocalCheckpointFiles()).add({topic: {0: 400}})
    proc = run_once(path, gname)
    out = proc.stderr + proc.stdout
    assert "was recorded by Spark but not all of it is known written; it runs again" in out, out[-3000:]
    # the batch Spark runs again reads from its own start (0 here, below what was written): what is on the
    # destination is skipped by the writer's committed position, nothing is mirrored twice (the batch may
    # also hold the source cluster's heartbeats, which the group mirrors when another test made them)
    batches = [ast.literal_eval(line.split(f"{gname} batch 0: ", 1)[1]) for line in out.splitlines()
               if f"{gname} batch 0: " in line]
    assert len(batches) == 1, out[-3000:]
    assert batches[0]["records"] >= 1000 and batches[0]["mirrored"] == 0, batches
    assert batches[0]["replayed_skipped"] == batches[0]["records"], batches
    got = read_all(clusters.dst_bootstrap, f"{topic}.mirror")[0]
    assert [m.key() for m in got] == [b"%d" % i for i in range(1000)]  # each once, in order


@pytest.mark.parametrize("delivery,writers", [
    ("exactly_once", "transactions: per_writer"),
    ("exactly_once", "transactions: per_partition, direct_processes: 1"),
    ("at_least_once", "transactions: per_writer"),
    ("at_least_once", "transactions: per_partition, direct_processes: 1"),
], ids=["writer-processes-per-writer", "driver-per-partition", "at-least-once-writer-processes",
        "at-least-once-driver"])
def test_keeping_on_mirrors_a_transactional_source_exactly_and_past_its_markers(
        clusters, unique, tmp_path, delivery, writers):
    """``spark.keep_writing_for`` on the direct read path, kept on by writer processes (each writes what its
    consumer fetched, with no request to the source) or by the driver (up to the source's last stable offsets,
    partition by partition), exactly_once (in transactions) and at_least_once (one shared idempotent producer
    per writer process, or a producer per partition). A source written in transactions, committed and aborted
    ones taking turns while the job keeps writing, the last one aborted: every committed record arrives once
    (nothing failed: at_least_once writes nothing twice either) and in order, no aborted one does, and
    replication lag (what ``mirrorflow lag`` shows, from the offset syncs) reaches 0 while the batch is still
    keeping on: the mirror's positions stand past each partition's last markers, even when a write's range
    held only markers and aborted records (no record to write)."""
    from mirror_core.checkpoint import load_sync_store, topic_mappings
    from mirror_core.health import replication_lag

    topic = unique("keeptxn")
    dst_topic = f"{topic}.mirror"
    create_topic(clusters.src_bootstrap, topic, 3)
    path, cfg = group_yaml(clusters, tmp_path, topic, delivery=delivery, value_serde="bytes",
                           spark=f", read_path: direct, {writers}, keep_writing_for: 60 seconds")
    g = cfg.groups[0]
    p = Producer({"bootstrap.servers": clusters.src_bootstrap, "enable.idempotence": True})
    p.produce(topic, key=b"first", value=b"v", partition=0)
    assert p.flush(30) == 0
    log = tmp_path / "job.log"
    with log.open("wb") as out:
        job = subprocess.Popen([sys.executable, "-m", "spark_jobs.mirror_stream", str(path), "--group", g.name],
                               cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while _dst_count(clusters.dst_bootstrap, dst_topic) < 1:  # the first batch is written: it keeps on
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the first record was not mirrored in 180 s"
            time.sleep(0.2)
        started = time.monotonic()
        tp = Producer({"bootstrap.servers": clusters.src_bootstrap, "transactional.id": unique("src-tx")})
        tp.init_transactions(30)
        want: dict[int, list[bytes]] = {0: [b"first"], 1: [], 2: []}
        for i in range(20):
            tp.begin_transaction()
            for j in range(6):
                key = b"c%d-%d" % (i, j)
                tp.produce(topic, key=key, value=b"v", partition=j % 3)
                want[j % 3].append(key)
            tp.commit_transaction(30)
            tp.begin_transaction()
            for j in range(3):
                tp.produce(topic, key=b"aborted", value=b"x", partition=j)
            tp.flush(30)
            tp.abort_transaction(30)
            time.sleep(0.05)
        tp.begin_transaction()
        for j in range(3):
            tp.produce(topic, key=b"last", value=b"v", partition=j)
            want[j].append(b"last")
        tp.commit_transaction(30)
        time.sleep(1)  # written on its own: the abort's range holds no record
        tp.begin_transaction()
        for j in range(3):
            tp.produce(topic, key=b"aborted", value=b"x", partition=j)
        tp.flush(30)
        tp.abort_transaction(30)
        total = sum(map(len, want.values()))
        while _dst_count(clusters.dst_bootstrap, dst_topic) < total:
            assert job.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the committed records were not all mirrored"
            time.sleep(0.2)
        # the lag the syncs show: 0 on every partition, the source's end past the last abort marker
        lag = None
        while time.monotonic() - started < 50:
            lag = replication_lag(cfg, g, load_sync_store(cfg, g), topic_mappings(cfg, g))
            if all(x.lag_records == 0 for x in lag.partitions):
                break
            time.sleep(0.5)
        assert lag is not None and len(lag.partitions) == 3
        assert all(x.lag_records == 0 and x.mirrored_to == x.source_end for x in lag.partitions), lag.partitions
        assert time.monotonic() - started < 55, "lag reached 0 only after the keep's span, with Spark's batch"
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(120)
    got = read_all(clusters.dst_bootstrap, dst_topic)
    assert {part: [m.key() for m in ms] for part, ms in got.items()} == want
    batches = [ast.literal_eval(line.split(f"{g.name} batch ", 1)[1].split(": ", 1)[1])
               for line in log.read_text().splitlines() if f"{g.name} batch " in line and ": {" in line]
    assert any(b.get("kept_writing") for b in batches), log.read_text()[-3000:]
