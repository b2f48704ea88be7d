"""MM2 record formats (byte-exact) and exact offset translation under the sync invariant."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

import pytest

from mirror_core.offsets import (
    AFTER_LOOPED,
    AHEAD,
    EXACT_SYNC,
    IN_GAP,
    INTERPOLATED,
    LOOPED,
    TOO_OLD,
    UNMAPPED,
    Checkpoint,
    Heartbeat,
    OffsetFormatError,
    OffsetSync,
    OffsetSyncStore,
    Translation,
    checkpoint_for,
    syncs_for_batch,
)

# --------------------------------------------------------------------------- golden vectors
# Written by hand from MM2's schemas (Kafka protocol types, big-endian; STRING = int16 length + UTF-8).


def h(s: str) -> bytes:
    return bytes.fromhex(s.replace(" ", ""))


def test_offset_sync_golden() -> None:
    s = OffsetSync("orders", 3, 1000, 2000)
    assert s.key_bytes() == h("0006 6f7264657273 00000003")
    assert s.value_bytes() == h("00000000000003e8 00000000000007d0")
    assert OffsetSync.from_record(h("0006 6f7264657273 00000003"), h("00000000000003e8 00000000000007d0")) == s


def test_checkpoint_golden() -> None:
    cp = Checkpoint("g1", "src.orders", 7, 42, 40, "meta")
    key = h("0002 6731  000a 7372632e6f7264657273  00000007")
    value = h("0000  000000000000002a  0000000000000028  0004 6d657461")
    assert cp.key_bytes() == key
    assert cp.value_bytes() == value
    assert Checkpoint.from_record(key, value) == cp
    # empty metadata is a zero-length STRING
    assert Checkpoint("g", "t", 0, 0, 0).value_bytes() == h("0000 0000000000000000 0000000000000000 0000")


def test_heartbeat_golden() -> None:
    hb = Heartbeat("us", "eu", 1_700_000_000_000)
    assert hb.key_bytes() == h("0002 7573 0002 6575")
    assert hb.value_bytes() == h("0000 0000018bcfe56800")
    assert Heartbeat.from_record(h("0002 7573 0002 6575"), h("0000 0000018bcfe56800")) == hb


def test_strings_are_utf8_with_byte_lengths() -> None:
    assert OffsetSync("é", 0, 0, 0).key_bytes() == h("0002 c3a9 00000000")
    assert OffsetSync("é", 0, 0, 0) == OffsetSync.from_record(h("0002 c3a9 00000000"), bytes(16))


def test_large_values_round_trip() -> None:
    s = OffsetSync("t" * 300, 2**31 - 1, 2**63 - 1, 2**40)
    assert OffsetSync.from_record(s.key_bytes(), s.value_bytes()) == s
    cp = Checkpoint("grüppe", "ß.topic", 12, 2**62, 0, "x" * 1000)
    assert Checkpoint.from_record(cp.key_bytes(), cp.value_bytes()) == cp
    hb = Heartbeat("a", "", 0)
    assert Heartbeat.from_record(hb.key_bytes(), hb.value_bytes()) == hb


@pytest.mark.parametrize(
    ("cls", "key", "value", "match"),
    [
        (OffsetSync, None, bytes(16), "null"),
        (OffsetSync, h("0006 6f7264"), bytes(16), "truncated reading topic"),
        (OffsetSync, h("0001 74 000000"), bytes(16), "truncated reading partition"),
        (OffsetSync, h("0001 74 00000000"), bytes(15), "truncated reading offset"),
        (OffsetSync, h("0001 74 00000000"), bytes(17), "trailing"),
        (OffsetSync, h("0001 74 00000000 00"), bytes(16), "trailing"),
        (OffsetSync, h("ffff 00000000"), bytes(16), "null STRING"),
        (OffsetSync, h("0001 ff 00000000"), bytes(16), "UTF-8"),
        (Checkpoint, h("0001 67 0001 74 00000000"), h("0001") + bytes(18), "unsupported version 1"),
        (Checkpoint, h("0001 67 0001 74 00000000"), h("0000") + bytes(16), "truncated reading metadata"),
        (Checkpoint, h("0001 67 0001 74"), h("0000") + bytes(18), "truncated reading partition"),
        (Checkpoint, h("0001 67 0001 74 00000000"), None, "null"),
        (Heartbeat, h("0001 61 0001 62"), h("0000 00000000"), "truncated reading timestamp"),
        (Heartbeat, h("0001 61 0001 62"), h("0002") + bytes(8), "unsupported version 2"),
        (Heartbeat, h("0001 61"), h("0000") + bytes(8), "truncated reading targetClusterAlias"),
    ],
)
def test_malformed_records_raise_a_clear_error(cls: type, key: bytes | None, value: bytes | None, match: str) -> None:
    with pytest.raises(OffsetFormatError, match=match):
        cls.from_record(key, value)


def test_values_that_cannot_be_encoded_raise() -> None:
    with pytest.raises(OffsetFormatError, match="32-bit"):
        OffsetSync("t", 2**31, 0, 0).key_bytes()
    with pytest.raises(OffsetFormatError, match="64-bit"):
        Checkpoint("g", "t", 0, 2**63, 0).value_bytes()
    with pytest.raises(OffsetFormatError, match="STRING"):
        Heartbeat("a" * 40_000, "b", 0).key_bytes()


# --------------------------------------------------------------------------- syncs_for_batch


def test_syncs_for_a_contiguous_batch_are_start_end_and_batch_end() -> None:
    pairs = [(u, u + 100) for u in range(10, 20)]
    assert [(s.upstream_offset, s.downstream_offset) for s in syncs_for_batch("t", 0, pairs, 20)] == [
        (10, 110), (19, 119), (20, 120)]


def test_syncs_mark_every_gap() -> None:
    # upstream 0,1,2 | gap 3-4 | 5,6 | gap 7 | 8 ; batch end past trailing markers at 9-10
    pairs = [(0, 0), (1, 1), (2, 2), (5, 3), (6, 4), (8, 5)]
    got = [(s.upstream_offset, s.downstream_offset) for s in syncs_for_batch("t", 0, pairs, 11)]
    assert got == [(0, 0), (2, 2), (5, 3), (6, 4), (8, 5), (11, 6)]


def test_syncs_shortcut_for_one_run_matches_the_general_rule() -> None:
    """The one-run shortcut keeps exactly what the point-by-point rule keeps."""
    import random

    from mirror_core import offsets

    rnd = random.Random(3)
    for _ in range(300):
        u, d, pairs = rnd.randrange(100), rnd.randrange(100), []
        for _ in range(rnd.randrange(1, 30)):
            pairs.append((u, d))
            step = rnd.choice((1, 1, 1, 2))
            u, d = u + step, d + (step if rnd.random() < 0.8 else 1)
        general: list[tuple[int, int]] = []
        for pt in pairs:
            while len(general) >= 2 and offsets._collinear(general[-2], general[-1], pt):
                general.pop()
            general.append(pt)
        end = pairs[-1][0] + 1 + rnd.randrange(3)
        want = general + [(max(end, pairs[-1][0] + 1), pairs[-1][1] + 1)]
        got = [(s.upstream_offset, s.downstream_offset) for s in syncs_for_batch("t", 0, pairs, end)]
        assert got == want, pairs


def test_syncs_for_single_record_and_empty_batch() -> None:
    assert syncs_for_batch("t", 1, [(7, 3)], 8) == [OffsetSync("t", 1, 7, 3), OffsetSync("t", 1, 8, 4)]
    assert syncs_for_batch("t", 1, [], 8) == []


# --------------------------------------------------------------------------- translation scenarios


def pairs_of(store: OffsetSyncStore, us: list[int]) -> list[int | None]:
    return [store.translate("t", 0, u).downstream_offset for u in us]


def test_contiguous_run_translates_exactly() -> None:
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(u, u + 5) for u in range(100, 200)], 200))
    # the run's ends and the batch end are syncs; a position inside the run is interpolated
    for u, reason in ((100, EXACT_SYNC), (150, INTERPOLATED), (199, EXACT_SYNC), (200, EXACT_SYNC)):
        assert store.translate("t", 0, u) == Translation(u + 5, True, reason), u


def test_compaction_gaps_map_to_the_next_mirrored_record() -> None:
    store = OffsetSyncStore()
    # upstream records 0, 1, 10, 11 (2..9 compacted away) -> downstream 0..3
    store.add_all(syncs_for_batch("t", 0, [(0, 0), (1, 1), (10, 2), (11, 3)], 12))
    assert pairs_of(store, [0, 1, 2, 5, 9, 10, 11, 12]) == [0, 1, 2, 2, 2, 2, 3, 4]
    assert all(store.translate("t", 0, u).exact for u in range(0, 13))
    # inside the gap a position maps to the next mirrored record, and says so
    assert [store.translate("t", 0, u).reason for u in (2, 5, 9)] == [IN_GAP] * 3
    assert [store.translate("t", 0, u).reason for u in (0, 1, 10, 12)] == [EXACT_SYNC] * 4


def test_upstream_aborted_transaction_and_markers() -> None:
    # upstream: 0-2 committed txn, 3 commit marker, 4-6 aborted, 7 abort marker, 8-9 committed, 10 marker
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(0, 0), (1, 1), (2, 2), (8, 3), (9, 4)], 11))
    assert pairs_of(store, list(range(12))) == [0, 1, 2, 3, 3, 3, 3, 3, 3, 4, 5, 5]
    assert all(store.translate("t", 0, u).exact for u in range(12))
    assert store.translate("t", 0, 12) == Translation(5, False, AHEAD)


def test_downstream_commit_markers_between_batches() -> None:
    # exactly-once: each batch is a destination transaction, so a commit marker follows each batch
    store = OffsetSyncStore()
    d = 0
    for start in range(0, 300, 100):
        pairs = [(u, d + i) for i, u in enumerate(range(start, start + 100))]
        d += 101
        store.add_all(syncs_for_batch("t", 0, pairs, start + 100))
    # record u lives at u + u // 100 (one marker per earlier batch)
    for u in range(0, 300):
        t = store.translate("t", 0, u)
        assert (t.downstream_offset, t.exact) == (u + u // 100, True), u
    assert store.translate("t", 0, 300).downstream_offset == 302  # right after the last commit marker


def test_restart_replay_supersedes_history() -> None:
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(u, u) for u in range(100)], 100))
    # at-least-once restart: records 50.. are written again at 100..
    store.add_all(syncs_for_batch("t", 0, [(u, u + 50) for u in range(50, 120)], 120))
    assert pairs_of(store, [0, 30, 49, 50, 99, 100, 119, 120]) == [0, 30, 49, 100, 149, 150, 169, 170]
    assert all(store.translate("t", 0, u).exact for u in range(0, 121))


def test_a_replayed_sync_supersedes_the_stored_ones_from_its_upstream_offset() -> None:
    """The documented history rule, checked on what the store keeps: a sync whose upstream offset equals
    a retained one replaces it and everything after it; a cut inside a linear run keeps the run up to
    just before the cut."""
    def stored(store: OffsetSyncStore) -> list[tuple[int, int]]:
        return [(s.upstream_offset, s.downstream_offset) for s in store.syncs("t", 0)]

    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(u, u) for u in range(100)], 100))
    assert stored(store) == [(0, 0), (99, 99), (100, 100)]
    # the next batch starts where the last one ended: its first sync supersedes the batch end
    store.add(OffsetSync("t", 0, 100, 101))
    assert stored(store) == [(0, 0), (99, 99), (100, 101)]
    # a replay from 99 (equal to a retained sync): 99 and 100 go, the run 0..98 stays exact
    store.add(OffsetSync("t", 0, 99, 300))
    assert stored(store) == [(0, 0), (98, 98), (99, 300)]
    assert store.translate("t", 0, 50) == Translation(50, True, INTERPOLATED)
    # a replay from the oldest retained offset replaces the whole history
    store.add(OffsetSync("t", 0, 0, 500))
    assert stored(store) == [(0, 500)]
    assert store.syncs("t", 1) == []


def test_rewind_before_all_history_replaces_it() -> None:
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(u, u) for u in range(100, 200)], 200))
    store.add_all(syncs_for_batch("t", 0, [(u, u + 200) for u in range(50, 60)], 60))
    assert store.oldest("t", 0) == OffsetSync("t", 0, 50, 250)
    assert store.latest("t", 0) == OffsetSync("t", 0, 60, 260)
    assert store.translate("t", 0, 150) == Translation(260, False, AHEAD)


def test_group_far_behind_the_head_is_exact_with_sparse_syncs() -> None:
    store = OffsetSyncStore()
    d = 0
    total = 0
    for start in range(0, 50_000, 5_000):
        # one compacted record per batch, one commit marker per batch
        ups = [u for u in range(start, start + 5_000) if u != start + 1234]
        pairs = [(u, d + i) for i, u in enumerate(ups)]
        syncs = syncs_for_batch("t", 0, pairs, start + 5_000)
        total += len(syncs)
        store.add_all(syncs)
        d += len(ups) + 1
    assert total <= 6 * 10  # sparse: a handful per batch, not one per record
    head = store.latest("t", 0)
    assert head is not None and head.upstream_offset == 50_000
    # a group 37,000+ records behind the head
    u = 12_345
    batch, i = divmod(u, 5_000)
    expected = batch * (4_999 + 1) + i - (1 if i > 1234 else 0)
    t = store.translate("t", 0, u)
    assert (t.downstream_offset, t.exact) == (expected, True)


def test_ahead_of_mirror_is_conservative() -> None:
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(10, 0), (11, 1)], 12))
    assert store.translate("t", 0, 12) == Translation(2, True, EXACT_SYNC)  # the batch end is a sync
    assert store.translate("t", 0, 500) == Translation(2, False, "ahead of mirror")


def test_older_than_history_is_never_guessed() -> None:
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(10, 0), (11, 1)], 12))
    assert store.translate("t", 0, 9) == Translation(None, False, "older than retained offset-sync history")
    assert store.translate("t", 1, 10).downstream_offset is None  # no syncs at all for that partition
    assert store.translate("other", 0, 10).downstream_offset is None


def test_bounded_memory_drops_the_oldest() -> None:
    store = OffsetSyncStore(max_per_partition=10)
    d = 0
    for start in range(0, 1000, 10):
        store.add_all(syncs_for_batch("t", 0, [(u, d + i) for i, u in enumerate(range(start, start + 10))], start + 10))
        d += 11
    assert store.size("t", 0) == 10
    oldest = store.oldest("t", 0)
    assert oldest is not None and oldest.upstream_offset > 900
    assert store.translate("t", 0, 5).reason == TOO_OLD
    assert store.translate("t", 0, 995) == Translation(995 + 99, True, INTERPOLATED)
    with pytest.raises(ValueError):
        OffsetSyncStore(max_per_partition=1)


def test_partitions_are_independent() -> None:
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(0, 0), (1, 1)], 2))
    store.add_all(syncs_for_batch("t", 1, [(0, 10), (1, 11)], 2))
    store.add_all(syncs_for_batch("u", 0, [(5, 0)], 6))
    assert store.partitions() == [("t", 0), ("t", 1), ("u", 0)]
    assert [store.translate(t, p, 1).downstream_offset for t, p in store.partitions()] == [1, 11, None]


# --------------------------------------------------------------------------- property: 0 gaps, 0 re-reads


@dataclass
class Sim:
    """A simulated upstream log, its mirror's downstream log, and the syncs the writer emitted."""

    visible: list[int] = field(default_factory=list)  # upstream offsets a read_committed reader sees
    log_end: int = 0
    downstream: list[int | None] = field(default_factory=list)  # committed copy's upstream offset, or None
    syncs: list[OffsetSync] = field(default_factory=list)


