"""One round of offset work for a group: checkpoints, consumer-group offset sync, heartbeats.

* Checkpoints: for every source consumer group the group filter selects and every mirrored topic it
  has committed offsets on, translate the committed offset through the offset-sync history and emit
  an MM2 ``Checkpoint`` to ``<source-alias>.checkpoints.internal`` on the destination. A checkpoint
  never moves backwards unless the source group itself was rewound.
* Group offset sync: write the offsets this round translated into the destination's consumer groups, but
  only for groups with no active members there, and never backwards unless forced. A position that is
  untranslatable now, or whose checkpoint would move backwards, leaves its group's offset as it is (reported),
  never set to an earlier round's checkpoint.
* Heartbeats: an MM2 ``Heartbeat`` to the source's heartbeats topic; the data path mirrors it, which
  measures end-to-end latency even when data topics are idle.

Everything decided here is reported (written / skipped and why), nothing is silently dropped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from mirror_core import clients
from mirror_core.config import GroupConfig, MirrorsConfig
from mirror_core.errors import KafkaOperationError
from mirror_core.offsets import (
    AFTER_LOOPED,
    LOOPED,
    NO_SYNCS,
    THROUGH_ORIGINALS,
    TOO_OLD,
    Checkpoint,
    Heartbeat,
    OffsetSync,
    OffsetSyncStore,
    Translation,
    checkpoint_for,
)
from mirror_core.policy import GroupFilter
from mirror_core.positions import (
    REFRESH_HEADER,
    is_refresh,
    lookup_consumer,
    sync_destination,
    sync_from_record,
    sync_headers,
)
from mirror_core.topics import create_topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicMapping:
    source_topic: str
    destination_topic: str
    mirror: str
    consumer_group: str


@dataclass
class GroupReport:
    """What one round did for one source consumer group."""

    group: str
    checkpoints: int = 0
    written: list[tuple[str, int, int]] = field(default_factory=list)  # (dst topic, partition, offset)
    skipped: list[tuple[str, int | None, str]] = field(default_factory=list)  # (dst topic, partition, why)


@dataclass
class RoundReport:
    mirror_group: str
    groups: list[GroupReport] = field(default_factory=list)
    heartbeat: bool = False
    #: idle partitions whose newest offset sync was written again (:func:`refresh_idle_syncs`)
    syncs_refreshed: int = 0


def topic_mappings(cfg: MirrorsConfig, group: GroupConfig) -> list[TopicMapping]:
    from mirror_core.provision import selected_mirrors

    return [TopicMapping(m.source_topic or "", m.destination_topic or "", m.name, m.consumer_group)
            for m in selected_mirrors(cfg, group)]


def remote_topic_name(group: GroupConfig) -> Callable[[str], str]:
    """The destination topic name ``group`` gives a source topic (an explicit mirror's, else its policy's)."""
    from mirror_core.config import resolve_mirrors
    from mirror_core.policy import build_replication_policy

    policy = build_replication_policy(group)
    explicit = {m.source_topic: m.destination_topic for m in resolve_mirrors(group) if m.source_topic}
    return lambda topic: explicit.get(topic) or policy.format_remote_topic(group.source, topic)


def sync_filter(group: GroupConfig) -> Callable[[OffsetSync, str | None], bool]:
    """Whether a sync naming destination ``dest`` (None: written before syncs named it) is one of
    ``group``'s: the sync topic is shared by every group reading one source cluster, and another group
    may mirror the same source topic elsewhere (its syncs would make translation garbage)."""
    remote = remote_topic_name(group)

    def ours(sync: OffsetSync, dest: str | None) -> bool:
        return dest is None or dest == remote(sync.topic)

    return ours


@dataclass
class _SyncTail:
    """What has been read of one offset-sync topic: the store, and per partition of the topic where the
    next read starts and where the first read started (retention moving past it triggers a fresh read)."""

    store: OffsetSyncStore
    next_offset: dict[int, int] = field(default_factory=dict)
    first_offset: dict[int, int] = field(default_factory=dict)
    #: per (source topic, partition): when its newest sync in the store was written (ms) and the destination it
    #: names (None: a sync from before syncs named it)
    written_at: dict[tuple[str, int], tuple[int, str | None]] = field(default_factory=dict)


#: (destination bootstrap servers, offset-sync topic, group) -> what this process has read of it for the group
#: (the topic is shared by every group reading one source cluster; each keeps only its own syncs)
_SYNC_TAILS: dict[tuple[str, str, str], _SyncTail] = {}
_SYNC_TAILS_LOCK = threading.Lock()


def load_sync_store(cfg: MirrorsConfig, group: GroupConfig) -> OffsetSyncStore:
    """The offset-sync history of the group (syncs of other groups' mirrors left out, see
    :func:`sync_filter`), read from the destination (read_committed).

    Incremental: a process that asks again (``checkpoint --loop``, lag samples) reads only the syncs
    written since, so a round's cost does not grow with the topic's retention. The history is read afresh
    when the topic was re-created (its end moved back) or retention removed records from where the kept
    history starts (so memory stays bounded by what the topic retains). A refresh copy
    (:func:`refresh_idle_syncs`) counts only when it is not older than the partition's newest sync: one that
    landed after a newer sync of the writer's would otherwise rewrite the history back to it."""
    return _sync_tail(cfg, group).store


