"""Issue 11, the driver's side of the streaming mirror without a broker: how Spark's checkpoint is read,
records of topics nobody planned for, and the decisions taken per batch."""

from __future__ import annotations

import pytest

from mirror_core import stream
from mirror_core.errors import MirrorError
from mirror_core.replicate import Columns


def cols(*offsets: int) -> Columns:
    n = len(offsets)
    return Columns(list(offsets), [b"k"] * n, [b"v"] * n, [0] * n)


def test_item1_record_of_an_unknown_topic_never_passes_silently() -> None:
    """A topic the plan has no settings for fails the batch with one line naming it, unless the group looked
    at it and chose not to mirror it (excluded by a flow): those records are passed over."""
    plan = stream.WriterPlan(settings={}, id_map={}, end_offsets={}, destination_consumer_config={},
                             registries=None, ignored=frozenset({"payments.tmp"}), group="payments-prod")
    bw = stream.BatchWriter(plan)
    bw.feed("payments.tmp", 0, cols(1, 2))  # deliberately not mirrored
    with pytest.raises(stream.UnknownTopicError) as err:
        bw.feed("payments.new", 3, cols(7, 8))
    msg = str(err.value)
    assert "payments-prod" in msg and "'payments.new' [3]@7" in msg and "\n" not in msg
    assert not bw.results


def test_item1_checkpoint_locations_keep_their_uri_and_are_read_as_spark_wrote_them(tmp_path) -> None:
    """``file:`` URIs are read from the disk; other schemes are never taken for a missing local file."""
    f = tmp_path / "g" / "offsets" / "4"
    f.parent.mkdir(parents=True)
    f.write_text('v1\n{"batchWatermarkMs":0}\n{"t":{"0":12,"1":3}}')
    base = tmp_path.as_uri()
    assert stream.join_location("s3a://bucket/ck", "g", "offsets") == "s3a://bucket/ck/g/offsets"
    assert stream.join_location(base + "/", "g") == base + "/g"
    assert stream.join_location(str(tmp_path), "g") == str(tmp_path / "g")
    assert stream.read_batch_end_offsets(stream.join_location(base, "g"), 4) == {"t": {0: 12, 1: 3}}
    assert stream.read_batch_end_offsets(str(tmp_path / "g"), 4) == {"t": {0: 12, 1: 3}}
    assert stream.read_batch_end_offsets(str(tmp_path / "g"), 5) == {}  # not planned yet
    with pytest.raises(MirrorError, match="s3a"):
        stream.read_batch_end_offsets("s3a://bucket/ck/g", 4)
    # whatever reader the Spark job hands in is the one used
    seen: list[str] = []
    stream.read_batch_end_offsets("hdfs://nn/ck/g", 9, lambda loc: seen.append(loc) or None)
    assert seen == ["hdfs://nn/ck/g/offsets/9"]