def simulate(seed: int, exactly_once: bool) -> Sim:
    rnd = random.Random(seed)
    sim = Sim()
    off = rnd.randint(0, 3)
    while len(sim.visible) < 2_000:
        kind = rnd.random()
        if kind < 0.70:  # plain record
            sim.visible.append(off)
            off += 1
        elif kind < 0.80:  # compaction removed a few offsets
            off += rnd.randint(1, 5)
        elif kind < 0.90:  # committed transaction: records + commit marker
            n = rnd.randint(1, 5)
            sim.visible.extend(range(off, off + n))
            off += n + 1
        else:  # aborted transaction: records + abort marker, none visible
            off += rnd.randint(1, 5) + 1
    sim.log_end = off + rnd.randint(0, 3)  # maybe trailing markers

    i = 0
    while i < len(sim.visible):
        n = rnd.randint(1, 150)
        batch = sim.visible[i:i + n]
        i += len(batch)
        nxt = sim.visible[i] if i < len(sim.visible) else sim.log_end
        upstream_end = rnd.randint(batch[-1] + 1, nxt)  # the batch's range may stop anywhere in a gap
        if exactly_once and rnd.random() < 0.1:  # an aborted attempt of this batch (zombie / crash)
            sim.downstream.extend([None] * (rnd.randint(1, 4) + 1))  # aborted records + abort marker
        pairs = []
        for u in batch:
            pairs.append((u, len(sim.downstream)))
            sim.downstream.append(u)
        if exactly_once:
            sim.downstream.append(None)  # commit marker
        sim.syncs.extend(syncs_for_batch("t", 0, pairs, upstream_end))
        if rnd.random() < 0.1 and upstream_end < nxt:
            # the writer's advance(): the position moved over markers only, nothing mirrored
            sim.syncs.append(OffsetSync("t", 0, rnd.randint(upstream_end + 1, nxt), pairs[-1][1] + 1))
    return sim