def _sync_tail(cfg: MirrorsConfig, group: GroupConfig) -> _SyncTail:
    """:func:`load_sync_store`'s read, with what it keeps about the topic."""
    dst = cfg.cluster(group.destination)
    key = (str(dst.kafka_properties().get("bootstrap.servers", "")), group.offset_syncs, group.name)
    ours = sync_filter(group)
    with _SYNC_TAILS_LOCK:
        try:
            ends = clients.end_offsets(dst, group.offset_syncs)
        except KafkaOperationError as exc:
            if exc.code == "UNKNOWN_TOPIC_OR_PART":
                _SYNC_TAILS.pop(key, None)
                return _SyncTail(OffsetSyncStore())
            raise
        tail = _SYNC_TAILS.get(key)
        if tail is None or set(ends) != set(tail.next_offset) or any(
                high < tail.next_offset[p] or low > tail.first_offset[p] for p, (low, high) in ends.items()):
            tail = _SYNC_TAILS[key] = _SyncTail(OffsetSyncStore(), {p: low for p, (low, _) in ends.items()},
                                                {p: low for p, (low, _) in ends.items()})
        try:
            for p, (_low, high) in ends.items():
                for m in clients.read_partition(dst, group.offset_syncs, p, tail.next_offset[p], high):
                    sync = sync_from_record(m.key(), m.value(), m.headers())
                    dest = sync_destination(m.headers())
                    if not ours(sync, dest):
                        continue
                    if is_refresh(m.headers()):
                        newest = tail.store.latest(sync.topic, sync.partition)
                        if newest is not None and sync.upstream_offset < newest.upstream_offset:
                            continue
                    tail.store.add(sync)
                    tail.written_at[(sync.topic, sync.partition)] = (m.timestamp()[1], dest)
                tail.next_offset[p] = high
        except BaseException:
            _SYNC_TAILS.pop(key, None)  # half read: the next call starts over
            raise
        return tail


#: an idle partition whose newest offset sync is older than this gets a copy of it (:func:`refresh_idle_syncs`):
#: well inside the sync topic's 7-day retention, so that rounds missed for days still leave it in time
SYNC_REFRESH_AGE_S = 24 * 3600.0


