"""``spark.read_path: direct`` without Spark, on the real clusters: the driver reads a micro-batch's ranges
from Spark's offset log (written here as Spark writes it) with its own consumer and writes them through the
same writer. What Spark's path proves end to end (tests/spark) is proven here for the reader's own hard
parts: transaction markers and aborted records inside and at the end of ranges, ranges that continue each
other, a replay of the same batch, and records deleted from the source before they are read."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import direct, native, replicate
from mirror_core.config import parse_config
from mirror_core.direct import DirectReader, Range
from mirror_core.errors import KafkaOperationError
from mirror_core.local import _free_port
from mirror_core.stream import MirrorRuntime
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(topic, partitions, 1)])


def one_group(clusters, name: str, topic: str, tmp_path: Path, delivery: str = "exactly_once", processes: int = 0,
              transactions: str = "per_partition", read_path: str = "direct"):
    text = clusters.config_yaml(f"""
groups:
  - name: {name}
    source: src
    destination: dst
    delivery: {delivery}
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{name}.syncs.internal"
    dead_letter_topic: "{name}.dlq"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{partition_count: {{type: mirror_source}}, replication_factor: {{type: fix, value: 1}}}}
    spark: {{checkpoint_dir: "{tmp_path / 'ckpt'}", read_path: {read_path}, direct_processes: {processes},
             transactions: {transactions}}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.m}}
""")
    cfg = parse_config(yaml.safe_load(text), env={})
    return cfg, cfg.groups[0]


def write_offset_log(rt: MirrorRuntime, batch_id: int, ends: dict[str, dict[int, int]]) -> None:
    """Spark's offset-log file for ``batch_id`` (version, batch metadata, the source's end offsets)."""
    d = Path(rt.checkpoint_dir()) / "offsets"
    d.mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": 0, "batchTimestampMs": int(time.time() * 1000), "conf": {}}
    (d / str(batch_id)).write_text("v1\n" + json.dumps(meta) + "\n"
                                   + json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in ends.items()}))


def write_initial_offsets(rt: MirrorRuntime, starts: dict[str, dict[int, int]]) -> None:
    d = Path(rt.checkpoint_dir()) / "sources" / "0"
    d.mkdir(parents=True, exist_ok=True)
    (d / "0").write_text("v1\n" + json.dumps({t: {str(p): o for p, o in ps.items()} for t, ps in starts.items()}))


def produce_mixed(bootstrap: str, topic: str, txid: str) -> dict[int, list[tuple[int, bytes]]]:
    """Into partitions 0 and 1: plain records, committed and aborted transactions, with headers, null keys
    and values; partition 0 ends with an aborted transaction and partition 1 with a commit marker. Returns
    the committed records per partition as (timestamp, key) in produce order."""
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid})
    tx.init_transactions(30)
    committed: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    ts = int(time.time() * 1000) - 60_000
    n = 0

    def send(p: Producer, part: int, keep: bool, count: int) -> None:
        nonlocal n, ts
        for _ in range(count):
            key = f"k{n}".encode()
            headers = [("h", str(n).encode()), ("nil", None)] if n % 3 == 0 else None
            value = None if n % 11 == 0 else b"v" * (n % 7)
            p.produce(topic, key=key, value=value, partition=part, timestamp=ts, headers=headers)
            if keep:
                committed[part].append((ts, key))
            n += 1
            ts += 1

    def transaction(part: int, commit: bool, count: int) -> None:
        tx.begin_transaction()
        send(tx, part, commit, count)
        tx.flush(30)
        (tx.commit_transaction if commit else tx.abort_transaction)(30)

    for part in (0, 1):
        send(plain, part, True, 5)
        assert plain.flush(30) == 0
        transaction(part, True, 4)
        transaction(part, False, 6)
        send(plain, part, True, 3)
        assert plain.flush(30) == 0
        transaction(part, True, 2)
    transaction(0, False, 5)  # partition 0 ends with aborted records and their marker
    return committed


def ends_of(bootstrap: str, topic: str, parts: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "ends", "isolation.level": "read_committed"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(parts)}
    finally:
        c.close()


@pytest.mark.parametrize(("ahead", "c_loop"), [(10000, True), (1, True), (10000, False), (1, False)])
def test_ranges_end_at_their_end_across_markers_and_aborted_records(clusters, unique, monkeypatch, ahead, c_loop):
    """Every range, cut anywhere (inside an aborted transaction, on a commit marker, at the partition's end
    behind aborted records), returns exactly the committed records inside it, in order, once, with key,
    value, timestamp and headers as a read_committed consumer sees them, and returns without waiting: a
    range's end is reached by offset, not by a count of records. With ``ahead`` 1 a partition is paused as
    soon as one record past its range is kept, and resumed by its next range. The same through the C
    consume loop and through confluent-kafka's ``consume()`` (the loop off, or not built)."""
    monkeypatch.setattr(direct, "AHEAD_RECORDS", ahead)
    if c_loop:
        assert native.available(), native.why_not()  # built by `make venv`; a missing compiler shows here
    else:
        monkeypatch.setattr(native, "_module", None)
    topic = unique("dread")
    create_topic(clusters.src_bootstrap, topic, 2)
    committed = produce_mixed(clusters.src_bootstrap, topic, unique("tx"))
    ends = ends_of(clusters.src_bootstrap, topic, 2)
    cfg, g = one_group(clusters, "dr", topic, Path("/tmp"))
    reader = DirectReader(cfg.cluster("src"), unique("g"))
    try:
        def read(ranges: list[Range]) -> tuple[dict[int, list], float]:
            got: dict[int, list] = {0: [], 1: []}
            done: list[int] = []

            def deliver(r: Range, cols, size=None):
                if cols is None:
                    done.append(r.partition)
                    return
                assert size == direct._size(cols)  # the bytes of keys and values handed over with them
                assert r.start is None or cols.offsets[0] >= r.start
                assert cols.offsets[-1] < r.end
                for i in range(len(cols)):
                    got[r.partition].append((cols.offsets[i], cols.keys[i], cols.values[i], cols.timestamps[i],
                                             cols.headers[i] if cols.headers else ()))
            t0 = time.monotonic()
            reader.read(ranges, deliver)
            assert sorted(done) == sorted(r.partition for r in ranges)
            return got, time.monotonic() - t0

        # the whole partitions from their first offset (a new partition: Spark's "earliest")
        whole, took = read([Range(topic, p, None, ends[p]) for p in (0, 1)])
        assert took < 10
        for p in (0, 1):
            assert [(ts, k) for _, k, _, ts, _ in whole[p]] == committed[p]
        # the same records as a plain read_committed consumer returns them (values, headers incl. None values)
        ref = Consumer({"bootstrap.servers": clusters.src_bootstrap, "group.id": unique("ref"),
                        "isolation.level": "read_committed", "enable.partition.eof": True})
        ref.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
        expect: dict[int, list] = {0: [], 1: []}
        eof: set[int] = set()
        deadline = time.monotonic() + 60
        while len(eof) < 2 and time.monotonic() < deadline:
            for m in ref.consume(100, 0.5):
                if m.error():
                    eof.add(m.partition())
                else:
                    expect[m.partition()].append((m.offset(), m.key(), m.value(), m.timestamp()[1],
                                                  tuple(m.headers() or ())))
        ref.close()
        assert whole == expect
        assert any(h for _, _, _, _, h in whole[0]) and any(v is None for _, _, v, _, _ in whole[0])

        # cut at every offset of partition 0: the two ranges continue each other (the second resumes the
        # consumer where the first stopped) and together give the whole partition, once
        for cut in range(1, ends[0]):
            first, _ = read([Range(topic, 0, 0, cut)])
            second, took = read([Range(topic, 0, cut, ends[0])])
            assert first[0] + second[0] == whole[0], cut
            assert all(o < cut for o, *_ in first[0]) and all(o >= cut for o, *_ in second[0])
            assert took < 10, (cut, took)
        # a batch replayed (the same range again, as after a crash): the same records, read again
        again, _ = read([Range(topic, 0, 3, ends[0])])
        assert again[0] == [x for x in whole[0] if x[0] >= 3]
    finally:
        reader.close()