@pytest.mark.parametrize("exactly_once", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_every_upstream_position_reads_exactly_the_remaining_records(seed: int, exactly_once: bool) -> None:
    sim = simulate(seed, exactly_once)
    store = OffsetSyncStore()
    store.add_all(sim.syncs)
    committed = [u for u in sim.downstream if u is not None]
    assert committed == sim.visible  # the simulated mirror itself is exact and in order
    # next committed record at or after each downstream position (read_committed consumer)
    next_rec: list[int | None] = [None] * (len(sim.downstream) + 1)
    for d in range(len(sim.downstream) - 1, -1, -1):
        next_rec[d] = sim.downstream[d] if sim.downstream[d] is not None else next_rec[d + 1]

    for U in range(sim.visible[0], sim.log_end + 1):
        t = store.translate("t", 0, U)
        assert t.downstream_offset is not None, (U, t)
        k = bisect.bisect_left(sim.visible, U)
        want = sim.visible[k] if k < len(sim.visible) else None
        # downstream is strictly increasing in upstream order, so the first record read decides it all:
        # equal first record => the consumer reads exactly the records >= U, 0 gaps, 0 re-reads
        assert next_rec[t.downstream_offset] == want, (seed, U, t)
        if U <= store.latest("t", 0).upstream_offset:  # type: ignore[union-attr]
            assert t.exact, (U, t)
    assert store.translate("t", 0, sim.visible[0] - 1).downstream_offset is None


@pytest.mark.parametrize("seed", range(6))
def test_replays_never_skip_and_are_exact_after_the_replay_point(seed: int) -> None:
    """At-least-once restarts replay from an earlier upstream offset: copies exist twice downstream."""
    rnd = random.Random(seed)
    ups = sorted(rnd.sample(range(0, 1_500), 1_000))
    downstream: list[int] = []
    store = OffsetSyncStore()
    i = 0
    replay_points = []
    while i < len(ups):
        n = rnd.randint(1, 120)
        batch = ups[i:i + n]
        pairs = [(u, len(downstream) + j) for j, u in enumerate(batch)]
        downstream.extend(batch)
        nxt = ups[i + n] if i + n < len(ups) else ups[-1] + 1
        store.add_all(syncs_for_batch("t", 0, pairs, nxt))
        i += len(batch)
        if rnd.random() < 0.2 and i < len(ups):  # restart: replay from an earlier record
            i = rnd.randint(max(0, i - 200), i - 1)
            replay_points.append(ups[i])
    assert replay_points
    last_replay = max(replay_points) if replay_points else ups[0]
    for U in range(ups[0], ups[-1] + 2):
        t = store.translate("t", 0, U)
        assert t.downstream_offset is not None
        read = downstream[t.downstream_offset:]
        want = [u for u in ups if u >= U]
        assert set(read) >= set(want) and all(u >= U for u in read), (seed, U)  # re-reads only
        if U >= last_replay:
            assert read == want, (seed, U)


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_for_first_and_unchanged() -> None:
    t = Translation(40, True, "exact sync")
    cp = checkpoint_for("g", "src.t", 0, 42, t, None)
    assert cp == Checkpoint("g", "src.t", 0, 42, 40, "")
    assert checkpoint_for("g", "src.t", 0, 42, t, cp) is None


def test_checkpoint_for_untranslatable_emits_nothing() -> None:
    assert checkpoint_for("g", "t", 0, 5, Translation(None, False, TOO_OLD), None) is None


def test_checkpoint_never_moves_backwards_unless_rewound() -> None:
    prev = Checkpoint("g", "t", 0, 100, 90)
    assert checkpoint_for("g", "t", 0, 80, Translation(70, True, "x"), prev) is None
    assert checkpoint_for("g", "t", 0, 80, Translation(70, True, "x"), prev, source_rewound=True) == \
        Checkpoint("g", "t", 0, 80, 70)
    # same downstream position, upstream moved back: still backwards
    assert checkpoint_for("g", "t", 0, 99, Translation(90, True, "x"), prev) is None


def test_checkpoint_moves_forward_including_conservative_answers() -> None:
    prev = Checkpoint("g", "t", 0, 100, 90)
    assert checkpoint_for("g", "t", 0, 120, Translation(95, False, AHEAD), prev) == Checkpoint("g", "t", 0, 120, 95)
    # an upstream gap: the group moved, the downstream position did not
    assert checkpoint_for("g", "t", 0, 105, Translation(90, True, "gap"), prev) == Checkpoint("g", "t", 0, 105, 90)


# --------------------------------------------------------------------------- loop-skipped records (case 3)


def _store(*pairs: tuple[int, int]) -> OffsetSyncStore:
    st = OffsetSyncStore()
    st.add_all(OffsetSync("t", 0, u, d) for u, d in pairs)
    return st


def test_positions_among_loop_skipped_records_are_untranslatable_and_the_next_one_exact() -> None:
    # a failback's reverse flow: 0-9 came from the destination (skipped), 10-12 were produced here
    st = _store((0, UNMAPPED), (10, 10), (12, 12), (13, 13))
    for pos in (0, 4, 9):
        got = st.translate("t", 0, pos)
        assert (got.downstream_offset, got.exact, got.reason) == (None, False, LOOPED)
    assert st.translate("t", 0, 10).downstream_offset == 10
    assert st.translate("t", 0, 13).downstream_offset == 13
    # a run opened after a mirrored record: the record's own position still maps, the ones after it do not
    st = _store((0, 0), (99, 99), (100, UNMAPPED), (110, 115), (111, 116))
    assert st.translate("t", 0, 99).downstream_offset == 99
    assert st.translate("t", 0, 105).downstream_offset is None
    assert st.translate("t", 0, 110).downstream_offset == 115


def test_a_run_marker_is_never_the_latest_and_never_interpolated_over() -> None:
    # an at-least-once writer that died between the marker and the sync after it
    st = _store((0, 0), (5, 5), (6, UNMAPPED))
    assert st.latest("t", 0) == OffsetSync("t", 0, 5, 5)
    # a rewind cutting a linear run next to a marker keeps no made-up point
    st = _store((0, UNMAPPED), (10, 9), (20, 19))
    st.add(OffsetSync("t", 0, 5, 30))
    assert st.syncs("t", 0) == [OffsetSync("t", 0, 0, UNMAPPED), OffsetSync("t", 0, 5, 30)]


def test_a_destination_that_went_back_ends_the_history_before_it() -> None:
    # the destination topic was re-created and the writer mirrors from source offset 1000 into its offset 0
    st = _store((0, 0), (999, 999), (1000, 0), (1099, 99), (1100, 100))
    got = st.translate("t", 0, 500)
    assert (got.downstream_offset, got.reason) == (None, TOO_OLD)
    assert st.translate("t", 0, 1050).downstream_offset == 50


def test_upstream_for_reads_a_history_backwards() -> None:
    # 0-9 -> 0-9, a commit marker at 10, 10-14 -> 11-15, then 15-17 not mirrored (dead letters), 18 -> 16
    st = _store((0, 0), (9, 9), (10, 11), (14, 15), (15, 16), (18, 16), (19, 17))
    for d in range(0, 18):
        u = st.upstream_for("t", 0, d)
        assert u is not None, d
        # the position maps back onto d (10 is the commit marker: a consumer there reads 11 next) ...
        assert st.translate("t", 0, u).downstream_offset == (11 if d == 10 else d), d
        # ... and is the smallest that does: the one before it maps lower
        assert u == 0 or (st.translate("t", 0, u - 1).downstream_offset or 0) < (11 if d == 10 else d), d
    assert st.upstream_for("t", 0, 10) == 10  # on the marker: the next record's original
    assert st.upstream_for("t", 0, 16) == 15  # the dead letters' positions map to the next record, as 15 does
    assert st.upstream_for("t", 0, 18) is None  # past the history
    # across a run of loop-skipped records nothing is known
    st = _store((0, 0), (4, 4), (5, UNMAPPED), (9, 20), (10, 21))
    assert st.upstream_for("t", 0, 4) == 4
    assert st.upstream_for("t", 0, 12) is None
    assert st.upstream_for("t", 0, 20) == 9


def test_the_position_after_a_trailing_run_of_copies_is_the_writers_only() -> None:
    """Case 4: 100-149 came back (loop guard), 150 the reverse flow's commit marker, nothing mirrored since: the
    syncs at 150 and 151 hold only where the writer resumes (100), not where a consumer there belongs."""
    st = OffsetSyncStore()
    st.add_all([OffsetSync("t", 0, 0, 0), OffsetSync("t", 0, 99, 99), OffsetSync("t", 0, 100, UNMAPPED),
                OffsetSync("t", 0, 150, 100, True), OffsetSync("t", 0, 151, 100, True)])
    for pos in (150, 151):
        got = st.translate("t", 0, pos)
        assert (got.downstream_offset, got.exact, got.reason) == (None, False, AFTER_LOOPED), pos
        assert st.run_end("t", 0, pos) == 150  # where a consumer has read the same: the run's end
    assert st.run_end("t", 0, 99) == 99
    # ahead of it: records not mirrored yet, copies or not: no answer (its d may lie past unread records)
    assert (st.translate("t", 0, 160).downstream_offset, st.translate("t", 0, 160).reason) == (None, AHEAD)
    assert st.latest("t", 0) == OffsetSync("t", 0, 151, 100, True)
    # a reverse flow's history never answers with one (its d is no translation)
    assert st.upstream_for("t", 0, 100) is None
    # the next record mirrored (at 153, to 150; a dead letter at 151-152): positions before it map to it, the
    # run's end still goes through the reverse flow
    st.add(OffsetSync("t", 0, 151, 150))
    st.add(OffsetSync("t", 0, 153, 150))
    assert st.translate("t", 0, 150).reason == AFTER_LOOPED
    assert [st.translate("t", 0, u).downstream_offset for u in (151, 152, 153)] == [150, 150, 150]
    # a sync without the mark (an earlier release's) reads as before
    old = OffsetSyncStore()
    old.add_all([OffsetSync("t", 0, 100, UNMAPPED), OffsetSync("t", 0, 150, 100)])
    assert old.translate("t", 0, 150) == Translation(100, True, EXACT_SYNC)


def test_a_rewind_never_interpolates_from_a_position_only_sync() -> None:
    st = OffsetSyncStore()
    st.add_all([OffsetSync("t", 0, 0, UNMAPPED), OffsetSync("t", 0, 10, 10, True), OffsetSync("t", 0, 20, 20)])
    st.add(OffsetSync("t", 0, 15, 30))
    assert st.syncs("t", 0) == [OffsetSync("t", 0, 0, UNMAPPED), OffsetSync("t", 0, 10, 10, True),
                                OffsetSync("t", 0, 15, 30)]
