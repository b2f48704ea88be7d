"""The direct read path's pure part: which ranges a micro-batch reads, from Spark's offset log."""

from __future__ import annotations

import threading
import time
import types
from pathlib import Path

import pytest

from mirror_core.direct import CHUNK_RECORDS, Range, _left, _runs, batch_ranges
from mirror_core.replicate import Columns


def test_batch_ranges_follow_the_offset_log():
    """A partition without a start (new to the query, or a symbolic one) from its first offset; unchanged
    and moved-back partitions (the runtime writes those from the start itself) and skipped topics left out."""
    starts = {"a": {0: 10, 1: 5, 2: -2}, "b": {0: 7}}
    ends = {"a": {0: 20, 1: 5, 2: 3, 3: 4, 4: 0}, "b": {0: 3}, "c": {0: 9}, "x": {0: 5}}
    assert batch_ranges(starts, ends, skip={"x"}) == [
        Range("a", 0, 10, 20), Range("a", 2, None, 3), Range("a", 3, None, 4), Range("c", 0, None, 9)]
    assert batch_ranges({}, {}) == []


def test_the_reader_asks_for_no_more_records_than_the_open_ranges_hold():
    """consume() is asked for what the open ranges can still hold (so a small batch of a live stream does
    not wait out the poll timeout for a full chunk): offsets after the last one read, to the range's end;
    a range from its partition's first offset, not yet started, is unbounded (a full chunk)."""
    by_key = {("t", 0): Range("t", 0, 100, 110), ("t", 1): Range("t", 1, 50, 53), ("t", 2): Range("t", 2, None, 9)}
    assert _left({("t", 0), ("t", 1)}, by_key, {}) == 13
    assert _left({("t", 0), ("t", 1)}, by_key, {("t", 0): 104}) == 5 + 3
    assert _left({("t", 2)}, by_key, {}) == CHUNK_RECORDS
    assert _left({("t", 2)}, by_key, {("t", 2): 6}) == 2
    assert _left(set(), by_key, {}) == 0


def _run(first: int, n: int, headers: bool = False) -> Columns:
    offs = list(range(first, first + n))
    return Columns(offs, [b"k%d" % o for o in offs], [b"v%d" % o for o in offs], [1000 + o for o in offs],
                   [(("h", b"%d" % o),) for o in offs] if headers else None)


def test_a_partitions_buffer_keeps_runs_in_order_and_headers_only_when_some_record_has_them():
    """Runs with and without headers, whole and in parts, make one chunk whose columns line up: a record
    without headers gets () once another record of the chunk has some, and a chunk without any has None."""
    assert Columns.concat([_run(0, 3)]).headers is None
    cols = Columns.concat([_run(0, 3), _run(3, 4, headers=True).slice(1, 3), _run(6, 2)])  # 4 and 5 of the second
    assert cols.offsets == [0, 1, 2, 4, 5, 6, 7]
    assert cols.keys == [b"k%d" % o for o in cols.offsets] and cols.values == [b"v%d" % o for o in cols.offsets]
    assert cols.timestamps == [1000 + o for o in cols.offsets]
    assert cols.headers == [(), (), (), (("h", b"4"),), (("h", b"5"),), (), ()]
    assert _run(10, 5).slice(2, 4).offsets == [12, 13] and _run(10, 5, True).slice(4, 5).headers == [(("h", b"14"),)]


class _Msg:
    """What the reader asks of a confluent_kafka Message."""

    def __init__(self, topic, part, offset, headers=None, err=None):
        self._t, self._p, self._o, self._h, self._e = topic, part, offset, headers, err

    def error(self): return self._e  # noqa: E704
    def topic(self): return self._t  # noqa: E704
    def partition(self): return self._p  # noqa: E704
    def offset(self): return self._o  # noqa: E704
    def key(self): return b"k"  # noqa: E704
    def value(self): return None  # noqa: E704
    def timestamp(self): return (1, 7)  # noqa: E704
    def headers(self): return self._h  # noqa: E704


class _Err:
    def code(self): return -191  # noqa: E704
    def name(self): return "_PARTITION_EOF"  # noqa: E704
    def str(self): return "end"  # noqa: E704


def test_messages_without_the_c_loop_are_grouped_as_it_groups_them():
    """Without the C consume loop, confluent-kafka's messages take the shape it returns: one run per stretch
    of a partition's records (a new run when the partition changes or an event comes between), events in
    place, and a headers column only for a run in which some record has headers."""
    got = _runs([_Msg("t", 0, 5), _Msg("t", 0, 6, [("h", b"x")]), _Msg("t", 1, 9), _Msg("t", 1, 10, err=_Err()),
                 _Msg("t", 1, 10), _Msg("t", 0, 7)])
    assert [g[:3] for g in got] == [(0, "t", 0), (0, "t", 1), (1, "t", 1), (0, "t", 1), (0, "t", 0)]
    assert got[0][3:] == ([5, 6], [b"k", b"k"], [None, None], [7, 7], [(), (("h", b"x"),)])
    assert got[1][3:] == ([9], [b"k"], [None], [7], None)
    assert got[2][3:] == (10, -191, "_PARTITION_EOF", "end")


def test_the_reader_hands_over_large_records_in_chunks_bounded_by_bytes(monkeypatch):
    """Chunks are CHUNK_RECORDS records or CHUNK_READ_BYTES of keys and values, whichever comes first: a range
    of large records is handed over as it is read, not held whole (20,000 records of 100 KB are 2 GB)."""
    from mirror_core import direct, native
    from mirror_core.direct import DirectReader

    monkeypatch.setattr(direct, "CHUNK_READ_BYTES", 2_000_000)
    big = b"x" * 100_000

    class Consumer:  # the C read loop's consumer: runs of ten records of partition 0, then nothing
        def __init__(self) -> None:
            self.next = 0

        def assignment(self):
            return []

        def assign(self, parts) -> None:
            pass

        def resume(self, parts) -> None:
            pass

        def consume(self, count, timeout):
            if self.next >= 100:
                return []
            offs = list(range(self.next, self.next + 10))
            self.next += 10
            return [(native.RUN, "t", 0, offs, [None] * 10, [big] * 10, [0] * 10, None)]

    reader = DirectReader(cluster=None, group="g")  # type: ignore[arg-type] - the consumer is the fake
    reader._consumer = Consumer()
    chunks: list[list[int]] = []
    sizes: list[int] = []

    def deliver(r, cols, size=None) -> None:
        if cols is not None:
            chunks.append(cols.offsets)
            sizes.append(size)

    reader.read([Range("t", 0, 0, 100)], deliver)
    assert [c[0] for c in chunks] == [0, 20, 40, 60, 80] and all(len(c) == 20 for c in chunks)
    assert sizes == [20 * len(big)] * 5


class _QueuedConsumer:
    """The C read loop's consumer over a script: each consume() takes the next entry of ``fetches`` (a list of
    items: runs and events); records the calls (count, timeout), the assignments and the pauses."""

    def __init__(self, fetches):
        self.fetches = list(fetches)
        self.calls: list[tuple[int, float]] = []
        self.assigned: list[tuple[str, int, int]] = []
        self.paused: list[tuple[str, int]] = []

    def assignment(self):
        return [(t, p) for t, p, _ in self.assigned]

    def assign(self, parts) -> None:
        self.assigned += parts

    def unassign(self, parts) -> None:
        pass

    def resume(self, parts) -> None:
        pass

    def pause(self, parts) -> None:
        self.paused += parts

    def consume(self, count, timeout):
        self.calls.append((count, timeout))
        if not self.fetches:
            time.sleep(timeout)
            return []
        return self.fetches.pop(0)


def _run_of(part, offsets):
    from mirror_core import native

    n = len(offsets)
    return (native.RUN, "t", part, list(offsets), [None] * n, [b"v"] * n, [0] * n, None)


def test_a_writer_process_that_keeps_writing_takes_what_its_consumer_fetched_without_asking_the_source():
    """``spark.keep_writing_for`` in a writer process: the ends of the next write are what the reader's own
    consumer fetched (past the last record held, or the partition's reported end when transaction markers
    follow it), with no request to the source; what was taken is handed over by the next read of those ranges
    without consuming it again; when nothing arrived it waits for the next fetch, up to the wait it was
    given; a partition the reader did not stand at is assigned there first."""
    from mirror_core import native
    from mirror_core.direct import DirectReader

    eof = (native.EVENT, "t", 1, 30, -191, "_PARTITION_EOF", "end")
    c = _QueuedConsumer([[_run_of(0, range(10, 15)), _run_of(1, [20, 21]), eof]])
    reader = DirectReader(cluster=None, group="g")  # type: ignore[arg-type] - the consumer is the fake
    reader._consumer = c
    reader._next.update({("t", 0): 10, ("t", 1): 20})
    c.assigned += [("t", 0, 10), ("t", 1, 20)]

    ends = reader.arrived({("t", 0): 10, ("t", 1): 20}, wait=5.0)
    assert ends == {("t", 0): 15, ("t", 1): 30}  # partition 1: its records, then markers to 30
    assert c.calls == [(CHUNK_RECORDS, 0.0)], "waited although records had arrived"

    got: dict[int, list[int]] = {}
    done: list[int] = []

    def deliver(r, cols, size=None):
        if cols is None:
            done.append(r.partition)
        else:
            got.setdefault(r.partition, []).extend(cols.offsets)

    reader.read([Range("t", 0, 10, 15), Range("t", 1, 20, 30)], deliver)
    assert got == {0: [10, 11, 12, 13, 14], 1: [20, 21]} and sorted(done) == [0, 1]
    assert len(c.calls) == 1, "the read consumed again what arrived() had taken"

    # nothing new: it waits for the next fetch (one item first, then the rest of that fetch), then answers
    c.fetches = [[], [_run_of(0, [15])], [_run_of(0, [16, 17])]]
    c.calls.clear()
    t0 = time.monotonic()
    assert reader.arrived({("t", 0): 15, ("t", 1): 30}, wait=5.0) == {("t", 0): 18, ("t", 1): 30}
    assert c.calls[0] == (CHUNK_RECORDS, 0.0) and c.calls[1][0] == 1 and c.calls[1][1] > 4
    assert c.calls[2] == (CHUNK_RECORDS, 0.0) and time.monotonic() - t0 < 4
    # nothing at all: where each stands, after the wait
    c.calls.clear()
    t0 = time.monotonic()
    assert reader.arrived({("t", 0): 18}, wait=0.05) == {("t", 0): 18}
    assert 0.05 <= time.monotonic() - t0 < 2 and [n for n, _ in c.calls] == [CHUNK_RECORDS, 1]

    # a backlog: what the consumer holds is taken, chunk after chunk, without waiting (keep_on sees it)
    c.fetches = [[_run_of(0, range(18, 18 + CHUNK_RECORDS))], [_run_of(0, range(18 + CHUNK_RECORDS, 30_000))]]
    c.calls.clear()
    assert reader.arrived({("t", 0): 18}, wait=5.0) == {("t", 0): 30_000}
    assert c.calls == [(CHUNK_RECORDS, 0.0)] * 2 and ("t", 0) in c.paused  # past AHEAD_RECORDS: paused
    reader._ahead.clear()
    reader._next[("t", 0)] = 30_000

    # a partition the reader does not stand at: assigned at where it stands, before anything is taken
    c.fetches = [[_run_of(2, [40, 41])]]
    assert reader.arrived({("t", 2): 40}, wait=1.0) == {("t", 2): 42}
    assert ("t", 2, 40) in c.assigned and reader._next[("t", 2)] == 40