def read_dst(bootstrap: str, topic: str, parts: int) -> dict[int, list[bytes]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"r{time.time_ns()}", "isolation.level":
                  "read_committed", "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in range(parts)])
    out: dict[int, list[bytes]] = {p: [] for p in range(parts)}
    eof: set[int] = set()
    deadline = time.monotonic() + 60
    while len(eof) < parts and time.monotonic() < deadline:
        for m in c.consume(500, 0.5):
            if m.error():
                eof.add(m.partition())
            else:
                out[m.partition()].append(m.key())
    c.close()
    return out


@pytest.mark.parametrize(("delivery", "processes", "transactions"), [
    ("exactly_once", 2, "per_partition"), ("at_least_once", 2, "per_partition"), ("exactly_once", 1, "per_partition"),
    ("exactly_once", 2, "per_writer"), ("exactly_once", 1, "per_writer"), ("at_least_once", 1, "per_writer")])
def test_direct_batches_mirror_committed_records_once_and_a_replay_adds_nothing(clusters, unique, tmp_path,
                                                                                 delivery, processes, transactions,
                                                                                 monkeypatch):
    """The runtime's direct path batch by batch, as the Spark job drives it (plan, write, after): batch 0
    from the query's initial offsets, batch 1 continuing it, then batch 1 again (a crash after writing and
    before Spark committed it: the replay re-reads the same range). Exactly the committed records arrive,
    in order; exactly_once writes the replay's records not again (skipped by position). With two writer
    processes each partition is written by its own process; with one, by the driver. With ``per_writer``
    transactions one transaction holds both partitions (at_least_once: the writer's one idempotent producer
    writes both; checked in the driver: no per-partition producer); in the driver its transactions are cut
    every 7 records, so partitions are cut mid-range too."""
    from mirror_core import replicate

    if processes == 1:
        monkeypatch.setattr(direct, "WRITER_TXN_RECORDS", 7)
        monkeypatch.setattr(direct, "WRITER_TXN_RECORDS_PER_PARTITION", 0)

    topic = unique("ddir")
    create_topic(clusters.src_bootstrap, topic, 2)
    committed = produce_mixed(clusters.src_bootstrap, topic, unique("tx"))
    ends = ends_of(clusters.src_bootstrap, topic, 2)
    name = unique("dg").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, delivery, processes, transactions)
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    assert (rt._writer_pool() is not None) == (processes > 1)
    try:
        write_initial_offsets(rt, {topic: {0: 0, 1: 0}})
        mid = {0: 12, 1: 9}  # inside partition 0's first aborted transaction; on partition 1's
        write_offset_log(rt, 0, {topic: mid})
        write_offset_log(rt, 1, {topic: ends})
        summaries = []

        def batch(batch_id: int) -> None:
            plan = rt.writer_plan(batch_id)
            rows = rt.write_direct(plan, batch_id)
            summaries.append(rt.after_batch(batch_id, rows, 1.0))

        batch(0)
        batch(1)
        want = [[k for _, k in committed[p]] for p in (0, 1)]
        got = read_dst(clusters.dst_bootstrap, f"{topic}.m", 2)
        assert [got[0], got[1]] == want
        assert summaries[0]["mirrored"] + summaries[1]["mirrored"] == len(want[0]) + len(want[1])
        assert summaries[0]["mirrored"] == 9 + 9  # 5 plain + 4 committed before each cut
        if delivery == "exactly_once":
            batch(1)  # at_least_once writes a replayed batch again (duplicates, as after any retry)
            assert summaries[2]["mirrored"] == 0 and summaries[2]["replayed_skipped"] == summaries[1]["mirrored"]
            assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 2) == got
        if processes == 1:
            ours = [k for k in replicate._PRODUCERS if k.startswith(f"mirrorflow.{name}:")]
            if transactions == "per_writer":  # exactly_once: its two, taking turns; at_least_once: one idempotent
                stem = f"mirrorflow.{name}:src::writer-0"
                assert sorted(ours) == ([stem + ":alo"] if delivery == "at_least_once" else [stem, stem + ".1"])
            else:
                assert len(ours) == 2 and all(k.endswith((":0", ":1")) for k in ours)
        # the mirror's consumer group on the source is at the batch end (markers included), once the last
        # batch's commit (which runs beside the next batch) is done
        assert rt.wait_for_commits()
        c = Consumer({"bootstrap.servers": clusters.src_bootstrap, "group.id": rt.consumer_groups[topic]})
        assert [tp.offset for tp in c.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)] == \
            [ends[0], ends[1]]
        c.close()
    finally:
        rt.close()


