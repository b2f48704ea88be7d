"""checkpoint.SourceTranslator: positions no offset sync covers, placed from what the source holds, against
in-memory stand-ins for the clusters' ends and the source's committed records."""

from __future__ import annotations

from typing import Any

import pytest

from mirror_core import checkpoint, replicate
from mirror_core.config import parse_config
from mirror_core.errors import KafkaOperationError
from mirror_core.offsets import (
    AFTER_LOOPED,
    LOOPED,
    NO_SYNCS,
    THROUGH_ORIGINALS,
    TOO_OLD,
    UNMAPPED,
    OffsetSync,
    OffsetSyncStore,
)
from mirror_core.positions import sync_from_record
from mirror_core.replicate import PROVENANCE_HEADER
from tests.unit.test_replicate import _FakeProducer, ids, rec, settings


class _Clusters:
    """Ends per (alias, topic) and the offsets of the source's committed records; notes every read in order."""

    def __init__(self, ends: dict[tuple[str, str], dict[int, tuple[int, int]]], records: dict[int, list[int]]):
        self.ends, self.records, self.reads = ends, records, []
        self.fail = False

    def end_offsets(self, cluster: Any, alias: str, topic: str) -> dict[int, tuple[int, int]]:
        self.reads.append(("ends", alias))
        return dict(self.ends.get((alias, topic), {}))

    def first(self, cluster: Any, topic: str, partition: int, start: int, end: int) -> int | None:
        self.reads.append(("records", start, end))
        if self.fail:
            raise KafkaOperationError("source did not answer")
        return next((o for o in self.records.get(partition, []) if start <= o < end), None)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Any:
    def make(ends: dict[tuple[str, str], dict[int, tuple[int, int]]], records: dict[int, list[int]],
             syncs: list[OffsetSync]) -> tuple[_Clusters, checkpoint.SourceTranslator]:
        cl = _Clusters(ends, records)
        monkeypatch.setattr(checkpoint, "_ends_or_none", cl.end_offsets)
        monkeypatch.setattr(checkpoint, "first_committed", cl.first)
        cfg = parse_config({"clusters": {"a": {"kafka": {"bootstrap.servers": "a:1"}},
                                         "b": {"kafka": {"bootstrap.servers": "b:1"}}},
                            "groups": [{"name": "g", "source": "a", "destination": "b",
                                        "mirrors": [{"source_topic": "t"}]}]}, env={})
        store = OffsetSyncStore()
        store.add_all(syncs)
        return cl, checkpoint.SourceTranslator(cfg, cfg.groups[0], store)
    return make


def test_a_position_before_the_first_mirrored_record_goes_to_it_only_when_nothing_lies_between(world: Any) -> None:
    # the log starts with an aborted transaction (0-2) and its marker (3); the first record, 4, is at 7 downstream
    cl, tr = world({("a", "t"): {0: (0, 10)}}, {0: [4, 5, 6]}, [OffsetSync("t", 0, 4, 7), OffsetSync("t", 0, 7, 10)])
    got = tr.translate("t", 0, 1, "t")
    assert (got.downstream_offset, got.exact, got.reason) == (7, True, checkpoint.BEFORE_FIRST)
    # a committed record between the position and the first sync (its syncs went with retention): no answer
    cl, tr = world({("a", "t"): {0: (0, 10)}}, {0: [2, 4]}, [OffsetSync("t", 0, 4, 7)])
    assert tr.translate("t", 0, 1, "t").reason == TOO_OLD
    # below the log start, or the first sync beyond the source's end (an earlier incarnation): no answer, no read
    for ends in ({0: (2, 10)}, {0: (0, 3)}):
        cl, tr = world({("a", "t"): ends}, {}, [OffsetSync("t", 0, 4, 7)])
        assert tr.translate("t", 0, 1, "t").downstream_offset is None
        assert not [r for r in cl.reads if r[0] == "records"]