class _FakeReader:
    """Delivers up to ``chunks`` chunks of one record for each range (for at most 30 s); counts them."""

    def __init__(self, chunks: int):
        self.chunks = chunks
        self.delivered = 0
        self.stopped_by: BaseException | None = None

    def read(self, ranges, deliver) -> float:
        from mirror_core.replicate import Columns

        deadline = time.monotonic() + 30
        try:
            for i in range(self.chunks):
                for r in ranges:
                    deliver(r, Columns([i], [b"k"], [b"v"], [0]))
                    self.delivered += 1
                if time.monotonic() > deadline:
                    break
            for r in ranges:
                deliver(r, None)
        except BaseException as exc:
            self.stopped_by = exc
            raise
        return 0.0


def test_a_writer_failure_stops_the_read_and_is_raised():
    """A record of a topic no mirror was set up for fails its partition's writer: the read stops (no more
    chunks are taken) and the writer's own error is raised, naming the topic."""
    from mirror_core.direct import write_ranges
    from mirror_core.stream import UnknownTopicError, WriterPlan

    plan = WriterPlan({}, {}, {"t": {0: 1000}}, {}, None, group="g")
    reader = _FakeReader(chunks=10**9)  # stopped by the failure, not by running out
    with pytest.raises(UnknownTopicError, match="source topic 't'"):
        write_ranges(plan, [Range("t", 0, 0, 10**9)], reader)
    assert reader.stopped_by is not None


def test_ranges_of_topics_passed_over_are_written_as_nothing():
    """A topic the group looked at and does not mirror: its records are passed over, nothing fails."""
    from mirror_core.direct import write_ranges
    from mirror_core.stream import WriterPlan

    plan = WriterPlan({}, {}, {"t": {0: 3}}, {}, None, ignored=frozenset({"t"}), group="g")
    assert write_ranges(plan, [Range("t", 0, 0, 3)], _FakeReader(chunks=3)) == []


class _RecordingWriter:
    """Stands in for :class:`mirror_core.stream.BatchWriter`: records what it is fed and which partitions'
    positions it is asked to move to their range's end."""

    fed: list = []
    finished: list = []

    def __init__(self, plan) -> None:
        pass

    def feed(self, topic, part, cols, chunk_records=None) -> None:
        self.fed.append((part, list(cols.offsets)))

    def finish(self, topic, part, start=None) -> None:
        self.finished.append(part)

    def rows(self, read_ms):
        return []


def test_a_read_that_fails_part_way_moves_no_position_to_its_ranges_end(monkeypatch):
    """The reader fails (a stalled fetch) after partition 0's range was read to its end and while partition 1's
    was still being read: partition 0's position moves past its trailing markers to its range's end, and
    partition 1's does not (its unread records would be taken as mirrored and skipped when the batch is
    written again); what was read of partition 1 is still written, and the reader's error is raised."""
    from mirror_core import direct, stream
    from mirror_core.errors import KafkaOperationError
    from mirror_core.replicate import Columns
    from mirror_core.stream import WriterPlan

    monkeypatch.setattr(stream, "BatchWriter", _RecordingWriter)
    _RecordingWriter.fed, _RecordingWriter.finished = [], []

    class Reader:
        def read(self, rs, deliver) -> float:
            deliver(rs[0], Columns([0, 1], [None] * 2, [b"v"] * 2, [0] * 2))
            deliver(rs[0], None)  # partition 0: read to its end (offsets 2-4 are markers)
            deliver(rs[1], Columns([0, 1], [None] * 2, [b"v"] * 2, [0] * 2))
            raise KafkaOperationError("reading t[1]: no progress in 30s")

    plan = WriterPlan({}, {}, {"t": {0: 5, 1: 5}}, {}, None, group="g")
    with pytest.raises(KafkaOperationError, match=r"t\[1\]"):
        direct.write_ranges(plan, [Range("t", 0, 0, 5), Range("t", 1, 0, 5)], Reader())
    assert _RecordingWriter.finished == [0]
    assert sorted(_RecordingWriter.fed) == [(0, [0, 1]), (1, [0, 1])]


class _SlowWriter:
    """Stands in for :class:`mirror_core.stream.BatchWriter`: records what it is fed, and feeds partition 0
    only once ``gate`` is set."""

    gate = None
    fed: list = []

    def __init__(self, plan) -> None:
        pass

    def feed(self, topic, part, cols, chunk_records=None) -> None:
        if part == 0:
            assert self.gate.wait(30)
        self.fed.append((part, len(cols)))

    def finish(self, topic, part, start=None) -> None:
        pass

    def rows(self, read_ms):
        return []


def _megabyte_chunks(chunks: int, delivered: list):
    """A reader delivering ``chunks`` chunks of one 1 MB record per range, noting each delivery."""
    from mirror_core.replicate import Columns

    class Reader:
        def read(self, rs, deliver) -> float:
            for i in range(chunks):
                for r in rs:
                    deliver(r, Columns([i], [None], [b"x" * 1_000_000], [0]))
                    delivered.append(r.partition)
            for r in rs:
                deliver(r, None)
            return 0.0

    return Reader()


def test_the_reader_waits_for_a_partition_being_written_once_it_holds_enough(monkeypatch):
    """A worker's memory does not grow with the batch: the reader stops taking records while a partition whose
    writer is busy holds QUEUED_BYTES_PER_PARTITION of them, and goes on as the writer catches up."""
    import threading

    from mirror_core import direct, stream
    from mirror_core.stream import WriterPlan

    monkeypatch.setattr(direct, "QUEUED_BYTES_PER_PARTITION", 3_000_000)
    monkeypatch.setattr(stream, "BatchWriter", _SlowWriter)
    _SlowWriter.gate, _SlowWriter.fed = threading.Event(), []
    delivered: list[int] = []
    plan = WriterPlan({}, {}, {"t": {0: 20}}, {}, None, group="g")
    done = threading.Thread(target=direct.write_ranges, daemon=True,
                            args=(plan, [Range("t", 0, 0, 20)], _megabyte_chunks(20, delivered)))
    done.start()
    time.sleep(0.5)
    # the chunk being written counts until it is written: with it, two more fit (3 MB); the fourth is
    # queued and its delivery waits, so the reader reads nothing more
    assert len(delivered) == 3
    _SlowWriter.gate.set()
    done.join(30)
    assert not done.is_alive() and len(delivered) == 20 and sum(n for _, n in _SlowWriter.fed) == 20


def test_chunks_larger_than_the_bound_do_not_stop_the_reader_at_the_first(monkeypatch):
    """Records of a kilobyte make chunks larger than QUEUED_BYTES_PER_PARTITION: the reader still hands over
    the chunk being written and two more before it waits (up to QUEUED_BYTES_PER_PARTITION_MAX), so it goes
    on reading the other partitions while one partition's chunk is written (waiting at the first chunk made
    the writes of a process's partitions take turns with the read)."""
    import threading

    from mirror_core import direct, stream
    from mirror_core.stream import WriterPlan

    monkeypatch.setattr(direct, "QUEUED_BYTES_PER_PARTITION", 500_000)  # each chunk is twice that
    monkeypatch.setattr(stream, "BatchWriter", _SlowWriter)
    plan = WriterPlan({}, {}, {"t": {0: 10}}, {}, None, group="g")
    # up to QUEUED_BYTES_PER_PARTITION_MAX: three chunks (the fourth one's delivery waits); past it, as before
    for most, handed in ((5_000_000, 3), (2_500_000, 2)):
        monkeypatch.setattr(direct, "QUEUED_BYTES_PER_PARTITION_MAX", most)
        _SlowWriter.gate, _SlowWriter.fed = threading.Event(), []
        delivered: list[int] = []
        done = threading.Thread(target=direct.write_ranges, daemon=True,
                                args=(plan, [Range("t", 0, 0, 10)], _megabyte_chunks(10, delivered)))
        done.start()
        time.sleep(0.5)
        assert len(delivered) == handed
        _SlowWriter.gate.set()
        done.join(30)
        assert not done.is_alive() and len(delivered) == 10 and sum(n for _, n in _SlowWriter.fed) == 10


def test_the_reader_never_waits_for_a_partition_whose_writer_has_not_started(monkeypatch):
    """With more partitions than writer threads, a partition waiting for a thread keeps what is read for it
    (waiting for it could wait forever: the thread frees up only when the read of the others ends)."""
    import threading

    from mirror_core import direct, stream
    from mirror_core.stream import WriterPlan

    monkeypatch.setattr(direct, "QUEUED_BYTES_PER_PARTITION", 3_000_000)
    monkeypatch.setattr(stream, "BatchWriter", _SlowWriter)
    _SlowWriter.gate, _SlowWriter.fed = threading.Event(), []
    _SlowWriter.gate.set()
    delivered: list[int] = []
    plan = WriterPlan({}, {}, {"t": {0: 10, 1: 10}}, {}, None, group="g")
    ranges = [Range("t", 0, 0, 10), Range("t", 1, 0, 10)]
    done = threading.Thread(target=direct.write_ranges, args=(plan, ranges, _megabyte_chunks(10, delivered)),
                            daemon=True,
                            kwargs={"threads": 1})
    done.start()
    done.join(30)
    assert not done.is_alive() and len(delivered) == 20
    assert {p: sum(n for q, n in _SlowWriter.fed if q == p) for p in (0, 1)} == {0: 10, 1: 10}


