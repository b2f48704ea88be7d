"""A destination topic deleted (or re-created) under a mirror: the batch-start check and the position after."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from mirror_core import replicate
from mirror_core.offsets import OffsetSync
from mirror_core.replicate import DestinationTopicError, SchemaIdTranslator
from mirror_core.stream import MirrorRuntime, destination_topic_ids
from tests.unit.test_replicate import _FakeProducer, rec, settings


class _FakeAdmin:
    """``describe_topics`` over a dict topic -> id (absent: unknown topic)."""

    def __init__(self, ids: dict[str, str]):
        self.ids = ids

    def describe_topics(self, topics: Any, request_timeout: float = 30) -> dict[str, Future[Any]]:
        out: dict[str, Future[Any]] = {}
        for t in topics.topic_names:
            f: Future[Any] = Future()
            if t in self.ids:
                f.set_result(SimpleNamespace(topic_id=self.ids[t]))
            else:
                f.set_exception(KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)))
            out[t] = f
        return out


def _runtime(admin: _FakeAdmin) -> MirrorRuntime:
    rt = object.__new__(MirrorRuntime)  # only the state check_destinations reads
    s = settings(mirror="g__t__t.m", destination_topic="t.m")
    rt.settings = {"t": s}
    rt.destination_ids = {"t.m": "id-1"}
    rt._dst_admin = admin
    rt._dst_admin_factory = lambda: admin
    rt.group = SimpleNamespace(name="g", destination="dst")
    return rt


class _AwayAdmin(_FakeAdmin):
    """The destination cluster does not answer the first ``away`` requests (a broker restarting)."""

    def __init__(self, ids: dict[str, str], away: int, error: KafkaError | None = None):
        super().__init__(ids)
        self.away, self.error, self.asked = away, error, 0

    def describe_topics(self, topics: Any, request_timeout: float = 30) -> dict[str, Future[Any]]:
        self.asked += 1
        if self.asked > self.away:
            return super().describe_topics(topics, request_timeout)
        f: Future[Any] = Future()
        if self.error is not None:
            f.set_exception(KafkaException(self.error))
        return {t: f for t in topics.topic_names}  # no error: never completes, the wait times out


def test_destination_topic_ids_reports_missing_topics_as_none() -> None:
    assert destination_topic_ids(_FakeAdmin({"a": "x"}), ["a", "b"]) == {"a": "x", "b": None}


def test_a_deleted_destination_stops_the_batch_with_one_line_naming_it() -> None:
    _runtime(_FakeAdmin({"t.m": "id-1"})).check_destinations()  # unchanged: goes on
    with pytest.raises(DestinationTopicError) as err:
        _runtime(_FakeAdmin({})).check_destinations()
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("g__t__t.m: destination topic t.m was deleted on cluster dst")


def test_a_re_created_destination_is_refused_too() -> None:
    """A broker with auto.create.topics.enable re-creates it with its default partitions: a new topic id."""
    with pytest.raises(DestinationTopicError, match="t.m was deleted and re-created on cluster dst"):
        _runtime(_FakeAdmin({"t.m": "id-2"})).check_destinations()


def test_a_position_beyond_the_re_created_destination_is_not_taken(monkeypatch) -> None:
    """After the topic was re-created, the committed sync (upstream 5 -> downstream 40) points past its end
    (0): the records it covers went with the deleted topic, so they are written again, not skipped."""
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), SchemaIdTranslator({}),
                                       lambda t, p: OffsetSync("t", 1, 5, 40), downstream_end=lambda t, p: 0,
                                       destination_high=lambda t, p: 0)
    r = writer.write(1, [rec(b"v", offset=o) for o in (2, 3, 4, 5)], upstream_end=6)
    assert r.replayed_skipped == 0 and r.mirrored == 4


def test_a_position_within_the_destination_is_kept(monkeypatch) -> None:
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), SchemaIdTranslator({}),
                                       lambda t, p: OffsetSync("t", 1, 5, 40), downstream_end=lambda t, p: 40,
                                       destination_high=lambda t, p: 41)
    r = writer.write(1, [rec(b"v", offset=o) for o in (2, 3, 4, 5)], upstream_end=6)
    assert r.replayed_skipped == 3 and r.mirrored == 1


def test_an_unreachable_destination_makes_the_batch_wait_not_fail(monkeypatch, caplog) -> None:
    """A destination broker away for a while (the fault test stops it for 30 s): the check asks again until
    the cluster answers, with a warning per attempt, and the batch then goes on."""
    from mirror_core import stream

    monkeypatch.setattr(stream, "DESTINATION_CHECK_TIMEOUT", 0.05)
    monkeypatch.setattr(stream, "DESTINATION_RETRY_PAUSE", 0.0)
    silent = _AwayAdmin({"t.m": "id-1"}, away=2)
    transport = _AwayAdmin({"t.m": "id-1"}, away=3, error=KafkaError(KafkaError._TRANSPORT))
    with caplog.at_level("WARNING", logger="mirror_core.stream"):
        _runtime(silent).check_destinations()
        _runtime(transport).check_destinations()
    assert (silent.asked, transport.asked) == (3, 4)
    waits = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(waits) == 5 and all(m.startswith("g: destination cluster dst does not answer") for m in waits)


class _StuckAdmin(_FakeAdmin):
    """Waits for a controller that is gone (the broker its metadata names was killed): never answers."""

    def __init__(self) -> None:
        super().__init__({})
        self.asked = 0

    def describe_topics(self, topics: Any, request_timeout: float = 30) -> dict[str, Future[Any]]:
        self.asked += 1
        assert self.asked == 1, "asked the client that waits for a dead broker again"
        return {t: Future() for t in topics.topic_names}


def test_an_unanswered_check_asks_again_with_a_new_client(monkeypatch, caplog) -> None:
    """A destination broker killed on a 3-broker cluster: the admin client still takes it for the
    controller (for up to 5 minutes, until its metadata refresh) and never answers; the next attempt uses a
    new client, which bootstraps from the brokers still up, and the batch goes on."""
    from mirror_core import stream

    monkeypatch.setattr(stream, "DESTINATION_CHECK_TIMEOUT", 0.05)
    monkeypatch.setattr(stream, "DESTINATION_RETRY_PAUSE", 0.0)
    stuck, fresh = _StuckAdmin(), _FakeAdmin({"t.m": "id-1"})
    rt = _runtime(stuck)  # type: ignore[arg-type]
    made: list[Any] = []
    rt._dst_admin_factory = lambda: made.append(fresh) or fresh
    with caplog.at_level("WARNING", logger="mirror_core.stream"):
        rt.check_destinations()
    assert stuck.asked == 1 and made == [fresh] and rt._dst_admin is fresh
    assert sum("does not answer" in r.getMessage() for r in caplog.records) == 1


def test_a_refusal_from_the_destination_is_not_waited_on(monkeypatch) -> None:
    from mirror_core import stream

    monkeypatch.setattr(stream, "DESTINATION_RETRY_PAUSE", 0.0)
    denied = _AwayAdmin({"t.m": "id-1"}, away=1, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException):
        _runtime(denied).check_destinations()
    assert denied.asked == 1