def test_a_partition_without_syncs_reads_the_destinations_end_before_the_sources(world: Any) -> None:
    """A record committed on the source and mirrored before the destination's end was read must lie below the
    source end the read looks to, or the position would be placed past it (a skipped record)."""
    cl, tr = world({("a", "t"): {0: (0, 4)}, ("b", "t"): {0: (0, 3)}}, {}, [])
    got = tr.translate("t", 0, 4, "t")
    assert (got.downstream_offset, got.exact, got.reason) == (3, False, checkpoint.NOTHING_TO_MIRROR)
    got = tr.translate("t", 0, 0, "t")  # offsets 0-3 hold only aborted records and markers
    assert got.downstream_offset == 3
    assert [r for r in cl.reads if r[0] == "ends"] == [("ends", "b"), ("ends", "a")]  # once per topic, in order
    # a record committed at 4 and mirrored (destination end 4, not 3) before the destination's end was read: the
    # source's end, read after it, covers the record, and the position stays unplaced instead of going past it
    cl, tr = world({("a", "t"): {0: (0, 5)}, ("b", "t"): {0: (0, 4)}}, {0: [4]}, [])
    assert tr.translate("t", 0, 4, "t").reason == NO_SYNCS


def test_a_position_at_the_sources_end_waits_for_records_below_it_to_be_mirrored(world: Any) -> None:
    """g sits at the source's end, 100, of a partition the writer has not mirrored yet (no sync, destination
    empty). Placed at the destination's end, 0, its consumers there would read the 100 records again once they
    are mirrored: it stays untranslatable until the writer's syncs place it."""
    cl, tr = world({("a", "t"): {0: (0, 100)}, ("b", "t"): {0: (0, 0)}}, {0: list(range(100))}, [])
    assert tr.translate("t", 0, 100, "t").reason == NO_SYNCS
    # the log's records below the position were removed by retention (log start 100): nothing left to mirror
    cl, tr = world({("a", "t"): {0: (100, 100)}, ("b", "t"): {0: (0, 0)}}, {}, [])
    got = tr.translate("t", 0, 100, "t")
    assert (got.downstream_offset, got.reason) == (0, checkpoint.NOTHING_TO_MIRROR)
    # only aborted records and markers below it (0-9), nothing committed anywhere: nothing to mirror either
    cl, tr = world({("a", "t"): {0: (0, 10)}, ("b", "t"): {0: (0, 0)}}, {}, [])
    assert tr.translate("t", 0, 10, "t").reason == checkpoint.NOTHING_TO_MIRROR


def test_empty_partitions_use_no_reads_and_many_are_placed(world: Any) -> None:
    """A consumer committed 0 on each of 100 empty partitions: nothing to read, so none of the budget's reads is
    used, and every position is placed (the failover's sync would refuse the ones left unplaced)."""
    n = 100
    cl, tr = world({("a", "t"): {p: (0, 0) for p in range(n)}, ("b", "t"): {p: (0, 0) for p in range(n)}}, {}, [])
    assert all(tr.translate("t", p, 0, "t").reason == checkpoint.NOTHING_TO_MIRROR for p in range(n))
    assert not [r for r in cl.reads if r[0] == "records"] and len(cl.reads) == 2


def test_an_unanswered_or_exhausted_source_leaves_positions_unplaced(world: Any) -> None:
    cl, tr = world({("a", "t"): {0: (0, 4)}, ("b", "t"): {0: (0, 3)}}, {}, [])
    cl.fail = True
    assert tr.translate("t", 0, 0, "t").reason == NO_SYNCS
    cl.fail = False
    reads = len(cl.reads)
    tr.probes = checkpoint.ProbeBudget(reads=0)
    assert tr.translate("t", 0, 0, "t").reason == NO_SYNCS
    tr.probes = checkpoint.ProbeBudget(seconds=0)
    assert tr.translate("t", 0, 0, "t").reason == NO_SYNCS
    assert len(cl.reads) == reads  # no read of the source once the budget is spent
    tr.probes = checkpoint.ProbeBudget()
    assert tr.translate("t", 0, 0, "t").reason == checkpoint.NOTHING_TO_MIRROR


def _two_way(*reverse_topics: str) -> Any:
    return parse_config({"clusters": {"a": {"kafka": {"bootstrap.servers": "a:1"}},
                                      "b": {"kafka": {"bootstrap.servers": "b:1"}}},
                         "groups": [*({"name": f"fwd-{t}", "source": "a", "destination": "b",
                                       "mirrors": [{"source_topic": t}]} for t in reverse_topics),
                                    {"name": "back", "source": "b", "destination": "a",
                                     "mirrors": [{"source_topic": "t"}]}]}, env={})