@pytest.mark.parametrize(("most", "writes"), [
    (None, [[0], [1, 2, 3, 4, 5, 6]]),  # the default bound (COALESCE_RECORDS) holds all six
    ("4", [[0], [1, 2, 3, 4], [5, 6]]),  # a bound of four records
    ("0", [[0], [1], [2], [3], [4], [5], [6]]),  # 0: each chunk written as it came, as before
])
def test_a_writer_behind_its_reader_writes_the_chunks_read_meanwhile_as_one(monkeypatch, most, writes):
    """Partition 0's writer is held in its first write while the reader hands over six more chunks: it then
    writes them as one (one transaction or flush instead of six), up to COALESCE_RECORDS records, in order;
    the next partition's reads and the reader's memory bound are as before (the chunks are small)."""
    import threading

    from mirror_core import direct, stream
    from mirror_core.replicate import Columns
    from mirror_core.stream import WriterPlan

    if most is None:
        monkeypatch.delenv(stream.COALESCE_RECORDS_ENV, raising=False)
    else:
        monkeypatch.setenv(stream.COALESCE_RECORDS_ENV, most)
    writing, go_on = threading.Event(), threading.Event()
    fed: list[tuple[list[int], int]] = []

    class Writer(_SlowWriter):
        def feed(self, topic, part, cols, chunk_records=None) -> None:
            if not fed:
                writing.set()
                assert go_on.wait(10)
            fed.append((list(cols.offsets), chunk_records))

    class Reader:
        def read(self, rs, deliver) -> float:
            deliver(rs[0], Columns([0], [None], [b"v"], [0]))
            assert writing.wait(10)
            for off in range(1, 7):
                deliver(rs[0], Columns([off], [None], [b"v"], [0]))
            go_on.set()
            deliver(rs[0], None)
            return 0.0

    monkeypatch.setattr(stream, "BatchWriter", Writer)
    plan = WriterPlan({}, {}, {"t": {0: 7}}, {}, None, group="g")
    direct.write_ranges(plan, [Range("t", 0, 0, 7)], Reader())
    assert [offsets for offsets, _ in fed] == writes
    cut = stream.COALESCE_RECORDS if most is None else max(int(most), stream.CHUNK_RECORDS)
    assert {n for _, n in fed} == {cut}


def test_writer_processes_keep_their_partitions_and_take_new_ones_by_load():
    """A partition stays with the process that wrote it first (its producer, position and fetch stay warm
    there), across batches that touch only some partitions; a partition new to the job goes to the process
    with the fewest, so the share stays even as topics and partitions are added."""
    from mirror_core.direct import WriterPool

    pool = WriterPool(cluster=None, group="g", processes=2)  # type: ignore[arg-type] - no process is started
    first = pool._share([("a", p) for p in range(6)])
    assert sorted(len(s) for s in first) == [3, 3]
    owner = {k: i for i, share in enumerate(first) for k in share}
    again = pool._share([("a", 5), ("a", 0), ("a", 3)])
    assert all(owner[k] == i for i, share in enumerate(again) for k in share)
    assert sum(map(len, again)) == 3
    # three new partitions, after one process got two more of an earlier topic: the other gets them first
    pool._owner.update({("b", 0): 0, ("b", 1): 0})
    new = pool._share([("c", 0), ("c", 1), ("c", 2), ("a", 1)])
    grew = {k: i for i, share in enumerate(new) for k in share if k[0] == "c"}
    assert sorted(grew.values()) == [0, 1, 1]
    assert sum(1 for w in pool._owner.values() if w == 0) == sum(1 for w in pool._owner.values() if w == 1) + 1


def _runtime(spark: str, checkpoint: Path | None = None):
    """A runtime of one group ``g`` (``a`` -> ``b``, mirroring ``t``) with the ``spark:`` options ``spark``."""
    import yaml

    from mirror_core.config import parse_config
    from mirror_core.stream import MirrorRuntime

    if checkpoint is not None:
        spark += f', checkpoint_dir: "{checkpoint}"'
    text = f"""
clusters:
  a: {{kafka: {{bootstrap.servers: "127.0.0.1:1"}}}}
  b: {{kafka: {{bootstrap.servers: "127.0.0.1:2"}}}}
groups:
  - name: g
    source: a
    destination: b
    spark: {{{spark}}}
    mirrors: [{{source_topic: t}}]
"""
    cfg = parse_config(yaml.safe_load(text), env={})
    return MirrorRuntime(cfg, cfg.groups[0])


def test_direct_processes_default_to_one_per_core_up_to_four(monkeypatch):
    """``spark.direct_processes: 0`` (the default) is one writer process per core of the driver's host, at
    most 4; a set number is taken as it is; with one, the driver writes itself (no process is started)."""
    import os

    def runtime(extra: str):
        return _runtime(f"read_path: direct{extra}")

    for cores, want in ((1, 1), (2, 2), (3, 3), (16, 4)):
        monkeypatch.setattr(os, "cpu_count", lambda c=cores: c)
        assert runtime("").direct_processes() == want
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert runtime(", direct_processes: 6").direct_processes() == 6
    rt = runtime(", direct_processes: 1")
    assert rt.direct_processes() == 1 and rt._writer_pool() is None


def test_a_writer_process_error_travels_as_itself_or_as_its_text():
    """What a writer process raised reaches the driver as the same type and text when it pickles (the job's
    one-line failure then reads as in one process); an error that does not (confluent-kafka's, from its C
    module) comes back as a KafkaOperationError carrying its type and text, the broker's reason included."""
    from confluent_kafka import KafkaError, KafkaException

    from mirror_core.direct import _transportable
    from mirror_core.errors import KafkaOperationError
    from mirror_core.replicate import WriterError

    same = _transportable(WriterError("m partition 3: could not commit after 3 attempts"))
    assert type(same) is WriterError and str(same) == "m partition 3: could not commit after 3 attempts"
    text = _transportable(KafkaException(KafkaError(KafkaError._FENCED, "producer fenced")))
    assert type(text) is KafkaOperationError
    assert str(text).startswith("KafkaException: ") and "producer fenced" in str(text) and "_FENCED" in str(text)


def test_a_warm_up_that_cannot_start_partitions_says_so_in_one_line(caplog):
    """A destination topic whose leaders are not ready fails the warm-up of every partition: one warning
    names how many, the first one and why (not a line per partition: thousands at 3,000 partitions); the
    partitions it could start are started."""
    from types import SimpleNamespace

    from mirror_core.direct import _warm
    from mirror_core.errors import KafkaOperationError

    started = []

    def prepare(topic, part):
        if part % 4:
            raise KafkaOperationError(f"{topic}[{part}]: Broker: Not leader for partition", "NOT_LEADER_FOR_PARTITION")
        started.append(part)

    bw = SimpleNamespace(plan=SimpleNamespace(group="g1", transactions="per_partition"), prepare=prepare)
    with caplog.at_level("DEBUG", logger="mirror_core.direct"):
        _warm(bw, [("t", p) for p in range(400)], threads=4)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    assert "could not start 300 of 400 partitions (first t[1]: t[1]: Broker: Not leader for partition" in warnings[0]
    assert sorted(started) == list(range(0, 400, 4))



def test_a_restarted_job_reads_from_what_was_last_known_written(tmp_path):
    """With ``spark.overlap_writes`` Spark may record a batch as done while its write runs on: a job's first
    batch reads from the written log's offsets where they are below Spark's starts (a partition the log does
    not know from its first offset); a start at or below them stays. The log keeps its newest entries, skips
    a torn one, and a job records where it starts before it writes, so a job that dies during its first
    write leaves the next one the same way back."""
    from mirror_core.errors import MirrorError
    from mirror_core.stream import LocalCheckpointFiles, WrittenLog, replay_starts

    starts = {"t": {0: 100, 1: 50, 2: 30, 3: -2}}
    written = {"t": {0: 60, 1: 70, 3: 5}}
    assert replay_starts(starts, written) == {"t": {0: 60, 1: 50, 2: -1, 3: -2}}
    assert starts["t"][0] == 100, "the offset log's starts are not changed in place"

    files = LocalCheckpointFiles()
    wl = WrittenLog(str(tmp_path / "ckpt" / "g"), files)
    assert wl.last() is None
    for i in range(8):
        wl.add({"t": {0: i}})
    assert WrittenLog(str(tmp_path / "ckpt" / "g"), files).last() == {"t": {0: 7}}
    assert sorted(int(n) for n in files.names(wl.dir)) == [3, 4, 5, 6, 7]
    (tmp_path / "ckpt" / "g" / "mirrorflow-written" / "8").write_text('{"t": {"0": 9')  # torn
    assert WrittenLog(str(tmp_path / "ckpt" / "g"), files).last() == {"t": {0: 7}}
    # entries none of which can be read: where the last job stopped writing is not known, so the job stops
    # with one line instead of trusting Spark's starts
    for f in (tmp_path / "ckpt" / "g" / "mirrorflow-written").iterdir():
        f.write_text("{")
    with pytest.raises(MirrorError, match="none of the written-offsets entries in .*mirrorflow-written can be read"):
        WrittenLog(str(tmp_path / "ckpt" / "g"), files).last()


def test_an_overlapped_write_reports_when_done_and_its_failure_fails_the_next_batch(monkeypatch):
    """``write_direct_behind`` returns at once; ``done`` gets the rows once written; a failure surfaces (once)
    where the next batch waits for it, so Spark fails that batch; one batch in flight at most."""
    import threading

    import yaml

    from mirror_core.config import parse_config
    from mirror_core.stream import MirrorRuntime

    text = """
clusters:
  a: {kafka: {bootstrap.servers: "127.0.0.1:1"}}
  b: {kafka: {bootstrap.servers: "127.0.0.1:2"}}
groups:
  - {name: g, source: a, destination: b, spark: {read_path: direct, overlap_writes: true}, mirrors: [{source_topic: t}]}
"""
    cfg = parse_config(yaml.safe_load(text), env={})
    assert not parse_config(yaml.safe_load(text.replace(", overlap_writes: true", "")), env={}
                            ).groups[0].spark.overlap_writes, "opt-in"
    rt = MirrorRuntime(cfg, cfg.groups[0])
    release = threading.Event()
    done: list[list[dict]] = []

    def write(plan, batch_id):
        release.wait(10)
        if batch_id == 2:
            raise RuntimeError("brokers gone")
        return [{"batch": batch_id}]

    # a running mirror's batches run on; a backlog's (or one whose size is not known) are written first
    for n, want in ((1, True), (50_000, True), (50_001, False), (None, False)):
        monkeypatch.setattr(rt, "batch_records", lambda _b, n=n: n)
        assert rt.overlaps(7) is want, n
    # nor one with a partition whose end moved back: the written log holds the old topic's end for it until
    # the batch is written, so a crash mid-write must not find Spark's record of the batch
    monkeypatch.setattr(rt, "batch_records", lambda _b: 100)
    assert rt.overlaps(7, types.SimpleNamespace(rewound={})) is True
    assert rt.overlaps(7, types.SimpleNamespace(rewound={("t", 0): (1000, 300)})) is False
    for spark in ("{read_path: direct, overlap_writes: false}", "{read_path: spark}"):
        other = parse_config(yaml.safe_load(text.replace("{read_path: direct, overlap_writes: true}", spark)), env={})
        assert not MirrorRuntime(other, other.groups[0]).overlaps(7)
    monkeypatch.setattr(rt, "write_direct", write)
    rt.write_direct_behind(None, 1, done.append)
    with pytest.raises(RuntimeError, match="not been waited for"):
        rt.write_direct_behind(None, 2, done.append)
    with pytest.raises(TimeoutError):
        rt.wait_for_write(0.05)
    assert done == []
    release.set()
    rt.wait_for_write(10)
    assert done == [[{"batch": 1}]]
    rt.write_direct_behind(None, 2, done.append)
    with pytest.raises(RuntimeError, match="brokers gone"):
        rt.wait_for_write(10)
    rt.wait_for_write(0)  # raised once; nothing left in flight
    assert done == [[{"batch": 1}]]
    rt._behind.shutdown()




