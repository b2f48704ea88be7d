"""The writer's delivery reports: one shared callback per chunk, the i-th report taken for the i-th record
produced to the partition (``replicate.ordered_acks``), and the fall back to one callback per record when
the reports do not prove that mapping. Either way the offset syncs map every record to where it landed."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from mirror_core import clients, native, replicate
from mirror_core.offsets import OffsetSync
from mirror_core.replicate import Columns, SchemaIdTranslator, WriterSettings, ordered_acks


def settings(**over: Any) -> WriterSettings:
    base: dict[str, Any] = dict(
        group="g", mirror="g__t__t", source_alias="src", destination_alias="dst", source_topic="t",
        destination_topic="t", source_partitions=3, destination_partitions=3, delivery="exactly_once",
        key_serde="bytes", value_serde="bytes", on_error="dead_letter", dlq_topic="g.dlq",
        offset_syncs_topic="syncs", provenance=False, producer_config={},
    )
    return WriterSettings(**(base | over))


class _Msg:
    def __init__(self, offset: int | None):
        self._offset = offset

    def offset(self) -> int | None:
        return self._offset


class _Broker:
    """A destination partition log and a producer writing to it. ``foreign_every``: another producer's
    record lands after every that many of ours (offsets not contiguous); ``reject``: values refused as too
    large; ``report_order``: the order in which ``flush`` delivers the reports (default: produce order)."""

    def __init__(self, foreign_every: int = 0, reject: frozenset[bytes] = frozenset(),
                 report_order: Callable[[list[Any]], list[Any]] | None = None) -> None:
        self.log: dict[tuple[str, int], list[bytes | None]] = {}
        self.foreign_every = foreign_every
        self.reject = reject
        self.report_order = report_order or (lambda reports: reports)
        self.pending: list[tuple[Any, KafkaError | None, _Msg]] = []
        self.callbacks: list[Any] = []  # the callback of every record produced to the topic "t"
        self.txn: list[tuple[str, int, bytes | None, bytes | None]] = []
        self.committed: list[list[tuple[str, int, bytes | None, bytes | None]]] = []
        self.aborts = 0

    def begin_transaction(self) -> None:
        self.txn = []

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = 0,
                on_delivery: Any = None, timestamp: int = 0, headers: Any = None) -> None:
        self.txn.append((topic, partition, key, value))
        if topic == "t":
            self.callbacks.append(on_delivery)
        if topic == "t" and value in self.reject:
            self.pending.append((on_delivery, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), _Msg(None)))
            return
        log = self.log.setdefault((topic, partition), [])
        if topic == "t" and self.foreign_every and len(log) % (self.foreign_every + 1) == self.foreign_every:
            log.append(b"foreign")
        log.append(value)
        if on_delivery is not None:
            self.pending.append((on_delivery, None, _Msg(len(log) - 1)))

    def flush(self, timeout: float = 0) -> int:
        pending, self.pending = self.report_order(self.pending), []
        for cb, err, msg in pending:
            cb(err, msg)
        return 0

    def commit_transaction(self, timeout: float = 0) -> None:
        self.committed.append(self.txn)

    def abort_transaction(self, timeout: float = 0) -> None:
        self.aborts += 1
        self.txn = []


def _writer(monkeypatch: pytest.MonkeyPatch, broker: _Broker, **over: Any) -> replicate.PartitionWriter:
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, gapless=False: (broker, "key"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    monkeypatch.setattr(replicate, "_drop_producer", lambda *a, **k: None)
    monkeypatch.setattr(replicate.PartitionWriter, "_learn_size_limit", lambda self: False)
    return replicate.PartitionWriter(settings(**over), SchemaIdTranslator({}), lambda t, p: None,
                                     downstream_end=lambda t, p: 0)


def _cols(offsets: list[int]) -> Columns:
    return Columns(list(offsets), [b"k"] * len(offsets), [f"v{o}".encode() for o in offsets],
                   [1_700_000_000_000] * len(offsets))


def _syncs(broker: _Broker) -> list[OffsetSync]:
    return [OffsetSync.from_record(k, v) for t, _, k, v in (broker.committed[-1] if broker.committed else broker.txn)
            if t == "syncs"]


def _where(broker: _Broker, offsets: list[int], partition: int = 1) -> dict[int, int]:
    """upstream offset -> the downstream offset its value landed at (the last copy, at-least-once)."""
    log = broker.log[("t", partition)]
    return {o: max(i for i, v in enumerate(log) if v == f"v{o}".encode()) for o in offsets}


# --------------------------------------------------------------------------- the mapping rule


def test_ordered_acks_pairs_the_i_th_report_with_the_i_th_record() -> None:
    assert ordered_acks([10, 11, 13], [40, 41, 42]) == [(10, 40), (11, 41), (13, 42)]
    # other producers' records in between: still strictly increasing, still exact
    assert ordered_acks([10, 11, 13], [40, 44, 45]) == [(10, 40), (11, 44), (13, 45)]
    assert ordered_acks([], []) == []


@pytest.mark.parametrize("reported", [
    [40, 41],            # a report missing
    [40, 41, 42, 43],    # one too many
    [41, 40, 42],        # out of order: the reports are not in produce order
    [40, 42, 41],        # out of order, same ends
    [40, 40, 42],        # the same offset twice
    [40, None, 42],      # a report without an offset
])
def test_ordered_acks_refuses_reports_that_do_not_prove_the_mapping(reported: list[int | None]) -> None:
    assert ordered_acks([10, 11, 13], reported) is None


# --------------------------------------------------------------------------- the writer


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_one_shared_callback_and_exact_syncs(monkeypatch: pytest.MonkeyPatch, delivery: str) -> None:
    broker = _Broker(foreign_every=2)  # downstream offsets not contiguous
    writer = _writer(monkeypatch, broker, delivery=delivery)
    offsets = [3, 4, 5, 7, 8]
    r = writer.write(1, _cols(offsets), upstream_end=9)
    assert r.mirrored == 5 and broker.aborts == 0
    assert len({id(cb) for cb in broker.callbacks}) == 1 and len(broker.callbacks) == 5  # no closure per record
    where = _where(broker, offsets)
    assert where == {3: 0, 4: 1, 5: 3, 7: 4, 8: 6}
    assert r.last_downstream == 6
    syncs = _syncs(broker)
    assert OffsetSync("t", 1, 3, 0) in syncs and OffsetSync("t", 1, 9, 7) in syncs
    for s in syncs:  # every sync of a mirrored record names where that record landed
        if s.upstream_offset in where:
            assert s.downstream_offset == where[s.upstream_offset]


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_reports_out_of_order_fall_back_to_a_callback_per_record(monkeypatch: pytest.MonkeyPatch,
                                                                 delivery: str) -> None:
    """Reports that cannot be tied to their records are never guessed: the chunk is written again with
    one callback per record (exactly_once aborts the first transaction; at_least_once writes it twice)."""
    broker = _Broker(report_order=lambda reports: list(reversed(reports)))
    writer = _writer(monkeypatch, broker, delivery=delivery)
    offsets = [3, 4, 5]
    r = writer.write(1, _cols(offsets), upstream_end=6)
    assert r.mirrored == 3
    assert len({id(cb) for cb in broker.callbacks[-3:]}) == 3  # the second pass: one callback per record
    where = _where(broker, offsets)
    if delivery == "exactly_once":
        assert broker.aborts == 1 and len(broker.committed) == 1
        committed = [v for t, _, _, v in broker.committed[0] if t == "t"]
        assert committed == [b"v3", b"v4", b"v5"]  # the aborted first pass is not in the transaction
    else:
        assert broker.log[("t", 1)] == [b"v3", b"v4", b"v5"] * 2  # at-least-once: written twice
    assert _syncs(broker) == [OffsetSync("t", 1, 3, where[3]), OffsetSync("t", 1, 5, where[5]),
                              OffsetSync("t", 1, 6, where[5] + 1)]


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_a_record_rejected_as_too_large_is_still_dead_lettered_by_its_offset(monkeypatch: pytest.MonkeyPatch,
                                                                            delivery: str) -> None:
    """A rejection needs the rejected record's offset, which a shared report cannot give: the writer falls
    back and the record is dead-lettered with its coordinates as before."""
    broker = _Broker(reject=frozenset({b"v4"}))
    writer = _writer(monkeypatch, broker, delivery=delivery)
    r = writer.write(1, _cols([3, 4, 5]), upstream_end=6)
    assert (r.mirrored, r.dead_lettered) == (2, 1)
    dead = [(k, v) for t, _, k, v in (broker.committed[-1] if broker.committed else broker.txn) if t == "g.dlq"]
    assert [v for _, v in dead] == [b"v4"]
    where = _where(broker, [3, 5])
    syncs = _syncs(broker)
    assert OffsetSync("t", 1, 5, where[5]) in syncs and OffsetSync("t", 1, 6, where[5] + 1) in syncs


def test_fewer_destination_partitions_keep_a_callback_per_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """Records hashed over several destination partitions have no single produce order to map by."""
    broker = _Broker()
    writer = _writer(monkeypatch, broker, source_partitions=3, destination_partitions=2)
    r = writer.write(1, _cols([3, 4, 5]), upstream_end=6)
    assert r.mirrored == 3 and len({id(cb) for cb in broker.callbacks}) == 3


# --------------------------------------------------------------------------- runs without reports (the C loop)


def _c_loop(monkeypatch: pytest.MonkeyPatch, broker: _Broker) -> list[tuple[int, int]]:
    """Stand the C loop in by one that hands records [start, stop) to ``broker`` without a report each, as
    ``_native.c`` hands them to librdkafka; returns the ranges it took."""
    took: list[tuple[int, int]] = []

    def produce(producer: Any, topic: str, partition: int, values: list[Any], keys: list[Any], stamps: list[int],
                headers: Any, start: int, stop: int, value_map: Any, key_map: Any, limit: Any) -> tuple[int, int, int]:
        for i in range(start, stop):
            producer.produce(topic, values[i], keys[i], partition, on_delivery=None, timestamp=stamps[i])
        took.append((start, stop))
        return stop, native.DONE, sum(len(values[i] or b"") + len(keys[i] or b"") for i in range(start, stop))

    monkeypatch.setattr(native, "usable", lambda producer: True)
    monkeypatch.setattr(native, "produce", produce)
    return took


def test_a_run_without_reports_takes_its_offsets_from_the_reports_around_it(monkeypatch: pytest.MonkeyPatch) -> None:
    broker = _Broker()
    took = _c_loop(monkeypatch, broker)
    writer = _writer(monkeypatch, broker)
    offsets = [3, 4, 5, 7, 8, 9]
    r = writer.write(1, _cols(offsets), upstream_end=10)
    assert took == [(1, 5)] and r.native_records == 4 and broker.aborts == 0
    assert [cb is not None for cb in broker.callbacks] == [True, False, False, False, False, True]
    where = _where(broker, offsets)
    assert r.last_downstream == 5
    syncs = _syncs(broker)
    assert OffsetSync("t", 1, 10, 6) in syncs
    for s in syncs:
        if s.upstream_offset in where:
            assert s.downstream_offset == where[s.upstream_offset]


def test_something_landing_among_a_run_is_never_guessed_the_chunk_is_written_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another producer's record (or a transaction marker) among records without reports: their offsets are
    unknown, so the transaction is aborted and the chunk written again with a report per record."""
    broker = _Broker(foreign_every=3)
    took = _c_loop(monkeypatch, broker)
    writer = _writer(monkeypatch, broker)
    offsets = [3, 4, 5, 7, 8, 9]
    r = writer.write(1, _cols(offsets), upstream_end=10)
    assert took == [(1, 5)] and broker.aborts == 1 and len(broker.committed) == 1
    assert r.native_records == 0 and r.mirrored == 6  # the second pass reported every record
    assert len({id(cb) for cb in broker.callbacks[-6:]}) == 6
    assert [v for t, _, _, v in broker.committed[0] if t == "t"] == [f"v{o}".encode() for o in offsets]
    where = _where(broker, offsets)  # the committed (second) copies
    syncs = _syncs(broker)
    assert OffsetSync("t", 1, 10, where[9] + 1) in syncs
    for s in syncs:
        if s.upstream_offset in where:
            assert s.downstream_offset == where[s.upstream_offset]