def refresh_idle_syncs(cfg: MirrorsConfig, group: GroupConfig, mappings: list[TopicMapping],
                       age_s: float = SYNC_REFRESH_AGE_S, now_ms: float | None = None) -> int:
    """Write again the newest offset sync of each of the group's partitions that has nothing left to mirror
    (the source's last stable offset at the sync's upstream position) and whose newest sync is ``age_s`` or
    older; returns how many. A writer syncs a partition only when it writes it, and the sync topic keeps 7 days:
    an idle partition would lose its whole history (lag counted from the log start, its groups' positions
    untranslatable; MirrorMaker 2 compacts its sync topic instead). A copy carries :data:`REFRESH_HEADER`: the
    writers' position lookups pass over it, and the translation history takes it only when it is not older than
    the partition's newest sync, so a copy that lands after a newer sync (a record arrived meanwhile) changes
    nothing."""
    tail = _sync_tail(cfg, group)
    now = time.time() * 1000 if now_ms is None else now_ms
    topics = {m.source_topic for m in mappings}
    stale = {k: v for k, v in tail.written_at.items() if k[0] in topics and now - v[0] >= age_s * 1000}
    if not stale:
        return 0
    src = cfg.cluster(group.source)
    ends = {t: _ends_or_none(src, group.source, t) for t in sorted({t for t, _ in stale})}  # gone: nothing kept
    producer = clients.producer(cfg.cluster(group.destination), **{"enable.idempotence": True, "acks": "all"})
    failed: list[str] = []
    n = 0
    for (topic, p), (_at, dest) in sorted(stale.items()):
        newest = tail.store.latest(topic, p)
        low_high = ends[topic].get(p)
        if newest is None or low_high is None or low_high[1] != newest.upstream_offset:
            # records to mirror (the writer syncs the partition with them), or an end below the sync (the topic
            # was re-created: the old incarnation's history is not kept alive)
            continue
        # a position-only sync's copy is one too (it would otherwise pass for a translation)
        headers = ([] if dest is None else sync_headers(dest, newest.position_only)) + [(REFRESH_HEADER, b"1")]
        producer.produce(group.offset_syncs, key=newest.key_bytes(), value=newest.value_bytes(), partition=0,
                         headers=headers, on_delivery=_note_failure(failed))  # type: ignore[arg-type]
        n += 1
    with clients.fatal_unmasked():
        unacked = producer.flush(30)
    if unacked or failed:
        raise KafkaOperationError(f"offset-sync refreshes to {group.offset_syncs} not written: "
                                  f"{failed[0] if failed else 'not acknowledged within 30 s'}")
    return n


#: a position with no committed source record between it and the partition's first retained sync
BEFORE_FIRST = "before the first mirrored record, no committed record in between on the source"
#: a position of a partition with no sync and no committed source record in its log
NOTHING_TO_MIRROR = "nothing mirrored and nothing to mirror: the destination's end"