def test_a_batch_spark_recorded_but_not_all_written_runs_again_at_start(tmp_path):
    """A job killed during an overlapped write of its newest batch, after Spark recorded that batch as done:
    the next start takes Spark's commit-log entry back, so Spark runs the batch again at once instead of
    waiting for a record that a quiet source never sends (``--once`` would otherwise end without it). Only
    then: a batch known written, a newest batch Spark has not recorded, or a checkpoint without the log stay
    as they are."""
    rt = _runtime("read_path: direct, overlap_writes: true", tmp_path / "ckpt")
    ck = Path(rt.checkpoint_dir())
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    for n, end in ((0, 40), (1, 70), (2, 100)):
        (ck / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{{"t":{{"0":{end},"1":5}}}}')
        (ck / "commits" / str(n)).write_text('v1\n{"nextBatchWatermarkMs":0}')
        (ck / "commits" / f".{n}.crc").write_bytes(b"crc")
    assert rt.rewind_unwritten_batch() is None, "no written log: a checkpoint from before it"

    rt.written_log().add({"t": {0: 100, 1: 5}})
    assert rt.rewind_unwritten_batch() is None, "everything of batch 2 is written"
    assert (ck / "commits" / "2").exists()

    rt.written_log().add({"t": {0: 70, 1: 5}})  # the job died while writing batch 2
    assert rt.rewind_unwritten_batch() == 2
    assert sorted(p.name for p in (ck / "commits").iterdir()) == [".0.crc", ".1.crc", "0", "1"]
    assert rt.rewind_unwritten_batch() is None, "Spark runs its newest planned batch again anyway"


def test_the_go_back_leaves_a_partition_whose_end_moved_back_alone(tmp_path):
    """A re-created topic's partition is read from its first offset by a range of its own; going back to
    the written log for it too would read it twice."""
    rt = _runtime("read_path: direct, overlap_writes: true", tmp_path / "ckpt")
    rt.written_log().add({"t": {0: 50, 1: 20}})
    got = rt.replay_starts({"t": {0: 90, 1: 90}}, keep=[("t", 1)])
    assert got == {"t": {0: 50, 1: 90}}
    assert rt.written_log().last() == got, "where the first batch starts is recorded before it writes"


class _SharedWriter:
    """Stands in for :class:`mirror_core.stream.BatchWriter` on ``transactions: per_writer``: notes the
    offsets of each shared write (a cut) and raises ``fail`` from the first one."""

    fail: BaseException | None = None
    cuts: list = []

    def __init__(self, plan, in_task: bool = False) -> None:
        self.results: dict = {}

    def write_shared(self, txn, todo) -> set:
        self.cuts.append(sorted(o for cols, _end in todo.values() for o in cols.offsets))
        if self.fail is not None and len(self.cuts) == 1:
            raise self.fail
        return set()

    def feed(self, topic, part, cols, chunk_records=None) -> None:
        raise AssertionError("nothing is written partition by partition here")

    def finish(self, topic, part, start=None) -> None:
        pass

    def rows(self, read_ms):
        return []


def _per_writer_cuts(monkeypatch, most: int, per_partition: int) -> None:
    """``write_ranges_per_writer`` with :class:`_SharedWriter` noting its cuts, a writer transaction that needs
    no broker, and transactions cut at ``most`` records or ``per_partition`` a partition."""
    from mirror_core import direct, replicate, stream

    class Txn:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def fence_unused(self) -> None:
            pass

    monkeypatch.setattr(direct, "WRITER_TXN_RECORDS", most)
    monkeypatch.setattr(direct, "WRITER_TXN_RECORDS_PER_PARTITION", per_partition)
    monkeypatch.setattr(replicate, "WriterTransaction", Txn)
    monkeypatch.setattr(stream, "BatchWriter", _SharedWriter)


def test_per_writer_a_failed_cut_stops_the_read_and_is_raised(monkeypatch):
    """``transactions: per_writer``, a transaction cut after every record: the first cut fails; the read stops
    there, nothing more is written, and the writer's own error is raised."""
    from types import SimpleNamespace

    from mirror_core import direct
    from mirror_core.stream import WriterPlan

    _per_writer_cuts(monkeypatch, most=1, per_partition=0)
    _SharedWriter.fail, _SharedWriter.cuts = RuntimeError("the destination refused the transaction"), []
    plan = WriterPlan({"t": SimpleNamespace(delivery="exactly_once")}, {}, {"t": {0: 10}}, {}, None, group="g",
                      transactions="per_writer")
    reader = _FakeReader(chunks=10**9)  # stopped by the failure, not by running out
    with pytest.raises(RuntimeError, match="refused the transaction"):
        direct.write_ranges_per_writer(plan, [Range("t", 0, 0, 10**9)], reader, 0, 1)
    assert reader.stopped_by is not None and _SharedWriter.cuts == [[0]]


def test_per_writer_a_transaction_over_many_partitions_holds_more_records(monkeypatch):
    """``transactions: per_writer``: a transaction is cut at ``WRITER_TXN_RECORDS`` records, or at
    ``WRITER_TXN_RECORDS_PER_PARTITION`` a partition when it spans enough partitions for that to be more (each
    partition's records go to the broker in a request of their own: fewer, larger requests)."""
    from types import SimpleNamespace

    from mirror_core import direct
    from mirror_core.stream import WriterPlan

    _per_writer_cuts(monkeypatch, most=6, per_partition=2)
    for partitions, cut in ((2, 6), (3, 6), (5, 10)):
        _SharedWriter.fail, _SharedWriter.cuts = None, []
        plan = WriterPlan({"t": SimpleNamespace(delivery="exactly_once")}, {}, {"t": {p: 10 for p in range(partitions)}},
                          {}, None, group="g", transactions="per_writer")
        ranges = [Range("t", p, 0, 10) for p in range(partitions)]
        direct.write_ranges_per_writer(plan, ranges, _FakeReader(chunks=10), 0, 1)
        assert [len(c) for c in _SharedWriter.cuts[:-1]] == [cut] * (10 * partitions // cut - (
            10 * partitions % cut == 0)), (partitions, _SharedWriter.cuts)
        assert sum(map(len, _SharedWriter.cuts)) == 10 * partitions
    monkeypatch.setenv(direct.WRITER_TXN_PER_PARTITION_ENV, "0")  # the bench's -txnflat A/B
    assert direct.writer_txn_records(5) == 6
    monkeypatch.setenv(direct.WRITER_TXN_PER_PARTITION_ENV, "many")
    with pytest.raises(ValueError, match="MIRRORFLOW_WRITER_TXN_PER_PARTITION='many'"):
        direct.writer_txn_records(5)


