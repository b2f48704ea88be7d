"""Seeding a mirror's positions from another tool's consumer group: the per-partition rules."""

from __future__ import annotations

from typing import Any

import pytest

from mirror_core import checkpoint, clients, handover, replicate
from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.handover import Seed, Skip, decide, destination_partition
from mirror_core.offsets import OffsetSync
from mirror_core.positions import sync_destination


def test_a_committed_partition_is_seeded_at_the_destination_end():
    assert decide("m", "t", 1, 30, False, 75, 1, "t2") == Seed("m", "t", 1, 30, 75, 1, "t2")


def test_an_existing_sync_is_never_overridden():
    d = decide("m", "t", 0, 30, True, 75, 0, "t2")
    assert isinstance(d, Skip) and "already has a position" in d.reason


def test_no_committed_offset_copies_from_the_start():
    for committed in (None, -1001):
        d = decide("m", "t", 0, committed, False, 75, 0, "t2")
        assert isinstance(d, Skip) and "from the start" in d.reason


def test_destination_partition_follows_the_writer():
    assert [destination_partition(p, 4, 4) for p in range(4)] == [0, 1, 2, 3]
    assert [destination_partition(p, 4, 8) for p in range(4)] == [0, 1, 2, 3]
    assert [destination_partition(p, 4, 3) for p in range(4)] == [0, 1, 2, 0]


# --------------------------------------------------------------------------- what is written, what is read


def _two_mirrors_of_t() -> MirrorsConfig:
    """Two groups mirroring source topic t onto one destination cluster, into different topics: they share the
    offset-sync topic (one per source cluster)."""
    return parse_config({"clusters": {"a": {"kafka": {"bootstrap.servers": "a:1"}},
                                      "b": {"kafka": {"bootstrap.servers": "b:1"}}},
                         "groups": [{"name": "live", "source": "a", "destination": "b",
                                     "mirrors": [{"source_topic": "t", "destination_topic": "t-live"}]},
                                    {"name": "archive", "source": "a", "destination": "b",
                                     "mirrors": [{"source_topic": "t", "destination_topic": "t-archive"}]}]},
                        env={})


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[OffsetSync, list[tuple[str, bytes]] | None]] = []

    def produce(self, topic: str, key: bytes | None = None, value: bytes | None = None, partition: int = 0,
                headers: list[tuple[str, bytes]] | None = None) -> None:
        self.sent.append((OffsetSync.from_record(key, value), headers))

    def flush(self, timeout: float = 0) -> int:
        return 0


def test_a_seed_names_its_destination_so_another_mirror_of_the_topic_passes_over_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``archive`` took over from viooh-mirror: its seed t[0] 1200 -> 40 is in t-archive. Without the destination
    header, ``live`` (t -> t-live) took the seed for one of its own syncs (a headerless sync from an earlier
    release): its translation history was cut there, and its writer could take it for its position."""
    cfg = _two_mirrors_of_t()
    live, archive = cfg.groups
    monkeypatch.setattr(handover, "plan_handover", lambda *_a: handover.HandoverReport(
        "archive", [Seed("archive__t__t-archive", "t", 0, 1200, 40, 0, "t-archive")]))
    producer = _Producer()
    monkeypatch.setattr(clients, "producer", lambda *_a, **_k: producer)
    assert handover.seed_positions(cfg, archive).written
    [(sync, headers)] = producer.sent
    assert sync == OffsetSync("t", 0, 1200, 40)
    assert sync_destination(headers) == "t-archive"
    assert checkpoint.sync_filter(archive)(sync, sync_destination(headers))
    assert not checkpoint.sync_filter(live)(sync, sync_destination(headers))


def test_the_plan_looks_for_syncs_of_its_own_destination(monkeypatch: pytest.MonkeyPatch) -> None:
    """``live`` already mirrors t[0] (its syncs name t-live); ``archive`` taking over from viooh-mirror still
    needs its seed: the lookup of existing syncs asks for t-archive's."""
    cfg = _two_mirrors_of_t()
    archive = cfg.groups[1]
    asked: list[str | None] = []

    def lookup(_conf: Any, _syncs: str, topic: str, partition: int, destination: str | None = None
               ) -> OffsetSync | None:
        asked.append(destination)
        return OffsetSync(topic, partition, 5000, 5000) if destination in (None, "t-live") else None

    class _Admin:
        def list_topics(self, timeout: float = 0) -> Any:
            md = type("Topic", (), {"partitions": {0: object()}, "error": None})()
            return type("Metadata", (), {"topics": {"t": md, "t-live": md, "t-archive": md}})()

    monkeypatch.setattr(replicate, "last_committed_sync", lookup)
    monkeypatch.setattr(clients, "admin", lambda *_a: _Admin())
    monkeypatch.setattr(clients, "kafka_config", lambda *_a: {})
    monkeypatch.setattr(handover, "_committed", lambda *_a: {0: 1200})
    monkeypatch.setattr(handover, "_end", lambda *_a: 40)
    report = handover.plan_handover(cfg, archive)
    assert asked == ["t-archive"]
    assert report.seeds == [Seed("archive__t__t-archive", "t", 0, 1200, 40, 0, "t-archive")]
