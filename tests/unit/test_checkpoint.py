"""checkpoint.emit_checkpoints and the group offset sync after it, against in-memory stand-ins for the clusters: a
destination group gets only what this round translated, never an earlier round's checkpoint of a position that
is untranslatable now or whose translation went back."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from mirror_core import checkpoint, clients, failover
from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.health import LagReport
from mirror_core.offsets import Checkpoint, OffsetSync, OffsetSyncStore


def _cfg(tmp_path: Path) -> MirrorsConfig:
    return parse_config({"clusters": {"a": {"kafka": {"bootstrap.servers": "a:1"}},
                                      "b": {"kafka": {"bootstrap.servers": "b:1"}}},
                         "groups": [{"name": "ab", "source": "a", "destination": "b",
                                     "mirrors": [{"source_topic": "t"}],
                                     "spark": {"checkpoint_dir": str(tmp_path / "ckpt")}}]}, env={})


class _Producer:
    def __init__(self) -> None:
        self.sent: list[Checkpoint] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes | None = None, partition: int = 0,
                on_delivery: Any = None) -> None:
        self.sent.append(Checkpoint.from_record(key, value))

    def flush(self, timeout: float = 0) -> int:
        return 0


class _Done:
    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value


class _Admin:
    """The destination: idle groups with the offsets in ``existing``; notes every offset written."""

    def __init__(self, existing: dict[tuple[str, int], int]) -> None:
        self.existing = existing
        self.altered: list[tuple[str, int, int]] = []

    def describe_consumer_groups(self, gids: list[str], request_timeout: float = 30) -> dict[str, _Done]:
        return {g: _Done(type("Description", (), {"members": []})()) for g in gids}

    def list_consumer_group_offsets(self, req: list[Any], request_timeout: float = 30) -> dict[str, _Done]:
        tps = [TopicPartition(t, p, o) for (t, p), o in self.existing.items()]
        return {req[0].group_id: _Done(type("Offsets", (), {"topic_partitions": tps})())}

    def alter_consumer_group_offsets(self, req: list[Any], request_timeout: float = 30) -> dict[str, _Done]:
        self.altered += [(tp.topic, tp.partition, tp.offset) for tp in req[0].topic_partitions]
        return {req[0].group_id: _Done(None)}


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The clusters: ``previous`` in the checkpoints topic, ``committed`` the source group g1's offset on t[0]."""
    def make(previous: Checkpoint | None, committed: int, existing: dict[tuple[str, int], int]
             ) -> tuple[_Admin, _Producer]:
        admin, producer = _Admin(existing), _Producer()
        monkeypatch.setattr(checkpoint, "remapped_topics", lambda *_a: set())
        monkeypatch.setattr(checkpoint, "load_checkpoints",
                            lambda *_a: {} if previous is None else {("g1", "t", 0): previous})
        monkeypatch.setattr(checkpoint, "source_group_offsets", lambda *_a: {"g1": {("t", 0): committed}})
        monkeypatch.setattr(clients, "producer", lambda *_a, **_k: producer)
        monkeypatch.setattr(clients, "admin", lambda *_a: admin)
        monkeypatch.setattr(clients, "acting_on", lambda *_a: contextlib.nullcontext())
        monkeypatch.setattr(clients, "fatal_unmasked", lambda: contextlib.nullcontext())
        return admin, producer
    return make


MAPPINGS = [checkpoint.TopicMapping("t", "t", "ab__t__t", "c")]


def _looped_history() -> OffsetSyncStore:
    """t[0] where source offsets 400-599 are copies a reverse flow made (loop-skipped): a position among them is
    untranslatable while the config has no reverse group."""
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 0, 0, 0), OffsetSync("t", 0, 399, 399), OffsetSync("t", 0, 400, -1),
                   OffsetSync("t", 0, 600, 400), OffsetSync("t", 0, 700, 500)])
    return store


def _round(cfg: MirrorsConfig, store: OffsetSyncStore) -> checkpoint.RoundReport:
    rep = checkpoint.RoundReport("ab")
    cps = checkpoint.emit_checkpoints(cfg, cfg.groups[0], store, MAPPINGS, rep)
    checkpoint.sync_selected_groups(cfg, cfg.groups[0], MAPPINGS, cps, rep)
    return rep


def test_an_untranslatable_position_writes_no_group_offset(tmp_path: Path, world: Any) -> None:
    """g1 sits at 500 (among the copies); an earlier round checkpointed 300 -> 300. Writing 300 into the idle
    destination group would make its consumers read again what they read on the source."""
    admin, producer = world(Checkpoint("g1", "t", 0, 300, 300), 500, {})
    rep = _round(_cfg(tmp_path), _looped_history())
    assert admin.altered == []
    assert producer.sent == []
    [g1] = rep.groups
    assert g1.written == [] and [why for _t, _p, why in g1.skipped] == [
        "offset 500 untranslatable: " + checkpoint.LOOPED]


def test_a_translation_that_went_back_writes_no_group_offset(tmp_path: Path, world: Any) -> None:
    """The destination topic was re-created and mirrored again: g1's 500 is at 100 now, the earlier round's
    checkpoint says 400. The checkpoint does not move back (MM2's rule), and 400 is not written into the group
    either: its consumers would skip 300 records."""
    admin, producer = world(Checkpoint("g1", "t", 0, 500, 400), 500, {})
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 0, 400, 0), OffsetSync("t", 0, 500, 100)])
    rep = _round(_cfg(tmp_path), store)
    assert admin.altered == []
    assert producer.sent == []
    [g1] = rep.groups
    assert g1.skipped == [("t", 0, "checkpoint would move backwards")]


def test_a_checkpoint_this_round_confirms_is_written_again(tmp_path: Path, world: Any) -> None:
    """Nothing moved since the earlier round (no new checkpoint), but the destination group lost its offsets
    (expired, deleted): the confirmed position is written."""
    admin, producer = world(Checkpoint("g1", "t", 0, 300, 300), 300, {})
    rep = _round(_cfg(tmp_path), _looped_history())
    assert producer.sent == []
    assert admin.altered == [("t", 0, 300)]
    assert rep.groups[0].written == [("t", 0, 300)]


def test_a_new_checkpoint_is_written(tmp_path: Path, world: Any) -> None:
    admin, producer = world(Checkpoint("g1", "t", 0, 300, 300), 650, {("t", 0): 300})
    _round(_cfg(tmp_path), _looped_history())
    assert producer.sent == [Checkpoint("g1", "t", 0, 650, 450)]
    assert admin.altered == [("t", 0, 450)]


def test_the_failovers_sync_writes_no_earlier_checkpoint(tmp_path: Path, world: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The failover's ``sync`` step runs the same round: it fails on the untranslatable position, and leaves the
    destination group alone rather than placing it at an earlier round's checkpoint."""
    admin, _producer = world(Checkpoint("g1", "t", 0, 300, 300), 500, {})
    cfg = _cfg(tmp_path)
    monkeypatch.setattr(failover, "topic_mappings", lambda *_a: MAPPINGS)
    monkeypatch.setattr(failover, "load_sync_store", lambda *_a: _looped_history())
    monkeypatch.setattr(failover, "replication_lag", lambda *_a: LagReport())
    monkeypatch.setattr(failover, "source_group_offsets", lambda *_a: {"g1": {("t", 0): 500}})
    rep = failover.final_sync(cfg, cfg.groups[0], failover.FailoverParams(("g1",)))
    assert admin.altered == []
    assert not rep.ok and "g1 t[0]: destination at None, expected None" in rep.summary