def test_per_writer_a_transaction_over_many_partitions_may_hold_more_bytes(monkeypatch):
    """A writer transaction holds ``CHUNK_BYTES`` of keys and values at most, or
    ``WRITER_TXN_BYTES_PER_PARTITION`` a partition when that is more: 32 MiB up to 128 partitions, 125 MiB at 500
    (a writer's share of 1,000); the bench's ``-flat`` A/B sets it to 0."""
    from mirror_core import direct

    assert [direct.writer_txn_bytes(n) >> 20 for n in (1, 128, 500)] == [32, 32, 125]
    monkeypatch.setattr(direct, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(direct, "WRITER_TXN_BYTES_PER_PARTITION", 30)
    assert [direct.writer_txn_bytes(n) for n in (1, 33, 34, 1000)] == [1000, 1000, 1020, 30000]
    monkeypatch.setenv(direct.WRITER_TXN_BYTES_PER_PARTITION_ENV, "0")
    assert direct.writer_txn_bytes(1000) == 1000
    monkeypatch.setenv(direct.WRITER_TXN_BYTES_PER_PARTITION_ENV, "1e6")
    with pytest.raises(ValueError, match="MIRRORFLOW_WRITER_TXN_BYTES_PER_PARTITION='1e6': must be a whole number "
                                         "of bytes"):
        direct.writer_txn_bytes(5)


def _shared_writer(monkeypatch, cap: int, lost, producer_config=None):
    """A :class:`mirror_core.stream.BatchWriter` whose one-transaction write notes the partitions of each
    transaction it is given (and, in ``once_more``, whether a producer error may still be tried again) and raises
    what ``lost(partitions)`` returns (None: it committed; :data:`HANDED_BACK`: it hands every partition back, as
    after a producer error on a second try)."""
    from types import SimpleNamespace

    from mirror_core import stream
    from mirror_core.stream import BatchWriter, WriterPlan

    monkeypatch.setattr(stream, "SHARED_TXN_PARTITIONS", cap)
    monkeypatch.setattr(stream, "SHARED_RETRY_PAUSE", 0.0)
    bw = BatchWriter(WriterPlan({}, {}, {}, {}, None, group="g", transactions="per_writer"))
    tried: list[list[int]] = []
    committed: list[int] = []
    bw.once_more = []  # type: ignore[attr-defined]

    def once(txn, parts, once_more=False, reported=False) -> set:
        tried.append([p for _t, p in parts])
        bw.once_more.append(once_more)  # type: ignore[attr-defined]
        exc = lost(len(parts))
        if exc is HANDED_BACK:
            return set(parts)
        if exc is not None:
            raise exc
        committed.extend(p for _t, p in parts)
        return {key for key in parts if key[1] == 3}  # partition 3: to be written partition by partition

    bw._write_shared = once  # type: ignore[method-assign]
    txn = SimpleNamespace(producer_config=producer_config or {})
    return bw, txn, tried, committed


HANDED_BACK = object()


def _parts(n: int) -> dict:
    return {("t", p): (Columns([0], [b"k"], [b"v"], [None]), 1) for p in range(n)}


def test_per_writer_a_transaction_holds_at_most_the_partition_cap(monkeypatch):
    """``transactions: per_writer``: a cut of more partitions than a transaction may hold goes out as several
    transactions, each partition in one of them, in the cut's order; what one hands back is handed back."""
    bw, txn, tried, committed = _shared_writer(monkeypatch, 2, lambda n: None)
    assert bw.write_shared(txn, _parts(5)) == {("t", 3)}
    assert tried == [[0, 1], [2, 3], [4]] and committed == [0, 1, 2, 3, 4]


def test_per_writer_a_lost_transaction_is_written_again_in_halves(monkeypatch, caplog):
    """A writer transaction whose records were not acknowledged within its time is lost; its partitions go
    out again as two transactions of half as many, halved again while they keep timing out (here: any of more
    than two partitions), until each partition committed once."""
    import logging

    from mirror_core.stream import _AckTimeout

    bw, txn, tried, committed = _shared_writer(monkeypatch, 1000, lambda n: _AckTimeout(7, 60.0) if n > 2 else None)
    with caplog.at_level(logging.WARNING, logger="mirror_core.stream"):
        assert bw.write_shared(txn, _parts(8)) == {("t", 3)}
    assert tried == [list(range(8)), [0, 1, 2, 3], [0, 1], [2, 3], [4, 5, 6, 7], [4, 5], [6, 7]]
    assert committed == list(range(8))
    lines = [r.getMessage() for r in caplog.records]
    assert any("transaction of 8 partitions was lost (7 records not acknowledged within 60 s); writing them again "
               "as two transactions of 4 and 4" in line for line in lines), lines


def test_per_writer_a_transaction_that_failed_is_written_again_once_before_partition_by_partition(monkeypatch,
                                                                                                 caplog):
    """A writer transaction that failed with a producer error (here: fenced) is written again once, as two
    transactions of half its partitions; a half that fails again is handed back to be written partition by
    partition, the other half commits. Nothing is tried a third time."""
    import logging

    from mirror_core.stream import _AckTimeout, _ProducerFailed

    outcomes = iter([_ProducerFailed("fenced by a newer instance"), HANDED_BACK, None])
    bw, txn, tried, committed = _shared_writer(monkeypatch, 1000, lambda n: next(outcomes))
    with caplog.at_level(logging.WARNING, logger="mirror_core.stream"):
        assert bw.write_shared(txn, _parts(8)) == {("t", p) for p in (0, 1, 2, 3)}
    assert tried == [list(range(8)), [0, 1, 2, 3], [4, 5, 6, 7]]
    assert bw.once_more == [True, False, False]  # type: ignore[attr-defined]
    assert committed == [4, 5, 6, 7]
    lines = [r.getMessage() for r in caplog.records]
    assert any("transaction of 8 partitions failed (fenced by a newer instance); writing them again as two "
               "transactions of 4 and 4" in line for line in lines), lines

    # a timeout after a producer error halves as before, and still does not try a producer error a second time
    outcomes = iter([_ProducerFailed("fenced"), _AckTimeout(1, 60.0), None, None, None])
    bw, txn, tried, committed = _shared_writer(monkeypatch, 1000, lambda n: next(outcomes))
    assert bw.write_shared(txn, _parts(4)) == {("t", 3)}
    assert tried == [[0, 1, 2, 3], [0, 1], [0], [1], [2, 3]]
    assert bw.once_more == [True, False, False, False, False]  # type: ignore[attr-defined]
    assert committed == [0, 1, 2, 3]


def test_per_writer_a_destination_that_never_acknowledges_fails_the_batch_after_the_delivery_timeout(monkeypatch):
    """Timeouts go on past the producers' delivery timeout (``message.timeout.ms``, here 300 ms) from the first:
    the batch fails with one line that says so, and nothing was committed. A producer that cannot start because
    the destination does not answer counts as a timeout; any other producer error is raised as it is."""
    from confluent_kafka import KafkaError, KafkaException

    from mirror_core.replicate import NotAcknowledged
    from mirror_core.stream import _AckTimeout

    bw, txn, tried, committed = _shared_writer(
        monkeypatch, 1000, lambda n: _AckTimeout(3, 60.0) if len(tried) % 2 else KafkaException(
            KafkaError(KafkaError._TRANSPORT)), {"message.timeout.ms": 300})
    t0 = time.monotonic()
    with pytest.raises(NotAcknowledged, match=r"^g: the writer's transaction of 1 partition: .*the destination has "
                                              r"not kept up for \d+ s; nothing of it is visible$"):
        bw.write_shared(txn, _parts(4))
    assert 0.3 <= time.monotonic() - t0 < 5 and committed == [] and len(tried) > 4

    bw, txn, tried, committed = _shared_writer(
        monkeypatch, 1000, lambda n: KafkaException(KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)))
    with pytest.raises(KafkaException):
        bw.write_shared(txn, _parts(4))
    assert tried == [[0, 1, 2, 3]]


def _kept_plan(ends):
    from mirror_core.stream import WriterPlan

    return WriterPlan(settings={"t": object()}, id_map={}, end_offsets=ends, destination_consumer_config={},
                      registries=None)


def _row(topic, part, first, end, **extra):
    return {"topic": topic, "partition": part, "records_in": end - first, "mirrored": end - first,
            "first_offset": first, "last_offset": end - 1, "upstream_end": end, "latency_ms": [1.0],
            "produce_ms": 2.0, **extra}


def test_a_running_mirrors_batch_keeps_writing_what_arrives_from_where_it_stands(monkeypatch):
    """``spark.keep_writing_for``: after a small batch's own ranges, the batch writes what arrived since, a
    range per partition from where it stands (Spark's end, then each write's end) to the source's last stable
    offset, with a plan whose ends are that write's, until asked to stop; its rows come back merged (counts
    added, the first offset from Spark's range, the position from the last write), and the next batch is to
    read from where it stopped. Nothing new: it asks again, writing nothing."""
    rt = _runtime("read_path: direct, keep_writing_for: 30 seconds")
    monkeypatch.setattr(rt, "batch_records", lambda _b: 40)
    rt._starts[5] = ({"t": {0: 80, 1: 100}}, {"t": {0: 100, 1: 120}})
    answers = iter([{("t", 0): 100, ("t", 1): 120},              # nothing new yet
                    {("t", 0): 130, ("t", 1): 120},
                    {("t", 0): 150, ("t", 1): 125}])
    asked = []

    def stable(keys):
        asked.append(sorted(keys))
        return next(answers)

    writes = []

    def write(plan, ranges):
        writes.append((plan.end_offsets, plan.rewound, [(r.topic, r.partition, r.start, r.end) for r in ranges]))
        return [_row(r.topic, r.partition, r.start, r.end) for r in ranges]

    monkeypatch.setattr(rt, "_writer_pool", lambda: None)  # the driver writes (writer processes: see below)
    monkeypatch.setattr(rt, "_stable_ends", stable)
    monkeypatch.setattr(rt, "_write_ranges", write)
    monkeypatch.setattr(rt, "stop_requested", lambda: len(asked) == 3 and len(writes) == 2)
    monkeypatch.setattr("mirror_core.direct.KEEP_WRITING_POLL", 0.001)
    spark_rows = [_row("t", 0, 80, 100), _row("t", 1, 100, 120)]
    rows = rt.keep_writing(_kept_plan({"t": {0: 100, 1: 120}}), 5, spark_rows)

    assert asked == [[("t", 0), ("t", 1)]] * 3
    assert writes == [({"t": {0: 130}}, {}, [("t", 0, 100, 130)]),
                      ({"t": {0: 150, 1: 125}}, {}, [("t", 0, 130, 150), ("t", 1, 120, 125)])]
    by = {r["partition"]: r for r in rows}
    assert (by[0]["records_in"], by[0]["first_offset"], by[0]["last_offset"], by[0]["upstream_end"]) == (70, 80, 149, 150)
    assert (by[1]["records_in"], by[1]["first_offset"], by[1]["upstream_end"]) == (25, 100, 125)
    assert by[0]["latency_ms"] == [1.0, 1.0, 1.0] and by[0]["produce_ms"] == 6.0
    assert spark_rows[0]["records_in"] == 20, "the batch's own rows are not changed in place"
    assert rt._ahead == {("t", 0): 150, ("t", 1): 125}
    assert rt._kept == {5: (2, 0)}  # two further writes, nothing expired: for the batch's line


def test_a_batch_stops_keeping_on_a_backlog_a_move_back_or_the_end_of_its_span(monkeypatch):
    """What arrived beyond 50,000 offsets (a backlog: Spark's large batches drain it) or a partition whose
    end moved back (Spark's next batch sees it) sends the batch back to Spark without writing; so does the end
    of the span; a batch larger than 50,000 offsets, one with partitions whose end moved back, and a group
    without the setting do not keep writing at all."""
    import time

    def runtime(spark="read_path: direct, keep_writing_for: 30 seconds"):
        rt = _runtime(spark)
        monkeypatch.setattr(rt, "batch_records", lambda _b: 20)
        rt._starts[1] = ({"t": {0: 80}}, {"t": {0: 100}})
        monkeypatch.setattr(rt, "_writer_pool", lambda: None)
        monkeypatch.setattr(rt, "_write_ranges", lambda plan, ranges: pytest.fail(f"wrote {ranges}"))
        return rt

    plan = _kept_plan({"t": {0: 100}})
    rows = [_row("t", 0, 80, 100)]
    for answer in ({("t", 0): 100 + 50_001}, {("t", 0): 99}, None):
        rt = runtime()
        monkeypatch.setattr(rt, "_stable_ends", lambda keys, a=answer: a)
        assert rt.keep_writing(plan, 1, rows) == rows and rt._ahead == {} and rt._kept == {1: (0, 0)}
    rt = runtime("read_path: direct, keep_writing_for: 200ms")
    monkeypatch.setattr(rt, "_stable_ends", lambda keys: {("t", 0): 100})
    t0 = time.monotonic()
    assert rt.keep_writing(plan, 1, rows) == rows
    assert 0.2 <= time.monotonic() - t0 < 5
    for rt, p in ((runtime("read_path: direct"), plan), (runtime(), replace_rewound(plan))):
        monkeypatch.setattr(rt, "_stable_ends", lambda keys: pytest.fail("asked the source"))
        assert rt.keep_writing(p, 1, rows) is rows
    rt = runtime()
    rt._starts[1] = ({"t": {0: 49_999}}, {"t": {0: 100_000}})
    monkeypatch.setattr(rt, "_stable_ends", lambda keys: pytest.fail("asked the source"))
    assert rt.keep_writing(_kept_plan({"t": {0: 100_000}}), 1, rows) is rows
    # after a batch that kept writing, Spark's batch spans those writes too: what counts is what this batch
    # wrote itself (from where the one before stopped)
    rt = runtime("read_path: direct, keep_writing_for: 50ms")
    monkeypatch.setattr(rt, "batch_records", lambda _b: 100_000)
    rt._starts[1] = ({"t": {0: 99_980}}, {"t": {0: 100_000}})
    monkeypatch.setattr(rt, "_stable_ends", lambda keys: {("t", 0): 100_000})
    assert rt.keep_writing(_kept_plan({"t": {0: 100_000}}), 1, rows) == rows and rt._kept == {1: (0, 0)}


def replace_rewound(plan):
    from dataclasses import replace

    return replace(plan, rewound={("t", 0): (120, 100)})


