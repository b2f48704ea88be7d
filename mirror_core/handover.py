"""Start a mirror where another tool stopped (viooh-mirror, MirrorMaker 1): seed positions from the
consumer groups that tool committed on the source.

Those tools leave no offset syncs, so a new mirror would start at each source partition's earliest
offset and copy again what they already wrote. Before the first run, :func:`seed_positions` writes,
for each partition of each selected mirror whose consumer group has committed offset ``C`` on the
source and that has no offset sync yet, one *position sync* ``C -> D`` to the group's offset-sync
topic, where ``D`` is the end of the destination partition the writer will use. Like the writer's syncs, it
names its destination topic in a header (:func:`mirror_core.positions.sync_headers`), so that another mirror of
the same source topic into another destination topic, which shares the sync topic, never takes it for its own:

- the writer resumes each partition after its newest committed sync, so it skips what the other
  tool copied and writes source offset ``C`` at destination offset ``D``;
- translation maps ``C`` to ``D`` exactly (no record of the partition was mirrored between them),
  so a consumer group at ``C`` on the source resumes on the destination with mirrorflow's first record.
  Positions below ``C`` have no sync and stay untranslatable (reported as such, never guessed): the
  other tool did not keep partitions, so its offsets mean nothing downstream.

Nothing is seeded where it could lose data or undo mirrorflow's own work: a partition with a sync of this
destination topic already (or one from before syncs named their destination, which may be this one's), a
group with no committed offset, or a destination topic that does not exist yet (nothing was copied; the
mirror starts from the beginning). Run it once, after ``provision`` and before ``run``:
``python -m mirror_core.handover CONFIG --group G [--dry-run]``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

from confluent_kafka import TopicPartition

from mirror_core import clients
from mirror_core.config import ClusterConfig, GroupConfig, MirrorsConfig, ResolvedMirror
from mirror_core.errors import KafkaOperationError, MirrorError
from mirror_core.offsets import OffsetSync
from mirror_core.positions import sync_headers


@dataclass(frozen=True)
class Seed:
    """A position sync to write: source ``topic``/``partition`` at ``upstream`` -> ``downstream`` (in
    ``destination_topic``'s ``destination_partition``)."""

    mirror: str
    topic: str
    partition: int
    upstream: int
    downstream: int
    destination_partition: int
    destination_topic: str


@dataclass(frozen=True)
class Skip:
    mirror: str
    topic: str
    partition: int | None
    reason: str


@dataclass
class HandoverReport:
    group: str
    seeds: list[Seed] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    written: bool = False


def destination_partition(partition: int, source_partitions: int, destination_partitions: int) -> int:
    """The destination partition the writer uses for a source partition (kept when it can be)."""
    return partition if destination_partitions >= source_partitions else partition % destination_partitions


def decide(mirror: str, topic: str, partition: int, committed: int | None, has_sync: bool,
           destination_end: int, destination_partition: int, destination_topic: str) -> Seed | Skip:
    """Seed or skip one partition (pure: the reasons are the module docstring's rules)."""
    if has_sync:
        return Skip(mirror, topic, partition, "mirrorflow already has a position for it")
    if committed is None or committed < 0:
        return Skip(mirror, topic, partition, "no committed offset: the mirror copies it from the start")
    return Seed(mirror, topic, partition, committed, destination_end, destination_partition, destination_topic)


def plan_handover(cfg: MirrorsConfig, group: GroupConfig) -> HandoverReport:
    """What :func:`seed_positions` would write; reads both clusters, changes nothing."""
    from mirror_core.provision import selected_mirrors
    from mirror_core.replicate import last_committed_sync

    src, dst = cfg.cluster(group.source), cfg.cluster(group.destination)
    report = HandoverReport(group.name)
    src_md = clients.admin(src).list_topics(timeout=30).topics
    dst_md = clients.admin(dst).list_topics(timeout=30).topics
    dst_consumer = clients.kafka_config(dst)
    for m in selected_mirrors(cfg, group):
        topic, dst_topic = m.source_topic or "", m.destination_topic or ""
        if dst_topic not in dst_md or dst_md[dst_topic].error is not None:
            report.skipped.append(Skip(m.name, topic, None, f"destination topic {dst_topic!r} does not exist: "
                                       "nothing was copied, the mirror copies from the start"))
            continue
        n_src, n_dst = len(src_md[topic].partitions), len(dst_md[dst_topic].partitions)
        committed = _committed(src, m, n_src)
        for p in range(n_src):
            dp = destination_partition(p, n_src, n_dst)
            # another mirror of the topic into another destination topic has syncs of its own: not this one's
            # (a sync from before syncs named their destination may be this one's: counted, nothing seeded)
            has_sync = last_committed_sync(dst_consumer, group.offset_syncs, topic, p,
                                           destination=dst_topic) is not None
            end = _end(dst, dst_topic, dp)
            d = decide(m.name, topic, p, committed.get(p), has_sync, end, dp, dst_topic)
            if isinstance(d, Seed):
                report.seeds.append(d)
            else:
                report.skipped.append(d)
    return report


def seed_positions(cfg: MirrorsConfig, group: GroupConfig, dry_run: bool = False) -> HandoverReport:
    """Write the position syncs :func:`plan_handover` decided (unless ``dry_run``)."""
    report = plan_handover(cfg, group)
    if dry_run or not report.seeds:
        return report
    p = clients.producer(cfg.cluster(group.destination), **{"acks": "all", "enable.idempotence": True})
    for s in report.seeds:
        sync = OffsetSync(s.topic, s.partition, s.upstream, s.downstream)
        # named like the writer's syncs: another mirror of the topic (into another destination topic, sharing
        # the sync topic) passes over it, in its translation and in its writer's position lookup
        p.produce(group.offset_syncs, key=sync.key_bytes(), value=sync.value_bytes(), partition=0,
                  headers=sync_headers(s.destination_topic))  # type: ignore[arg-type]
    if p.flush(60):
        raise KafkaOperationError(f"position syncs for group {group.name!r} not acknowledged within 60 s")
    report.written = True
    return report


def _committed(cluster: ClusterConfig, m: ResolvedMirror, partitions: int) -> dict[int, int]:
    c = clients.consumer(cluster, m.consumer_group)
    try:
        tps = c.committed([TopicPartition(m.source_topic or "", p) for p in range(partitions)], timeout=30)
        return {tp.partition: tp.offset for tp in tps if tp.error is None and tp.offset >= 0}
    finally:
        c.close()


def _end(cluster: ClusterConfig, topic: str, partition: int) -> int:
    c = clients.consumer(cluster, "mirrorflow-handover")
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, partition), timeout=30)[1])
    finally:
        c.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m mirror_core.handover CONFIG --group G [--dry-run]``: one line per partition."""
    from mirror_core.config import load_config
    from mirror_core.errors import ConfigError

    ap = argparse.ArgumentParser(prog="python -m mirror_core.handover", description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--group", "-g", required=True)
    ap.add_argument("--dry-run", action="store_true", help="say what would be seeded, write nothing")
    args = ap.parse_args(argv)
    try:
        cfg = load_config(args.config)
        rep = seed_positions(cfg, cfg.group(args.group), dry_run=args.dry_run)
    except ConfigError as exc:
        for issue in exc.issues:
            print(f"{exc.source + ': ' if exc.source else ''}{issue}", file=sys.stderr)
        return exc.exit_code
    except MirrorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    verb = "would seed" if args.dry_run else "seeded"
    for s in rep.seeds:
        print(f"{s.mirror}: {verb} {s.topic}[{s.partition}] at source offset {s.upstream} -> destination "
              f"partition {s.destination_partition} offset {s.downstream}")
    for k in rep.skipped:
        where = f"{k.topic}[{k.partition}]" if k.partition is not None else k.topic
        print(f"{k.mirror}: skipped {where}: {k.reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