class SourceTranslator:
    """Translation of a group's committed source positions (:meth:`OffsetSyncStore.translate`), and of the
    positions the syncs alone cannot place, from what the source holds:

    * below a partition's first retained sync, with no committed record on the source from the position up
      to the sync (a log whose first offsets were compacted away, or held aborted records or transaction
      markers): the sync's downstream position (``BEFORE_FIRST``, exact);
    * in a partition with no sync at all, with no committed record from the source's log start to its last
      stable offset (an empty partition where a consumer committed 0, one holding only aborted records, one
      whose records retention removed): the destination partition's last stable offset (``NOTHING_TO_MIRROR``,
      conservative: whatever lands there next is read, nothing is skipped). A committed record below the
      position, not mirrored yet, would land there too and be read again: such a position waits for the
      writer's syncs.

    A writer only syncs a partition once it mirrors a record, so without this such positions were
    untranslatable: no checkpoint, no group offset, and a failover's sync refused them. A position below the
    source's log start, or with committed records between it and the first sync (history retention removed
    their syncs), or whose first sync lies beyond the source's end (an earlier incarnation of the topic), stays
    untranslatable, as does any once the translator's reads of the source are used up (:class:`ProbeBudget`).

    A position among records the loop guard skipped (copies a reverse flow made of the destination's records: a
    failback's consumers, still reading what the failover's flow had copied) maps to where their originals are,
    by the reverse group's own syncs read backwards (``THROUGH_ORIGINALS``, exact), when the config has that
    group and its syncs hold the position; else it stays untranslatable. So does a position just past such a
    run with nothing mirrored since (``AFTER_LOOPED``: its sync holds only the writer's position, see the
    invariant's case 4), placed as the run's end."""

    def __init__(self, cfg: MirrorsConfig, group: GroupConfig, store: OffsetSyncStore):
        self.cfg, self.group, self.store = cfg, group, store
        #: the groups mirroring the other way: each with its sync history (read when first needed) and how it names
        #: this group's destination topics (None: not listed yet)
        self._reverse: list[tuple[GroupConfig, OffsetSyncStore | None, Callable[[str], str]]] | None = None
        self._there: dict[str, dict[int, tuple[int, int]]] = {}  # destination topics' ends, for _remapped
        self._ends: dict[str, dict[int, tuple[int, int]]] = {}
        #: per source topic: the destination topic's ends, then the source's, read in that order (see translate)
        self._pairs: dict[str, tuple[dict[int, tuple[int, int]], dict[int, tuple[int, int]]]] = {}
        self.probes = ProbeBudget()

    def _source_ends(self, topic: str) -> dict[int, tuple[int, int]]:
        if topic not in self._ends:
            self._ends[topic] = _ends_or_none(self.cfg.cluster(self.group.source), self.group.source, topic)
        return self._ends[topic]

    def _nothing_committed(self, topic: str, partition: int, start: int, end: int) -> bool:
        """No committed source record in [start, end) for certain (see :meth:`ProbeBudget.first`)."""
        answered, first = self.probes.first(self.cfg, self.group, topic, partition, start, end)
        return answered and first is None

    def _through_originals(self, topic: str, partition: int, committed: int, destination_topic: str) -> int | None:
        """Where the originals of loop-skipped records are (see the class docstring), or None."""
        if self._reverse is None:
            self._reverse = [(g, None, remote_topic_name(g)) for g in self.cfg.groups
                             if g.source == self.group.destination and g.destination == self.group.source]
        for i, (rev, store, remote) in enumerate(self._reverse):
            # a reverse group that copied destination_topic into this group's source topic (else its syncs say
            # nothing here), keeping partitions (placed by key hash, its offsets are no single partition's)
            if remote(destination_topic) != topic or self._remapped(topic, destination_topic):
                continue
            if store is None:
                store = load_sync_store(self.cfg, rev)
                self._reverse[i] = (rev, store, remote)
            found = store.upstream_for(destination_topic, partition, committed)
            if found is not None:
                return found
        return None

    def _remapped(self, topic: str, destination_topic: str) -> bool:
        """Whether ``topic`` (here) has fewer partitions than ``destination_topic``: a flow the other way placed
        its records by key hash."""
        if destination_topic not in self._there:
            self._there[destination_topic] = _ends_or_none(self.cfg.cluster(self.group.destination),
                                                           self.group.destination, destination_topic)
        return len(self._source_ends(topic)) < len(self._there[destination_topic])

    def translate(self, topic: str, partition: int, committed: int, destination_topic: str) -> Translation:
        tr = self.store.translate(topic, partition, committed)
        if tr.reason in (LOOPED, AFTER_LOOPED):
            # just past the run (AFTER_LOOPED): where a consumer has read the same, the run's end
            at = committed if tr.reason == LOOPED else self.store.run_end(topic, partition, committed)
            back = self._through_originals(topic, partition, at, destination_topic)
            return tr if back is None else Translation(back, True, THROUGH_ORIGINALS)
        if tr.reason not in (NO_SYNCS, TOO_OLD):
            return tr
        first = self.store.oldest(topic, partition)
        if first is not None:
            ends = self._source_ends(topic).get(partition)
            # below the log start a consumer resets anyway; a first sync beyond the source's end is an earlier
            # incarnation's (topic re-created): nothing to tell
            # a first sync that opens a run of loop-skipped records (UNMAPPED): what follows came back from there;
            # a position-only one gives no place (invariant, case 4)
            if ends is None or committed < ends[0] or first.upstream_offset > ends[1] or \
                    first.downstream_offset < 0 or first.position_only or \
                    not self._nothing_committed(topic, partition, committed, first.upstream_offset):
                return tr
            return Translation(first.downstream_offset, True, BEFORE_FIRST)
        # no sync at all: the destination's ends first, then the source's (once per topic, in that order), so that
        # a record committed on the source (and perhaps mirrored) before the destination's end was read lies below
        # the source's end, where the read below sees it
        if topic not in self._pairs:
            dst_ends = _ends_or_none(self.cfg.cluster(self.group.destination), self.group.destination,
                                     destination_topic)
            self._pairs[topic] = (dst_ends, _ends_or_none(self.cfg.cluster(self.group.source), self.group.source,
                                                          topic))
        dst, ends = (side.get(partition) for side in self._pairs[topic])
        # nothing committed in the whole log, not only from the position on: a record below it is still to be
        # mirrored (no sync: the writer starts at the log start) and lands at the destination's end or after it,
        # where a consumer placed there would read it again
        if dst is None or ends is None or not ends[0] <= committed <= ends[1] or \
                not self._nothing_committed(topic, partition, ends[0], ends[1]):
            return tr
        return Translation(dst[1], False, NOTHING_TO_MIRROR)