def test_the_batch_after_reads_from_where_the_batch_before_kept_writing_to():
    """``past_written_ahead``: a start moves up to where the batch before went on writing (no range when the
    batch's end is not past it, and the entry is kept for the next batch); an end that reached it drops the
    entry; a partition whose end moved back below its start starts over as Spark plans it (entry dropped); a
    partition the batch does not plan keeps its entry."""
    from mirror_core.stream import past_written_ahead

    starts = {"t": {0: 100, 1: 100, 2: 100, 3: 100}, "u": {0: 5}}
    ends = {"t": {0: 180, 1: 140, 2: 150, 3: 40}, "u": {0: 9}}
    ahead = {("t", 0): 150, ("t", 1): 160, ("t", 2): 150, ("t", 3): 130, ("v", 0): 7}
    moved, left = past_written_ahead(starts, ends, ahead)
    assert moved == {"t": {0: 150, 1: 160, 2: 150, 3: 100}, "u": {0: 5}}
    assert left == {("t", 1): 160, ("v", 0): 7}
    assert starts["t"][0] == 100, "not changed in place"
    from mirror_core.direct import batch_ranges

    assert [(r.partition, r.start, r.end) for r in batch_ranges(moved, ends) if r.topic == "t"] == [(0, 150, 180)]


def test_keep_writing_for_is_a_duration_for_the_direct_path_and_not_with_overlap_writes():
    """``spark.keep_writing_for``: off by default (0); a duration; refused, naming it, on Spark's read path and
    together with ``overlap_writes``."""
    from pydantic import ValidationError

    from mirror_core.config import SparkConfig

    assert SparkConfig().keep_writing_for == 0
    assert SparkConfig(read_path="direct", keep_writing_for="500ms").keep_writing_for == 0.5
    assert SparkConfig(read_path="direct", keep_writing_for=0).keep_writing_for == 0
    assert SparkConfig(keep_writing_for="1s", master="yarn").reads_directly  # auto: the option needs the path
    for kw, msg in ((dict(read_path="spark", keep_writing_for="1s"), "keep_writing_for needs read_path: direct"),
                    (dict(read_path="direct", keep_writing_for="1s", overlap_writes=True),
                     "keep_writing_for and overlap_writes cannot both be on"),
                    (dict(read_path="direct", keep_writing_for="soon"), "not a duration: 'soon'")):
        with pytest.raises(ValidationError, match=msg):
            SparkConfig(**kw)


def test_the_driver_reports_expired_records_of_the_writes_that_read_from_past_their_start(monkeypatch):
    """A further write whose partition brought no record, or whose first record lies past the write's start,
    is checked for records retention removed (with that write's own starts and ends); one read from its start
    is not."""
    rt = _runtime("read_path: direct, keep_writing_for: 30 seconds")
    monkeypatch.setattr(rt, "batch_records", lambda _b: 40)
    rt._starts[5] = ({"t": {0: 80, 1: 100}}, {"t": {0: 100, 1: 120}})
    answers = iter([{("t", 0): 130, ("t", 1): 140}])
    monkeypatch.setattr(rt, "_writer_pool", lambda: None)
    monkeypatch.setattr(rt, "_stable_ends", lambda keys: next(answers, None))
    # partition 0 is read from 110 (offsets 100-109 are gone), partition 1 brings nothing
    monkeypatch.setattr(rt, "_write_ranges", lambda plan, ranges: [_row("t", 0, 110, 130)])
    checked = []
    monkeypatch.setattr(rt, "report_expired", lambda b, rows, planned: checked.append((b, rows, planned)) or 10)
    rows = rt.keep_writing(_kept_plan({"t": {0: 100, 1: 120}}), 5, [_row("t", 0, 80, 100), _row("t", 1, 100, 120)])
    assert checked == [(5, [_row("t", 0, 110, 130)], ({"t": {0: 100, 1: 120}}, {"t": {0: 130, 1: 140}}))]
    assert rt._kept == {5: (1, 10)}
    assert rt._ahead == {("t", 0): 130, ("t", 1): 140}
    assert {r["partition"]: r["records_in"] for r in rows} == {0: 40, 1: 20}


class _GoneProc:
    """A writer process's handle for :class:`_Worker` where the process is a thread of the test."""

    def poll(self):
        return None


def _thread_pool(monkeypatch, answers, written):
    """A :class:`WriterPool` of two writer "processes" that are threads of this test running the writer's own
    request loop (:func:`mirror_core.direct.answer`) over pipes: partition ("t", 0) is the first's, ("t", 1)
    the second's. What each process's reader finds arrived comes from ``answers(keys)`` (it waits
    2 ms when nothing did, as the reader waits for its consumer's next fetch), writes are recorded in
    ``written`` (by thread) and return one row per range."""
    import threading
    import time
    from multiprocessing import Pipe

    from mirror_core import direct

    def arrived(reader, at, wait):
        ends = answers(list(at))
        if all(ends[k] <= o for k, o in at.items()):
            time.sleep(0.002)
        return ends

    monkeypatch.setattr(direct.DirectReader, "arrived", arrived)

    def write(plan, ranges, reader, threads, slot, slots_used):
        written.append((slot, [(r.partition, r.start, r.end) for r in ranges]))
        return [_row(r.topic, r.partition, r.start, r.end) for r in ranges]

    monkeypatch.setattr(direct, "write_ranges", write)
    pool = direct.WriterPool(cluster=None, group="g", processes=2)  # type: ignore[arg-type]
    threads = []
    for i in range(2):
        ours, theirs = Pipe()
        th = threading.Thread(target=direct.answer, args=(theirs, None, "g", None, 1, i, 2), daemon=True)
        th.start()
        threads.append(th)
        pool._workers.append(direct._Worker(i, _GoneProc(), ours))
    pool._owner.update({("t", 0): 0, ("t", 1): 1})
    return pool, threads


def test_writer_processes_left_keeping_on_write_until_the_next_batch_ends_their_keep(monkeypatch):
    """With writer processes a span that ends with none ended early leaves them writing while Spark plans
    the next batch (``keep`` returns None at the end of the span); no other request goes to them until
    ``end_keep``, which stops them after their write and gives everything they wrote since the keep began:
    contiguous ranges, where each partition stands, the write count. Nothing is written after it."""
    import time

    ends = {("t", 0): 10, ("t", 1): 10}

    def answers(keys):
        for k in keys:
            ends[k] += 3  # a steady trickle on both partitions
        return {k: ends[k] for k in keys}

    written: list = []
    pool, threads = _thread_pool(monkeypatch, answers, written)
    plan = _kept_plan({"t": {0: 10, 1: 10}})
    t0 = time.monotonic()
    assert pool.keep(plan, {("t", 0): 10, ("t", 1): 10}, 0.2, 50_000, lambda: False, leave_running=True) is None
    # at the span's end, without waiting for the processes (which write until end_keep: waited for, this would
    # never return); the bound leaves room for a loaded machine
    assert time.monotonic() - t0 < 10
    at_return = len(written)
    deadline = time.monotonic() + 5
    while len(written) < at_return + 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(written) >= at_return + 4, "the processes stopped writing when the span was over"
    with pytest.raises(RuntimeError, match="end_keep"):
        pool.write(plan, [Range("t", 0, 50, 60)])
    kept = pool.end_keep()
    assert kept is not None and kept.ended == "stop"
    after_end = len(written)
    time.sleep(0.1)
    assert len(written) == after_end, "a process wrote after its keep was ended"
    assert kept.writes == after_end
    for slot, key in ((0, ("t", 0)), (1, ("t", 1))):
        ranges = [r for s_, rs in written if s_ == slot for r in rs]
        assert ranges[0][1] == 10 and all(a[2] == b[1] for a, b in zip(ranges, ranges[1:], strict=False))
        assert kept.at[key] == ranges[-1][2]
    assert pool.end_keep() is None
    assert [r["partition"] for r in pool.write(plan, [Range("t", 0, kept.at[("t", 0)], 500)])] == [0]
    for w in pool._workers:
        w.conn.send(None)
    for th in threads:
        th.join(5)
        assert not th.is_alive()


class _LeftKeeping:
    """A writer pool whose processes are left keeping on by every keep asked so (others end at once, having
    written nothing); ``end_keep`` gives ``kept``."""

    def __init__(self, kept):
        self.kept = kept
        self.calls: list = []

    def keep(self, plan, at, span, limit, stopped, leave_running=False):
        from mirror_core.direct import Kept

        self.calls.append(("keep", dict(at), leave_running))
        return None if leave_running else Kept(at=dict(at))

    def end_keep(self):
        self.calls.append(("end",))
        kept, self.kept = self.kept, None
        return kept

    def write(self, plan, ranges):
        self.calls.append(("write", [(r.topic, r.partition, r.start, r.end) for r in ranges]))
        return [_row(r.topic, r.partition, r.start, r.end) for r in ranges]


def test_the_next_batch_ends_the_keep_its_writer_processes_went_on_with_and_reads_from_where_they_stopped(
        monkeypatch):
    """``MIRRORFLOW_KEEP_THROUGH_SPARK=1`` (off by default: the processes then stop at the end of the span):
    a batch whose writer processes were left keeping on returns its own rows at once; the next batch first
    ends that keep, then writes only what lies past where the processes stopped (a partition they took past
    the batch's end has no range and stays ahead), and reports their writes with its own: counts added,
    positions from its own write, the first offset of its own range (its expired-record check is of that)."""
    from mirror_core.direct import Kept

    rt = _runtime("read_path: direct, keep_writing_for: 2 seconds")
    rt._first_direct = False
    kept = Kept(rows=[_row("t", 0, 100, 150), _row("t", 1, 120, 124)], at={("t", 0): 150, ("t", 1): 124}, writes=7,
                ended="stop")
    pool = _LeftKeeping(kept)
    rt._pool = pool
    monkeypatch.setattr(rt, "_writer_pool", lambda: pool)
    rt._starts[5] = ({"t": {0: 80, 1: 100}}, {"t": {0: 100, 1: 120}})
    spark_rows = [_row("t", 0, 80, 100), _row("t", 1, 100, 120)]
    monkeypatch.delenv("MIRRORFLOW_KEEP_THROUGH_SPARK", raising=False)
    rt.keep_writing(_kept_plan({"t": {0: 100, 1: 120}}), 5, spark_rows)
    assert pool.calls == [("keep", {("t", 0): 100, ("t", 1): 120}, False)], "left running by default"
    assert rt._keeping_from is None
    pool.calls.clear()
    rt._kept = {}
    monkeypatch.setenv("MIRRORFLOW_KEEP_THROUGH_SPARK", "1")
    assert rt.keep_writing(_kept_plan({"t": {0: 100, 1: 120}}), 5, spark_rows) == spark_rows
    assert pool.calls == [("keep", {("t", 0): 100, ("t", 1): 120}, True)]
    assert rt._kept == {}, "nothing kept is known before the next batch"

    rt._starts[6] = ({"t": {0: 100, 1: 120}}, {"t": {0: 140, 1: 125}})
    rows = rt.write_direct(_kept_plan({"t": {0: 140, 1: 125}}), 6)
    assert pool.calls[1:] == [("end",), ("write", [("t", 1, 124, 125)])]
    by = {r["partition"]: r for r in rows}
    assert (by[0]["records_in"], by[0]["first_offset"], by[0]["upstream_end"]) == (50, 100, 150)
    assert (by[1]["records_in"], by[1]["first_offset"], by[1]["upstream_end"]) == (5, 124, 125)
    assert rt._ahead == {("t", 0): 150}
    assert rt._kept == {6: (7, 0)}
    # a batch with no keep left running writes as before
    rt._starts[7] = ({"t": {0: 140, 1: 125}}, {"t": {0: 160, 1: 130}})
    rows = rt.write_direct(_kept_plan({"t": {0: 160, 1: 130}}), 7)
    assert pool.calls[3:] == [("write", [("t", 0, 150, 160), ("t", 1, 125, 130)])]
    assert {r["partition"]: r["records_in"] for r in rows} == {0: 10, 1: 5}


