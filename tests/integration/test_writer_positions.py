"""The partition writer's position on real brokers (issue 11 items 2 and 6): its own position when two
mirrors read one source topic, a lookup that sees past transactions open on the sync partition, and a
partition handed back by another Spark Python worker (its cached producer fenced).

The writer is driven the way the Spark job drives it (:class:`mirror_core.stream.BatchWriter`), without
Spark: a restart is a new process's view (producers and positions forgotten, the old producer fenced).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import clients, replicate
from mirror_core.checkpoint import load_sync_store
from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.offsets import OffsetSync
from mirror_core.positions import (
    LegacySync,
    PositionLookupError,
    last_committed_sync,
    last_committed_syncs,
    sync_headers,
)
from mirror_core.replicate import Columns, WriterSettings
from mirror_core.stream import BatchWriter, WriterPlan
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def two_groups(clusters, syncs: str, topic: str) -> MirrorsConfig:
    """Groups ``live`` (topic -> topic.live) and ``archive`` (topic -> topic.archive) of one source cluster,
    sharing its offset-sync topic, as every group reading one source alias does by default."""
    text = clusters.config_yaml(f"""
groups:
  - name: live-{topic}
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: {syncs}
    mirrors: [{{source_topic: {topic}, destination_topic: {topic}.live}}]
  - name: archive-{topic}
    source: src
    destination: dst
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: {syncs}
    mirrors: [{{source_topic: {topic}, destination_topic: {topic}.archive}}]
""")
    return parse_config(yaml.safe_load(text), env={})


def create(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(t, 1, 1) for t in topics])


def writer_settings(cfg: MirrorsConfig, gi: int, topic: str) -> WriterSettings:
    g = cfg.groups[gi]
    dst = g.mirrors[0].destination_topic
    assert dst is not None
    return WriterSettings(
        group=g.name, mirror=f"{g.name}__{topic}__{dst}", source_alias="src", destination_alias="dst",
        source_topic=topic, destination_topic=dst, source_partitions=1, destination_partitions=1,
        delivery="exactly_once", key_serde="bytes", value_serde="bytes", on_error="dead_letter",
        dlq_topic=g.dlq_topic, offset_syncs_topic=g.offset_syncs, provenance=False,
        producer_config=clients.kafka_config(cfg.cluster("dst")))


#: record timestamps: recent, since the broker's retention check (every 5 minutes, 7 days' retention) deletes
#: records stamped years ago from under a test that reads them again
NOW_MS = int(time.time() * 1000)


def columns(start: int, stop: int) -> Columns:
    return Columns(list(range(start, stop)), [str(i).encode() for i in range(start, stop)],
                   [b"v%d" % i for i in range(start, stop)], [NOW_MS + i for i in range(start, stop)])


def feed(s: WriterSettings, cols: Columns, end: int) -> None:
    """One micro-batch of the source partition 0 through the Spark job's writer, up to ``end``."""
    bw = BatchWriter(WriterPlan({s.source_topic: s}, {}, {s.source_topic: {0: end}}, s.producer_config, None))
    bw.feed(s.source_topic, 0, cols)


def keys(cfg: MirrorsConfig, topic: str) -> list[int]:
    dst = cfg.cluster("dst")
    (low, high), = clients.end_offsets(dst, topic, settled=True).values()
    return [int(m.key()) for m in clients.read_partition(dst, topic, 0, low, high)]