def test_a_failbacks_position_among_copies_goes_to_their_originals_by_the_failovers_syncs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The failback group (b -> a) skipped b's 0-9: copies the failover's group (a -> b) made of a's 0-9 (a commit
    marker of a -> b's transaction at b's 5: a's 5-9 are b's 6-10). A consumer group at b's 4 has read the
    copies of a's 0-3: on a it goes to 4, not to a's end (which skipped 4-9) and not nowhere."""
    # another group the other way, of another topic, comes first in the file: its syncs do not hold t
    cfg = _two_way("x", "t")
    forward = OffsetSyncStore()
    forward.add_all(OffsetSync("t", 0, u, d) for u, d in ((0, 0), (4, 4), (5, 6), (9, 10), (10, 11)))
    other = OffsetSyncStore()
    other.add_all(OffsetSync("x", 0, u, d) for u, d in ((0, 0), (50, 50)))
    read: list[str] = []
    monkeypatch.setattr(checkpoint, "load_sync_store",
                        lambda _cfg, g: read.append(g.name) or (forward if g.name == "fwd-t" else other))
    parts = {("b", "t"): {0: (0, 14)}, ("a", "t"): {0: (0, 11)}}
    monkeypatch.setattr(checkpoint, "_ends_or_none", lambda _c, alias, topic: parts.get((alias, topic), {}))
    back = OffsetSyncStore()
    back.add_all(OffsetSync("t", 0, u, d) for u, d in ((0, UNMAPPED), (11, 10), (14, 13)))
    tr = checkpoint.SourceTranslator(cfg, cfg.groups[-1], back)
    got = {pos: tr.translate("t", 0, pos, "t") for pos in (0, 4, 5, 6, 10, 11, 12)}
    assert {pos: t.downstream_offset for pos, t in got.items()} == {0: 0, 4: 4, 5: 5, 6: 5, 10: 9, 11: 10, 12: 11}
    assert got[4].exact and got[4].reason == THROUGH_ORIGINALS
    assert sorted(read) == ["fwd-t", "fwd-x"]  # each read once, for all of them
    # a flow the other way that placed records by key hash (t has more partitions on a than on b) says nothing
    parts[("a", "t")] = {0: (0, 11), 1: (0, 0)}
    tr = checkpoint.SourceTranslator(cfg, cfg.groups[-1], back)
    assert tr.translate("t", 0, 4, "t").reason == LOOPED
    # without the reverse group in the config: no answer, as before
    alone = _two_way()
    assert checkpoint.SourceTranslator(alone, alone.groups[0], back).translate("t", 0, 4, "t").reason == LOOPED


# --------------------------------------------------------------------------- the position after a trailing run of copies


def _written_syncs(fake: Any) -> list[OffsetSync]:
    """The syncs a fake producer was given, with what their headers say (position-only)."""
    return [sync_from_record(k, v, list(h)) for t, _p, k, v, h, _ts in fake.full if t == "syncs"]


def _with_reverse(monkeypatch: pytest.MonkeyPatch, cfg: Any, reverse: str, reverse_store: OffsetSyncStore) -> None:
    monkeypatch.setattr(checkpoint, "load_sync_store", lambda _cfg, g: reverse_store if g.name == reverse else
                        OffsetSyncStore())
    ends = {p: (0, 2000) for p in range(3)}
    monkeypatch.setattr(checkpoint, "_ends_or_none", lambda _c, alias, topic: dict(ends))


def test_a_second_failover_places_the_end_of_the_copies_at_their_originals_end(monkeypatch: pytest.MonkeyPatch
                                                                               ) -> None:
    """The flow a -> b restarts after a failback with its sync from before the first failover (a 100 -> b 100).
    Meanwhile b's producers wrote b 100-149 and the flow back copied them to a 100-149 (its commit marker at a 150).
    The flow skips the copies: nothing mirrored, so the position after them got the writer's own position (b 100),
    called exact, and a group at a 151 that had read the copies went to b 100: 50 records read again. It is
    position-only now and placed by the flow back's syncs: b 150."""
    fake = _FakeProducer()
    fake._next[("t", 1)] = 150
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(provenance=True, value_serde="bytes", source_alias="a",
                                                destination_alias="b"), ids({}),
                                       lambda t, p: OffsetSync("t", 1, 100, 100),
                                       downstream_end=lambda t, p: 150, destination_high=lambda t, p: 150)
    copies = [rec(b"v", ((PROVENANCE_HEADER, b"b"),), offset=o) for o in range(100, 150)]
    assert writer.write(1, copies, upstream_end=151).provenance_skipped == 50
    syncs = _written_syncs(fake)
    forward = OffsetSyncStore()
    forward.add_all([OffsetSync("t", 1, 0, 0), OffsetSync("t", 1, 99, 99), OffsetSync("t", 1, 100, 100), *syncs])
    back = OffsetSyncStore()  # b 100-149 -> a 100-149, its commit marker at a 150
    back.add_all(OffsetSync("t", 1, u, d) for u, d in ((100, 100), (149, 149), (150, 150)))
    cfg = _two_way("t")
    _with_reverse(monkeypatch, cfg, "back", back)
    tr = checkpoint.SourceTranslator(cfg, cfg.groups[0], forward)
    got = {pos: tr.translate("t", 1, pos, "t") for pos in (120, 150, 151)}
    assert {pos: (t.downstream_offset, t.exact) for pos, t in got.items()} == \
        {120: (120, True), 150: (150, True), 151: (150, True)}
    assert {t.reason for t in got.values()} == {THROUGH_ORIGINALS}
    # the syncs alone no longer call it exact ...
    for pos in (150, 151):
        t = forward.translate("t", 1, pos)
        assert (t.downstream_offset, t.exact, t.reason) == (None, False, AFTER_LOOPED), pos
    assert syncs == [OffsetSync("t", 1, 100, UNMAPPED), OffsetSync("t", 1, 150, 100, True),
                     OffsetSync("t", 1, 151, 100, True)]
    # ... and the writer resumes from there all the same: nothing is read twice or skipped
    assert replicate._POSITIONS["txid"] == replicate.Position(151, 100, True)
    # a's own records after them are mirrored to b 150-151: exact syncs again, from the next record on
    writer.write(1, [rec(b"v", offset=o) for o in (151, 152)], upstream_end=153)
    forward.add_all(_written_syncs(fake)[len(syncs):])
    assert [forward.translate("t", 1, u).downstream_offset for u in (151, 152, 153)] == [150, 151, 152]
    assert tr.translate("t", 1, 150, "t").downstream_offset == 150
    # without the flow back in the config: untranslatable, not its writer's position
    alone = _two_way()
    assert checkpoint.SourceTranslator(alone, alone.groups[0], forward).translate("t", 1, 150, "t").reason == \
        AFTER_LOOPED