def _ends_or_none(cluster: Any, alias: str, topic: str) -> dict[int, tuple[int, int]]:
    """:func:`clients.end_offsets` (last stable offsets), or nothing for a topic that does not exist."""
    try:
        with clients.acting_on(alias, cluster):
            return clients.end_offsets(cluster, topic)
    except KafkaOperationError as exc:
        if exc.code != "UNKNOWN_TOPIC_OR_PART":
            raise
        return {}


#: reads of the source a :class:`SourceTranslator` (a round) or a lag sample makes at most, for positions and
#: partitions no offset sync covers, and the time they may take together: beyond either, such positions stay
#: untranslatable and such partitions unmirrored, as before 7 December
PROBES_MAX = 64
PROBES_BUDGET_S = 30.0
#: how long one such read waits for the source
PROBE_TIMEOUT_S = 10.0


class ProbeBudget:
    """What is left of :data:`PROBES_MAX` reads and :data:`PROBES_BUDGET_S` seconds, and the reads themselves."""

    def __init__(self, reads: int = PROBES_MAX, seconds: float = PROBES_BUDGET_S):
        self.reads, self.seconds = reads, seconds

    def first(self, cfg: MirrorsConfig, group: GroupConfig, topic: str, partition: int, start: int, end: int
              ) -> tuple[bool, int | None]:
        """:func:`first_committed` on ``group``'s source, out of this budget: ``(True, offset or None)``, or
        ``(False, None)`` when the budget is spent or the source did not answer (said in the log). A range with
        nothing to read costs nothing."""
        if end <= start:
            return True, None
        if self.reads <= 0 or self.seconds <= 0:
            return False, None
        self.reads -= 1
        src = cfg.cluster(group.source)
        t0 = time.monotonic()
        try:
            with clients.acting_on(group.source, src):
                return True, first_committed(src, topic, partition, start, end)
        except KafkaOperationError as exc:
            log.warning("%s: %s[%d]: could not read the source from offset %d: %s", group.name, topic, partition,
                        start, exc)
            return False, None
        finally:
            self.seconds -= time.monotonic() - t0


def first_committed(cluster: Any, topic: str, partition: int, start: int, end: int,
                    timeout: float = PROBE_TIMEOUT_S) -> int | None:
    """The offset of the first committed record of ``topic[partition]`` in [start, end) (``end`` at most its last
    stable offset), None when there is none (only transaction markers and aborted records, or nothing), read on
    one of the process's kept lookup consumers. Raises :class:`KafkaOperationError` when the source does not
    answer within ``timeout``."""
    if end <= start:
        return None
    with lookup_consumer(clients.kafka_config(cluster), "read_committed") as c:
        for m in clients.scan(c, topic, partition, start, end, timeout):
            return int(m.offset())
    return None


#: why a remapped topic gets no checkpoint, no group offset and no translated lag
REMAPPED = ("the destination has fewer partitions than the source (records placed by key hash): offsets "
            "cannot be translated exactly")