#: what a Python worker process keeps between the tasks it runs (see _Workers)
_PROCESS_STATE = (replicate._PRODUCERS, replicate._POSITIONS, replicate._PRODUCER_LIMITS,
                  replicate._PRODUCER_PARTITIONS, replicate._TURNS, replicate._FENCED_PARTITIONS,
                  replicate._MARKERS_DUE, replicate._MARKERS_SEEN, replicate._ASK_ALWAYS, direct._TASK_READERS)


class _Workers:
    """Processes of one host, played in this one: each keeps its own producers, positions, fences and readers
    (``replicate``'s and ``direct``'s process state), swapped in while it runs a task, as Spark's Python workers
    keep theirs between tasks. ``"driver"`` is the job's own process."""

    def __init__(self) -> None:
        self.saved: dict[str, list[object]] = {}
        self.now = "driver"

    def run_as(self, name: str, fn):
        if name != self.now:
            self.saved[self.now] = [type(d)(d) for d in _PROCESS_STATE]
            for d, kept in zip(_PROCESS_STATE, self.saved.get(name) or [type(d)() for d in _PROCESS_STATE],
                               strict=True):
                d.clear()
                d.update(kept)
            self.now = name
        return fn()

    def close(self) -> None:
        for state in [*self.saved.values(), [type(d)(d) for d in _PROCESS_STATE]]:
            for reader in state[-1].values():
                reader.close()


@pytest.mark.parametrize("transactions", ["per_writer", "per_partition"])
@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_task_shares_moving_between_workers_and_writer_slots_mirror_every_record_once(clusters, unique, tmp_path,
                                                                                     delivery, transactions):
    """``read_path: executors``: a share runs on whichever Python worker is free, and a partition changes shares
    when the number of tasks does. Batch 0 in one task on worker A; batch 1 in two tasks, partition 1's on
    worker B; batch 1 again on A (a replay after a crash, in one task): A's own position of partition 1 is from
    before B wrote it, and only the committed one tells what B wrote. Then a small batch by the driver and its
    replay in a task on B. With ``transactions: per_writer`` (a transaction per task share, on the share's
    writer ids; B's slot's ids do not fence A's) a task reads its positions again; with a transaction per
    partition a task starts its share's producers and reads their positions together ahead of its writes, and
    the partition's producer on B fenced A's. exactly_once: every committed record once, in order, the replays
    write nothing; at_least_once writes replays again (as after any retry) and loses nothing."""
    topic = unique("dtask")
    create_topic(clusters.src_bootstrap, topic, 2)
    committed = produce_mixed(clusters.src_bootstrap, topic, unique("tx"))
    ends = ends_of(clusters.src_bootstrap, topic, 2)
    name = unique("dtk").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, delivery, transactions=transactions, read_path="executors")
    assert g.spark.reads_in_tasks and g.spark.writes_per_writer == (transactions == "per_writer")
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    workers = _Workers()
    placed: list[list[tuple[str, int, list[int]]]] = []
    try:
        write_initial_offsets(rt, {topic: {0: 0, 1: 0}})
        write_offset_log(rt, 0, {topic: {0: 12, 1: 9}})
        write_offset_log(rt, 1, {topic: {0: 20, 1: 22}})
        write_offset_log(rt, 2, {topic: ends})
        summaries = []

        def in_tasks(batch_id: int, where: list[str]) -> None:
            plan = rt.writer_plan(batch_id)

            def run(shares, fn):  # each share in a task on the worker named for it
                placed.append([(w, slot, [r.partition for r in ranges])
                               for w, (slot, ranges) in zip(where, shares, strict=True)])
                return [row for w, share in zip(where, shares, strict=True)
                        for row in workers.run_as(w, lambda share=share: list(fn(iter([share]))))]

            rows = rt.write_in_tasks(plan, batch_id, len(where), run)
            workers.run_as("driver", lambda: None)
            summaries.append(rt.after_batch(batch_id, rows, 1.0))

        in_tasks(0, ["A"])
        in_tasks(1, ["A", "B"])
        in_tasks(1, ["A"])  # the replay
        plan = rt.writer_plan(2)
        summaries.append(rt.after_batch(2, rt.write_direct(plan, 2), 1.0))  # a small batch: the driver's
        in_tasks(2, ["B"])  # its replay
        assert placed == [[("A", 0, [0, 1])], [("A", 0, [0]), ("B", 1, [1])], [("A", 0, [0, 1])],
                          [("B", 0, [0, 1])]]
        want = [[k for _, k in committed[p]] for p in (0, 1)]
        got = read_dst(clusters.dst_bootstrap, f"{topic}.m", 2)
        mirrored = [s["mirrored"] for s in summaries]
        if delivery == "exactly_once":
            assert [got[0], got[1]] == want
            assert mirrored[2] == mirrored[4] == 0
            assert summaries[2]["replayed_skipped"] == mirrored[1] and summaries[4]["replayed_skipped"] == mirrored[3]
        else:
            assert [list(dict.fromkeys(got[p])) for p in (0, 1)] == want  # each record in order, some again
        assert sum(mirrored[i] for i in (0, 1, 3)) == len(want[0]) + len(want[1])
    finally:
        workers.run_as("driver", lambda: None)
        workers.close()
        rt.close()