class _Gapless(_Broker):
    """A producer with ``enable.gapless.guarantee``: once it loses a record (one in ``reject``), every record
    produced after it is reported failed with a fatal error, reported or not."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.lost = False

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = 0,
                on_delivery: Any = None, timestamp: int = 0, headers: Any = None) -> None:
        self.txn.append((topic, partition, key, value))
        if topic == "t":
            self.callbacks.append(on_delivery)
        if self.lost or (topic == "t" and value in self.reject):
            self.lost = True
            self.pending.append((on_delivery, KafkaError(KafkaError._FATAL, fatal=True), _Msg(None)))
            return
        log = self.log.setdefault((topic, partition), [])
        log.append(value)
        self.pending.append((on_delivery, None, _Msg(len(log) - 1)))

    def flush(self, timeout: float = 0) -> int:
        pending, self.pending = self.pending, []
        for cb, err, msg in pending:
            if cb is not None:  # a record produced without a report: nothing is called, lost or not
                cb(err, msg)
        return 0


def _alo_writer(monkeypatch: pytest.MonkeyPatch, usual: _Broker, gapless: _Broker) -> replicate.PartitionWriter:
    writer = _writer(monkeypatch, usual, delivery="at_least_once")
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, gapless_=False, **k: (
        (gapless, "gapless") if k.get("gapless", gapless_) else (usual, "key")))
    return writer


def test_at_least_once_runs_go_without_reports_on_the_gapless_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    """at_least_once: the chunk goes through the C loop on the partition's gapless producer, the run's offsets
    taken from the reports around it, and the offset syncs with it; the usual producer is not used."""
    usual, gapless = _Broker(), _Gapless()
    took = _c_loop(monkeypatch, gapless)
    writer = _alo_writer(monkeypatch, usual, gapless)
    offsets = [3, 4, 5, 7, 8, 9]
    r = writer.write(1, _cols(offsets), upstream_end=10)
    assert took == [(1, 5)] and r.native_records == 4 and r.mirrored == 6
    assert [cb is not None for cb in gapless.callbacks] == [True, False, False, False, False, True]
    assert usual.log == {} and usual.callbacks == []
    assert r.last_downstream == 5
    syncs = _syncs(gapless)
    assert OffsetSync("t", 1, 3, 0) in syncs and OffsetSync("t", 1, 10, 6) in syncs


def test_at_least_once_a_record_lost_inside_a_run_sends_the_chunk_again_with_reports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A record lost among the records without reports stops the gapless producer: the chunk's last record
    is reported failed, and the whole chunk is written again on the usual producer with a report per record;
    the offset syncs map every record to its copy there."""
    usual, gapless = _Broker(), _Gapless(reject=frozenset({b"v5"}))
    took = _c_loop(monkeypatch, gapless)
    writer = _alo_writer(monkeypatch, usual, gapless)
    offsets = [3, 4, 5, 7, 8, 9]
    r = writer.write(1, _cols(offsets), upstream_end=10)
    assert took == [(1, 5)] and gapless.log[("t", 1)] == [b"v3", b"v4"]  # what landed before the loss
    assert r.native_records == 0 and r.mirrored == 6
    assert usual.log[("t", 1)] == [f"v{o}".encode() for o in offsets]
    assert all(cb is not None for cb in usual.callbacks)
    where = _where(usual, offsets)
    syncs = _syncs(usual)
    assert OffsetSync("t", 1, 10, where[9] + 1) in syncs
    for s in syncs:
        if s.upstream_offset in where:
            assert s.downstream_offset == where[s.upstream_offset]


