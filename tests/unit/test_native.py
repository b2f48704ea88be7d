"""The C produce loop (``mirror_core/_native.c``) and the proof of the offsets it does not report
(``native.fill_runs``). The loop is driven here with a real confluent_kafka Producer and no broker:
librdkafka queues what it is given, so what went in is counted without a network; what lands on a real
destination is checked in ``tests/integration/test_native_produce.py``."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from mirror_core import native


def test_the_c_loop_is_built_and_bound_to_the_loaded_librdkafka() -> None:
    # `make venv` builds it; without it the writer silently takes the Python loop, which is what this guards
    assert native.available(), native.why_not()


@pytest.fixture
def producer() -> Producer:
    # no broker to connect to: records stay queued in librdkafka, where len(producer) counts them
    p = Producer({"log_level": 0, "queue.buffering.max.messages": 50})
    yield p
    p.purge()


def columns(n: int) -> tuple[list[bytes | None], list[bytes | None], list[int]]:
    values: list[bytes | None] = [b"\x00\x00\x00\x00\x07" + b"v%d" % i for i in range(n)]
    keys: list[bytes | None] = [b"k%d" % i for i in range(n)]
    return values, keys, [1_700_000_000_000 + i for i in range(n)]


def test_a_run_is_queued_whole_and_its_bytes_counted(producer: Producer) -> None:
    values, keys, stamps = columns(10)
    values[3] = None  # a tombstone goes through as one
    j, status, nbytes = native.produce(producer, "t", 0, values, keys, stamps, None, 1, 9, None, None, None)
    assert (j, status) == (9, native.DONE)
    assert len(producer) == 8
    assert nbytes == sum(len(v or b"") + len(k or b"") for v, k in zip(values[1:9], keys[1:9], strict=True))


@pytest.mark.parametrize("why", ["headers", "unmapped id", "near the size limit", "not bytes", "short value"])
def test_a_record_the_c_loop_cannot_take_is_handed_back_with_the_ones_before_it_queued(producer: Producer,
                                                                                       why: str) -> None:
    values, keys, stamps = columns(10)
    headers: list[tuple[tuple[str, bytes], ...]] | None = None
    id_map = {b"\x00\x00\x00\x00\x07": b"\x00\x00\x00\x00\x2a"}
    limit = None
    if why == "headers":
        headers = [()] * 10
        headers[6] = (("h", b"1"),)
    elif why == "unmapped id":
        values[6] = b"\x00\x00\x00\x00\x08rest"
    elif why == "near the size limit":
        values[6] = b"\x00\x00\x00\x00\x07" + b"x" * 900
        limit = 1000
    elif why == "not bytes":
        values[6] = bytearray(b"\x00\x00\x00\x00\x07x")  # type: ignore[call-overload]
    else:
        values[6] = b"\x00\x00"
    j, status, _ = native.produce(producer, "t", 0, values, keys, stamps, headers, 1, 9, id_map, None, limit)
    assert (j, status) == (6, native.NEEDS_PYTHON)
    assert len(producer) == 5


def test_a_full_queue_stops_the_run_where_it_is(producer: Producer) -> None:
    values, keys, stamps = columns(80)
    j, status, _ = native.produce(producer, "t", 0, values, keys, stamps, None, 0, 80, None, None, None)
    assert (j, status) == (50, native.QUEUE_FULL)
    assert len(producer) == 50


def test_only_a_confluent_kafka_producer_is_accepted() -> None:
    assert not native.usable(object())
    values, keys, stamps = columns(3)
    with pytest.raises(TypeError, match="confluent_kafka Producer"):
        native.produce(object(), "t", 0, values, keys, stamps, None, 0, 3, None, None, None)
    with pytest.raises(ValueError, match="different lengths"):
        native.produce(Producer({"log_level": 0}), "t", 0, values, keys[:2], stamps, None,
                       0, 3, None, None, None)


@pytest.mark.parametrize(("sent", "reported", "runs", "expected"), [
    # one run of 3 between reports 10 and 14: nothing else fits in between
    (5, [10, 14], [(1, 3)], [10, 11, 12, 13, 14]),
    # two runs, each bracketed
    (7, [10, 13, 15, 17], [(1, 2), (4, 1)], [10, 11, 12, 13, 14, 15, 17]),
    # a transaction marker (or another producer's record) somewhere in the run: not provable
    (5, [10, 15], [(1, 3)], None),
    # reported offsets too close for the run: not provable either
    (5, [10, 13], [(1, 3)], None),
    # a run with no report after it, or before it
    (4, [10, 11], [(2, 2)], None),
    (4, [13, 14], [(0, 2)], None),
    # a report missing, or one too many
    (5, [10], [(1, 3)], None),
    (5, [10, 14, 15], [(1, 3)], None),
    # no runs: every record reported
    (3, [4, 6, 9], [], [4, 6, 9]),
])
def test_fill_runs_gives_offsets_only_when_the_reports_around_each_run_prove_them(
        sent: int, reported: list[int | None], runs: list[tuple[int, int]], expected: list[int] | None) -> None:
    assert native.fill_runs(sent, reported, runs) == expected
