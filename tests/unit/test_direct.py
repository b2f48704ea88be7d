"""The direct read path's pure part: which ranges a micro-batch reads, from Spark's offset log."""

from __future__ import annotations

from mirror_core.direct import Range, batch_ranges


def test_batch_ranges_follow_the_offset_log():
    """A partition without a start (new to the query, or a symbolic one) from its first offset; unchanged
    and moved-back partitions (the runtime writes those from the start itself) and skipped topics left out."""
    starts = {"a": {0: 10, 1: 5, 2: -2}, "b": {0: 7}}
    ends = {"a": {0: 20, 1: 5, 2: 3, 3: 4, 4: 0}, "b": {0: 3}, "c": {0: 9}, "x": {0: 5}}
    assert batch_ranges(starts, ends, skip={"x"}) == [
        Range("a", 0, 10, 20), Range("a", 2, None, 3), Range("a", 3, None, 4), Range("c", 0, None, 9)]
    assert batch_ranges({}, {}) == []