def remapped_topics(cfg: MirrorsConfig, group: GroupConfig, mappings: list[TopicMapping]) -> set[str]:
    """Source topics mirrored into fewer destination partitions. Their records were placed by key hash,
    so a source partition's records are spread over several destination partitions (and share them with
    other source partitions): no single destination position corresponds to a source offset. Like
    ``verify``, checkpoints, group offset sync and lag leave them out and say why."""
    src = clients.admin(cfg.cluster(group.source)).list_topics(timeout=30).topics
    dst = clients.admin(cfg.cluster(group.destination)).list_topics(timeout=30).topics
    out = set()
    for m in mappings:
        s, d = src.get(m.source_topic), dst.get(m.destination_topic)
        if s is not None and d is not None and s.error is None and d.error is None \
                and len(d.partitions) < len(s.partitions):
            out.add(m.source_topic)
    return out


def load_checkpoints(cfg: MirrorsConfig, group: GroupConfig) -> dict[tuple[str, str, int], Checkpoint]:
    """The latest checkpoint per (consumer group, destination topic, partition)."""
    out: dict[tuple[str, str, int], Checkpoint] = {}
    try:
        for m in clients.read_topic(cfg.cluster(group.destination), group.checkpoints_topic):
            cp = Checkpoint.from_record(m.key(), m.value())
            out[(cp.group, cp.topic, cp.partition)] = cp
    except KafkaOperationError as exc:
        if exc.code != "UNKNOWN_TOPIC_OR_PART":
            raise
    return out


def source_group_offsets(cfg: MirrorsConfig, group: GroupConfig, topics: set[str]
                         ) -> dict[str, dict[tuple[str, int], int]]:
    """Committed offsets on the mirrored topics of every source group the filter selects."""
    admin = clients.admin(cfg.cluster(group.source))
    gf = GroupFilter(group.offsets.groups.include, group.offsets.groups.exclude)
    listed = admin.list_consumer_groups(request_timeout=30).result(30)
    ids = sorted(g.group_id for g in listed.valid if gf.matches(g.group_id))
    out: dict[str, dict[tuple[str, int], int]] = {}
    for gid in ids:
        fut = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)], request_timeout=30)[gid]
        res = fut.result(30)
        offs = {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions
                if tp.topic in topics and tp.offset >= 0 and tp.error is None}
        if offs:
            out[gid] = offs
    return out


def emit_checkpoints(cfg: MirrorsConfig, group: GroupConfig, store: OffsetSyncStore,
                     mappings: list[TopicMapping], report: RoundReport) -> dict[tuple[str, str, int], Checkpoint]:
    """Translate every selected group's committed offsets and write checkpoints; returns the checkpoint of each
    (group, destination topic, partition) this round translated: the one it wrote, or the earlier one when the
    translation is the same (confirmed). Only these may be applied to destination groups: an earlier checkpoint of
    a position that is untranslatable now, or whose translation went back (a re-created destination topic), is
    where the group was, not where it is, and would make its consumers read again or skip. The earlier ones are
    read only to keep the checkpoints from moving backwards, as MirrorMaker 2's do."""
    by_src = {m.source_topic: m for m in mappings}
    remapped = remapped_topics(cfg, group, mappings)
    previous = load_checkpoints(cfg, group)
    current: dict[tuple[str, str, int], Checkpoint] = {}
    translator = SourceTranslator(cfg, group, store)
    with clients.acting_on(group.source, cfg.cluster(group.source)):
        offsets = source_group_offsets(cfg, group, set(by_src))
    producer = clients.producer(cfg.cluster(group.destination), **{"enable.idempotence": True, "acks": "all"})
    failed: list[str] = []
    for gid, offs in offsets.items():
        rep = GroupReport(gid)
        report.groups.append(rep)
        for (src_topic, part), committed in sorted(offs.items()):
            dst_topic = by_src[src_topic].destination_topic
            if src_topic in remapped:
                rep.skipped.append((dst_topic, part, REMAPPED))
                continue
            prev = previous.get((gid, dst_topic, part))
            tr = translator.translate(src_topic, part, committed, dst_topic)
            rewound = prev is not None and committed < prev.upstream_offset
            cp = checkpoint_for(gid, dst_topic, part, committed, tr, prev, source_rewound=rewound)
            if tr.downstream_offset is None:
                rep.skipped.append((dst_topic, part, f"offset {committed} untranslatable: {tr.reason}"))
                continue
            if cp is None:
                if prev is not None and (prev.upstream_offset, prev.downstream_offset) == \
                        (committed, tr.downstream_offset):
                    current[(gid, dst_topic, part)] = prev  # unchanged: confirmed by this round
                else:  # the translation went back while the source group did not
                    rep.skipped.append((dst_topic, part, "checkpoint would move backwards"))
                continue
            producer.produce(group.checkpoints_topic, key=cp.key_bytes(), value=cp.value_bytes(), partition=0,
                             on_delivery=_note_failure(failed))
            current[(gid, dst_topic, part)] = cp
            rep.checkpoints += 1
    with clients.fatal_unmasked():
        unacked = producer.flush(30)
    if unacked:
        raise KafkaOperationError(f"checkpoints to {group.checkpoints_topic} not acknowledged within 30 s")
    if failed:
        # the checkpoints (and the group offsets that would follow from them) are not written: say so
        raise KafkaOperationError(f"{len(failed)} checkpoint(s) to {group.checkpoints_topic} not written: {failed[0]}")
    return current