def test_at_least_once_a_chunk_written_again_does_not_dead_letter_a_record_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk's first record is too large for the destination (dead-lettered, and its dead letter
    acknowledged) and a record inside the run is lost: the chunk is written again on the usual producer,
    every other record with it, but the first record's dead letter is not sent a second time."""
    usual, gapless = _Broker(), _Gapless(reject=frozenset({b"v5"}))
    took = _c_loop(monkeypatch, gapless)
    writer = _alo_writer(monkeypatch, usual, gapless)
    writer.s = dataclasses.replace(writer.s, destination_max_message_bytes=1000)
    writer.fast = replicate.FastPath(writer.s, writer.translator)
    offsets = [3, 4, 5, 7, 8, 9]
    cols = _cols(offsets)
    cols.values[0] = b"x" * 2000
    r = writer.write(1, cols, upstream_end=10)
    assert took == [(1, 5)]
    assert len(gapless.log[("g.dlq", 0)]) == 1 and ("g.dlq", 0) not in usual.log
    assert usual.log[("t", 1)] == [f"v{o}".encode() for o in offsets[1:]]
    assert r.dead_lettered == 1 and r.mirrored == 5
    assert OffsetSync("t", 1, 10, _where(usual, offsets[1:])[9] + 1) in _syncs(usual)


