"""The driver's writing of a micro-batch as Spark hands it over (``stream.write_batches``).

The partition writers are replaced by a recorder (``BatchWriter.feed`` / ``finish``): these tests are
about what reaches them, in what order, and when, not about Kafka.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pytest

from mirror_core import stream
from mirror_core.replicate import BatchResult, Columns

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def batch(topic: str, part: int, offsets: list[int]) -> pa.RecordBatch:
    """Spark Kafka rows of one partition, the shape a Spark task's Arrow batch has."""
    n = len(offsets)
    return pa.RecordBatch.from_arrays([
        pa.array([topic] * n), pa.array([part] * n, pa.int32()), pa.array(offsets, pa.int64()),
        pa.array([b"k%d" % o for o in offsets], pa.binary()), pa.array([b"v%d" % o for o in offsets], pa.binary()),
        pa.array([1_700_000_000_000_000 + o for o in offsets], pa.timestamp("us", tz="UTC")),
        pa.array([None] * n, HEADERS),
    ], names=["topic", "partition", "offset", "key", "value", "timestamp", "headers"])


class Recorder:
    """Stands in for the partition writers: records every feed and finish, optionally fails; ``on_feed``
    (called with the partition and its feed count, inside the feed) lets a test hold a feed on an event."""

    def __init__(self, fail_on: tuple[str, int] | None = None,
                 on_feed: Callable[[tuple[str, int], int], None] | None = None):
        self.events: list[tuple[str, tuple[str, int], list[int]]] = []
        self.fed = threading.Event()
        self.failed = threading.Event()
        self.fail_on = fail_on
        self.on_feed = on_feed
        self.feeds: dict[tuple[str, int], int] = {}
        self.active: dict[tuple[str, int], int] = {}
        self.overlap = False
        self.chunk_records: list[int] = []  # what each feed was told to cut its transactions at
        self.lock = threading.Lock()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        rec = self

        def feed(bw: Any, topic: str, part: int, cols: Columns, chunk_records: int = 0) -> None:
            tp = (topic, part)
            with rec.lock:
                rec.active[tp] = rec.active.get(tp, 0) + 1
                rec.overlap |= rec.active[tp] > 1  # two threads writing one partition at once
                rec.feeds[tp] = n = rec.feeds.get(tp, 0) + 1
            try:
                if rec.on_feed is not None:
                    rec.on_feed(tp, n)
                if tp == rec.fail_on:
                    rec.failed.set()
                    raise RuntimeError(f"writer failed on {topic}[{part}]")
                with rec.lock:
                    rec.events.append(("feed", tp, list(cols.offsets)))
                    rec.chunk_records.append(chunk_records)
                    r = bw.results.setdefault(tp, BatchResult(topic, part))
                    r.records_in += len(cols)
                rec.fed.set()
            finally:
                with rec.lock:
                    rec.active[tp] -= 1

        def finish(bw: Any, topic: str, part: int) -> None:
            with rec.lock:
                rec.events.append(("finish", (topic, part), []))

        monkeypatch.setattr(stream.BatchWriter, "feed", feed)
        monkeypatch.setattr(stream.BatchWriter, "finish", finish)


PLAN = stream.WriterPlan(settings={}, id_map={}, end_offsets={}, destination_consumer_config={}, registries=None)


def test_partitions_are_written_while_later_ones_are_still_arriving(monkeypatch) -> None:
    """The first partition's records reach its writer before Spark has handed over the next partition."""
    rec = Recorder()
    rec.install(monkeypatch)
    waited: list[bool] = []

    def spark() -> Iterator[pa.RecordBatch]:
        yield batch("a", 0, [0, 1, 2])
        waited.append(rec.fed.wait(10))  # a collect-then-write would never feed before the stream ends
        yield batch("a", 1, [5, 6])

    rows = stream.write_batches(PLAN, spark())
    assert waited == [True]
    assert sorted((r["topic"], r["partition"], r["records_in"]) for r in rows) == [("a", 0, 3), ("a", 1, 2)]


def test_each_partition_keeps_its_order_and_is_finished_after_its_last_records(monkeypatch) -> None:
    handed_all = threading.Event()
    second_b0 = threading.Event()

    def on_feed(tp: tuple[str, int], n: int) -> None:
        if tp == ("b", 0) and n == 1:
            # b[0]'s first run holds its partition until every batch was handed over, then gives a wrongly
            # started second run time to show up (it must not: the second run waits for this one)
            assert handed_all.wait(10)
            second_b0.wait(0.3)
        elif tp == ("b", 0):
            second_b0.set()

    rec = Recorder(on_feed=on_feed)
    rec.install(monkeypatch)
    batches = [batch("a", 0, [0, 1]), batch("a", 0, [2, 3]), batch("b", 0, [10]), batch("a", 1, [4]),
               batch("b", 0, [11, 12])]  # b[0] seen again after a gap: written after its first run

    def spark() -> Iterator[pa.RecordBatch]:
        yield from batches
        handed_all.set()

    stream.write_batches(PLAN, spark())
    fed: dict[tuple[str, int], list[int]] = {}
    for kind, tp, offsets in rec.events:
        if kind == "feed":
            assert ("finish", tp, []) not in rec.events[:rec.events.index((kind, tp, offsets))]
            fed.setdefault(tp, []).extend(offsets)
    assert fed == {("a", 0): [0, 1, 2, 3], ("b", 0): [10, 11, 12], ("a", 1): [4]}
    assert sorted(tp for kind, tp, _ in rec.events if kind == "finish") == [("a", 0), ("a", 1), ("b", 0)]
    assert not rec.overlap