def test_a_writer_process_keeping_on_ends_quietly_when_the_driver_is_gone(monkeypatch):
    """The job dies while a writer process keeps writing: the process stops after its write in progress and
    ends without a traceback (its stop check reads the end of the pipe, its answer has no one to go to)."""
    import threading
    import time

    failures: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    written: list = []
    pool, threads = _thread_pool(monkeypatch, lambda keys: {k: 1_000 + 5 * len(written) for k in keys}, written)
    pool._workers[0].conn.send(("keep", _kept_plan({"t": {0: 10}}), ({("t", 0): 10}, 30.0, 50_000)))
    deadline = time.monotonic() + 5
    while not written and time.monotonic() < deadline:
        time.sleep(0.01)
    assert written, "the writer process never wrote"
    pool._workers[0].conn.close()  # the driver is gone
    threads[0].join(5)
    assert not threads[0].is_alive(), "the writer process went on writing with no driver"
    assert failures == []
    pool._workers[1].conn.send(None)
    threads[1].join(5)


def test_writer_processes_keep_writing_on_their_own_and_stop_together(monkeypatch):
    """With writer processes each keeps writing its own partitions without waiting for the other's writes;
    when one meets a backlog the other is asked to stop after its write (not at the end of the span), and
    the batch reports the backlog; a stop asked of a process that has already answered is passed over by
    its next request; the job's stop ends both."""
    import time

    ends = {("t", 0): 10, ("t", 1): 10}
    backlog = [True]

    def answers(keys):
        for k in keys:
            if k == ("t", 0):
                ends[k] += 5  # a steady trickle on the first process's partition
        if backlog and len([w for w in written if w[0] == 1]) >= 3 and any(w[0] == 0 for w in written):
            ends[("t", 1)] += 30_000  # a backlog on the second's, once each has written (3 writes or more)
            backlog.clear()
        elif ("t", 1) in keys:
            ends[("t", 1)] += 1
        return {k: ends[k] for k in keys}

    written: list = []
    pool, threads = _thread_pool(monkeypatch, answers, written)
    plan = _kept_plan({"t": {0: 10, 1: 10}})
    t0 = time.monotonic()
    kept = pool.keep(plan, {("t", 0): 10, ("t", 1): 10}, 30.0, 50_000, lambda: False)
    assert time.monotonic() - t0 < 10, "the first process was not asked to stop"
    assert kept.ended == "backlog"
    first = [r for slot, rs in written if slot == 0 for r in rs]
    second = [r for slot, rs in written if slot == 1 for r in rs]
    assert len(second) >= 3 and second == [(1, 10 + i, 11 + i) for i in range(len(second))]
    assert first and first[0][1] == 10 and all(a[2] == b[1] for a, b in zip(first, first[1:], strict=False))
    assert kept.at == {("t", 0): first[-1][2], ("t", 1): 10 + len(second)}
    assert kept.writes == len(first) + len(second)
    by = {r["partition"]: r for r in kept.rows}
    assert by[1]["records_in"] == len(second) and by[0]["records_in"] == first[-1][2] - 10

    # a stop for a process that already answered: its next request is answered as usual
    pool._workers[0].ask_to_stop()
    assert [r["partition"] for r in pool.write(plan, [Range("t", 0, 50, 60)])] == [0]
    # the job's stop ends both
    written.clear()
    ends.update({("t", 0): 100, ("t", 1): 100})
    asked = []
    kept = pool.keep(plan, {("t", 0): 100, ("t", 1): 100}, 30.0, 50_000,
                     lambda: asked.append(1) or len(asked) > 3)
    assert kept.ended == "stop" and time.monotonic() - t0 < 20
    for w in pool._workers:
        w.conn.send(None)
    for th in threads:
        th.join(5)
        assert not th.is_alive()


@pytest.mark.parametrize("native_read", ["1", "0"])
def test_the_direct_readers_fetches_wait_for_64_kib_or_10_ms_and_bring_less_a_partition_the_more_it_reads(
        monkeypatch, native_read):
    """The source consumer of the direct path (the C read loop's, or confluent-kafka's with
    ``MIRRORFLOW_NATIVE_READ=0``) asks the broker to hold each fetch until 64 KiB arrived or 10 ms passed, not to
    answer at the first byte (librdkafka's default, a fetch per arrival); ``MIRRORFLOW_DIRECT_FETCH_MIN_BYTES``
    sets it for an A/B, and a value that is not a whole number of bytes from 1 to 1 MiB is refused naming it.
    A fetch brings librdkafka's 1 MiB of a partition for a reader of up to 128 partitions, less for more (what
    comes past a range's end is held until the next range: 1 MiB of each of 500 partitions was gigabytes as
    Python objects), never under 64 KiB; ``MIRRORFLOW_DIRECT_PARTITION_FETCH_BYTES`` sets it for an A/B."""
    from mirror_core import clients, direct
    from mirror_core.config import ClusterConfig

    got: list[dict] = []

    def capture(cluster, group_id, **extra):
        got.append(dict(clients._consumer_config(cluster, group_id, extra)))
        return object()

    monkeypatch.setattr(clients, "native_reader", capture)
    monkeypatch.setattr(clients, "consumer", capture)
    monkeypatch.setattr(direct, "_Consumer", lambda c: c)
    monkeypatch.setenv("MIRRORFLOW_NATIVE_READ", native_read)
    cluster = ClusterConfig(kafka={"bootstrap.servers": "b:9092", "fetch.min.bytes": "1"})

    def conf(partitions: int = 6) -> dict:
        direct.DirectReader(cluster, "g")._client(partitions)
        return got.pop()

    monkeypatch.delenv(direct.PARTITION_FETCH_BYTES_ENV, raising=False)
    assert [conf(n)["max.partition.fetch.bytes"] for n in (1, 6, 128, 256, 500, 2048, 10000)] == [
        1 << 20, 1 << 20, 1 << 20, 512 << 10, 268435, 64 << 10, 64 << 10]
    monkeypatch.setenv(direct.PARTITION_FETCH_BYTES_ENV, str(1 << 20))
    assert conf(500)["max.partition.fetch.bytes"] == 1 << 20

    monkeypatch.delenv(direct.FETCH_MIN_BYTES_ENV, raising=False)
    c = conf()
    assert (c["fetch.min.bytes"], c["fetch.wait.max.ms"], c["isolation.level"]) == (65536, 10, "read_committed")
    monkeypatch.setenv(direct.FETCH_MIN_BYTES_ENV, "1")
    assert conf()["fetch.min.bytes"] == 1
    for bad in ("many", "0", "2000000", "1.5"):
        monkeypatch.setenv(direct.FETCH_MIN_BYTES_ENV, bad)
        with pytest.raises(ValueError, match=f"{direct.FETCH_MIN_BYTES_ENV}='{bad}'"):
            conf()


def _read_into(reader, ranges):
    """``reader.read(ranges)``: each partition's offsets handed over, in order."""
    got: dict[int, list[int]] = {}

    def deliver(r, cols, size=None):
        if cols is not None:
            got.setdefault(r.partition, []).extend(cols.offsets)

    reader.read(ranges, deliver)
    return got


def test_a_partition_whose_range_ends_inside_a_fetch_is_paused_once_ahead_records_are_kept(monkeypatch):
    """A fetch brings a partition's records past its range's end in the same run as its last ones: what is
    kept of them counts toward :data:`AHEAD_RECORDS` like what comes later, and the partition is paused once
    they reach it (before, only records that came after the range had ended were counted, and a partition
    whose first fetch already held more was never paused: a backlog was read whole into memory)."""
    from mirror_core import direct
    from mirror_core.direct import DirectReader

    monkeypatch.setattr(direct, "AHEAD_RECORDS", 100)
    c = _QueuedConsumer([[_run_of(0, range(0, 150))], [_run_of(1, range(0, 10))], [_run_of(1, range(10, 20))]])
    reader = DirectReader(cluster=None, group="g")  # type: ignore[arg-type] - the consumer is the fake
    reader._consumer = c
    assert _read_into(reader, [Range("t", 0, 0, 40), Range("t", 1, 0, 20)]) == {0: list(range(40)),
                                                                                   1: list(range(20))}
    assert c.paused == [("t", 0)], "110 records past the range's end were kept without a pause"
    assert reader._ahead.records(("t", 0)) == 110
    # its next range resumes it, starts with what was kept and reads on from the consumer
    c.fetches = [[_run_of(0, range(150, 160))]]
    assert _read_into(reader, [Range("t", 0, 40, 160)]) == {0: list(range(40, 160))}
    assert ("t", 0) not in reader._paused and reader._ahead.bytes == 0


def test_the_reader_pauses_partitions_past_their_ranges_once_it_keeps_ahead_bytes_of_all_of_them(monkeypatch):
    """What a reader keeps past its ranges' ends is bounded in bytes over all partitions, not only in records
    a partition: at 1,000 partitions with a backlog, 10,000 records each would be gigabytes. Once the kept
    keys and values reach ``MIRRORFLOW_DIRECT_AHEAD_BYTES``, each partition that gets more is paused (once);
    what its consumer had already fetched is still kept, never dropped, and its next range hands it over
    first. 0 turns the bound off (the bench's ``-aheadall``)."""
    from mirror_core.direct import AHEAD_BYTES_ENV, DirectReader

    def batch0():
        # partitions 0-2, whose ranges end at 10, and 3, whose range ends at 40; each fetch brings records of
        # one byte (b"v", no key): 30 of each partition, then 10 more
        return [[_run_of(p, range(0, 30)) for p in range(4)], [_run_of(p, range(30, 40)) for p in range(4)]]

    ranges = [Range("t", p, 0, 10) for p in range(3)] + [Range("t", 3, 0, 40)]
    monkeypatch.setenv(AHEAD_BYTES_ENV, "45")
    c = _QueuedConsumer(batch0())
    reader = DirectReader(cluster=None, group="g")  # type: ignore[arg-type] - the consumer is the fake
    reader._consumer = c
    assert _read_into(reader, ranges) == {**{p: list(range(10)) for p in range(3)}, 3: list(range(40))}
    # the first fetch: partitions 0 and 1 kept 20 bytes each, 2 brought it to 60 and was paused; the second:
    # 0 and 1 got more past the bound and were paused, 2 was not paused again, and all of it was kept
    assert c.paused == [("t", 2), ("t", 0), ("t", 1)]
    assert reader._ahead.bytes == 90 and all(reader._ahead.records(("t", p)) == 30 for p in range(3))
    calls = len(c.calls)
    assert _read_into(reader, [Range("t", p, 10, 40) for p in range(3)]) == {p: list(range(10, 40)) for p in range(3)}
    assert len(c.calls) == calls, "what was kept was asked of the consumer again"
    assert reader._ahead.bytes == 0 and not reader._paused

    monkeypatch.setenv(AHEAD_BYTES_ENV, "0")
    c = _QueuedConsumer(batch0())
    reader = DirectReader(cluster=None, group="g")  # type: ignore[arg-type] - the consumer is the fake
    reader._consumer = c
    _read_into(reader, ranges)
    assert c.paused == [] and reader._ahead.bytes == 90


