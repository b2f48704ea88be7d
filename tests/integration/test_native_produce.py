"""The C produce loop on real brokers: runs of records produced without delivery reports land where the
reports around them prove (so the offset syncs stay exact), with their schema ids rewritten, and a record
the destination rejects inside such a run is still set aside with its reason, never lost unseen.

The writer is driven as the Spark job drives it: on the exactly_once path one transaction per chunk, on the
at_least_once path the partition's gapless producer."""

from __future__ import annotations

import time

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import clients, native
from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.positions import last_committed_sync
from mirror_core.replicate import Columns, PartitionWriter, SchemaIdTranslator, WriterSettings, release_producers
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration

SRC_ID, DST_ID = 7, 42
#: record timestamps: recent (the broker's retention check deletes records stamped years ago)
NOW_MS = int(time.time() * 1000)


def config(clusters, syncs: str) -> MirrorsConfig:
    text = clusters.config_yaml(f"""
groups:
  - name: native
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: {syncs}
    mirrors: [{{source_topic: t, destination_topic: t}}]
""")
    return parse_config(yaml.safe_load(text), env={})


def settings(cfg: MirrorsConfig, topic: str, dlq: str, syncs: str, **over) -> WriterSettings:
    base = dict(
        group="native", mirror=f"native__{topic}__{topic}", source_alias="src", destination_alias="dst",
        source_topic=topic, destination_topic=topic, source_partitions=1, destination_partitions=1,
        delivery="exactly_once", key_serde="bytes", value_serde="avro", on_error="dead_letter", dlq_topic=dlq,
        offset_syncs_topic=syncs, provenance=False, producer_config=clients.kafka_config(cfg.cluster("dst")))
    return WriterSettings(**(base | over))


def create(bootstrap: str, *topics: str, config: dict[str, str] | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(t, 1, 1, config=config or {}) for t in topics])


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + body


def read(cfg: MirrorsConfig, topic: str) -> list[tuple[int, bytes | None, bytes | None, int]]:
    dst = cfg.cluster("dst")
    (low, high), = clients.end_offsets(dst, topic, settled=True).values()
    return [(m.offset(), m.key(), m.value(), m.timestamp()[1]) for m in clients.read_partition(dst, topic, 0, low, high)]


@pytest.fixture(autouse=True)
def fresh_producers():
    yield
    release_producers()


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_runs_without_reports_land_in_order_with_ids_rewritten_and_exact_syncs(clusters, unique, delivery):
    """Both delivery modes: exactly_once in a transaction per chunk, at_least_once on the partition's
    gapless producer (no transaction markers, so the second chunk follows the first at once)."""
    eos = delivery == "exactly_once"
    topic, dlq, syncs = unique("native"), unique("native-dlq"), unique("native-syncs")
    create(clusters.dst_bootstrap, topic, dlq, syncs)
    cfg = config(clusters, syncs)
    s = settings(cfg, topic, dlq, syncs, delivery=delivery)
    n = 5000
    offsets = list(range(1000, 1000 + n))
    values = [None if i % 997 == 0 else framed(SRC_ID, b"value-%d" % i) for i in offsets]
    cols = Columns(offsets, [b"k%d" % i for i in offsets], values, [NOW_MS + i for i in offsets])
    w = PartitionWriter(s, SchemaIdTranslator({SRC_ID: DST_ID}))

    result = w.write(0, cols, upstream_end=1000 + n)

    assert native.available()
    assert result.native_records == n - 2  # all but the first and the last, whose reports bracket the run
    assert result.mirrored == n and result.last_downstream == n - 1
    got = read(cfg, topic)
    assert [o for o, *_ in got] == list(range(n))  # no marker among the records
    assert [k for _, k, _, _ in got] == cols.keys
    assert [v for _, _, v, _ in got] == [None if v is None else framed(DST_ID, v[5:]) for v in values]
    assert [t for *_, t in got] == cols.timestamps
    sync = last_committed_sync(s.producer_config, syncs, topic, 0, destination=topic)
    assert sync is not None and (sync.upstream_offset, sync.downstream_offset) == (1000 + n, n)

    # the next chunk lands after this transaction's marker: its run is proven from its own reports again
    more = Columns(list(range(1000 + n, 1000 + 2 * n)), [b"k"] * n, [framed(SRC_ID, b"x")] * n, [NOW_MS] * n)
    result = w.write(0, more, upstream_end=1000 + 2 * n)
    gap = 1 if eos else 0  # exactly_once: n records after one transaction marker
    assert result.native_records == n - 2 and result.last_downstream == 2 * n - 1 + gap
    sync = last_committed_sync(s.producer_config, syncs, topic, 0, destination=topic)
    assert sync is not None and (sync.upstream_offset, sync.downstream_offset) == (1000 + 2 * n, 2 * n + gap)