@pytest.mark.parametrize("c_loop", [True, False])
def test_at_least_once_prepare_starts_the_producer_its_chunks_go_through(monkeypatch: pytest.MonkeyPatch,
                                                                        c_loop: bool) -> None:
    """The warm-up starts one producer per at_least_once partition: the gapless one when chunks go through
    the C loop (the usual one is then only made if a chunk falls back), the usual one when they cannot; a
    partition whose range ends in markers syncs on that same producer."""
    usual, gapless = _Broker(), _Gapless()
    writer = _alo_writer(monkeypatch, usual, gapless)
    asked: list[bool] = []

    def producer(_s: Any, _p: int, gapless_: bool = False, **k: Any) -> tuple[_Broker, str]:
        asked.append(k.get("gapless", gapless_))
        return (gapless, "gapless") if asked[-1] else (usual, "key")

    monkeypatch.setattr(replicate, "_producer", producer)
    monkeypatch.setattr(native, "available", lambda: c_loop)
    writer.prepare(1)
    writer.advance(1, 12, 5)
    assert asked == [c_loop, c_loop]
    assert _syncs(gapless if c_loop else usual) == [OffsetSync("t", 1, 12, 6)]


def test_at_least_once_a_range_of_only_markers_moves_the_position_from_the_last_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """at_least_once on the direct path: a range that held no record (transaction markers, aborted records)
    moves the partition's offset sync to its end from where this process's last write left it, so lag
    reaches 0; not when that write stopped short of the range's start (another process or a failed write
    covered what is between), nor for a partition this process has not written (after a restart)."""
    broker = _Broker()
    writer = _writer(monkeypatch, broker, delivery="at_least_once")
    # the producer's key is where the partition's at-least-once position is kept, as replicate._producer's
    monkeypatch.setattr(replicate, "_producer", lambda s, p, gapless=False: (broker, replicate._alo_key(s, p)))
    monkeypatch.setattr(native, "available", lambda: False)
    writer.write(1, _cols([3, 4, 5]), upstream_end=6)
    assert writer.advance_idle(1, 9, start=6) == 2  # the last mirrored record is at downstream 2
    assert _syncs(broker)[-1] == OffsetSync("t", 1, 9, 3)
    sent = len(broker.txn)
    assert writer.advance_idle(1, 9, start=6) is None  # already there
    assert writer.advance_idle(1, 14, start=10) is None  # [9, 10) is not known written here
    assert writer.advance_idle(2, 5, start=0) is None  # nothing written of partition 2 by this process
    assert writer.advance_idle(1, 14, start=None) is None
    assert len(broker.txn) == sent
    writer.advance(1, 11, 2)  # trailing markers after a write: the position moves with them
    assert writer.advance_idle(1, 13, start=11) == 2 and _syncs(broker)[-1] == OffsetSync("t", 1, 13, 3)