@pytest.mark.parametrize(("most", "writes"), [
    (None, [[0], [1, 2, 3, 4]]),  # the default bound (COALESCE_RECORDS) holds all four
    ("2", [[0], [1, 2], [3, 4]]),  # a bound of two records
    ("0", [[0], [1], [2], [3], [4]]),  # 0: each batch written as it came, as before
])
def test_a_writer_behind_spark_writes_the_batches_handed_over_meanwhile_as_one(monkeypatch, most, writes) -> None:
    """a[0]'s writer is held in its first write while Spark hands over four more of its batches: it then writes
    them as one (one transaction, or one flush, instead of four), up to COALESCE_RECORDS records, in order, and
    tells the partition's writer to cut its transactions there rather than at CHUNK_RECORDS."""
    if most is None:
        monkeypatch.delenv(stream.COALESCE_RECORDS_ENV, raising=False)
    else:
        monkeypatch.setenv(stream.COALESCE_RECORDS_ENV, most)
    writing, go_on = threading.Event(), threading.Event()

    def on_feed(tp: tuple[str, int], n: int) -> None:
        if n == 1:
            writing.set()
            assert go_on.wait(10)

    rec = Recorder(on_feed=on_feed)
    rec.install(monkeypatch)

    def spark() -> Iterator[pa.RecordBatch]:
        yield batch("a", 0, [0])
        assert writing.wait(10)
        for off in range(1, 5):
            yield batch("a", 0, [off])
        go_on.set()  # the four are queued by now (each is, before the next is asked for)

    rows = stream.write_batches(PLAN, spark())
    assert [offsets for kind, _, offsets in rec.events if kind == "feed"] == writes
    assert rows[0]["records_in"] == 5
    cut = 200_000 if most is None else max(int(most), stream.CHUNK_RECORDS)  # the README's 200,000 by default
    assert set(rec.chunk_records) == {cut}


def test_a_failed_collect_is_a_collect_error_and_stops_the_writers(monkeypatch) -> None:
    """What was handed over before the failure is written (positions make a rerun skip it); no
    partition is finished, so no position moves past records that were never written."""
    rec = Recorder()
    rec.install(monkeypatch)

    def spark() -> Iterator[pa.RecordBatch]:
        yield batch("a", 0, [0, 1])
        raise OSError("connection reset by the JVM")

    with pytest.raises(stream.CollectError, match="connection reset"):
        stream.write_batches(PLAN, spark())
    assert rec.events == [("feed", ("a", 0), [0, 1])]


def test_a_writer_error_is_raised_and_the_stream_abandoned(monkeypatch) -> None:
    rec = Recorder(fail_on=("a", 1))
    rec.install(monkeypatch)
    closed = threading.Event()
    handed: list[int] = []

    def spark() -> Iterator[pa.RecordBatch]:
        try:
            for i in range(50):
                handed.append(i)
                yield batch("a", i, [i])
                if i == 1:
                    assert rec.failed.wait(10)  # a[1]'s writer has failed before Spark hands over more
        finally:
            closed.set()

    with pytest.raises(RuntimeError, match=r"writer failed on a\[1\]"):
        stream.write_batches(PLAN, spark())
    assert closed.is_set()
    assert len(handed) < 50  # it stopped reading once the writer failed
    assert not any(kind == "finish" for kind, _, _ in rec.events)


def test_records_handed_over_twice_are_refused(monkeypatch) -> None:
    Recorder().install(monkeypatch)
    with pytest.raises(RuntimeError, match=r"a\[0\]: Spark handed over offset 1 after 2"):
        stream.write_batches(PLAN, iter([batch("a", 0, [0, 1, 2]), batch("a", 0, [1, 2])]))


def test_an_empty_batch_writes_nothing(monkeypatch) -> None:
    rec = Recorder()
    rec.install(monkeypatch)
    assert stream.write_batches(PLAN, iter([batch("a", 0, [])])) == []
    assert rec.events == []


@pytest.mark.parametrize(("variable", "records"), [(None, 200_000), ("0", 0), ("5000", 5000)])
def test_a_transaction_coalesces_up_to_200000_records_or_what_the_variable_says(monkeypatch, variable, records):
    """README: "up to 200,000 records (`MIRRORFLOW_COALESCE_RECORDS`; 0 for a chunk at a time)"."""
    if variable is None:
        monkeypatch.delenv("MIRRORFLOW_COALESCE_RECORDS", raising=False)
    else:
        monkeypatch.setenv("MIRRORFLOW_COALESCE_RECORDS", variable)
    assert stream.coalesce_records() == records


def test_a_coalesce_bound_that_is_not_a_whole_number_is_refused(monkeypatch):
    monkeypatch.setenv("MIRRORFLOW_COALESCE_RECORDS", "lots")
    with pytest.raises(ValueError, match="MIRRORFLOW_COALESCE_RECORDS='lots': must be a whole number of records"):
        stream.coalesce_records()