def test_item2_two_mirrors_of_one_source_topic_keep_their_own_positions(clusters, unique):
    """``archive`` starts after ``live`` mirrored 300 records: it must mirror its own 200, not take live's
    sync (upstream 300) as its position; and each group's checkpoints translate through its own syncs."""
    topic = unique("shared")
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs, f"{topic}.live", f"{topic}.archive")
    cfg = two_groups(clusters, syncs, topic)
    live, archive = writer_settings(cfg, 0, topic), writer_settings(cfg, 1, topic)
    feed(live, columns(0, 300), 300)
    feed(archive, columns(100, 300), 300)  # archive mirrors from offset 100 on (e.g. a later start)
    assert keys(cfg, f"{topic}.live") == list(range(300))
    assert keys(cfg, f"{topic}.archive") == list(range(100, 300))
    # a restart of both (new processes): each resumes from its own position, nothing written twice
    replicate.release_producers()
    feed(live, columns(0, 350), 350)
    feed(archive, columns(100, 350), 350)
    assert keys(cfg, f"{topic}.live") == list(range(350))
    assert keys(cfg, f"{topic}.archive") == list(range(100, 350))
    # the checkpoint readers: upstream 300 is downstream 300 on live, 200 on archive (+ commit markers)
    live_store, archive_store = load_sync_store(cfg, cfg.groups[0]), load_sync_store(cfg, cfg.groups[1])
    assert live_store.translate(topic, 0, 300).downstream_offset == 301  # one commit marker before
    assert archive_store.translate(topic, 0, 300).downstream_offset == 201
    assert archive_store.translate(topic, 0, 50).downstream_offset is None  # archive never had offset 50


def test_positions_read_together_are_each_partitions_own_newest_sync(clusters, unique):
    """The lookup of many partitions at once (a writer starting 1,000 partitions) finds what the lookup of
    each alone finds, on a real sync topic read in small chunks: the newest sync naming this mirror's
    destination, not another mirror's; an earlier release's sync without the header as such; a sync far back
    in the log past many newer ones of other partitions; None for a partition never synced; and it skips a
    record that is not a sync."""
    topic, dest = unique("many"), "orders.mirror"
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs)
    p = Producer({"bootstrap.servers": clusters.dst_bootstrap})

    def sync(part: int, up: int, down: int, to: str | None = dest) -> None:
        s = OffsetSync(topic, part, up, down)
        p.produce(syncs, s.value_bytes(), s.key_bytes(), 0, headers=sync_headers(to) if to else None)

    sync(3, 7, 70)  # far back: everything below comes after it
    sync(0, 3, 30)
    sync(0, 10, 100)
    sync(1, 5, 50, to="orders.archive")  # another mirror's
    sync(2, 4, 40, to=None)  # an earlier release's
    p.produce(syncs, b"not a sync", b"garbage", 0)
    for i in range(12):
        sync(5, i, i)
    sync(0, 11, 110, to="orders.archive")  # another mirror's, newer than partition 0's own
    p.flush(30)
    config = {"bootstrap.servers": clusters.dst_bootstrap}
    parts = [0, 1, 2, 3, 4, 5]
    together = last_committed_syncs(config, syncs, topic, parts, chunk=4, destination=dest)
    alone = {x: last_committed_sync(config, syncs, topic, x, chunk=4, destination=dest) for x in parts}
    assert together == alone
    assert together == {0: OffsetSync(topic, 0, 10, 100), 1: None, 2: LegacySync(topic, 2, 4, 40),
                        3: OffsetSync(topic, 3, 7, 70), 4: None, 5: OffsetSync(topic, 5, 11, 11)}
    assert type(together[0]) is OffsetSync and type(together[2]) is LegacySync
    # without a destination, any mirror's newest sync counts
    assert last_committed_syncs(config, syncs, topic, [0, 1], chunk=4) == {
        0: OffsetSync(topic, 0, 11, 110), 1: OffsetSync(topic, 1, 5, 50)}