def test_per_writer_a_retried_task_fences_what_the_attempt_before_it_left_open(clusters, unique, tmp_path, caplog):
    """``read_path: executors``, ``transactions: per_writer``, exactly_once. Batch 0 by a task on worker B. Batch
    1's first attempt runs on worker A and fails: it has started its writer's producer (fencing B's) and left a
    transaction open on it, and has handed a partition back to be written alone, a transaction open on that
    partition's own id. Spark's retry runs on B: it starts the writer's id anew (B's producer is A's fenced
    predecessor: used as it was, its first transaction would fail) and fences the partitions' own ids before it
    reads their positions, so neither of A's transactions can commit after. Batch 2 on A, a first attempt: the
    producer A kept was fenced by the retry; its transaction is written again on a new one, from positions read
    after that one started. Every record arrives once, in order."""
    from confluent_kafka import KafkaException

    from mirror_core.config import writer_transactional_id
    from mirror_core.offsets import OffsetSync
    from mirror_core.positions import sync_headers
    from mirror_core.replicate import WriterTransaction

    topic = unique("dzmb")
    want = keyed_source(clusters, topic, 2)  # 20 records a partition
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for part in (0, 1):
        for i in range(20, 25):
            key = f"{part}-{i}".encode()
            want[part].append(key)
            p.produce(topic, key=key, value=b"x", partition=part)
    assert p.flush(30) == 0
    name = unique("dzmb").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, transactions="per_writer", read_path="executors")
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    workers = _Workers()
    dst = {"bootstrap.servers": clusters.dst_bootstrap}

    def in_task(batch_id: int, worker: str, attempt: int) -> dict:
        def run(shares, fn):
            return [row for share in shares for row in workers.run_as(worker, lambda share=share: list(fn(iter([share]))))]

        rows = rt.write_in_tasks(rt.writer_plan(batch_id), batch_id, 1, run, lambda: attempt)
        workers.run_as("driver", lambda: None)
        return rt.after_batch(batch_id, rows, 1.0)

    def open_transaction(producer, part: int) -> None:
        """Batch 1's records of ``part`` in a transaction left open (its offset sync is written last, with the
        commit: an open transaction holding one would keep every position lookup waiting until it ended)."""
        producer.begin_transaction()
        for k in want[part][10:20]:
            producer.produce(f"{topic}.m", key=k, value=b"x", partition=part)
        assert producer.flush(30) == 0

    def commit(producer, part: int) -> None:
        sync = OffsetSync(topic, part, 20, 20)
        producer.produce(f"{name}.syncs.internal", key=sync.key_bytes(), value=sync.value_bytes(), partition=0,
                         headers=sync_headers(f"{topic}.m"))
        producer.commit_transaction(30)

    try:
        write_initial_offsets(rt, {topic: {0: 0, 1: 0}})
        for batch_id, end in enumerate((10, 20, 25)):
            write_offset_log(rt, batch_id, {topic: {0: end, 1: end}})
        assert in_task(0, "B", 0)["mirrored"] == 20
        # batch 1's first attempt, on A: its writer's producer started, a transaction open on it (partition 1),
        # and partition 0 handed back, a transaction open on its own id
        slot_id = writer_transactional_id(name, "src", 0)
        plan = rt.writer_plan(1)
        zombie = workers.run_as("A", lambda: (WriterTransaction(plan.settings.values(), 0, 1).start(),
                                              replicate._PRODUCERS[slot_id])[1])
        workers.run_as("driver", lambda: None)
        open_transaction(zombie, 1)
        alone = Producer(dst | {"transactional.id": rt.settings[topic].transactional_id_for(0)})
        alone.init_transactions(30)
        open_transaction(alone, 0)
        with caplog.at_level(logging.INFO, logger="mirror_core.direct"):
            assert in_task(1, "B", 1)["mirrored"] == 20  # Spark's retry
        assert any("a retry of a Spark task (writer 0)" in r.getMessage() for r in caplog.records)
        # its writer's producer, started anew, wrote the batch in one go (not on a fenced one, then again)
        assert not [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        for gave_up, part in ((zombie, 1), (alone, 0)):
            with pytest.raises(KafkaException):
                commit(gave_up, part)
        assert in_task(2, "A", 0)["mirrored"] == 10  # the share moved back to A
        assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 2) == want
    finally:
        workers.run_as("driver", lambda: None)
        workers.close()
        rt.close()


def test_a_job_of_the_old_default_restarted_on_the_new_one_resumes_exactly(clusters, unique, tmp_path):
    """``transactions: auto`` (a transaction per writer process on the direct path) replaced ``per_partition``
    as the default on 5 December. A job of the old default wrote batch 0 and died while a writer of it held a
    transaction open on a partition's own transactional id. Restarted on the new default (two writer processes,
    as on two cores), it replays batch 0 and writes batch 1: the new writers fence each partition's own id
    before they read its position, so the open transaction is aborted and its writer cannot commit after;
    every record arrives once, in order, and the replay adds nothing."""
    from confluent_kafka import KafkaException

    topic = unique("dupg")
    want = keyed_source(clusters, topic, 2)
    name = unique("dupg").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, processes=2, transactions="per_partition")
    old = MirrorRuntime(cfg, g)
    old.prepare()
    try:
        write_initial_offsets(old, {topic: {0: 0, 1: 0}})
        write_offset_log(old, 0, {topic: {0: 10, 1: 10}})
        write_offset_log(old, 1, {topic: {0: 20, 1: 20}})
        plan = old.writer_plan(0)
        assert plan.transactions == "per_partition"
        assert old.after_batch(0, old.write_direct(plan, 0), 1.0)["mirrored"] == 20
        txid = old.settings[topic].transactional_id_for(0)
    finally:
        old.close()
    # what a writer of the old job left: a transaction open on partition 0's own id, records in it
    zombie = Producer({"bootstrap.servers": clusters.dst_bootstrap, "transactional.id": txid})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for i in range(5):
        zombie.produce(f"{topic}.m", key=b"zombie-%d" % i, value=b"z", partition=0)
    assert zombie.flush(30) == 0

    cfg, g = one_group(clusters, name, topic, tmp_path, processes=2, transactions="auto")
    assert g.spark.writes_per_writer
    new = MirrorRuntime(cfg, g)
    new.prepare()
    try:
        summaries = []
        for batch_id in (0, 1):  # Spark replays batch 0 (not committed when the job died), then goes on
            plan = new.writer_plan(batch_id)
            assert plan.transactions == "per_writer"
            summaries.append(new.after_batch(batch_id, new.write_direct(plan, batch_id), 1.0))
        assert summaries[0]["mirrored"] == 0 and summaries[0]["replayed_skipped"] == 20
        assert summaries[1]["mirrored"] == 20
        assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 2) == want
        with pytest.raises(KafkaException):  # fenced: the old writer can no longer commit
            zombie.commit_transaction(30)
        assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 2) == want
    finally:
        new.close()