def _note_failure(failed: list[str]) -> Any:
    """A delivery callback that keeps the broker's reason of every record it failed to write."""
    def cb(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(err.str())
    return cb


def sync_group_offsets(cfg: MirrorsConfig, group: GroupConfig, checkpoints: dict[tuple[str, str, int], Checkpoint],
                       report: RoundReport, force: bool = False, untranslatable: frozenset[str] = frozenset()) -> None:
    """Write checkpointed offsets into idle destination groups; never backwards unless ``force``.

    ``untranslatable``: destination topics whose offsets cannot be translated exactly (see
    :func:`remapped_topics`); a checkpoint of one (written before this rule) is never applied."""
    admin = clients.admin(cfg.cluster(group.destination))
    by_group: dict[str, list[Checkpoint]] = {}
    for (gid, _, _), cp in checkpoints.items():
        by_group.setdefault(gid, []).append(cp)
    reports = {r.group: r for r in report.groups}
    for gid, cps in sorted(by_group.items()):
        rep = reports.get(gid)
        if rep is None:
            rep = GroupReport(gid)
            report.groups.append(rep)
        desc = admin.describe_consumer_groups([gid], request_timeout=30)[gid].result(30)
        if desc.members:
            rep.skipped.append(("*", None, f"group has {len(desc.members)} active member(s) on the destination"))
            continue
        existing_res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)],
                                                          request_timeout=30)[gid].result(30)
        existing = {(tp.topic, tp.partition): tp.offset for tp in existing_res.topic_partitions if tp.offset >= 0}
        to_write = []
        for cp in sorted(cps, key=lambda c: (c.topic, c.partition)):
            if cp.topic in untranslatable:
                if not any(t == cp.topic and p == cp.partition for t, p, _ in rep.skipped):
                    rep.skipped.append((cp.topic, cp.partition, REMAPPED))
                continue
            cur = existing.get((cp.topic, cp.partition))
            if cur == cp.downstream_offset:
                continue
            if cur is not None and cur > cp.downstream_offset and not force:
                rep.skipped.append((cp.topic, cp.partition,
                                    f"destination offset {cur} is ahead of {cp.downstream_offset} (use --force)"))
                continue
            to_write.append(TopicPartition(cp.topic, cp.partition, cp.downstream_offset))
        if not to_write:
            continue
        try:
            admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(gid, to_write)],
                                               request_timeout=30)[gid].result(30)
        except KafkaException as exc:
            rep.skipped.append(("*", None, f"could not write offsets: {exc.args[0].str()}"))
            continue
        rep.written += [(tp.topic, tp.partition, tp.offset) for tp in to_write]


