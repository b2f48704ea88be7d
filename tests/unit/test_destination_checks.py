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
    return rt


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
    monkeypatch.setattr(replicate, "_POSITIONS", {})
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), SchemaIdTranslator({}),
                                       lambda t, p: OffsetSync("t", 1, 5, 40), downstream_end=lambda t, p: 0,
                                       destination_high=lambda t, p: 0)
    r = writer.write(1, [rec(b"v", offset=o) for o in (2, 3, 4, 5)], upstream_end=6)
    assert r.replayed_skipped == 0 and r.mirrored == 4


def test_a_position_within_the_destination_is_kept(monkeypatch) -> None:
    fake = _FakeProducer()
    monkeypatch.setattr(replicate, "_producer", lambda _s, p: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", {})
    writer = replicate.PartitionWriter(settings(value_serde="bytes"), SchemaIdTranslator({}),
                                       lambda t, p: OffsetSync("t", 1, 5, 40), downstream_end=lambda t, p: 40,
                                       destination_high=lambda t, p: 41)
    r = writer.write(1, [rec(b"v", offset=o) for o in (2, 3, 4, 5)], upstream_end=6)
    assert r.replayed_skipped == 3 and r.mirrored == 1