def _served_after_a_fatal_error(fatal: KafkaException, callbacks: int) -> None:
    """What confluent-kafka's ``flush`` raises when a producer's fatal error is served among delivery reports:
    its error callback leaves the error pending, and each delivery callback that runs after it fails at its
    first step with a SystemError caused by what was pending (the error, or the SystemError before)."""
    exc: BaseException = fatal
    for _ in range(callbacks):
        masked = SystemError("<method 'append' of 'list' objects> returned a result with an exception set")
        masked.__cause__ = exc
        exc = masked
    raise exc


@pytest.mark.parametrize("callbacks", [1, 3])
def test_a_fatal_error_served_among_delivery_reports_comes_out_as_itself(callbacks: int) -> None:
    """A fenced producer's flush must raise the fence (the writer then writes the chunk again on a new
    producer), not the SystemError confluent-kafka's later callbacks turn it into (that fails the task)."""
    fenced = KafkaException(KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True))
    with pytest.raises(KafkaException) as got, clients.fatal_unmasked():
        _served_after_a_fatal_error(fenced, callbacks)
    assert got.value is fenced


def test_a_system_error_of_another_cause_is_left_alone() -> None:
    with pytest.raises(SystemError), clients.fatal_unmasked():
        try:
            raise ValueError("not a kafka error")
        except ValueError as exc:
            raise SystemError("something else") from exc
    # raised while a fence was being handled, but not caused by it
    with pytest.raises(SystemError), clients.fatal_unmasked():
        try:
            raise KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
        except KafkaException:
            raise SystemError("something else")  # noqa: B904 - the point: no cause


def test_at_least_once_small_chunks_go_on_the_gapless_producer_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of one and two records (a slow stream's) have no run for the C loop: they go with a report per
    record on the same gapless producer as the partition's larger chunks and its offset syncs, so the
    partition keeps one producer; the usual producer is not used."""
    usual, gapless = _Broker(), _Gapless()
    took = _c_loop(monkeypatch, gapless)
    writer = _alo_writer(monkeypatch, usual, gapless)
    r1 = writer.write(1, _cols([3]), upstream_end=4)
    r2 = writer.write(1, _cols([4, 6]), upstream_end=7)
    assert took == [] and r1.native_records == r2.native_records == 0
    assert (r1.mirrored, r2.mirrored, r2.last_downstream) == (1, 2, 2)
    assert usual.log == {} and usual.callbacks == []
    assert gapless.log[("t", 1)] == [b"v3", b"v4", b"v6"] and all(cb is not None for cb in gapless.callbacks)
    assert OffsetSync("t", 1, 7, 3) in _syncs(gapless)