def sync_selected_groups(cfg: MirrorsConfig, group: GroupConfig, mappings: list[TopicMapping],
                         checkpoints: dict[tuple[str, str, int], Checkpoint], report: RoundReport,
                         force: bool = False) -> None:
    """:func:`sync_group_offsets` for the consumer groups :func:`emit_checkpoints` just translated (those in
    ``report``: the group's ``offsets.groups`` that commit on the source) and no other: the checkpoints
    topic also holds earlier checkpoints of groups no longer selected (another failover's, MirrorMaker 2's),
    which must not move their destination offsets."""
    wanted = {r.group for r in report.groups}
    remapped = remapped_topics(cfg, group, mappings)
    untranslatable = frozenset(m.destination_topic for m in mappings if m.source_topic in remapped)
    sync_group_offsets(cfg, group, {k: v for k, v in checkpoints.items() if k[0] in wanted}, report, force,
                       untranslatable)


def emit_heartbeat(cfg: MirrorsConfig, group: GroupConfig) -> bool:
    """One MM2 heartbeat to the source's heartbeats topic (created compacted if missing)."""
    src = cfg.cluster(group.source)
    topic = group.heartbeats.topic
    admin = clients.admin(src)
    if topic not in admin.list_topics(timeout=30).topics:
        rf = min(3, len(admin.list_topics(timeout=30).brokers))
        create_topics(admin, [NewTopic(topic, 1, rf, config={"cleanup.policy": "compact"})], timeout=30,
                      exist_ok=True)
    hb = Heartbeat(group.source, group.destination, int(time.time() * 1000))
    p = clients.producer(src, **{"enable.idempotence": True, "acks": "all"})
    failed: list[str] = []
    p.produce(topic, key=hb.key_bytes(), value=hb.value_bytes(), partition=0, on_delivery=_note_failure(failed))
    with clients.fatal_unmasked():
        unacked = p.flush(30)
    if unacked:
        raise KafkaOperationError(f"heartbeat to {topic} on {group.source} not acknowledged within 30 s")
    if failed:
        raise KafkaOperationError(f"heartbeat to {topic} on {group.source} not written: {failed[0]}")
    return True


def run_round(cfg: MirrorsConfig, group: GroupConfig, force: bool = False) -> RoundReport:
    """Checkpoints, then group offset sync (if enabled), then a heartbeat (if enabled)."""
    report = RoundReport(group.name)
    mappings = topic_mappings(cfg, group)
    store = load_sync_store(cfg, group)
    checkpoints: dict[tuple[str, str, int], Any] = {}
    if group.offsets.emit_checkpoints or group.offsets.sync_group_offsets:
        with clients.acting_on(group.destination, cfg.cluster(group.destination)):
            checkpoints = emit_checkpoints(cfg, group, store, mappings, report)
    if group.offsets.sync_group_offsets:
        with clients.acting_on(group.destination, cfg.cluster(group.destination)):
            sync_selected_groups(cfg, group, mappings, checkpoints, report, force)
    if group.heartbeats.enabled:
        report.heartbeat = emit_heartbeat(cfg, group)
    with clients.acting_on(group.destination, cfg.cluster(group.destination)):
        report.syncs_refreshed = refresh_idle_syncs(cfg, group, mappings)
    return report


def run_forever(cfg: MirrorsConfig, groups: list[GroupConfig], force: bool = False,
                on_report: Any = None, rounds: int | None = None) -> None:
    """Heartbeats every ``heartbeats.interval`` and checkpoint rounds every ``offsets.interval``, per group."""
    next_cp = {g.name: 0.0 for g in groups}
    next_hb = {g.name: 0.0 for g in groups}
    done = 0
    while rounds is None or done < rounds:
        now = time.monotonic()
        for g in groups:
            if now >= next_cp[g.name]:
                rep = run_round(cfg, g, force=force)
                next_cp[g.name] = now + g.offsets.interval
                next_hb[g.name] = now + g.heartbeats.interval
                done += 1
                if on_report:
                    on_report(rep)
            elif g.heartbeats.enabled and now >= next_hb[g.name]:
                emit_heartbeat(cfg, g)
                next_hb[g.name] = now + g.heartbeats.interval
        wake = min(min(next_cp.values()), min(next_hb[g.name] for g in groups if g.heartbeats.enabled)
                   if any(g.heartbeats.enabled for g in groups) else float("inf"))
        time.sleep(max(0.05, wake - time.monotonic()))