def test_records_deleted_before_the_read_are_skipped_and_reported(clusters, unique, tmp_path, caplog):
    """The source's log start moved past the batch's start (retention, DeleteRecords) between Spark's
    planning and the read: the records still there are mirrored, the deleted ones are reported in one
    line with their count, as on Spark's path (failOnDataLoss=false)."""
    topic = unique("ddel")
    create_topic(clusters.src_bootstrap, topic, 1)
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for i in range(100):
        p.produce(topic, key=str(i).encode(), value=b"x", partition=0)
    assert p.flush(30) == 0
    name = unique("dd").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path)
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    try:
        write_initial_offsets(rt, {topic: {0: 0}})
        write_offset_log(rt, 0, {topic: {0: 100}})
        plan = rt.writer_plan(0)
        admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
        for fut in admin.delete_records([TopicPartition(topic, 0, 40)]).values():
            fut.result(30)
        with caplog.at_level(logging.WARNING, logger="mirror_core.stream"):
            rows = rt.write_direct(plan, 0)
            summary = rt.after_batch(0, rows, 1.0)
        assert summary["mirrored"] == 60 and summary["expired"] == 40
        assert any("40 records (offsets 0-39) expired on the source" in r.getMessage() for r in caplog.records)
        assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 1)[0] == [str(i).encode() for i in range(40, 100)]
    finally:
        rt.close()


def huge_record_topic(clusters, topic: str) -> tuple[list[bytes], list[bytes]]:
    """Source ``topic`` of 2 partitions: 41 records in partition 0 (keys a0-a19, a 10 KB one keyed ``huge``, then
    b0-b19), 30 in partition 1 (c0-c29). Returns the keys each partition should arrive with (not ``huge``)."""
    create_topic(clusters.src_bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    want0 = [f"a{i}".encode() for i in range(20)] + [f"b{i}".encode() for i in range(20)]
    for k in want0[:20]:
        p.produce(topic, key=k, value=b"x", partition=0)
    p.produce(topic, key=b"huge", value=b"y" * 10_000, partition=0)
    for k in want0[20:]:
        p.produce(topic, key=k, value=b"x", partition=0)
    want1 = [f"c{i}".encode() for i in range(30)]
    for k in want1:
        p.produce(topic, key=k, value=b"x", partition=1)
    assert p.flush(30) == 0
    return want0, want1


def lower_destination_limit(clusters, topic: str, limit: int = 2000) -> None:
    """The destination topic's ``max.message.bytes``, lowered after the mirror learnt it."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    res = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET)])
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})  # held until the answer is in
    admin.incremental_alter_configs([res])[res].result(30)


def test_per_writer_falls_back_to_partition_transactions_without_losing_or_doubling(clusters, unique, tmp_path,
                                                                                      caplog):
    """``transactions: per_writer``: the destination rejects a record as too large that the writer did not
    know to be (the topic's limit was lowered after the start). The one transaction holding both partitions
    is aborted and the batch written partition by partition, which learns the limit and dead-letters the
    record: every other record arrives once, in order, and a replay of the batch adds nothing."""
    topic = unique("dpw")
    want0, want1 = huge_record_topic(clusters, topic)
    name = unique("dpw").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, processes=1, transactions="per_writer")
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    lower_destination_limit(clusters, f"{topic}.m")
    try:
        write_initial_offsets(rt, {topic: {0: 0, 1: 0}})
        write_offset_log(rt, 0, {topic: {0: 41, 1: 30}})
        with caplog.at_level(logging.INFO, logger="mirror_core.stream"):
            summary = rt.after_batch(0, rt.write_direct(rt.writer_plan(0), 0), 1.0)
        assert any("writing the batch partition by partition" in r.getMessage() for r in caplog.records)
        assert summary["mirrored"] == 70 and summary["dead_lettered"] == 1
        got = read_dst(clusters.dst_bootstrap, f"{topic}.m", 2)
        assert (got[0], got[1]) == (want0, want1)
        assert read_dst(clusters.dst_bootstrap, f"{name}.dlq", 1)[0] == [b"huge"]
        again = rt.after_batch(0, rt.write_direct(rt.writer_plan(0), 0), 1.0)  # a replay of the batch
        assert again["mirrored"] == 0 and again["replayed_skipped"] == 71
        assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 2) == got
    finally:
        rt.close()


def keyed_source(clusters, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Create ``topic`` on the source with ``partitions`` partitions of 20 records each (keys
    ``<partition>-<i>``); returns the keys each partition holds, in order."""
    create_topic(clusters.src_bootstrap, topic, partitions)
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    want = {part: [f"{part}-{i}".encode() for i in range(20)] for part in range(partitions)}
    for part, keys in want.items():
        for k in keys:
            p.produce(topic, key=k, value=b"x", partition=part)
    assert p.flush(30) == 0
    return want


def four_partitions_per_writer(clusters, unique, tmp_path: Path, stem: str
                               ) -> tuple[str, str, dict[int, list[bytes]], MirrorRuntime]:
    """A source topic of 4 partitions with 20 records each (keys ``<partition>-<i>``) and a prepared exactly_once
    ``per_writer`` mirror of it in one writer process: the topic, the mirror's name, the keys each partition
    should arrive with, the runtime."""
    topic = unique(stem)
    want = keyed_source(clusters, topic, 4)
    name = unique(stem).replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, processes=1, transactions="per_writer")
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    return topic, name, want, rt


def write_with_flush(rt: MirrorRuntime, topic: str, flush, caplog, monkeypatch) -> tuple[dict, list[str]]:
    """Batch 0 of :func:`four_partitions_per_writer`'s mirror (every record), with the writer's ``flush_within``
    replaced by ``flush``: its summary and the lines logged."""
    from mirror_core import stream

    monkeypatch.setattr(stream, "SHARED_RETRY_PAUSE", 0.0)
    write_initial_offsets(rt, {topic: {q: 0 for q in range(4)}})
    write_offset_log(rt, 0, {topic: {q: 20 for q in range(4)}})
    with caplog.at_level(logging.INFO, logger="mirror_core.stream"), monkeypatch.context() as mp:
        mp.setattr(stream, "flush_within", flush)
        summary = rt.after_batch(0, rt.write_direct(rt.writer_plan(0), 0), 1.0)
    return summary, [r.getMessage() for r in caplog.records]


def assert_once_and_a_replay_adds_nothing(clusters, rt: MirrorRuntime, topic: str, want: dict[int, list[bytes]]
                                          ) -> None:
    """Every record of batch 0 arrived once, in order, and a replay of the batch adds nothing."""
    got = read_dst(clusters.dst_bootstrap, f"{topic}.m", 4)
    assert got == want
    again = rt.after_batch(0, rt.write_direct(rt.writer_plan(0), 0), 1.0)
    assert again["mirrored"] == 0 and again["replayed_skipped"] == sum(map(len, want.values()))
    assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 4) == got


