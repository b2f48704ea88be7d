"""MM2 byte formats and exact translation (lead's tests; see also test_offsets.py)."""

from __future__ import annotations

import random

from mirror_core.offsets import Checkpoint, Heartbeat, OffsetSync, OffsetSyncStore, syncs_for_batch


def test_golden_bytes():
    assert OffsetSync("t", 1, 5, 7).key_bytes() == b"\x00\x01t\x00\x00\x00\x01"
    assert OffsetSync("t", 1, 5, 7).value_bytes() == (5).to_bytes(8, "big") + (7).to_bytes(8, "big")
    cp = Checkpoint("g", "t", 2, 10, 20, "")
    assert cp.key_bytes() == b"\x00\x01g\x00\x01t\x00\x00\x00\x02"
    assert cp.value_bytes() == b"\x00\x00" + (10).to_bytes(8, "big") + (20).to_bytes(8, "big") + b"\x00\x00"
    hb = Heartbeat("a", "b", 99)
    assert hb.key_bytes() == b"\x00\x01a\x00\x01b" and hb.value_bytes() == b"\x00\x00" + (99).to_bytes(8, "big")
    assert Checkpoint.from_record(cp.key_bytes(), cp.value_bytes()) == cp
    assert Heartbeat.from_record(hb.key_bytes(), hb.value_bytes()) == hb


def simulate(seed: int):
    """Random upstream log with gaps, random batches with downstream commit markers."""
    rnd = random.Random(seed)
    upstream = []
    off = 0
    for _ in range(3000):
        off += 1 if rnd.random() > 0.1 else rnd.randint(2, 6)  # compaction / markers / aborted records
        upstream.append(off)
    store = OffsetSyncStore()
    mapping: dict[int, int] = {}
    d = 0
    i = 0
    while i < len(upstream):
        n = rnd.randint(1, 400)
        batch = upstream[i:i + n]
        pairs = []
        for u in batch:
            pairs.append((u, d))
            mapping[u] = d
            d += 1
        d += 1  # the transaction's commit marker
        end = upstream[i + n] if i + n < len(upstream) and rnd.random() < 0.5 else batch[-1] + 1
        store.add_all(syncs_for_batch("t", 0, pairs, end))
        i += n
    return upstream, mapping, store


def test_every_position_translates_without_gaps_or_rereads():
    for seed in range(5):
        upstream, mapping, store = simulate(seed)
        downstream_records = sorted(mapping.values())
        for U in range(upstream[0], upstream[-1] + 1):
            t = store.translate("t", 0, U)
            assert t.downstream_offset is not None
            want = [u for u in upstream if u >= U]
            got_d = [d for d in downstream_records if d >= t.downstream_offset]
            inverse = {d: u for u, d in mapping.items()}
            assert [inverse[d] for d in got_d] == want, (seed, U)


def test_far_behind_group_is_exact_with_sparse_syncs():
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(u, u + 100) for u in range(0, 50_000)], 50_000))
    assert len(syncs_for_batch("t", 0, [(u, u + 100) for u in range(0, 50_000)], 50_000)) == 3
    t = store.translate("t", 0, 12_345)
    assert (t.downstream_offset, t.exact) == (12_445, True)


def test_ahead_and_too_old():
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(10, 0), (11, 1)], 12))
    assert store.translate("t", 0, 5).downstream_offset is None
    t = store.translate("t", 0, 20)
    assert t.downstream_offset == 2 and not t.exact


def test_replay_supersedes_history():
    store = OffsetSyncStore()
    store.add_all(syncs_for_batch("t", 0, [(u, u) for u in range(100)], 100))
    store.add_all(syncs_for_batch("t", 0, [(u, u + 100) for u in range(50, 100)], 100))
    assert store.translate("t", 0, 60).downstream_offset == 160
    assert store.translate("t", 0, 10).downstream_offset == 10