def test_a_reused_lookup_consumer_reads_what_was_committed_since_and_a_failed_lookup_keeps_none(
        clusters, unique, monkeypatch):
    """Position lookups reuse this process's idle lookup consumers: the second lookup runs on the first one's
    two consumers and finds the sync committed between the two (nothing the first read or fetched ahead is
    passed on); a lookup that failed (a transaction that never ended) closes the consumers it took instead of
    keeping them; with ``MIRRORFLOW_LOOKUP_POOL=0`` none is kept."""
    from mirror_core import positions

    topic, dest = unique("pool"), "orders.mirror"
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs)
    p = Producer({"bootstrap.servers": clusters.dst_bootstrap})

    def sync(part: int, up: int) -> None:
        s = OffsetSync(topic, part, up, up * 10)
        p.produce(syncs, s.value_bytes(), s.key_bytes(), 0, headers=sync_headers(dest))

    for i in range(300):
        sync(i % 3, i)
    assert p.flush(30) == 0
    config = {"bootstrap.servers": clusters.dst_bootstrap}

    def idle() -> list[object]:
        return [c for cs in positions._IDLE.values() for _since, c in cs]

    positions.close_idle_lookups()
    first = last_committed_syncs(config, syncs, topic, [0, 1, 2], chunk=50, destination=dest)
    assert first == {q: OffsetSync(topic, q, 297 + q, (297 + q) * 10) for q in range(3)}
    kept = idle()
    assert len(kept) == 2  # read_committed and read_uncommitted
    sync(1, 1000)
    assert p.flush(30) == 0
    second = last_committed_syncs(config, syncs, topic, [0, 1, 2], chunk=50, destination=dest)
    assert second == first | {1: OffsetSync(topic, 1, 1000, 10000)}
    assert sorted(map(id, idle())) == sorted(map(id, kept))  # the same two, used again
    # a sync in a transaction that was aborted, newer than any: the kept read_committed consumer never sees it
    aborted = Producer({"bootstrap.servers": clusters.dst_bootstrap, "transactional.id": unique("aborted")})
    aborted.init_transactions(30)
    aborted.begin_transaction()
    s = OffsetSync(topic, 1, 5000, 50000)
    aborted.produce(syncs, s.value_bytes(), s.key_bytes(), 0, headers=sync_headers(dest))
    aborted.abort_transaction(30)
    assert last_committed_syncs(config, syncs, topic, [0, 1, 2], chunk=50, destination=dest) == second
    # lookups at once each have a consumer of their own
    barrier = threading.Barrier(2)
    held: list[int] = []

    def hold() -> None:
        with positions.lookup_consumer(config, "read_committed") as c:
            held.append(id(c))
            barrier.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(set(held)) == 2
    positions.close_idle_lookups()
    last_committed_syncs(config, syncs, topic, [0], destination=dest)
    assert len(idle()) == 2
    foreign = foreign_open_transaction(clusters.dst_bootstrap, syncs, unique("foreign-txn"))
    try:
        with pytest.raises(PositionLookupError, match="did not end within 1 s"):
            last_committed_syncs(config, syncs, topic, [0], destination=dest, settle_timeout=1)
        assert idle() == []
    finally:
        foreign.abort_transaction(30)
    monkeypatch.setenv(positions.LOOKUP_POOL_ENV, "0")
    assert last_committed_syncs(config, syncs, topic, [1], destination=dest) == {1: second[1]}
    assert idle() == []


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def foreign_open_transaction(bootstrap: str, topic: str, txid: str) -> Producer:
    """A transaction of another writer (another group's job sharing the sync topic), left open on the
    sync partition with one record in it."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txid, "transaction.timeout.ms": 120000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, key=b"not ours", value=b"x", partition=0)
    assert p.flush(30) == 0
    return p


def test_item6_lookup_waits_for_lso_past_open_foreign_transaction(clusters, unique):
    """A foreign transaction open on the sync partition hides the writer's newest committed sync from a
    read_committed read. A restarted writer must wait for it to end and resume from that sync, not from
    the older one the LSO shows: 0 duplicates."""
    topic = unique("lso")
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs, f"{topic}.live", f"{topic}.archive")
    cfg = two_groups(clusters, syncs, topic)
    s = writer_settings(cfg, 0, topic)
    feed(s, columns(0, 100), 100)
    foreign = foreign_open_transaction(clusters.dst_bootstrap, syncs, unique("foreign-txn"))
    feed(s, columns(100, 200), 200)  # committed, but its syncs sit behind the open transaction
    replicate.release_producers()  # the job restarts: a new process, nothing known

    lines = _Lines()
    logging.getLogger("mirror_core.positions").addHandler(lines)
    logging.getLogger("mirror_core.positions").setLevel(logging.INFO)
    errors: list[BaseException] = []

    def replay() -> None:
        try:
            feed(s, columns(0, 250), 250)  # Spark replays the uncommitted batch from the start
        except BaseException as exc:  # reported by the test below
            errors.append(exc)

    t = threading.Thread(target=replay)
    try:
        t.start()
        deadline = time.monotonic() + 60
        while t.is_alive() and not any("waiting for open transactions" in ln for ln in lines.lines):
            assert time.monotonic() < deadline, "the replay neither finished nor waited"
            t.join(0.05)
        waited = t.is_alive()
        foreign.commit_transaction(30)
        t.join(120)
    finally:
        logging.getLogger("mirror_core.positions").removeHandler(lines)
    assert not t.is_alive() and not errors, errors
    got = keys(cfg, f"{topic}.live")
    assert len(got) - len(set(got)) == 0, f"{len(got) - len(set(got))} duplicates"
    assert got == list(range(250))
    assert waited, "the lookup did not wait for the open transaction"


def test_a_position_past_the_destinations_last_stable_offset_is_not_taken_for_a_recreated_topic(clusters, unique):
    """Another producer's transaction is open on the destination partition from before the mirror's records (the
    last stable offset stays below them until it ends), and the writer restarts with nothing known. Its
    committed position maps past that last stable offset but not past the partition's high watermark: the topic
    was not re-created, and the replayed batch writes only what is new. (The destination's end was read with
    librdkafka's default isolation, read_committed, until 7 December: its last stable offset, so a replay here
    wrote the whole batch again.)"""
    from mirror_core.positions import committed_end_offset, high_watermarks

    topic = unique("lsodst")
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs, f"{topic}.live", f"{topic}.archive")
    cfg = two_groups(clusters, syncs, topic)
    s = writer_settings(cfg, 0, topic)
    foreign = foreign_open_transaction(clusters.dst_bootstrap, f"{topic}.live", unique("foreign-txn"))
    try:
        feed(s, columns(0, 100), 100)
        replicate.release_producers()  # the job restarts: a new process, nothing known
        config = {"bootstrap.servers": clusters.dst_bootstrap}
        high, stable = high_watermarks(config, f"{topic}.live", [0])[0], committed_end_offset(config, f"{topic}.live", 0)
        feed(s, columns(0, 150), 150)  # Spark replays the batch from its start, and more
    finally:
        foreign.abort_transaction(30)
    got = keys(cfg, f"{topic}.live")
    assert got == list(range(150)), f"{len(got) - len(set(got))} duplicates"
    assert stable == 0 and high > 100  # the foreign transaction held the last stable offset at its first record


def test_item6_lookup_fails_clearly_when_a_transaction_never_ends(clusters, unique):
    """No guessing: past the deadline the lookup stops with one line naming the sync partition."""
    topic = unique("stuck")
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs)
    foreign = foreign_open_transaction(clusters.dst_bootstrap, syncs, unique("foreign-txn"))
    try:
        with pytest.raises(PositionLookupError, match=rf"{syncs}\[0\]: a transaction open below offset 1 .* did "
                                                       r"not end within 2 s"):
            last_committed_sync({"bootstrap.servers": clusters.dst_bootstrap}, syncs, topic, 0,
                                destination=f"{topic}.live", settle_timeout=2)
    finally:
        foreign.abort_transaction(30)
    assert last_committed_sync({"bootstrap.servers": clusters.dst_bootstrap}, syncs, topic, 0,
                               destination=f"{topic}.live", settle_timeout=30) is None


#: what one Spark Python worker holds: this process's cached producers and positions
_WORKER_STATE = (replicate._PRODUCERS, replicate._POSITIONS, replicate._PRODUCER_LIMITS,
                 replicate._PRODUCER_PARTITIONS)


def process_state() -> tuple[dict, ...]:
    return tuple(dict(d) for d in _WORKER_STATE)


def switch_to(state: tuple[dict, ...]) -> None:
    for d, saved in zip(_WORKER_STATE, state, strict=True):
        d.clear()
        d.update(saved)


@pytest.mark.parametrize("records", [3, 100, 5000])
def test_a_partition_handed_back_by_another_worker_is_written_on_a_new_producer_exactly_once(clusters, unique,
                                                                                              records, caplog):
    """Spark runs a partition's task on whichever Python worker is free, so a partition moves between worker
    processes: worker B's producer for it fences worker A's, and A finds its cached producer fenced when the
    partition comes back to it. That fence may surface while A's records are flushed (confluent-kafka then
    raises it through a delivery callback: a SystemError caused by it); the chunk must be written again on a
    new producer from the committed position, not fail the task (a failed task fails the query)."""
    topic = unique("handback")
    syncs = f"{topic}.syncs.internal"
    create(clusters.dst_bootstrap, syncs, f"{topic}.live")
    cfg = two_groups(clusters, syncs, topic)
    s = writer_settings(cfg, 0, topic)
    replicate.release_producers()
    feed(s, columns(0, records), records)  # worker A
    worker_a = process_state()
    replicate.release_producers()
    feed(s, columns(records, 2 * records), 2 * records)  # worker B: its producer fences A's
    worker_b = process_state()
    switch_to(worker_a)  # the partition is back on A, whose producer and position are stale
    caplog.set_level(logging.DEBUG, logger="librdkafka")
    caplog.set_level(logging.INFO, logger="mirror_core.replicate")
    try:
        feed(s, columns(2 * records, 3 * records), 3 * records)
    finally:
        for p in worker_b[0].values():
            p.flush(5)
        replicate.release_producers()
    got = keys(cfg, f"{topic}.live")
    assert len(got) - len(set(got)) == 0, f"{len(got) - len(set(got))} duplicates"
    assert got == list(range(3 * records))
    # what the user reads: the writer's one line naming the fence, not librdkafka's three about it
    ours = [r.getMessage() for r in caplog.records if r.name == "mirror_core.replicate" and r.levelno >= logging.INFO]
    assert any("fenced by a newer producer with the partition's transactional id" in m for m in ours), ours
    loud = [r.getMessage() for r in caplog.records if r.name == "librdkafka" and r.levelno > logging.DEBUG]
    assert not [m for m in loud if "fenced" in m or "old epoch" in m], loud


def test_markers_pending_names_the_partitions_whose_transaction_is_not_settled_yet(clusters, unique):
    """``replicate.markers_pending`` on a real broker (what a writer transaction asks about the last commit's
    markers): a partition holding an open transaction's records is pending (its last stable offset is below
    its end), one with only committed records is not, and once that transaction commits and its markers
    are written neither is. Partitions of two topics in one question."""
    a, b = unique("mpend-a"), unique("mpend-b")
    create(clusters.dst_bootstrap, a, b)
    config = {"bootstrap.servers": clusters.dst_bootstrap}
    p = Producer(config | {"transactional.id": unique("mpend-tx")})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(a, b"committed", partition=0)
    p.commit_transaction(30)
    wait_settled(config, [(a, 0)])
    p.begin_transaction()
    p.produce(b, b"open", partition=0)
    assert p.flush(30) == 0
    parts = [(a, 0), (b, 0)]
    assert replicate.markers_pending(config, parts) == [(b, 0)]
    p.commit_transaction(30)
    wait_settled(config, parts)


def wait_settled(config: dict, parts: list[tuple[str, int]]) -> None:
    """Until ``markers_pending`` names none of ``parts`` (the broker writes a commit's markers after the commit
    returned; a new partition's first take a while); fails after 30 s."""
    deadline = time.monotonic() + 30
    while (left := replicate.markers_pending(config, parts, timeout=5)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], f"still pending 30 s after the commit: {left}"