def test_per_writer_a_transaction_not_acknowledged_in_time_is_written_again_in_halves_exactly_once(
        clusters, unique, tmp_path, caplog, monkeypatch):
    """``transactions: per_writer``: the writer's one transaction over four partitions is not acknowledged
    within its time (its flush says a record is outstanding, though every record reached the broker in that
    transaction). The transaction is lost: its producer is replaced, and the new one's start aborts it; the
    four partitions go out again as two transactions of two. Every record arrives once, in order, nothing of
    the lost transaction is visible, and a replay of the batch adds nothing."""
    from mirror_core import replicate, stream

    topic, name, want, rt = four_partitions_per_writer(clusters, unique, tmp_path, "dpwto")
    real = stream.flush_within
    flushed: list[tuple[object, int]] = []

    def late(producer, timeout, who, check=None):
        left = real(producer, timeout, who, check)
        flushed.append((producer, left))
        return 1 if len(flushed) == 1 else left  # the first: one record "not acknowledged"

    try:
        summary, lines = write_with_flush(rt, topic, late, caplog, monkeypatch)
        assert any("transaction of 4 partitions was lost (1 records not acknowledged within 60 s); writing them "
                   "again as two transactions of 2 and 2" in line for line in lines), lines
        assert not any("partition by partition" in line for line in lines), lines
        assert [left for _p, left in flushed] == [0, 0, 0] and summary["mirrored"] == 80
        assert all(prod is not flushed[0][0] for prod in replicate._PRODUCERS.values())  # replaced
        assert_once_and_a_replay_adds_nothing(clusters, rt, topic, want)
    finally:
        rt.close()


def test_per_writer_a_transaction_whose_producer_was_fenced_is_written_again_not_partition_by_partition(
        clusters, unique, tmp_path, caplog, monkeypatch):
    """``transactions: per_writer``: once the writer's transaction over four partitions has all its records
    acknowledged, another producer takes the writer's transactional id (as a writer of a later job would), so
    the commit fails: the producer was fenced. The transaction is written again on a new producer, as two
    transactions of two partitions, not partition by partition (at thousands of partitions that starts a
    producer for each), and one line says so. Every record arrives once, in order, and a replay of the batch adds
    nothing."""
    from mirror_core import replicate, stream

    topic, name, want, rt = four_partitions_per_writer(clusters, unique, tmp_path, "dpwf")
    real = stream.flush_within
    fenced: list[str] = []

    def fence_first(producer, timeout, who, check=None):
        left = real(producer, timeout, who, check)
        if not fenced:
            txid = next(k for k, v in replicate._PRODUCERS.items() if v is producer)
            replicate.fence_transactional_id({"bootstrap.servers": clusters.dst_bootstrap}, txid)
            fenced.append(txid)
        return left

    try:
        summary, lines = write_with_flush(rt, topic, fence_first, caplog, monkeypatch)
        assert fenced == [f"mirrorflow.{name}:src::writer-0"]
        assert any("transaction of 4 partitions failed" in line and "writing them again as two transactions of 2 "
                   "and 2" in line for line in lines), lines
        assert not any("writing the batch partition by partition" in line for line in lines), lines
        # one line says it: librdkafka's own line of the fence is not shown as well
        assert not [r for r in caplog.records if r.name == "librdkafka" and r.levelno >= logging.WARNING]
        assert summary["mirrored"] == 80
        assert_once_and_a_replay_adds_nothing(clusters, rt, topic, want)
    finally:
        rt.close()