def _large_record_inside_a_run(clusters, unique, monkeypatch, delivery: str):
    """A chunk of 300 records whose 151st is 5 KB, to a topic that takes 2,000 bytes, written by a writer
    that does not know that limit (so the C loop takes the large record along with the rest). Returns the
    config, settings, values, the C loop's runs [start, index reached) and the write's result."""
    topic, dlq, syncs = unique("native-big"), unique("native-big-dlq"), unique("native-big-syncs")
    create(clusters.dst_bootstrap, dlq, syncs)
    create(clusters.dst_bootstrap, topic, config={"max.message.bytes": "2000"})
    cfg = config(clusters, syncs)
    s = settings(cfg, topic, dlq, syncs, value_serde="bytes", destination_max_message_bytes=None, delivery=delivery)
    n = 300
    values = [b"v%d" % i for i in range(n)]
    values[150] = b"x" * 5000
    cols = Columns(list(range(n)), [b"k%d" % i for i in range(n)], values, [NOW_MS] * n)

    runs: list[tuple[int, int]] = []
    produce = native.produce

    def spy(*args, **kwargs):
        out = produce(*args, **kwargs)
        runs.append((args[7], out[0]))
        return out

    monkeypatch.setattr(native, "produce", spy)
    result = PartitionWriter(s, SchemaIdTranslator({})).write(0, cols, upstream_end=n)
    assert any(start <= 150 < reached for start, reached in runs)  # the large record went out without a report
    return cfg, s, values, result


def test_a_record_rejected_inside_a_run_is_dead_lettered_and_nothing_else_lost(clusters, unique, monkeypatch):
    cfg, s, values, result = _large_record_inside_a_run(clusters, unique, monkeypatch, "exactly_once")
    n = len(values)
    assert result.dead_lettered == 1 and result.mirrored == n - 1
    got = read(cfg, s.destination_topic)
    assert [v for _, _, v, _ in got] == values[:150] + values[151:]  # each once, in order, nothing doubled
    dead = read(cfg, s.dlq_topic)
    assert len(dead) == 1 and dead[0][2] == values[150]
    sync = last_committed_sync(s.producer_config, s.offset_syncs_topic, s.destination_topic, 0,
                               destination=s.destination_topic)
    assert sync is not None and sync.upstream_offset == n


def test_at_least_once_a_record_lost_inside_a_run_stops_the_run_and_the_chunk_is_written_again(clusters, unique,
                                                                                                monkeypatch):
    """at_least_once has no transaction to fail: a record the destination rejects inside a run would be lost
    unseen, but the gapless producer stops there (a fatal error), so the chunk's last record is reported
    failed and the chunk is written again the Python way: the rejected record is dead-lettered with its
    reason, every other record is on the destination (some twice, as at-least-once allows), in order from
    its last copy, and the offset syncs end where the chunk ends."""
    cfg, s, values, result = _large_record_inside_a_run(clusters, unique, monkeypatch, "at_least_once")
    n = len(values)
    assert result.native_records == 0  # the chunk was written again, every record with a report
    assert result.dead_lettered == 1 and result.mirrored == n - 1
    got = [v for _, _, v, _ in read(cfg, s.destination_topic)]
    kept = values[:150] + values[151:]
    assert set(got) == set(kept)
    last = {v: i for i, v in enumerate(got)}
    assert sorted(kept, key=last.__getitem__) == kept  # each record's last copy in order
    dead = read(cfg, s.dlq_topic)
    assert len(dead) == 1 and dead[0][2] == values[150]
    sync = last_committed_sync(s.producer_config, s.offset_syncs_topic, s.destination_topic, 0,
                               destination=s.destination_topic)
    assert sync is not None and sync.upstream_offset == n


def test_native_off_takes_the_python_loop_for_every_record(clusters, unique, monkeypatch):
    topic, dlq, syncs = unique("native-off"), unique("native-off-dlq"), unique("native-off-syncs")
    create(clusters.dst_bootstrap, topic, dlq, syncs)
    cfg = config(clusters, syncs)
    s = settings(cfg, topic, dlq, syncs, value_serde="bytes")
    monkeypatch.setattr(native, "_module", None)  # what MIRRORFLOW_NATIVE=0 (or no compiler) leaves
    cols = Columns(list(range(100)), [None] * 100, [b"v"] * 100, [NOW_MS] * 100)
    result = PartitionWriter(s, SchemaIdTranslator({})).write(0, cols, upstream_end=100)
    assert result.native_records == 0 and result.mirrored == 100 and result.last_downstream == 99
    assert len(read(cfg, topic)) == 100
