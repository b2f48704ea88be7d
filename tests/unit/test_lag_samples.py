"""The lag sample contract: the whole sample, its throughput since the one before, and its small totals."""

from __future__ import annotations

import json

from mirror_core.health import LagReport, PartitionLag
from mirror_core.lag_samples import MAX_REASON_CHARS, to_sample, totals, with_throughput


def _sample(taken_at: str, dst_ends: tuple[int, int], **kw: object) -> dict:
    lag = LagReport([PartitionLag("g", "g__o__o2", "o", 0, 120, 100, 20, 1.5),
                     PartitionLag("g", "g__o__o2", "o", 1, 7, None, 7, None)])
    return to_sample("g", lag, {"o": "o2"}, {("o2", 0): dst_ends[0], ("o2", 1): dst_ends[1]}, None,
                     taken_at=taken_at, **kw)


def test_to_sample_is_the_record_lag_contract() -> None:
    sample = _sample("2026-01-01T00:00:00Z", (101, 0), stream_stopped="failover of group g to b at 09:00")
    assert sample == {
        "group": "g", "taken_at": "2026-01-01T00:00:00Z", "last_checkpoint_at": None,
        "stream_stopped": "failover of group g to b at 09:00", "lag_records": 27, "max_lag_seconds": 1.5,
        "partitions": [
            {"source_topic": "o", "destination_topic": "o2", "partition": 0, "lag_records": 20, "lag_seconds": 1.5,
             "source_end": 120, "destination_end": 101},
            {"source_topic": "o", "destination_topic": "o2", "partition": 1, "lag_records": 7, "lag_seconds": None,
             "source_end": 7, "destination_end": 0}]}
    assert json.loads(json.dumps(sample)) == sample
    assert to_sample("g", LagReport(), {}, {}, None)["taken_at"].endswith("Z")


def test_throughput_is_per_partition_since_the_sample_before() -> None:
    before = _sample("2026-01-01T00:00:00Z", (100, 0))
    now = with_throughput(_sample("2026-01-01T00:00:10Z", (150, 0)), before)
    assert [p["throughput"] for p in now["partitions"]] == [5.0, 0.0] and now["throughput"] == 5.0
    # the first sample, one from the same instant or later, or a partition the one before lacks: no rate
    assert with_throughput(before, None)["throughput"] is None
    assert with_throughput(before, now)["throughput"] is None
    fewer = {**before, "partitions": before["partitions"][:1]}
    assert [p["throughput"] for p in with_throughput(now, fewer)["partitions"]] == [5.0, None]


def test_totals_stay_small_however_many_partitions() -> None:
    sample = _sample("2026-01-01T00:00:00Z", (100, 0), stream_stopped="x" * 10_000)
    sample["partitions"] = sample["partitions"] * 5_000
    t = totals(with_throughput(sample, None))
    assert t["partitions"] == 10_000 and t["lag_records"] == 27 and t["stream_stopped"] == "x" * MAX_REASON_CHARS
    assert len(json.dumps(t)) < 600
    # a stop the task could not read stays unknown in the totals too
    del sample["stream_stopped"]
    assert "stream_stopped" not in totals(sample)