def test_per_writer_a_writer_fenced_by_another_that_committed_meanwhile_writes_only_what_is_left(
        clusters, unique, tmp_path, caplog, monkeypatch):
    """``transactions: per_writer``: after the writer read its partitions' positions and before its transaction
    took a partition, another producer took the writer's transactional id and committed partition 0's records
    and offset sync (as another attempt of the same Spark task does, or a writer the first one's owner took for
    dead). The writer's transaction fails (fenced) before it asked to commit; it is written again on a new
    producer, from positions read after that producer's start: partition 0's records arrive once, not twice,
    and the other three partitions once too."""
    from mirror_core import stream
    from mirror_core.offsets import OffsetSync
    from mirror_core.positions import sync_headers

    topic, name, want, rt = four_partitions_per_writer(clusters, unique, tmp_path, "dpwo")
    txid = f"mirrorflow.{name}:src::writer-0"
    real = replicate.WriterTransaction.late_markers
    other: list[str] = []

    def another_writer_first(self, partitions):
        if not other:
            self.producer()  # the writer's producer has started (a running writer's has)
            p = Producer({"bootstrap.servers": clusters.dst_bootstrap, "transactional.id": txid})
            p.init_transactions(30)  # fences the writer's producer
            p.begin_transaction()
            for k in want[0]:
                p.produce(f"{topic}.m", key=k, value=b"x", partition=0)
            sync = OffsetSync(topic, 0, 20, 20)
            p.produce(f"{name}.syncs.internal", key=sync.key_bytes(), value=sync.value_bytes(), partition=0,
                      headers=sync_headers(f"{topic}.m"))
            p.commit_transaction(30)
            other.append(txid)
        return real(self, partitions)

    monkeypatch.setattr(replicate.WriterTransaction, "late_markers", another_writer_first)
    try:
        summary, lines = write_with_flush(rt, topic, stream.flush_within, caplog, monkeypatch)
        assert other == [txid]
        assert any("transaction of 4 partitions failed" in line for line in lines), lines
        assert summary["mirrored"] == 60 and summary["replayed_skipped"] == 20
        assert_once_and_a_replay_adds_nothing(clusters, rt, topic, want)
    finally:
        rt.close()


def test_per_writer_at_least_once_a_record_lost_by_the_shared_producer_is_written_again_partition_by_partition(
        clusters, unique, tmp_path, caplog):
    """``transactions: per_writer``, at_least_once: the writer's shared producer is gapless, so its runs of
    records go through the C loop without delivery reports. The destination rejects a record inside such a
    run as too large (the topic's limit was lowered after the start): the producer stops (a fatal error, the
    records after the loss fail with it), the reports still due are taken, and what did not land is written
    again partition by partition, which learns the limit and dead-letters the record once. Every other
    record is on the destination, each record's last copy in order (at-least-once may write some twice), the
    offset syncs end where the batch ends, and the next batch goes out on a new shared producer."""
    from mirror_core import native, replicate
    from mirror_core.replicate import last_committed_sync

    topic = unique("dpwalo")
    want0, want1 = huge_record_topic(clusters, topic)
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    more1 = [f"d{i}".encode() for i in range(10)]  # the next batch's
    for k in more1:
        p.produce(topic, key=k, value=b"x", partition=1)
    assert p.flush(30) == 0
    name = unique("dpwalo").replace("-", "")
    cfg, g = one_group(clusters, name, topic, tmp_path, "at_least_once", processes=1, transactions="per_writer")
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    lower_destination_limit(clusters, f"{topic}.m")
    runs: list[tuple[int, int, int]] = []
    producers: list[object] = []  # the producer of each C run
    produce = native.produce

    def spy(producer, topic_, partition, values, keys, stamps, headers, start, stop, *rest):
        out = produce(producer, topic_, partition, values, keys, stamps, headers, start, stop, *rest)
        runs.append((partition, start, out[0]))
        producers.append(producer)
        return out

    try:
        write_initial_offsets(rt, {topic: {0: 0, 1: 0}})
        write_offset_log(rt, 0, {topic: {0: 41, 1: 30}})
        write_offset_log(rt, 1, {topic: {0: 41, 1: 40}})
        with caplog.at_level(logging.INFO, logger="mirror_core.stream"), pytest.MonkeyPatch.context() as mp:
            mp.setattr(native, "produce", spy)
            summary = rt.after_batch(0, rt.write_direct(rt.writer_plan(0), 0), 1.0)
        assert any(p_ == 0 and start <= 20 < reached for p_, start, reached in runs)  # the large one: no report
        shared = f"mirrorflow.{name}:src::writer-0:alo"
        stopped = producers[0]
        assert replicate._PRODUCERS[shared] is not stopped  # replaced
        assert any("the writer's shared producer lost a record" in r.getMessage() for r in caplog.records)
        assert summary["mirrored"] == 70 and summary["dead_lettered"] == 1
        got = read_dst(clusters.dst_bootstrap, f"{topic}.m", 2)
        for want, have in ((want0, got[0]), (want1, got[1])):
            assert set(have) == set(want)
            last = {k: i for i, k in enumerate(have)}
            assert sorted(want, key=last.__getitem__) == want  # each record's last copy in order
        assert read_dst(clusters.dst_bootstrap, f"{name}.dlq", 1)[0] == [b"huge"]
        for p_, end in ((0, 41), (1, 30)):
            sync = last_committed_sync({"bootstrap.servers": clusters.dst_bootstrap}, f"{name}.syncs.internal",
                                       topic, p_, destination=f"{topic}.m")
            assert sync is not None and sync.upstream_offset == end

        runs.clear()
        producers.clear()
        with pytest.MonkeyPatch.context() as mp:  # the next batch: on the new shared producer, its run in C again
            mp.setattr(native, "produce", spy)
            summary = rt.after_batch(1, rt.write_direct(rt.writer_plan(1), 1), 1.0)
        assert summary["mirrored"] == 10 and [p_ for p_, *_ in runs] == [1]
        assert producers == [replicate._PRODUCERS[shared]]
        assert read_dst(clusters.dst_bootstrap, f"{topic}.m", 2)[1][-10:] == more1
    finally:
        rt.close()