def test_a_batchs_ranges_are_shared_among_the_tasks_the_same_way_every_batch():
    """``read_path: executors``: every n-th range of the batch's order to the same task, at most one task per
    range, none for an empty batch."""
    from mirror_core.direct import task_shares

    ranges = [Range("t", p, 10 * p, 10 * p + 5) for p in range(5)]
    assert task_shares(ranges, 2) == [[ranges[0], ranges[2], ranges[4]], [ranges[1], ranges[3]]]
    assert task_shares(ranges, 8) == [[r] for r in ranges]
    assert task_shares(ranges, 0) == [ranges]
    assert task_shares([], 4) == []


def test_the_tasks_read_the_batchs_ranges_from_the_offset_log_with_their_workers_reader(monkeypatch, tmp_path):
    """``read_path: executors``: the runtime hands Spark one share of the offset log's ranges per task (a
    partition whose end moved back from its first offset, as on the direct path), and what the tasks yield is
    the batch's rows; a task reads its share with its Python worker's reader, kept for the worker's next task,
    and writes it as the driver would. Small batches are the driver's, with a reader of its own (no writer
    processes)."""
    from dataclasses import replace

    from mirror_core import direct

    monkeypatch.setattr(direct, "_TASK_READERS", {})
    rt = _runtime("read_path: executors", tmp_path / "ck")
    assert rt._writer_pool() is None
    rt._starts[3] = ({"t": {0: 100, 1: 200, 2: 300}}, {"t": {0: 150, 1: 200, 2: 310, 3: 7}})
    plan = replace(_kept_plan({"t": {0: 150, 2: 310, 3: 7, 4: 40}}), rewound={("t", 4): (90, 40)})
    handed = []
    written = []

    def write_ranges(p, ranges, reader, threads=8, slot=0, slots_used=1, in_task=False, retry=False):
        written.append((p, ranges, reader, slot, slots_used, in_task, retry))
        return [_row(r.topic, r.partition, r.start or 0, r.end) for r in ranges]

    monkeypatch.setattr(direct, "write_ranges", write_ranges)

    def run(shares, fn):  # what Spark does: each share in a task of its own, the yields collected
        handed.append(shares)
        return [row for share in shares for row in fn(iter([share]))]

    attempts = iter([0, 1])  # the second share's task is a retry
    rows = rt.write_in_tasks(plan, 3, 2, run, lambda: next(attempts))
    assert handed == [[(0, [Range("t", 0, 100, 150), Range("t", 3, None, 7)]),
                       (1, [Range("t", 2, 300, 310), Range("t", 4, None, 40)])]]
    assert [(r["partition"], r["upstream_end"]) for r in rows] == [(0, 150), (3, 7), (2, 310), (4, 40)]
    assert [w[0] for w in written] == [plan, plan] and written[0][2] is written[1][2]  # one reader per worker
    # each share's slot, of the batch's two; the retry says so
    assert [w[3:] for w in written] == [(0, 2, True, False), (1, 2, True, True)]
    assert written[0][2].cluster == rt.src and written[0][2].group == "g"
    rt._starts[4] = ({"t": {0: 150}}, {"t": {0: 150}})  # nothing new
    assert rt.write_in_tasks(_kept_plan({"t": {0: 150}}), 4, 2, lambda shares, fn: pytest.fail("tasks for an empty batch")) == []


def test_the_tasks_writer_ids_are_fenced_once_before_the_tasks_first_write(monkeypatch, tmp_path):
    """``read_path: executors`` with ``transactions: per_writer``: every writer id but the driver's slot, and each
    exactly-once partition's own id, is fenced before the tasks first write (a task of an earlier job may hold
    one): in the background from the job's warm-up, which the first batch waits for, or by that batch itself
    when no warm-up ran. Once a job. The tasks learn which partitions' own ids are fenced (they need not fence
    them again)."""
    from dataclasses import replace
    from types import SimpleNamespace

    from mirror_core import direct, stream
    from mirror_core.config import DRIVER_WRITER_SLOT

    fenced = []
    own = []

    class Txn:
        def __init__(self, settings, slot, slots_used, producers=2, delivery="exactly_once"):
            self.args = (slot, slots_used, producers)

        def fence_unused(self, keep=()):
            time.sleep(0.3)  # the fence's round trips
            fenced.append((self.args, tuple(keep), threading.current_thread().name.split("_")[0]))

    class Writers:
        def __init__(self, plan):
            pass

        def prepare_shared_many(self, keys, pool, stop=None, read_positions=True):
            assert not read_positions  # only the fences: the driver reads no position for the tasks
            own.extend(keys)
            return []

    def write_ranges(p, ranges, *args, **kwargs):
        assert fenced and sorted(own) == [("t", 0), ("t", 1)], "a task wrote before the writer ids were fenced"
        assert p.fenced == {"t": 2}
        return [_row(r.topic, r.partition, r.start or 0, r.end) for r in ranges]

    monkeypatch.setattr(stream, "WriterTransaction", Txn)
    monkeypatch.setattr(stream, "BatchWriter", Writers)
    monkeypatch.setattr(direct, "write_ranges", write_ranges)
    monkeypatch.setattr(direct, "_TASK_READERS", {})

    def run(shares, fn):
        return [row for share in shares for row in fn(iter([share]))]

    for warm in (True, False):
        fenced.clear()
        own.clear()
        rt = _runtime("read_path: executors, transactions: per_writer, driver_batch_max_records: 0",
                      tmp_path / f"ck-{warm}")
        s = SimpleNamespace(source_topic="t", source_partitions=2, delivery="exactly_once")
        plan = replace(_kept_plan({"t": {0: 150}}), settings={"t": s}, transactions="per_writer", writer_producers=3)
        monkeypatch.setattr(rt, "writer_plan", lambda batch_id, plan=plan: plan)
        if warm:
            rt.warm_up()
        rt._starts[3] = ({"t": {0: 100}}, {"t": {0: 150}})
        assert len(rt.write_in_tasks(plan, 3, 2, run)) == 1
        # all slots from 0 (slots_used 0) but the driver's, and every slot's producers beyond the job's three
        assert fenced == [((DRIVER_WRITER_SLOT, 0, 3), (DRIVER_WRITER_SLOT,),
                           "mirrorflow-fence" if warm else "MainThread")]
        rt._starts[4] = ({"t": {0: 150}}, {"t": {0: 170}})
        assert len(rt.write_in_tasks(plan, 4, 2, run)) == 1
        assert len(fenced) == 1 and len(own) == 2


def test_a_workers_reader_is_replaced_when_the_sources_settings_change(monkeypatch):
    """A Python worker keeps one reader per group between tasks; a task whose source settings differ (the job
    was restarted with a changed config, on a worker Spark kept) gets a new one and the old one is closed."""
    from mirror_core import direct

    monkeypatch.setattr(direct, "_TASK_READERS", {})
    src = _runtime("read_path: executors").src
    first = direct.task_reader(src, "g", "cg")
    assert direct.task_reader(src, "g", "cg") is first
    assert direct.task_reader(src, "h", "cg") is not first  # another group: a reader of its own
    closed = []
    monkeypatch.setattr(first, "close", lambda: closed.append(True))
    moved = src.model_copy(update={"kafka": {**src.kafka, "bootstrap.servers": "127.0.0.1:9"}})
    second = direct.task_reader(moved, "g", "cg")
    assert second is not first and second.cluster == moved and closed == [True]


def test_read_path_executors_plans_in_spark_and_reads_in_the_tasks():
    """``read_path: executors``: not the driver's direct read (no writer processes, a transaction per partition
    under ``transactions: auto``), but Spark only plans (the driver JVM's options of the direct path), and on a
    ``local[...]`` master its batches get the direct path's cap, so large ones reach the tasks."""
    from mirror_core.config import SparkConfig
    from mirror_core.stream import DIRECT_BATCH_RECORDS, effective_max_offsets

    for master in ("local[2]", "spark://h:7077"):
        s = SparkConfig(read_path="executors", master=master)
        assert (s.reads_in_tasks, s.reads_directly, s.plans_only, s.writes_per_writer) == (True, False, True, False)
    assert effective_max_offsets(SparkConfig(read_path="executors", master="local[2]")) == DIRECT_BATCH_RECORDS
    assert effective_max_offsets(SparkConfig(read_path="executors", master="spark://h:7077")) is None
    for path in ("auto", "spark", "direct"):
        assert not SparkConfig(read_path=path).reads_in_tasks
    assert not SparkConfig(read_path="spark").plans_only and SparkConfig(read_path="direct").plans_only


def test_a_topic_provisioning_could_not_make_stops_the_job(monkeypatch):
    """Provisioning goes on past a topic it could not make (the CLI reports each), but the job does not: nothing may
    write to a topic not made, grown or served yet (records acknowledged while a partition comes online can be
    lost), so it stops in one line naming it; a failed ACL copy or config change is logged and the job goes on."""
    from mirror_core import provision
    from mirror_core.errors import KafkaOperationError
    from mirror_core.provision import GroupPlan, ProvisionResult
    from mirror_core.topics import TopicPlan

    rt = _runtime('master: "local[1]"')
    monkeypatch.setattr(provision, "plan_group", lambda cfg, group: GroupPlan(group.name, TopicPlan(group.name, ())))
    refreshed = []
    monkeypatch.setattr(rt, "_refresh_settings", lambda: refreshed.append(1))
    res = ProvisionResult("g", errors=["g__t__t: create t: cluster 'b' ... denied", "g__t__t: create ACLs on t: no"],
                          unusable=["t"])
    monkeypatch.setattr(provision, "provision_group", lambda cfg, group, plan: res)
    with pytest.raises(KafkaOperationError, match="cannot provision t on b: g__t__t: create t"):
        rt.prepare()
    assert refreshed == []
    res.unusable = []
    rt.prepare()
    assert refreshed == [1]
