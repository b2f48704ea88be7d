"""Seeding a mirror's positions from another tool's consumer group: the per-partition rules."""

from __future__ import annotations

from mirror_core.handover import Seed, Skip, decide, destination_partition


def test_a_committed_partition_is_seeded_at_the_destination_end():
    assert decide("m", "t", 1, 30, False, 75, 1) == Seed("m", "t", 1, 30, 75, 1)


def test_an_existing_sync_is_never_overridden():
    d = decide("m", "t", 0, 30, True, 75, 0)
    assert isinstance(d, Skip) and "already has a position" in d.reason


def test_no_committed_offset_copies_from_the_start():
    for committed in (None, -1001):
        d = decide("m", "t", 0, committed, False, 75, 0)
        assert isinstance(d, Skip) and "from the start" in d.reason


def test_destination_partition_follows_the_writer():
    assert [destination_partition(p, 4, 4) for p in range(4)] == [0, 1, 2, 3]
    assert [destination_partition(p, 4, 8) for p in range(4)] == [0, 1, 2, 3]
    assert [destination_partition(p, 4, 3) for p in range(4)] == [0, 1, 2, 0]