def test_a_writer_process_failure_is_raised_in_the_driver_once_the_others_are_done(clusters, unique, tmp_path):
    """A failure inside one writer process reaches the driver as the same error type and text (so the job's
    one-line failure names it), after every process has finished its share: nothing is left mid-write. The
    pool then goes on with its next batch."""
    from mirror_core.direct import WriterPool
    from mirror_core.stream import UnknownTopicError, WriterPlan

    topic = unique("dfail")
    create_topic(clusters.src_bootstrap, topic, 2)
    p = Producer({"bootstrap.servers": clusters.src_bootstrap})
    for i in range(20):
        p.produce(topic, key=str(i).encode(), value=b"x", partition=i % 2)
    assert p.flush(30) == 0
    cfg, g = one_group(clusters, unique("dfg").replace("-", ""), topic, tmp_path)
    pool = WriterPool(cfg.cluster("src"), g.name, processes=2)
    try:
        # a plan without the topic's settings, and not ruling it out: its records must fail the batch
        plan = WriterPlan({}, {}, {}, {"bootstrap.servers": clusters.dst_bootstrap}, None, group=g.name)
        ranges = [Range(topic, 0, 0, 10), Range(topic, 1, 0, 10)]
        with pytest.raises(UnknownTopicError, match=topic):
            pool.write(plan, ranges)
        assert all(w.pending == 0 for w in pool._workers)  # both answered
        passed_over = WriterPlan({}, {}, {}, {"bootstrap.servers": clusters.dst_bootstrap}, None,
                                 ignored=frozenset({topic}), group=g.name)
        assert pool.write(passed_over, ranges) == []
    finally:
        pool.close()


def test_writer_processes_end_with_the_job_even_when_it_is_killed(clusters):
    """The writer processes do not outlive their job: a SIGKILL of the job (no chance to close them) ends
    them within a second or two, so no orphan keeps a producer or a source consumer."""
    script = """
import sys, time
from mirror_core.config import ClusterConfig
from mirror_core.direct import WriterPool
from mirror_core.stream import WriterPlan
pool = WriterPool(ClusterConfig.model_validate({"kafka": {"bootstrap.servers": sys.argv[1]}}), "g", processes=2)
pool.warm(WriterPlan({}, {}, {}, {}, None, group="g"))  # starts them; nothing to warm
assert [w.result() for w in pool._workers] == [None, None]  # both set up and answering
print(" ".join(str(w.proc.pid) for w in pool._workers), flush=True)
time.sleep(600)
"""
    _kill_and_expect_its_writers_gone([script, clusters.src_bootstrap], "a writer process outlived its killed job")


def test_a_writer_process_busy_mid_batch_ends_with_its_killed_job(clusters, unique):
    """A writer process in the middle of a batch does not read its socket, so it cannot see its job's end
    there: the parent watcher ends it within a second or two of a SIGKILL of the job. Here the process is
    waiting for records of a range that are not there yet (it would wait a minute before giving up)."""
    topic = unique("busy")
    create_topic(clusters.src_bootstrap, topic, 1)
    script = """
import sys, threading, time
from mirror_core.config import ClusterConfig
from mirror_core.direct import Range, WriterPool
from mirror_core.stream import WriterPlan
pool = WriterPool(ClusterConfig.model_validate({"kafka": {"bootstrap.servers": sys.argv[1]}}), "g", processes=2)
plan = WriterPlan({}, {}, {}, {}, None, group="g")
pool.warm(plan)
assert [w.result() for w in pool._workers] == [None, None]
threading.Thread(target=pool.write, args=(plan, [Range(sys.argv[2], 0, 0, 10)]), daemon=True).start()
time.sleep(2)  # the owner of the partition is reading, waiting for offsets 0-9
print(" ".join(str(w.proc.pid) for w in pool._workers), flush=True)
time.sleep(600)
"""
    _kill_and_expect_its_writers_gone([script, clusters.src_bootstrap, topic],
                                      "a busy writer process outlived its killed job")


def _kill_and_expect_its_writers_gone(args: list[str], message: str) -> None:
    """Start a job (``python -c``, printing its two writer processes' pids), SIGKILL it, and expect both
    processes gone within 10 s."""
    job = subprocess.Popen([sys.executable, "-c", *args], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in job.stdout.readline().split()]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        job.kill()
        job.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in pids), message
    finally:
        job.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("c_loop", [True, False])
def test_a_reader_whose_brokers_are_gone_fails_the_batch_in_one_line(monkeypatch, caplog, c_loop):
    """Brokers that refuse every connection: the read fails once its stall timeout passes, with one error
    naming the partition and how long it waited, and librdkafka's connection lines stay at DEBUG. Through the
    C read loop this is the case that would abort the process if librdkafka's errors reached confluent-kafka's
    callbacks from C (the reader's consumer is its own, without them)."""
    if not c_loop:
        monkeypatch.setattr(native, "_module", None)
    closed = f"127.0.0.1:{_free_port()}"
    cfg = parse_config(yaml.safe_load(f"""
clusters:
  src: {{kafka: {{bootstrap.servers: "{closed}"}}}}
  dst: {{kafka: {{bootstrap.servers: "{closed}"}}}}
groups:
  - name: gone
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    mirrors: [{{source_topic: t, destination_topic: t.m}}]
"""), env={})
    reader = DirectReader(cfg.cluster("src"), "gone", stall_timeout=3)
    caplog.set_level(logging.DEBUG, logger="librdkafka")
    t0 = time.monotonic()
    with pytest.raises(KafkaOperationError, match=r"^reading t\[0\] up to 5: no progress in 3s$"):
        reader.read([Range("t", 0, 0, 5)], lambda *a: pytest.fail("nothing to deliver"))
    assert time.monotonic() - t0 < 30
    refused = [r for r in caplog.records if r.name == "librdkafka" and "Connection refused" in r.getMessage()]
    assert refused and all(r.levelno == logging.DEBUG for r in refused)
    reader.close()