def test_a_standby_reverse_flow_places_the_failover_point_at_the_originals_end(monkeypatch: pytest.MonkeyPatch
                                                                              ) -> None:
    """The flow back (b -> a) runs while a is active: every record of b is a copy of a's. Its first sync mapped
    b 100 to a 100 (a's end then); a's producers wrote 1,000 more, the flow out copied them to b, and the flow back,
    skipping copies only, kept a 100 for the position after them: a group failed over to b at b 1100 went back to a
    100 on failback, "exact": 1,000 records read again. Now it goes to a 1100 by the flow out's syncs."""
    fake = _FakeProducer()
    a_end = {"v": 100}
    monkeypatch.setattr(replicate, "_producer", lambda _s, p, **_k: (fake, "txid"))
    monkeypatch.setattr(replicate, "_POSITIONS", replicate._PositionTable())
    writer = replicate.PartitionWriter(settings(provenance=True, value_serde="bytes", source_alias="b",
                                                destination_alias="a"), ids({}), lambda t, p: None,
                                       downstream_end=lambda t, p: a_end["v"],
                                       destination_high=lambda t, p: a_end["v"])
    cp = ((PROVENANCE_HEADER, b"a"),)
    writer.write(1, [rec(b"v", cp, offset=o) for o in range(0, 100)], upstream_end=100)
    a_end["v"] = 1100
    writer.write(1, [rec(b"v", cp, offset=o) for o in range(100, 1100)], upstream_end=1100)
    back = OffsetSyncStore()
    back.add_all(_written_syncs(fake))
    forward = OffsetSyncStore()  # a 0-1099 -> b 0-1099
    forward.add_all(OffsetSync("t", 1, u, d) for u, d in ((0, 0), (1099, 1099), (1100, 1100)))
    cfg = _two_way("t")
    _with_reverse(monkeypatch, cfg, "fwd-t", forward)
    tr = checkpoint.SourceTranslator(cfg, cfg.groups[-1], back)
    got = tr.translate("t", 1, 1100, "t")
    assert (got.downstream_offset, got.exact, got.reason) == (1100, True, THROUGH_ORIGINALS)
    assert back.latest("t", 1) == OffsetSync("t", 1, 1100, 100, True)
    got = back.translate("t", 1, 1100)
    assert (got.downstream_offset, got.reason) == (None, AFTER_LOOPED)
    # ahead of the flow back (records it has not read yet, copies or not): no answer, not its position
    assert tr.translate("t", 1, 1105, "t").downstream_offset is None
