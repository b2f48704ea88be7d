"""The streaming mirror's logic, independent of Spark.

:class:`MirrorRuntime` holds one group's state on the driver: what is mirrored
where, the schema-id map, and what happens after each micro-batch (committing
source offsets under each mirror's consumer group, metrics, provisioning topics
that a regex flow discovered). :func:`arrow_writer` is the function Spark runs
per partition through ``mapInArrow``; it only needs pyarrow and confluent-kafka.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from mirror_core import clients
from mirror_core.config import (
    DRIVER_WRITER_SLOT,
    WRITER_PRODUCERS_DEFAULT,
    WRITER_SLOTS,
    GroupConfig,
    MirrorsConfig,
    default_consumer_group,
    location_scheme,
    mirror_name,
    resolve_mirrors,
)
from mirror_core.errors import KafkaOperationError, MirrorError
from mirror_core.joblock import local_path
from mirror_core.policy import ReplicationPolicy, TopicSelection, build_replication_policy, group_topic_filter
from mirror_core.redaction import ClientConfig, client_config
from mirror_core.replicate import (
    FENCE_THREADS,
    BatchResult,
    Columns,
    DestinationTopicError,
    NotAcknowledged,
    PartitionWriter,
    SchemaIdTranslator,
    SourceRecord,
    Staged,
    WriterError,
    WriterSettings,
    WriterTransaction,
    _abort_quietly,
    _RunsUnproven,
    _Unmapped,
    ack_wait,
    another_took_over,
    delivery_timeout,
    destination_deleted,
    flush_within,
    last_committed_sync,
    last_committed_syncs,
    quiet_gc,
)
from mirror_core.topics import ClusterState, create_topics, read_state

log = logging.getLogger(__name__)

RESULT_FIELDS = (
    ("topic", "string"), ("partition", "int"), ("records_in", "long"), ("mirrored", "long"),
    ("bytes_out", "long"), ("replayed_skipped", "long"), ("provenance_skipped", "long"),
    ("dead_lettered", "long"), ("cache_misses", "long"), ("first_offset", "long"), ("last_offset", "long"),
    ("upstream_end", "long"), ("last_downstream", "long"), ("latency_ms", "array<double>"),
    ("setup_ms", "double"), ("produce_ms", "double"), ("commit_ms", "double"), ("input_ms", "double"),
)
RESULT_DDL = ", ".join(f"{n} {t}" for n, t in RESULT_FIELDS)
CHUNK_RECORDS = 20000
#: a partition's writer (``transactions: per_partition``, both read paths) writes the chunks queued for it while it
#: wrote the last ones as one, up to this many records (and, on the direct path, ``replicate.CHUNK_BYTES``): one
#: transaction and commit (exactly_once) or one flush (at_least_once) where a chunk of :data:`CHUNK_RECORDS` at a time
#: drained the partition's produce pipeline and waited for a commit every 20,000 records. A writer that keeps up
#: with its reader (a live stream) still writes each chunk as it comes. A 4,000,000-record drain of 100 B records
#: over 6 partitions (exactly_once, direct) took 0.57-0.58 s a micro-batch of 500,000 records against 0.62-0.76 s
#: (docs/benchmarks.md, 5 December)
COALESCE_RECORDS = 200000
#: overrides :data:`COALESCE_RECORDS`, for an A/B (the bench's ``-chunk`` variants: 0, a chunk at a time)
COALESCE_RECORDS_ENV = "MIRRORFLOW_COALESCE_RECORDS"
#: Spark Kafka source defaults (``spark.source_options`` overrides them). A Spark task reads its
#: partition up to the batch end, which in a running mirror is the log end: with the consumer's default
#: fetch.max.wait.ms (500) each task then waits out a broker long-poll, 0.5 s per task wave per batch.
#: Larger polls cut the per-record overhead of Spark's fetch loop.
SOURCE_DEFAULTS = {"kafka.fetch.max.wait.ms": "10", "kafka.max.poll.records": "5000"}
DRIVER_THREADS = 8  # partitions written at once by the driver (their network waits overlap)
#: ``transactions: per_writer``: a writer transaction holds at most this many partitions (a batch's share of
#: more goes out in several). The broker's work for a transaction grows with its partitions (each is added to
#: it, each gets a commit marker): 1,000 partitions of a few records each took 1-2 s to flush here; 4,500 took
#: 56 s once, and once more than the transaction's 60 s
SHARED_TXN_PARTITIONS = 1000
#: ``transactions: per_writer``: the pause before a lost writer transaction's partitions are written again
SHARED_RETRY_PAUSE = 1.0
#: ``transactions: per_writer``: how long a writer transaction waits at most, after staging its other partitions,
#: for the last commit's markers in partitions where they were late (asking every :data:`LATE_MARKERS_POLL_S`);
#: a partition whose markers land meanwhile goes through the C loop, the others are then reported record by
#: record (see :meth:`BatchWriter._stage_order`). Reporting each record cost a writer process 7 s for 1,000,000
#: records of 500 partitions whose first markers were late
LATE_MARKERS_WAIT_S = 5
LATE_MARKERS_POLL_S = 0.1
#: overrides :data:`LATE_MARKERS_WAIT_S` (seconds), for an A/B (0: report every late partition's records at once)
LATE_MARKERS_WAIT_ENV = "MIRRORFLOW_LATE_MARKERS_WAIT"
#: the batch cap of ``read_path: direct`` on a ``local[...]`` master (see :func:`effective_max_offsets`)
DIRECT_BATCH_RECORDS = 500_000
#: ... or this many records a partition of the group when that is more (from 250 partitions): at 1,000 partitions
#: a batch of 500,000 records was 500 a partition, each written as a batch of its own with a commit marker (see
#: ``direct.WRITER_TXN_BYTES_PER_PARTITION``). :data:`DIRECT_BATCH_PER_PARTITION_ENV` overrides it, for an A/B
#: (the bench's ``-flat`` variants: 0, :data:`DIRECT_BATCH_RECORDS` whatever the partitions)
DIRECT_BATCH_RECORDS_PER_PARTITION = 2000
DIRECT_BATCH_PER_PARTITION_ENV = "MIRRORFLOW_DIRECT_BATCH_PER_PARTITION"


@dataclass(frozen=True)
class WriterPlan:
    """What the executors need: settings per source topic, the id map, and how to resolve misses."""

    settings: dict[str, WriterSettings]
    id_map: dict[int, int]
    end_offsets: dict[str, dict[int, int]]
    destination_consumer_config: ClientConfig  # secrets: printed redacted (a plain mapping is turned into one)
    registries: tuple[Any, Any] | None  # (source SchemaRegistryConfig, destination SchemaRegistryConfig)
    #: source topics this group looked at and deliberately does not mirror (not selected by its mirrors):
    #: their records are passed over. A record of any other topic without settings fails the batch.
    ignored: frozenset[str] = frozenset()
    group: str = ""
    #: (topic, partition) -> (previous batch end, this batch end) where the source's end moved back (the
    #: topic was re-created or its log truncated): Spark drops that range, :meth:`MirrorRuntime.write_rewound`
    #: (or, on the direct path, :meth:`MirrorRuntime.write_direct`) writes it from the partition's start
    rewound: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    #: ``spark.transactions`` as it resolves (:attr:`SparkConfig.writes_per_writer`): the direct path's writers
    #: commit a transaction per partition (``per_partition``) or per writer process (``per_writer``)
    transactions: str = "per_partition"
    #: ``spark.writer_producers`` (``transactions: per_writer``: the producers a writer takes turns with)
    writer_producers: int = WRITER_PRODUCERS_DEFAULT
    #: ``read_path: executors`` with ``transactions: per_writer``: the partitions whose own transactional ids the
    #: driver fenced for this job (those below the count, by source topic): the tasks need not fence them again
    fenced: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "destination_consumer_config", client_config(self.destination_consumer_config))


#: reads one file of a Spark checkpoint (a plain path or a URI such as ``s3a://...``): its text, or None when
#: it does not exist. The Spark job passes one that goes through Hadoop's file system.
CheckpointReader = Callable[[str], "str | None"]


def local_checkpoint_reader(location: str) -> str | None:
    """A :data:`CheckpointReader` for checkpoints on this machine (a plain path or a ``file:`` URI).

    Any other scheme raises: reading it as a local path would find nothing, and the batch's end offsets
    (which tell the mirror about new topics) would silently be empty."""
    path = local_path(location)
    if path is None:
        raise MirrorError(f"cannot read the Spark checkpoint {location!r} without Spark's file system "
                          f"(scheme {location.split(':', 1)[0]!r}); the Spark job reads it through Hadoop")
    try:
        return path.read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return None


class LocalCheckpointFiles:
    """Files of mirrorflow's own beside Spark's in a checkpoint on this machine (see :class:`WrittenLog`); the
    Spark job uses one that goes through Hadoop's file system for other schemes."""

    def _path(self, location: str) -> Path:
        return local_path(location) or Path(location)

    def read(self, location: str) -> str | None:
        return local_checkpoint_reader(location)

    def create(self, location: str, text: str) -> None:
        path = self._path(location)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def names(self, location: str) -> list[str]:
        path = self._path(location)
        return [p.name for p in path.iterdir()] if path.is_dir() else []

    def delete(self, location: str) -> None:
        self._path(location).unlink(missing_ok=True)


class WrittenLog:
    """What the direct read path has written, per partition: ``{topic: {partition: offset}}``, every record
    below ``offset`` is on the destination. One small file per entry (``<checkpoint>/mirrorflow-written/<n>``),
    never rewritten, so a torn write only loses that entry and an older one is read instead, which is safe:
    an entry may lag behind the truth, never run ahead of it. Written once per batch after its write has
    finished and before the batch goes back to Spark (on either read path), and by a starting direct-path job
    before it writes anything; read when a job starts (``spark.overlap_writes``: Spark records a batch as done
    while it is still being written; see :meth:`MirrorRuntime.rewind_unwritten_batch` and :func:`replay_starts`)."""

    KEEP = 5

    def __init__(self, checkpoint_dir: str, files: Any):
        self.dir = join_location(checkpoint_dir, "mirrorflow-written")
        self.files = files
        self._next: int | None = None

    def _numbers(self) -> list[int]:
        return sorted(int(n) for n in self.files.names(self.dir) if n.isdigit())

    def last(self) -> dict[str, dict[int, int]] | None:
        """The newest readable entry, None when there is none. An entry that cannot be read (torn by a crash, or
        the store refusing it) is passed over for the one before, which lies further back (safe); entries
        none of which can be read stop the job with one line rather than let it trust Spark's starts."""
        numbers = self._numbers()
        self._next = (numbers[-1] + 1) if numbers else 0
        for n in reversed(numbers):
            try:
                text = self.files.read(join_location(self.dir, str(n)))
                if text is None:
                    continue
                return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(text).items()}
            except Exception as exc:  # noqa: BLE001 - JSON, or the file system's own error through py4j
                reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                log.warning("written-offsets entry %s/%d is unreadable (%s); taking the one before", self.dir, n,
                            reason)
        if numbers:
            raise MirrorError(f"none of the written-offsets entries in {self.dir} can be read, so where the last "
                              f"job stopped writing is not known; check the checkpoint's storage (removing that "
                              f"directory makes the job trust Spark's checkpoint alone)")
        return None

    def add(self, written: dict[str, dict[int, int]]) -> None:
        if self._next is None:
            self.last()
        n = self._next or 0
        self.files.create(join_location(self.dir, str(n)), json.dumps(written, sort_keys=True))
        self._next = n + 1
        for old in self._numbers():
            if old <= n - self.KEEP:
                self.files.delete(join_location(self.dir, str(old)))


def join_location(base: str, *parts: str) -> str:
    """``base`` joined with ``parts`` by ``/``, keeping a URI's ``//`` (``Path`` would fold ``s3a://b`` to
    ``s3a:/b``)."""
    if location_scheme(base) is None:
        return str(Path(base).joinpath(*parts))
    return "/".join([base.rstrip("/"), *parts])


class MirrorRuntime:
    """Driver-side state of one group's streaming mirror."""

    def __init__(self, cfg: MirrorsConfig, group: GroupConfig, read_checkpoint: CheckpointReader | None = None):
        self.cfg = cfg
        #: how Spark's offset log is read (the Spark job sets one that goes through Hadoop's file system)
        self.read_checkpoint: CheckpointReader = read_checkpoint or local_checkpoint_reader
        self.group = group
        self.src = cfg.cluster(group.source)
        self.dst = cfg.cluster(group.destination)
        self.policy = build_replication_policy(group)
        self.mirrors = tuple(resolve_mirrors(group))
        self.settings: dict[str, WriterSettings] = {}
        self.consumer_groups: dict[str, str] = {}
        self._committers: dict[str, Any] = {}  # one long-lived consumer per mirror consumer group
        self._committers_lock = threading.Lock()
        #: the source-offset commit of the last batch, running beside the next batch (see :meth:`after_batch`)
        self._commit_thread: threading.Thread | None = None
        self.id_map: dict[int, int] = {}
        #: key + value bytes per record of the batches so far (None before the first): sizes driver batches
        self.bytes_per_record: float | None = None
        #: set to stop the background warm-up (the tasks are taking over)
        self._warm_stop = threading.Event()
        self._warm_thread: threading.Thread | None = None
        #: ``read_path: executors`` with ``transactions: per_writer``: the tasks' writer slots and the partitions'
        #: own ids are fenced once, before the first batch the tasks write (in the background from the warm-up:
        #: ``_task_fence``); what was fenced (:attr:`WriterPlan.fenced`)
        self._task_fenced: dict[str, int] | None = None
        self._task_fence: Future[dict[str, int]] | None = None
        #: source topics already looked at (mirrored or deliberately not); any other topic a batch
        #: brings (a regex flow's new match, a heartbeats topic created later) triggers provisioning
        self.known_topics: set[str] = set()
        #: source topic -> its mirror's ``topics_mirroring.allow_placement_change``
        self.placement_change_allowed: dict[str, bool] = {}
        #: the offset-log files read last (see :meth:`batch_ends`)
        self._offset_log: dict[int, dict[str, dict[int, int]]] = {}
        #: the planned batch's start and end offsets (see :meth:`batch_starts`)
        self._starts: dict[int, tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]]] = {}
        #: source topic -> its mirror's ``topics_mirroring.partition_count`` rule
        self.partition_rules: dict[str, Any] = {}
        #: destination topic -> its topic id when the settings were made (see :meth:`check_destinations`)
        self.destination_ids: dict[str, str] = {}
        self._dst_admin: Any = None
        #: makes the destination check's admin client (see :meth:`_destination_ids_when_answered`)
        self._dst_admin_factory: Callable[[], Any] = lambda: clients.admin(
            self.dst, **{"allow.auto.create.topics": False})
        self._secrets_dir: Path | None = None
        #: the source consumer of ``spark.read_path: direct`` (see :mod:`mirror_core.direct`)
        self._direct: Any = None
        #: its writer processes, when there are more than one (see :meth:`direct_processes`)
        self._pool: Any = None
        #: ``spark.overlap_writes``: the write of the last direct batch, running on (see :meth:`write_direct_behind`)
        self._inflight: Future[None] | None = None
        self._behind: ThreadPoolExecutor | None = None
        #: the next direct batch is this process's first: it reads from what is known written (see :meth:`replay_starts`)
        self._first_direct = True
        #: how mirrorflow's own files in the checkpoint are read and written (the Spark job sets Hadoop's)
        self.checkpoint_files: Any = LocalCheckpointFiles()
        self._written: WrittenLog | None = None
        #: ``spark.keep_writing_for``: (topic, partition) -> how far a batch's writers went on past Spark's end for
        #: it; the next batch reads from there (see :meth:`keep_writing`)
        self._ahead: dict[tuple[str, int], int] = {}
        #: batch id -> (further writes, records found expired in them) of :meth:`keep_writing`, for its summary
        self._kept: dict[int, tuple[int, int]] = {}
        #: where the writer processes left keeping on by the last batch began (see :meth:`end_keep`)
        self._keeping_from: dict[tuple[str, int], int] | None = None
        #: asked between a batch's further writes (:meth:`keep_writing`): the job was asked to stop
        self.stop_requested: Callable[[], bool] = lambda: False
        #: the source's last stable offsets for :meth:`keep_writing` (one request for all its partitions)
        self._src_admin: Any = None

    # -- setup

    def prepare(self) -> list[str]:
        """Provision the group (topics + schemas) and learn what is mirrored where. Returns what was done."""
        from mirror_core.provision import plan_group, provision_group

        plan = plan_group(self.cfg, self.group)
        if plan.topics.blocking:
            raise_plan_errors(plan)
        res = provision_group(self.cfg, self.group, plan)
        if res.unusable:
            # a topic not made (or grown, or served yet) stops the job, as before 7 December: writing to partitions
            # coming online can lose acknowledged records (KAFKA-15591), and the internal topics are the mirror's own
            why = [e for e in res.errors if any(t in e for t in res.unusable)] or res.errors
            raise KafkaOperationError(f"cannot provision {', '.join(res.unusable)} on {self.group.destination}: "
                                      + "; ".join(why))
        for e in res.errors:
            log.error("%s: %s", self.group.name, e)
        self.id_map.update(res.id_map)
        self._refresh_settings()
        return res.done

    def _refresh_settings(self) -> None:
        src_state = read_state(clients.admin(self.src))
        dst_admin = clients.admin(self.dst)
        dst_state = read_state(dst_admin)
        chosen, _ = group_topic_filter(self.cfg, self.group, self.mirrors, self.policy).select(sorted(src_state.topics))
        hb = heartbeat_selection(self.group, self.policy, sorted(src_state.topics), chosen)
        if hb is not None:
            chosen.append(hb)
            if hb.destination_topic not in dst_state.topics:
                ensure_heartbeats_topic(dst_admin, hb.destination_topic, src_state, dst_state, hb.source_topic)
                dst_state = read_state(dst_admin)
        producer_cfg = clients.kafka_config(self.dst)
        source_cfg = clients.kafka_config(self.src)
        self.known_topics = set(src_state.topics)
        for sel in chosen:
            m = sel.mirror
            dst_info = dst_state.topics.get(sel.destination_topic)
            if dst_info is None:
                self.known_topics.discard(sel.source_topic)  # provisioning failed: try again next batch
                continue
            provenance = default_provenance(m.settings.provenance_headers, sel.source_topic, sel.destination_topic)
            max_bytes = dst_info.configs.get("max.message.bytes")
            self.settings[sel.source_topic] = WriterSettings(
                group=self.group.name, mirror=m.name, source_alias=self.group.source,
                destination_alias=self.group.destination, source_topic=sel.source_topic,
                destination_topic=sel.destination_topic,
                source_partitions=src_state.topics[sel.source_topic].partitions,
                destination_partitions=dst_info.partitions, delivery=m.settings.delivery,
                key_serde=m.settings.serdes.key, value_serde=m.settings.serdes.value,
                on_error=m.settings.on_error, dlq_topic=self.group.dlq_topic,
                offset_syncs_topic=self.group.offset_syncs, provenance=provenance,
                producer_config=producer_cfg, source_consumer_config=source_cfg,
                destination_max_message_bytes=int(max_bytes) if max_bytes else None,
            )
            self.consumer_groups[sel.source_topic] = m.consumer_group
            self.placement_change_allowed[sel.source_topic] = m.settings.topics_mirroring.allow_placement_change
            self.partition_rules[sel.source_topic] = m.settings.topics_mirroring.partition_count
        # the id first seen stays: provisioning for a new source topic must not make a re-created destination
        # look like the one the offset syncs describe
        new = [s.destination_topic for s in self.settings.values() if s.destination_topic not in self.destination_ids]
        for t, i in destination_topic_ids(dst_admin, new).items():
            if i is not None:
                self.destination_ids[t] = i

    def check_destinations(self) -> None:
        """Stop the mirror when a destination topic was deleted, or deleted and re-created (its topic id
        changed), since its settings were made: records written on would reach no topic, or a topic that is
        not the one the offset syncs describe (a broker's ``auto.create.topics.enable`` re-creates it with
        its default partitions). One metadata request per micro-batch, before anything is written."""
        if not self.destination_ids:
            return
        if self._dst_admin is None:
            self._dst_admin = self._dst_admin_factory()
        now = self._destination_ids_when_answered()
        for s in self.settings.values():
            before = self.destination_ids.get(s.destination_topic)
            if before is None:
                continue
            after = now.get(s.destination_topic)
            if after is None:
                raise DestinationTopicError(destination_deleted(s))
            if after != before:
                raise DestinationTopicError(
                    f"{s.mirror}: destination topic {s.destination_topic} was deleted and re-created on cluster "
                    f"{s.destination_alias} while mirroring (its topic id changed; a broker that auto-creates "
                    f"topics does that); nothing more is written or committed. Check its partitions and "
                    f"configs (mirrorflow provision) and start the mirror again (see README, Faults)")

    def _destination_ids_when_answered(self) -> dict[str, str | None]:
        """The destination topics' ids; while the destination cluster does not answer (a broker restarting, a
        network partition) the batch waits for it, as the writer's producers would: an unreachable destination
        stalls the mirror, it does not end it. Errors that are not about reaching the cluster (authorization)
        are raised.

        Each attempt after one that got no answer uses a new admin client. librdkafka sends DescribeTopics to
        the broker its metadata names as the controller (on a KRaft cluster, any live broker) and refreshes
        that only every ``topic.metadata.refresh.interval.ms`` (5 minutes): when that broker dies, the old
        client waits for it that long, while a new one bootstraps from the brokers still up."""
        from concurrent.futures import TimeoutError as FutureTimeout

        from confluent_kafka import KafkaException

        started = time.monotonic()
        while True:
            try:
                return destination_topic_ids(self._dst_admin, sorted(self.destination_ids),
                                             timeout=DESTINATION_CHECK_TIMEOUT)
            except (FutureTimeout, KafkaException) as exc:
                if isinstance(exc, KafkaException) and not _unreachable(exc.args[0]):
                    raise
                reason = "no answer" if isinstance(exc, FutureTimeout) else exc.args[0].str()
            log.warning("%s: destination cluster %s does not answer (%s); the batch waits for it (%.0fs so far)",
                        self.group.name, self.group.destination, reason, time.monotonic() - started)
            time.sleep(DESTINATION_RETRY_PAUSE)
            self._dst_admin = self._dst_admin_factory()

    # -- the Spark source

    def source_options(self, once: bool) -> ClientConfig:
        """Options for Spark's Kafka source (``spark.readStream.format("kafka")``); they may hold the
        source's secrets inline, so they print redacted."""
        # the private directory is made only when the source has secrets to write there
        java = clients.java_kafka_options(self.src, self.secrets_dir, f"{self.group.name}-source")
        opts = {f"kafka.{k}": v for k, v in java.items()}
        opts |= SOURCE_DEFAULTS | self.group.spark.source_options
        opts |= {
            "kafka.isolation.level": "read_committed",
            "includeHeaders": "true",
            "startingOffsets": "earliest",
            "failOnDataLoss": "false",
        }
        cap = effective_max_offsets(self.group.spark, sum(s.source_partitions for s in self.settings.values()))
        if cap:
            opts["maxOffsetsPerTrigger"] = str(cap)
        explicit = [m.source_topic for m in self.mirrors if not m.is_flow and m.source_topic]
        flows = [m.topics.include for m in self.mirrors if m.is_flow and m.topics]
        hb = self.group.heartbeats.topic if self.group.heartbeats.enabled else None
        if flows:
            alternatives = [re.escape(t) for t in explicit] + [f"(?:{f})" for f in flows]
            if hb is not None:
                alternatives.append(re.escape(hb))  # picked up whenever it appears on the source
            opts["subscribePattern"] = "^(?:" + "|".join(alternatives) + ")$"
            # new matching topics are found at each trigger; keep the consumers' metadata fresh too
            opts.setdefault("kafka.metadata.max.age.ms", "5000")
        else:
            if hb is not None and hb in self.settings and hb not in explicit:
                explicit.append(hb)
            opts["subscribe"] = ",".join(explicit)
        return ClientConfig(opts)

    def secrets_dir(self) -> Path:
        """Where the Spark source's secrets go (0600 files the Kafka clients read through a config
        provider): ``spark.secrets_dir``, else a private directory removed when this process exits.
        Executors read the same path, so on a multi-host cluster it must be mounted on each of them."""
        if self._secrets_dir is None:
            if self.group.spark.secrets_dir:
                self._secrets_dir = Path(self.group.spark.secrets_dir)
                self._secrets_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            else:
                self._secrets_dir = clients.private_secrets_dir()
                atexit.register(shutil.rmtree, self._secrets_dir, True)
        return self._secrets_dir

    def checkpoint_dir(self) -> str:
        return join_location(self.group.spark.checkpoint_dir, self.group.name)

    # -- per batch

    def writer_plan(self, batch_id: int) -> WriterPlan:
        """Settings for this batch; provisions topics a flow has just discovered."""
        self.check_destinations()
        ends = self.batch_ends(batch_id)
        unknown = [t for t in ends if t not in self.settings and t not in self.known_topics]
        grown = [t for t, parts in ends.items()
                 if t in self.settings and parts and max(parts) >= self.settings[t].source_partitions]
        if unknown:
            log.info("%s: new source topics %s; provisioning", self.group.name, unknown)
        if grown:
            log.info("%s: source topics %s have new partitions; growing their destinations", self.group.name, grown)
        if unknown or grown:
            self.prepare()
        self.check_placement(batch_id)
        starts = self.batch_starts(batch_id)
        self._starts = {batch_id: (starts, ends)}
        rewound = rewound_partitions(starts, ends, set(self.settings))
        if rewound:
            from mirror_core import metrics

            for (t, p), (before, end) in sorted(rewound.items()):
                log.warning("%s: %s[%d]: the source's end offset moved back from %d to %d (%d offsets; topic "
                            "re-created or log truncated): mirroring the partition again from its start",
                            self.group.name, t, p, before, end, before - end)
                metrics.REWOUND.labels(self.group.name, self.settings[t].mirror).inc(before - end)
        regs = None
        if self.src.schema_registry and self.dst.schema_registry:
            regs = (self.src.schema_registry, self.dst.schema_registry)
        return WriterPlan(dict(self.settings), dict(self.id_map), ends,
                          clients.kafka_config(self.dst), regs,
                          ignored=frozenset(self.known_topics - set(self.settings)), group=self.group.name,
                          rewound=rewound,
                          transactions="per_writer" if self.group.spark.writes_per_writer else "per_partition",
                          writer_producers=self.group.spark.writer_producers)

    def batch_starts(self, batch_id: int) -> dict[str, dict[int, int]]:
        """Where micro-batch ``batch_id`` starts per partition: the batch before's ends, or for the first
        batch the source's initial offsets (negative: symbolic, e.g. earliest)."""
        if batch_id < 0:
            return {}
        if batch_id == 0:
            return read_initial_offsets(self.checkpoint_dir(), self.read_checkpoint)
        return self.batch_ends(batch_id - 1)

    def write_rewound(self, plan: WriterPlan) -> list[dict[str, Any]]:
        """Write, from the driver, the records of partitions whose end moved back, from the partition's
        start to the batch end. Spark's source (``failOnDataLoss=false``) drops a range that moved back,
        so without this the re-created topic's first records would never be mirrored; the writer, finding
        its committed position beyond the source's end, takes them as new. On the direct read path they are
        ranges of the batch instead (:meth:`write_direct`), written by the process that owns the partition."""
        if not plan.rewound or self.group.spark.plans_only:
            return []
        bw = BatchWriter(plan)
        for (t, p), (_before, end) in sorted(plan.rewound.items()):
            low = clients.end_offsets(self.src, t).get(p, (0, 0))[0]
            buf: list[SourceRecord] = []
            for m in clients.read_partition(self.src, t, p, low, end):
                buf.append(SourceRecord(t, p, m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                        m.timestamp()[1]))
                if len(buf) >= CHUNK_RECORDS:
                    bw.feed(t, p, Columns.from_records(buf))
                    buf = []
            if buf:
                bw.feed(t, p, Columns.from_records(buf))
            bw.finish(t, p)
        return bw.rows()

    def write_direct(self, plan: WriterPlan, batch_id: int) -> list[dict[str, Any]]:
        """``spark.read_path: direct``: read micro-batch ``batch_id``'s ranges from the source (the ones in
        Spark's offset log, so a replayed batch reads exactly the same) and write them from the driver. The
        micro-batch DataFrame is never evaluated. Call after :meth:`writer_plan` for the same batch."""
        carried = self.end_keep(batch_id)  # the batch before's writer processes, if they wrote on
        rows = self._write_ranges(plan, self.direct_ranges(plan, batch_id))
        return after_carried(carried, rows) if carried else rows

    def direct_ranges(self, plan: WriterPlan, batch_id: int) -> list[Any]:
        """Micro-batch ``batch_id``'s ranges for mirrorflow's readers (``read_path: direct`` or ``executors``):
        each partition's [start, end) from Spark's offset log, partitions whose end moved back from their first
        offset. Call after :meth:`writer_plan` for the same batch."""
        from mirror_core.direct import Range, batch_ranges

        starts, ends = self._starts.get(batch_id) or (self.batch_starts(batch_id), self.batch_ends(batch_id))
        if self._first_direct:
            starts = self.replay_starts(starts, keep=set(plan.rewound))
            self._first_direct = False
        if self._ahead:
            # the batch before went on writing past its end (spark.keep_writing_for): read from there
            starts, self._ahead = past_written_ahead(starts, ends, self._ahead)
            self._starts[batch_id] = (starts, ends)
        ranges = batch_ranges(starts, ends, skip=plan.ignored)
        # partitions whose end moved back (topic re-created, log truncated) have no range from Spark: they are
        # read from their first offset, as a new partition is, and their writer takes the records as new
        ranges += [Range(t, p, None, end) for (t, p), (_start, end) in sorted(plan.rewound.items()) if end > 0]
        return ranges

    def write_in_tasks(self, plan: WriterPlan, batch_id: int, tasks: int,
                       run: Callable[[list[Any], Callable[..., Any]], list[dict[str, Any]]],
                       attempt: Callable[[], int] | None = None) -> list[dict[str, Any]]:
        """``spark.read_path: executors``: micro-batch ``batch_id``'s ranges read and written by at most ``tasks``
        Spark tasks: ``run(shares, fn)`` runs ``fn`` (:func:`~mirror_core.direct.task_writer`) on each share
        (numbered: its writer slot with ``transactions: per_writer``) in a task of its own and returns what they
        yield; ``attempt()``, called in a task, says which attempt of it that is. The DataFrame is never evaluated,
        as with :meth:`write_direct`. Call after :meth:`writer_plan` for the same batch."""
        from mirror_core.direct import task_shares, task_writer

        per_writer = plan.transactions == "per_writer"
        if per_writer:
            tasks = min(tasks, DRIVER_WRITER_SLOT)  # a writer slot each; the last is the driver's
        shares = task_shares(self.direct_ranges(plan, batch_id), tasks)
        if not shares:
            return []
        if per_writer:
            plan = replace(plan, fenced=self._fenced_for_tasks(plan))
        return run(list(enumerate(shares)),
                   task_writer(plan, self.src, self.group.name, self._read_group(), len(shares), attempt))

    def _fence_task_slots(self, plan: WriterPlan) -> dict[str, int]:
        """``read_path: executors`` with ``transactions: per_writer``: fence every writer id but the driver's, and
        each exactly-once partition's own id, before the tasks first write: a task of an earlier job may still
        hold one (this job's tasks start their slots' producers after this, which fences those again,
        harmlessly). Once a job. Returns the partitions fenced (the count by source topic, for
        :attr:`WriterPlan.fenced`): fenced in each Python worker's first task instead, they held up its write
        by about 0.6 s."""
        WriterTransaction(plan.settings.values(), DRIVER_WRITER_SLOT, 0,
                          producers=plan.writer_producers).fence_unused(keep=(DRIVER_WRITER_SLOT,))
        fenced = {s.source_topic: s.source_partitions for s in plan.settings.values() if s.delivery == "exactly_once"}
        keys = [(topic, p) for topic, count in fenced.items() for p in range(count)]
        if keys:
            with ThreadPoolExecutor(max_workers=min(FENCE_THREADS, len(keys)),
                                    thread_name_prefix="mirrorflow-fence") as pool:
                failed = BatchWriter(plan).prepare_shared_many(keys, pool, read_positions=False)
            if failed:
                raise failed[0][1]
        return fenced

    def _fenced_for_tasks(self, plan: WriterPlan) -> dict[str, int]:
        """What :meth:`_fence_task_slots` fenced for this job: its background run from the warm-up, waited for,
        or (none, or it failed) a run now, whose failure fails the batch."""
        if self._task_fenced is None:
            fence, self._task_fence = self._task_fence, None
            try:
                if fence is None:
                    raise LookupError("no warm-up")
                self._task_fenced = fence.result()
            except Exception as exc:  # noqa: BLE001 - done again here, where a failure fails the batch
                log.debug("%s: the task slots were not fenced ahead (%s); fencing them now", self.group.name, exc)
                self._task_fenced = self._fence_task_slots(plan)
        return self._task_fenced

    def _driver_slot(self) -> tuple[int, int]:
        """The driver's writer slot and the slots its job uses (``transactions: per_writer``): with
        ``read_path: executors`` the last slot, beside its tasks' (it fences only what no one uses)."""
        if self.group.spark.reads_in_tasks:
            return DRIVER_WRITER_SLOT, WRITER_SLOTS
        return 0, 1

    def _read_group(self) -> str | None:
        """The ``group.id`` mirrorflow's source readers give (a formality: they never join or commit)."""
        return min(self.consumer_groups.values(), default=None)

    def _write_ranges(self, plan: WriterPlan, ranges: list[Any]) -> list[dict[str, Any]]:
        """Read ``ranges`` from the source and write them: by the writer processes, or by the driver."""
        from mirror_core.direct import DirectReader, write_ranges

        pool = self._writer_pool()
        if pool is not None:
            return pool.write(plan, ranges)
        if self._direct is None:
            quiet_gc()  # the driver reads and writes the records itself
            self._direct = DirectReader(self.src, self.group.name, consumer_group=self._read_group())
        return write_ranges(plan, ranges, self._direct, DRIVER_THREADS, *self._driver_slot())

    def keep_writing(self, plan: WriterPlan, batch_id: int, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``spark.keep_writing_for``: once a small batch's own ranges are written (``rows``), go on writing what
        arrives on its partitions, a range per partition from where it stands to the source's last stable
        offset, until the span is over or the job is asked to stop, and return the batch's rows with those
        writes' merged in. Spark's per-batch work (offsets, planning, its logs, the call into Python) is paid
        once a span instead of once a write. Each writer process does so for its own partitions, on its own
        (:meth:`~mirror_core.direct.WriterPool.keep`); without them, the driver. Ends early, leaving the rest to
        Spark's batches, when what arrived exceeds :data:`OVERLAP_MAX_RECORDS` offsets (a backlog: Spark's
        larger batches drain it) or a partition's end moved back (Spark's next batch sees it and starts the
        partition over). With ``MIRRORFLOW_KEEP_THROUGH_SPARK=1`` (an experiment, off: slower on two cores, see
        README) writer processes whose span ended so are left writing while Spark records the batch and plans
        the next: the next batch ends their keep first (:meth:`end_keep`) and counts their writes. The next
        batch reads from where this one stopped (:func:`past_written_ahead`); a job that dies meanwhile starts
        from Spark's offset log, before those writes: exactly_once writers skip what their committed positions
        cover, at_least_once ones write it again, as after any crash. A batch of more offsets, with partitions
        whose end moved back, or with the setting off, returns ``rows`` as they are."""
        from mirror_core.direct import keep_on, merge_rows

        span = self.group.spark.keep_writing_for
        if not span or plan.rewound:
            return rows
        planned = self._starts.get(batch_id)
        # what this batch wrote itself: after a batch that kept writing, Spark's batch spans those writes too
        n = self.batch_records(batch_id) if planned is None else offsets_between(*planned)
        if n is None or n > OVERLAP_MAX_RECORDS:
            return rows
        ends = planned[1] if planned is not None else self.batch_ends(batch_id)
        at = {(t, p): max(end, self._ahead.get((t, p), end))
              for t, parts in ends.items() if t in plan.settings for p, end in parts.items()}
        if not at:
            return rows
        pool = self._writer_pool()
        if pool is not None:
            kept = pool.keep(plan, at, span, OVERLAP_MAX_RECORDS, self.stop_requested,
                             leave_running=os.environ.get("MIRRORFLOW_KEEP_THROUGH_SPARK") == "1")
            if kept is None:  # they write on while Spark plans the next batch, which ends their keep first
                self._keeping_from = at
                return rows
        else:
            kept = keep_on(plan, at, span, self._stable_ends, self._write_ranges, self.stop_requested,
                           OVERLAP_MAX_RECORDS)
        self._took(batch_id, kept, at)
        return merge_rows(rows, kept.rows) if kept.rows else rows

    def end_keep(self, batch_id: int) -> list[dict[str, Any]]:
        """Stop the writer processes left keeping on by the batch before (:meth:`keep_writing`) after their
        write in progress and count what they wrote since that batch's own write to ``batch_id``: its rows
        (empty when none were left writing). Where they stopped is where ``batch_id`` reads from."""
        at, self._keeping_from = self._keeping_from, None
        if at is None or self._pool is None:
            return []
        kept = self._pool.end_keep()
        if kept is None:
            return []
        self._took(batch_id, kept, at)
        return kept.rows

    def _took(self, batch_id: int, kept: Any, at: dict[tuple[str, int], int]) -> None:
        """Count a keep that began at ``at`` to ``batch_id``: the expired-record check of its writes that read
        from past their start, where it left each partition (the next batch reads from there), its writes."""
        expired = sum(self.report_expired(batch_id, got, (starts, gap_ends)) for starts, gap_ends, got in kept.gaps)
        self._ahead.update({k: o for k, o in kept.at.items() if o > at[k]})
        writes, before = self._kept.get(batch_id, (0, 0))
        self._kept = {batch_id: (writes + kept.writes, before + expired)}

    def _stable_ends(self, at: dict[tuple[str, int], int]) -> dict[tuple[str, int], int] | None:
        """The source's last stable offsets of the partitions of ``at`` (see
        :func:`~mirror_core.direct.stable_ends`)."""
        from mirror_core.direct import stable_ends

        if self._src_admin is None:
            self._src_admin = clients.admin(self.src)
        return stable_ends(self._src_admin, list(at), self.group.name)

    def written_log(self) -> WrittenLog:
        if self._written is None:
            self._written = WrittenLog(self.checkpoint_dir(), self.checkpoint_files)
        return self._written

    def replay_starts(self, starts: dict[str, dict[int, int]], keep: Iterable[tuple[str, int]] = ()
                      ) -> dict[str, dict[int, int]]:
        """Where this process's first direct batch reads from: ``starts`` (from Spark's offset log), moved back
        to what the written log says is on the destination where that is less, since with
        ``spark.overlap_writes`` Spark records a batch as done while its write runs on, and a job may have died
        during it (or during the re-read of a job before it). Its exactly_once writers skip what is already on
        the destination (by their committed positions); at_least_once ones write it again. Records the result
        in the written log before anything is written, so a job that dies before its first write has finished
        leaves a log that still goes back far enough. Without a log (a checkpoint from before it, or a new
        query) the starts are taken as they are: Spark only recorded batches as done once written. Partitions
        in ``keep`` (whose end moved back: they are read from their first offset anyway) keep their starts."""
        log_ = self.written_log()
        written = log_.last()
        out = starts if written is None else replay_starts(starts, written)
        for t, p in keep:
            if p in starts.get(t, {}):
                out[t][p] = starts[t][p]
        if out != starts:
            back = sum(starts[t][p] - max(o, 0) for t, parts in out.items() for p, o in parts.items()
                       if o != starts[t][p])
            log.info("%s: reading again from what was last known written (at most %d records back: a batch may "
                     "not have been written when the job before stopped)", self.group.name, back)
        log_.add(out)
        return out

    def rewind_unwritten_batch(self) -> int | None:
        """Before the query starts: if Spark recorded its newest batch as done (a commit-log entry for the newest
        offset-log entry) but the written log says part of it is not on the destination (its write ran on
        under ``spark.overlap_writes`` and the job died during it), remove that commit-log entry, so Spark
        runs the batch again at once, and its first batch goes back to what was written
        (:meth:`replay_starts`). Without this the missing records would wait for the next record to arrive
        (a quiet source runs no batch; ``--once`` would end without them). Returns the batch id taken back."""
        ck = self.checkpoint_dir()
        commits, offsets = join_location(ck, "commits"), join_location(ck, "offsets")
        done = [int(n) for n in self.checkpoint_files.names(commits) if n.isdigit()]
        planned = [int(n) for n in self.checkpoint_files.names(offsets) if n.isdigit()]
        if not done or not planned or max(done) != max(planned):
            return None  # a new query, or Spark runs its newest planned batch again anyway
        written = self.written_log().last()
        if written is None:
            return None  # a checkpoint from before the log: Spark recorded batches as done once written
        n = max(done)
        ends = read_batch_end_offsets(ck, n, self.read_checkpoint)
        if not ends or replay_starts(ends, written) == ends:
            return None
        self.checkpoint_files.delete(join_location(commits, str(n)))
        self.checkpoint_files.delete(join_location(commits, f".{n}.crc"))  # a local file system's checksum
        log.info("%s: batch %d was recorded by Spark but not all of it is known written; it runs again",
                 self.group.name, n)
        return n

    def overlaps(self, batch_id: int, plan: WriterPlan | None = None) -> bool:
        """Whether batch ``batch_id``'s write runs on while Spark goes on (``spark.overlap_writes``): a batch of
        at most :data:`OVERLAP_MAX_RECORDS` offsets, as a running mirror's are. A larger one (a backlog, a
        drain) is written before Spark goes on: Spark's part is small next to its write, and on two cores
        the overlap slowed 100-byte drains by 7-21 % (Spark's planning then competes with the writers).
        Nor a batch with a partition whose end moved back (``plan.rewound``, read from its first offset): the
        written log keeps the old topic's larger end for it until the batch is written, so a crash during an
        overlapped write would leave Spark's record of the batch and a log that calls the new records written."""
        if not self.group.spark.reads_directly or not self.group.spark.overlap_writes:
            return False
        if plan is not None and plan.rewound:
            return False
        n = self.batch_records(batch_id)
        return n is not None and n <= OVERLAP_MAX_RECORDS

    def write_direct_behind(self, plan: WriterPlan, batch_id: int, done: Callable[[list[dict[str, Any]]], None]
                            ) -> None:
        """``spark.overlap_writes``: :meth:`write_direct` on a thread of its own, so that Spark records the batch
        and plans the next one meanwhile; ``done(rows)`` runs on that thread once it is written. At most one
        batch is in flight: call :meth:`wait_for_write` first."""
        if self._inflight is not None:
            raise RuntimeError("the write of the batch before has not been waited for")
        if self._behind is None:
            self._behind = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirrorflow-write")
        self._inflight = self._behind.submit(lambda: done(self.write_direct(plan, batch_id)))

    def wait_for_write(self, timeout: float | None = None) -> None:
        """Wait for the batch :meth:`write_direct_behind` writes, if any; raises what stopped it. Raises
        ``TimeoutError`` if it is still running after ``timeout`` seconds (it is still waited for next time)."""
        f = self._inflight
        if f is None:
            return
        if not wait([f], timeout).done:
            raise TimeoutError(f"the last micro-batch is still being written after {timeout:.0f}s")
        self._inflight = None
        f.result()

    def direct_processes(self) -> int:
        """Writer processes of the direct path (``spark.direct_processes``; 0 = one per core, at most 4)."""
        n = self.group.spark.direct_processes
        return n if n > 0 else max(1, min(4, os.cpu_count() or 1))

    def _writer_pool(self) -> Any:
        """The direct path's :class:`~mirror_core.direct.WriterPool`, or None when the driver writes."""
        if not self.group.spark.reads_directly or self.direct_processes() < 2:
            return None
        if self._pool is None:
            from mirror_core.direct import WriterPool

            self._pool = WriterPool(self.src, self.group.name, self.direct_processes(), DRIVER_THREADS,
                                    consumer_group=self._read_group())
        return self._pool

    def close(self) -> None:
        """Finish the last source-offset commit, close the direct path's source consumer and writer processes
        (if any)."""
        try:
            self.wait_for_write(60.0)
        except Exception as exc:  # noqa: BLE001 - closing: the next start re-reads that batch
            log.error("%s: the last micro-batch was not written: %s", self.group.name, exc)
        if self._behind is not None:
            self._behind.shutdown(wait=False)
        if not self.wait_for_commits():
            log.warning("%s: the last source-offset commit did not finish within 10s; the consumer group on the "
                        "source may show the batch before", self.group.name)
        if self._direct is not None:
            self._direct.close()
        if self._pool is not None:
            self._pool.close()

    def report_expired(self, batch_id: int, rows: list[dict[str, Any]],
                       planned: tuple[dict[str, dict[int, int]], dict[str, dict[int, int]]] | None = None) -> int:
        """Records that retention removed from the source before they were mirrored: a partition of the batch
        whose first record read lies past the batch's start (or that brought no record at all although its
        range was not empty) while the source's log now starts past that start. Logged with the counts and
        counted in ``mirrorflow_records_expired_total``; returns the total."""
        from mirror_core import metrics

        starts, ends = planned or self._starts.get(batch_id) or (self.batch_starts(batch_id), self.batch_ends(batch_id))
        first = {(r["topic"], r["partition"]): r.get("first_offset") for r in rows}
        lows: dict[str, dict[int, tuple[int, int]]] = {}
        total = 0
        for t, parts in ends.items():
            s = self.settings.get(t)
            if s is None:
                continue
            for p, end in parts.items():
                start = starts.get(t, {}).get(p, -1)
                read = first.get((t, p))
                if start < 0 or end <= start or (read is not None and read <= start):
                    continue  # nothing planned, moved back, or read from where the mirror stood
                if t not in lows:
                    lows[t] = clients.end_offsets(self.src, t)
                low = lows[t].get(p, (0, 0))[0]
                if low <= start:
                    continue  # a gap of compaction, aborted records or markers: nothing lost
                lost = min(read if read is not None else end, low) - start
                total += lost
                log.warning("%s: %s[%d]: %d records (offsets %d-%d) expired on the source (retention) before "
                            "they were mirrored", self.group.name, t, p, lost, start, start + lost - 1)
                metrics.EXPIRED.labels(self.group.name, s.mirror).inc(lost)
        return total

    def batch_ends(self, batch_id: int) -> dict[str, dict[int, int]]:
        """End offsets of micro-batch ``batch_id`` from Spark's offset log. An offset-log file never changes
        once written, so the last few are kept: each batch reads one file (an object-store GET on s3a)."""
        got = self._offset_log.get(batch_id)
        if got is None:
            got = read_batch_end_offsets(self.checkpoint_dir(), batch_id, self.read_checkpoint)
            if got:
                self._offset_log[batch_id] = got
                for old in [b for b in self._offset_log if b < batch_id - 2]:
                    del self._offset_log[old]
        return got

    def check_placement(self, batch_id: int) -> None:
        """Refuse a switch of existing partitions from keeping their numbers to key hashing.

        A mirror places records by key hash when its destination has fewer partitions than the source.
        When the batch before this one read the topic only from partitions that the destination has, the
        mirror ran with partition-preserving placement and the source has grown past what the destination
        may have since (``partition_count`` max): hashing from now on would break per-key order across the
        switch and exact offsets. Unless ``topics_mirroring.allow_placement_change`` says so, raise."""
        hashed = [s for s in self.settings.values() if s.destination_partitions < s.source_partitions
                  and not self.placement_change_allowed.get(s.source_topic, False)]
        if not hashed or batch_id < 1:
            return
        before = self.batch_ends(batch_id - 1)
        for s in hashed:
            parts = before.get(s.source_topic)
            if parts and max(parts) < s.destination_partitions and not self._destination_grows(s.source_topic):
                raise PlacementChangeError(
                    f"{s.mirror}: source topic {s.source_topic} grew to {s.source_partitions} partitions but "
                    f"{s.destination_topic} may have only {s.destination_partitions} (partition_count): its "
                    f"records would switch from keeping their partition to key hashing; raise partition_count's "
                    f"max or set topics_mirroring.allow_placement_change: true")

    def _destination_grows(self, topic: str, timeout: float = 30.0) -> bool:
        """The partition rule gives the destination as many partitions as the source: wait (with a deadline)
        for the growth just applied to show in the destination's metadata, and take the new settings."""
        rule = self.partition_rules.get(topic)
        s = self.settings[topic]
        if rule is None or rule.resolve(s.source_partitions) < s.source_partitions:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._refresh_settings()
            s = self.settings[topic]
            if s.destination_partitions >= s.source_partitions:
                return True
            time.sleep(0.5)
        return False

    def warm_up(self) -> threading.Thread | None:
        """In the background: start every mirrored partition's producer and read its position, so the
        driver's first micro-batch finds them ready (runs while Spark plans and reads that batch). Makes the
        admin clients the batches ask through (the destination check's; with ``keep_writing_for``, the
        source's)."""
        # the admin clients a batch asks through are made now, not at the first batch's first question: a new
        # client's first request can wait 1-3 s (replicate.markers_admin)
        if self.destination_ids and self._dst_admin is None:
            self._dst_admin = self._dst_admin_factory()  # check_destinations
        if self.group.spark.keep_writing_for and self._src_admin is None:
            self._src_admin = clients.admin(self.src)  # _stable_ends
        plan: WriterPlan | None = None
        if self.group.spark.reads_in_tasks and self.group.spark.writes_per_writer and self._task_fence is None:
            # some 60 ids, 1-2 s: while Spark starts and plans the first batch (write_in_tasks waits for it)
            plan = self.writer_plan(-1)
            one = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirrorflow-fence")
            self._task_fence = one.submit(self._fence_task_slots, plan)
            one.shutdown(wait=False)
        if not self.group.spark.driver_batch_max_records and not self.group.spark.reads_directly:
            return None  # the tasks write: their producers live in the Python workers
        if plan is None:
            plan = self.writer_plan(-1)
        pool = self._writer_pool()
        if pool is not None:
            pool.warm(plan)  # the writer processes start their partitions; the driver warms its committers
            t = self._warm_thread = threading.Thread(target=self._warm_committers, name="mirrorflow-warm-up",
                                                     daemon=True)
            t.start()
            return t
        bw = BatchWriter(plan)

        def run() -> None:
            from mirror_core.direct import _warm

            items = [(s.source_topic, p) for s in plan.settings.values() for p in range(s.source_partitions)]
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="mirrorflow-warm-up") as pool:
                committers = pool.submit(self._warm_committers)
                _warm(bw, items, DRIVER_THREADS, *self._driver_slot(), stop=self._warm_stop)
                committers.result()
            log.info("%s: %d partition writers ready in %.1fs", self.group.name, len(items), time.monotonic() - t0)

        t = self._warm_thread = threading.Thread(target=run, name="mirrorflow-warm-up", daemon=True)
        t.start()
        return t

    def stop_warm_up(self, timeout: float = 60.0) -> None:
        """Stop starting producers in the background (partitions being started finish first)."""
        self._warm_stop.set()
        if self._warm_thread is not None:
            self._warm_thread.join(timeout)

    def batch_records(self, batch_id: int) -> int | None:
        """How many offsets micro-batch ``batch_id`` spans (from Spark's offset log; the first batch from the
        source's initial offsets), or None when unknown (a new topic or partition, a symbolic offset)."""
        return offsets_between(self.batch_starts(batch_id), self.batch_ends(batch_id))

    def on_driver(self, batch_id: int) -> bool:
        """Write this micro-batch in the driver (see ``spark.driver_batch_max_records`` / ``_bytes``)."""
        limit = self.group.spark.driver_batch_max_records
        n = self.batch_records(batch_id) if limit else None
        if n is None or n > limit:
            return False
        per_record = self.bytes_per_record if self.bytes_per_record is not None else 1024.0
        return n * per_record <= self.group.spark.driver_batch_max_bytes

    def after_batch(self, batch_id: int, rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        """Commit source offsets under each mirror's consumer group, update metrics, return a summary."""
        from mirror_core import metrics

        commits: dict[str, list[tuple[str, int, int]]] = {}
        totals: dict[str, Any] = {"records": 0, "mirrored": 0, "dead_lettered": 0, "replayed_skipped": 0, "bytes": 0}
        phases = {"input": 0.0, "setup": 0.0, "produce": 0.0, "commit": 0.0}
        # latency samples (up to 200 per written chunk) go into the histogram thinned to about LATENCY_SAMPLES
        # a batch, at least one per partition: an observation costs some 3 us, on every micro-batch's path
        step = max(1, -(-sum(len(r["latency_ms"] or ()) for r in rows) // LATENCY_SAMPLES))
        for r in rows:
            s = self.settings.get(r["topic"])
            if s is None:
                continue
            labels = (self.group.name, s.mirror)
            metrics.RECORDS.labels(*labels).inc(r["mirrored"])
            metrics.BYTES.labels(*labels).inc(r["bytes_out"])
            metrics.DEAD.labels(*labels).inc(r["dead_lettered"])
            metrics.REPLAYED.labels(*labels).inc(r["replayed_skipped"])
            metrics.LOOPED.labels(*labels).inc(r["provenance_skipped"])
            metrics.MISSES.labels(*labels).inc(r["cache_misses"])
            if r["latency_ms"]:
                observe = metrics.LATENCY_MS.labels(*labels).observe
                for lat in r["latency_ms"][::step]:
                    observe(lat)
            if r["upstream_end"] is not None:
                cg = self.consumer_groups[r["topic"]]
                commits.setdefault(cg, []).append((r["topic"], r["partition"], r["upstream_end"]))
            totals["records"] += r["records_in"]
            totals["mirrored"] += r["mirrored"]
            totals["dead_lettered"] += r["dead_lettered"]
            totals["replayed_skipped"] += r["replayed_skipped"]
            totals["bytes"] += r["bytes_out"]
            for ph in phases:
                phases[ph] += r[f"{ph}_ms"] or 0.0
        metrics.BATCH_SECONDS.labels(self.group.name).observe(seconds)
        if totals["mirrored"]:
            recent = totals["bytes"] / totals["mirrored"]
            prev = self.bytes_per_record
            self.bytes_per_record = recent if prev is None else max(recent, 0.7 * prev + 0.3 * recent)
        # everything below the batch's ends is written (see WrittenLog): recorded before the batch returns to
        # Spark, so the log is never behind a batch Spark records as done unless that batch's write ran on
        # (spark.overlap_writes) and was cut short; on Spark's read path too, so that a job moving to the
        # direct path later does not go back to an old entry
        written = self._starts.get(batch_id, ({}, None))[1]
        if written:
            try:
                self.written_log().add(written)
            except Exception as exc:  # noqa: BLE001 - a lagging log is safe: a restart re-reads more
                log.warning("%s: could not record the written offsets in the checkpoint: %s", self.group.name,
                            exc)
        self._commit_in_background(commits)
        lats = [x for r in rows for x in (r["latency_ms"] or [])]
        totals["latency_p50_ms"] = round(statistics.median(lats), 1) if lats else None
        totals["expired"] = self.report_expired(batch_id, rows)
        kept = self._kept.pop(batch_id, None)
        if kept is not None:
            totals["kept_writing"] = kept[0]  # further writes of spark.keep_writing_for
            totals["expired"] += kept[1]
        totals["batch_id"] = batch_id
        totals["seconds"] = round(seconds, 3)
        # task time summed over partitions (tasks overlap, so the sum can exceed the batch's seconds)
        totals["task_ms"] = {ph: round(v) for ph, v in phases.items()}
        for ph, v in phases.items():
            metrics.PHASE_SECONDS.labels(self.group.name, ph).inc(v / 1000)
        return totals

    def _committer(self, cg: str) -> Any:
        with self._committers_lock:
            c = self._committers.get(cg)
            if c is None:
                c = self._committers[cg] = clients.consumer(self.src, cg)
            return c

    def _warm_committers(self) -> None:
        """Find each consumer group's coordinator before the first commit (about 1 s on a cold client)."""
        from confluent_kafka import TopicPartition

        for cg, topic in {cg: t for t, cg in list(self.consumer_groups.items())}.items():
            if self._warm_stop.is_set():
                return
            try:
                self._committer(cg).committed([TopicPartition(topic, 0)], timeout=10)
            except Exception as exc:  # noqa: BLE001 - only a head start: the first commit tries again
                log.debug("%s: committer warm-up for %s: %s", self.group.name, cg, exc)

    def _commit_in_background(self, commits: dict[str, list[tuple[str, int, int]]]) -> None:
        """Commit ``commits`` on a thread of its own once the previous batch's commit has finished, so they
        land in batch order. The commit is a round trip to the source's group coordinator that only monitoring
        reads (the mirror's own position is in the offset syncs): the next micro-batch does not wait for it,
        which shortens a continuous mirror's cycle by that round trip. A commit still running after a minute (the source unreachable) makes this batch's commit
        wait for the next batch's, which covers it."""
        if not self.wait_for_commits(60.0):
            log.warning("%s: the previous source-offset commit has not finished after 60s; this batch's "
                        "positions are committed with the next batch's", self.group.name)
            return
        if commits:
            t = self._commit_thread = threading.Thread(target=self._commit_quietly, args=(commits,),
                                                       name="mirrorflow-source-commit", daemon=True)
            t.start()

    def _commit_quietly(self, commits: dict[str, list[tuple[str, int, int]]]) -> None:
        try:
            self.commit_source_offsets(commits)
        except Exception as exc:  # noqa: BLE001 - a thread's traceback would be the only trace; one line instead
            log.warning("%s: could not commit source offsets: %s", self.group.name, exc)

    def wait_for_commits(self, timeout: float = 10.0) -> bool:
        """Wait up to ``timeout`` seconds for the source-offset commit in flight, if any; False if it is still
        running then."""
        t = self._commit_thread
        if t is None:
            return True
        t.join(timeout)
        if t.is_alive():
            return False
        self._commit_thread = None
        return True

    def commit_source_offsets(self, commits: dict[str, list[tuple[str, int, int]]]) -> None:
        """So kafka-consumer-groups and lag exporters see the mirror's position on the source; in requests of
        at most :data:`SOURCE_COMMIT_PARTITIONS` partitions."""
        from confluent_kafka import KafkaException, TopicPartition

        for cg, tps in commits.items():
            c = self._committer(cg)
            offsets = [TopicPartition(t, p, off) for t, p, off in tps]
            try:
                for i in range(0, len(offsets), SOURCE_COMMIT_PARTITIONS):
                    c.commit(offsets=offsets[i:i + SOURCE_COMMIT_PARTITIONS], asynchronous=False)
            except KafkaException as exc:
                # only monitoring depends on it (the mirror's own position is in the offset syncs): warn, go on;
                # the next batch commits again
                log.warning("%s: could not commit source offsets for %s: %s", self.group.name, cg,
                            exc.args[0].str())


#: a source-offset commit carries at most this many partitions: the group coordinator writes a commit as one
#: record batch, which must stay within the broker's message size limit (1 MB by default; a partition's entry
#: is some 200 bytes with short names, under 1 KB with the longest). 9,000 partitions in one commit failed on
#: every batch: "Unknown broker error", the broker's log saying the message was larger than it accepts
SOURCE_COMMIT_PARTITIONS = 1000
#: ``spark.overlap_writes``: batches of at most this many offsets run on while Spark plans the next
OVERLAP_MAX_RECORDS = 50_000
#: latency observations per micro-batch at most (about; see :meth:`MirrorRuntime.after_batch`)
LATENCY_SAMPLES = 400
DESTINATION_CHECK_TIMEOUT = 15.0  # one attempt of the per-batch destination check
DESTINATION_RETRY_PAUSE = 2.0


def offsets_between(starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]]) -> int | None:
    """How many offsets lie between ``starts`` and ``ends`` over all partitions, or None when unknown (no
    starts or ends, a partition or topic missing from ``starts`` or with a symbolic start). Pure."""
    if not ends or not starts:
        return None
    total = 0
    for topic, parts in ends.items():
        before = starts.get(topic, {})
        for p, end in parts.items():
            if before.get(p, -1) < 0:
                return None  # a new partition or topic (read from its start), or a symbolic offset
            total += max(0, end - before[p])
    return total


def after_carried(carried: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch's rows (``rows``, of its own ranges) after those of the writes the batch before's writer
    processes went on with (``carried``, earlier): counts added, positions from the batch's own write, and
    each partition's first offset from its own write too, since the batch's expired-record check is of its
    own ranges (the carried writes were checked on their own). Pure."""
    from mirror_core.direct import merge_rows

    own = {(r["topic"], r["partition"]): r.get("first_offset") for r in rows}
    out = merge_rows(carried, rows)
    for r in out:
        key = (r["topic"], r["partition"])
        if key in own:
            r["first_offset"] = own[key]
    return out


def past_written_ahead(starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]],
                       ahead: dict[tuple[str, int], int]
                       ) -> tuple[dict[str, dict[int, int]], dict[tuple[str, int], int]]:
    """A batch's ``starts`` moved up to where the batch before went on writing (``ahead``, see
    :meth:`MirrorRuntime.keep_writing`), and what is left of ``ahead`` after this batch: a partition whose
    ``ends`` reach its entry is caught up (dropped); one whose end lies below its start moved back (topic
    re-created, log truncated: dropped, the partition starts over as Spark plans it); one this batch does not
    plan stays. A start past its end leaves the partition no range in this batch. Pure."""
    out = {t: dict(parts) for t, parts in starts.items()}
    left: dict[tuple[str, int], int] = {}
    for (t, p), offset in ahead.items():
        end = ends.get(t, {}).get(p)
        if end is None:
            left[(t, p)] = offset
            continue
        start = starts.get(t, {}).get(p, -1)
        if start < 0 or end < start:
            continue
        out.setdefault(t, {})[p] = max(start, offset)
        if offset > end:
            left[(t, p)] = offset
    return out, left


def _unreachable(err: Any) -> bool:
    """A client error that means the cluster did not answer, or may answer if asked again (rather than
    refused)."""
    return bool(err.retriable()) or clients.no_answer(err)


def destination_topic_ids(admin: Any, topics: list[str], timeout: float = 30.0) -> dict[str, str | None]:
    """Each topic's id (a string), None for a topic that does not exist."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection

    if not topics:
        return {}
    out: dict[str, str | None] = {}
    for topic, fut in admin.describe_topics(TopicCollection(topics), request_timeout=timeout).items():
        try:
            out[topic] = str(fut.result(timeout).topic_id)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
            out[topic] = None
    return out


def default_provenance(configured: bool | None, source_topic: str, destination_topic: str) -> bool:
    """Whether a mirror marks records with the provenance header (and skips those that came from its
    destination): as configured, else on for identity naming (the destination topic has the source topic's
    name). A reverse flow with identity naming -- from another file, another process or MirrorMaker 2 --
    maps such a topic straight back onto the original, and nothing in one config can rule that out; a
    renamed or prefixed topic is not mapped back by a reverse identity or prefix flow."""
    if configured is not None:
        return configured
    return source_topic == destination_topic


def rewound_partitions(starts: dict[str, dict[int, int]], ends: dict[str, dict[int, int]], topics: set[str]
                       ) -> dict[tuple[str, int], tuple[int, int]]:
    """Partitions of ``topics`` whose batch end lies below the batch start: ``(start, end)`` each. Pure."""
    out = {}
    for t, parts in ends.items():
        if t not in topics:
            continue
        for p, end in parts.items():
            start = starts.get(t, {}).get(p, -1)
            if start >= 0 and 0 <= end < start:
                out[(t, p)] = (start, end)
    return out


def replay_starts(starts: dict[str, dict[int, int]], written: dict[str, dict[int, int]]
                  ) -> dict[str, dict[int, int]]:
    """``starts`` moved back to ``written`` (offsets below which everything is on the destination) where that
    is less; a partition ``written`` does not know (it came later) from its first offset (-1). A negative,
    symbolic start already reads from the first offset. Pure."""
    out = {t: dict(parts) for t, parts in starts.items()}
    for t, parts in starts.items():
        for p, start in parts.items():
            back = written.get(t, {}).get(p, -1)
            if start >= 0 and back < start:
                out[t][p] = back if back >= 0 else -1
    return out


def effective_max_offsets(spark: Any, partitions: int = 0) -> int | None:
    """The records cap per micro-batch: the configured one; unset on a ``local[...]`` master, the driver
    batch size, so a backlog goes through the driver's warm writer in driver-sized batches (the tasks
    would share the same cores and add a Python-worker hop) -- with ``read_path: direct`` (or ``executors``),
    where nothing is collected, :data:`DIRECT_BATCH_RECORDS` (or
    :data:`DIRECT_BATCH_RECORDS_PER_PARTITION` times the group's ``partitions`` when that is more), so
    Spark's planning and logs between batches (0.1-0.25 s) stay small next to the writing; unset elsewhere,
    none (large batches are written by tasks spread over the executors, or read by the driver in chunks)."""
    if spark.max_offsets_per_trigger:
        return int(spark.max_offsets_per_trigger)
    if spark.master.startswith("local") and spark.plans_only:
        from mirror_core.direct import whole_number_env

        per = whole_number_env(DIRECT_BATCH_PER_PARTITION_ENV, DIRECT_BATCH_RECORDS_PER_PARTITION, "records")
        return max(DIRECT_BATCH_RECORDS, per * partitions)
    if spark.master.startswith("local") and spark.driver_batch_max_records:
        return int(spark.driver_batch_max_records)
    return None


def heartbeat_selection(group: GroupConfig, policy: ReplicationPolicy, source_topics: list[str],
                        chosen: list[TopicSelection]) -> TopicSelection | None:
    """The group's heartbeats topic as one more mirror, when heartbeats are on and the topic exists.

    Named by the replication policy (``heartbeats`` under identity, ``<source-alias>.heartbeats``
    under prefix), copied as bytes (no schema translation), with the group's delivery and error
    handling. User flows never select it (it is an internal topic); an explicit user mirror of the
    same topic wins. Pure.
    """
    hb = group.heartbeats
    if not hb.enabled or hb.topic not in source_topics or any(c.source_topic == hb.topic for c in chosen):
        return None
    base = resolve_mirrors(group)[0]
    dst = policy.format_remote_topic(group.source, hb.topic)
    settings = base.settings.model_copy(update={
        "serdes": base.settings.serdes.model_copy(update={"key": "bytes", "value": "bytes"}),
        "delivery": group.delivery, "on_error": group.on_error,
        "provenance_headers": group.provenance_headers,
    })
    mirror = base.model_copy(update={
        "source_topic": hb.topic, "destination_topic": dst, "topics": None,
        "name": mirror_name(group.name, hb.topic, dst),
        "consumer_group": default_consumer_group(group.name, hb.topic, dst), "settings": settings,
    })
    return TopicSelection(mirror, hb.topic, dst)


def ensure_heartbeats_topic(admin: Any, topic: str, source: ClusterState, destination: ClusterState,
                            source_topic: str) -> None:
    """Create the destination heartbeats topic like MM2 does (compacted), with the source's partitions."""
    from confluent_kafka.admin import NewTopic

    parts = source.topics[source_topic].partitions
    rf = max(1, min(3, destination.broker_count))
    try:
        create_topics(admin, [NewTopic(topic, parts, rf, config={"cleanup.policy": "compact"})], timeout=30)
        log.info("created %s (%d partitions, RF %d) for mirrored heartbeats", topic, parts, rf)
    except KafkaOperationError as exc:
        if exc.code != "TOPIC_ALREADY_EXISTS":
            log.error("cannot create heartbeats topic %s: %s", topic, exc)


def raise_plan_errors(plan: Any) -> None:
    from mirror_core.errors import PlanError

    raise PlanError("; ".join(f"{a.topic}: {a.reason}" for a in plan.topics.blocking))


def read_initial_offsets(checkpoint_dir: str, read: CheckpointReader = local_checkpoint_reader
                         ) -> dict[str, dict[int, int]]:
    """Where the query's first micro-batch starts, per partition (the Kafka source's initial offsets,
    kept in the checkpoint), or {} when not known."""
    try:
        return _offsets_json(read(join_location(checkpoint_dir, "sources", "0", "0")), skip=0)
    except (ValueError, AttributeError):
        return {}


def read_batch_end_offsets(checkpoint_dir: str, batch_id: int, read: CheckpointReader = local_checkpoint_reader
                           ) -> dict[str, dict[int, int]]:
    """End offsets of micro-batch ``batch_id`` from Spark's offset log (written before the batch runs)."""
    if batch_id < 0:
        return {}
    return _offsets_json(read(join_location(checkpoint_dir, "offsets", str(batch_id))), skip=2)


def _offsets_json(text: str | None, skip: int) -> dict[str, dict[int, int]]:
    """``{topic: {partition: offset}}`` from the JSON lines of a Spark checkpoint file, after its first
    ``skip`` lines (version, batch metadata); {} when the file is not there (``text`` None)."""
    if text is None:
        return {}
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines()[skip:]:
        line = line.strip()
        if line.startswith("{"):
            for topic, parts in json.loads(line).items():
                out[topic] = {int(p): int(o) for p, o in parts.items()}
    return out


# --------------------------------------------------------------------------- executor side


class LazySchemaResolver:
    """On a schema-id or GUID miss: register the source schema under the mapped subject on the destination
    (:class:`mirror_core.schemas.SchemaResolver`). Lazy: the registry clients are only built on the first
    miss (most batches have none)."""

    def __init__(self, registries: tuple[Any, Any], source_topic: str, destination_topic: str):
        self.registries, self.source_topic, self.destination_topic = registries, source_topic, destination_topic
        self._resolver: Any = None

    def _get(self) -> Any:
        if self._resolver is None:
            from mirror_core import schemas

            self._resolver = schemas.make_id_resolver(self.registries[0], self.registries[1], self.source_topic,
                                                      self.destination_topic)
        return self._resolver

    def __call__(self, source_id: int) -> int | None:
        return self._get()(source_id)  # type: ignore[no-any-return]

    def guid(self, source_guid: bytes) -> bytes | None:
        return self._get().guid(source_guid)  # type: ignore[no-any-return]


def make_resolver(registries: tuple[Any, Any] | None, source_topic: str, destination_topic: str
                  ) -> LazySchemaResolver | None:
    """The schema resolver of one mirror's writers (None without registries)."""
    if registries is None:
        return None
    return LazySchemaResolver(registries, source_topic, destination_topic)


#: per Python worker: one translator per (group, source topic, destination topic), so ids resolved on a
#: miss stay known to later tasks of the same worker
_TRANSLATORS: dict[tuple[str, str, str], SchemaIdTranslator] = {}


def translator_for(plan: WriterPlan, s: WriterSettings) -> SchemaIdTranslator:
    key = (s.group, s.source_topic, s.destination_topic)
    t = _TRANSLATORS.get(key)
    if t is None:
        t = _TRANSLATORS[key] = SchemaIdTranslator(plan.id_map, make_resolver(plan.registries, s.source_topic,
                                                                              s.destination_topic))
    else:
        t.id_map.update(plan.id_map)
    return t


class PlacementChangeError(MirrorError):
    """A source topic outgrew its destination's allowed partitions while mirrored partition to partition."""


class UnknownTopicError(MirrorError):
    """A micro-batch brought records of a topic the plan has no settings for and did not rule out: passing
    them over would lose them (Spark commits the batch), so the batch fails."""


def coalesce_records() -> int:
    """:data:`COALESCE_RECORDS`, or :data:`COALESCE_RECORDS_ENV` when set (0: each chunk written as it came)."""
    from mirror_core.direct import whole_number_env

    return whole_number_env(COALESCE_RECORDS_ENV, COALESCE_RECORDS, "records")


def coalesced(q: queue.SimpleQueue[Any], measure: Callable[[Any], tuple[int, int]], most_records: int,
              most_bytes: int | None = None) -> Iterator[list[Any]]:
    """The items of ``q`` up to its end (a None), in order, grouped: each group is the next item (waited for)
    and those behind it in ``q`` at that moment (never waited for), while they stay within ``most_records``
    records and ``most_bytes`` bytes (``measure(item)``: its records and bytes; an item alone is a group
    whatever its size)."""
    carry = None  # taken from the queue past the last group's bounds: it starts the next group
    while True:
        first = carry if carry is not None else q.get()
        if first is None:
            return
        group, carry = [first], None
        records, size = measure(first)
        while True:
            try:
                nxt = q.get_nowait()
            except queue.Empty:
                break
            if nxt is None:
                yield group
                return
            n, b = measure(nxt)
            if records + n > most_records or (most_bytes is not None and size + b > most_bytes):
                carry = nxt
                break
            group.append(nxt)
            records, size = records + n, size + b
        yield group


class BatchWriter:
    """One micro-batch's writing, partition by partition: chunks to each partition's writer, then the
    position moved past trailing transaction markers. Used by the tasks (:func:`arrow_writer`) and by
    the driver (both through :func:`write_batches`, one thread per partition)."""

    def __init__(self, plan: WriterPlan):
        self.plan = plan
        self.results: dict[tuple[str, int], BatchResult] = {}
        self._writers: dict[str, PartitionWriter] = {}
        self._lock = threading.Lock()

    def _writer(self, topic: str, s: WriterSettings) -> PartitionWriter:
        with self._lock:
            w = self._writers.get(topic)
            if w is None:
                cc = self.plan.destination_consumer_config

                def lookup(t: str, p: int) -> Any:
                    return last_committed_sync(cc, s.offset_syncs_topic, t, p, destination=s.destination_topic)

                def lookup_many(t: str, ps: list[int]) -> Any:
                    return last_committed_syncs(cc, s.offset_syncs_topic, t, ps, destination=s.destination_topic)

                w = self._writers[topic] = PartitionWriter(s, translator_for(self.plan, s), lookup,
                                                           positions_lookup=lookup_many)
            return w

    def prepare(self, topic: str, part: int) -> None:
        """Start the partition's producer and read its position ahead of its first records."""
        s = self.plan.settings.get(topic)
        if s is not None:
            self._writer(topic, s).prepare(part)

    def feed(self, topic: str, part: int, cols: Columns, chunk_records: int = CHUNK_RECORDS) -> None:
        """Write the next records of ``topic``/``part`` (in offset order), a transaction (or flush) each
        ``chunk_records`` of them (and ``replicate.CHUNK_BYTES``)."""
        s = self.plan.settings.get(topic)
        if s is None:
            if topic in self.plan.ignored:
                return  # looked at and not selected by this group's mirrors (e.g. excluded by a flow)
            raise UnknownTopicError(
                f"{self.plan.group or 'mirror'}: the batch holds records of source topic {topic!r} "
                f"[{part}]@{cols.offsets[0]}, which no mirror of the group was set up for (a new topic "
                f"not provisioned?); failing the batch instead of passing them over")
        w = self._writer(topic, s)
        end = self.plan.end_offsets.get(topic, {}).get(part)
        for start in range(0, len(cols), chunk_records):
            chunk = cols.slice(start, start + chunk_records) if len(cols) > chunk_records else cols
            is_last = end is not None and chunk.offsets[-1] >= end - 1
            r = w.write(part, chunk, end if is_last else None)
            with self._lock:
                _merge(self.results, r)

    def _after_a_lost_record(self, txn: WriterTransaction, producer: Any, lost: Any, wait: float) -> Any:
        """at_least_once, ``transactions: per_writer``: the shared gapless producer lost a record (``lost``, its
        fatal error, raised by the flush) and stopped, which fails every record it still held. Takes the
        delivery reports still due, so each partition's show whether all its records landed, then replaces
        the producer; returns the new one (for the offset syncs of the partitions that keep their records)."""
        from confluent_kafka import KafkaException

        log.info("%s: the writer's shared producer lost a record (%s); what did not land is written again "
                 "partition by partition", self.plan.group, lost.args[0].str())
        deadline = time.monotonic() + wait
        while True:
            try:
                flush_within(producer, max(0.0, deadline - time.monotonic()), self.plan.group)
                break
            except KafkaException:  # the fatal error again: the reports after it are still due
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
        txn.drop()
        return txn.producer()

    def read_positions_again(self, keys: Iterable[tuple[str, int]], fence_again: bool = False) -> None:
        """``transactions: per_writer`` in a Spark task: the positions this process keeps of ``keys`` may be behind
        (another process wrote them since, see
        :meth:`~mirror_core.replicate.PartitionWriter.forget_written_elsewhere`): forget them, and read the
        exactly-once ones again at once (each partition's own id fenced first, once in this process, or with
        ``fence_again`` now, whatever this process did before: a retry of the task; a lookup a topic). Read as
        each transaction first took a partition, a task of 24 partitions read them in five rounds of 0.6 s."""
        unknown = []
        for topic, part in keys:
            s = self.plan.settings.get(topic)
            if s is not None:
                w = self._writer(topic, s)
                w.forget_written_elsewhere(part)
                if s.delivery == "exactly_once":
                    if fence_again:
                        w.fence_again(part)
                    elif part < self.plan.fenced.get(topic, 0):
                        w.fenced_by_the_driver(part)
                    unknown.append((w, part))
        self._read_positions(unknown)

    def add_setup(self, topic: str, part: int, ms: float) -> None:
        """Count ``ms`` more of the partition's setup (time its writer waited for its producer and position to
        be made ready elsewhere, :func:`~mirror_core.direct.write_ranges` in a Spark task), once it has a
        result (a range of no records has none: its row stays as it was)."""
        with self._lock:
            r = self.results.get((topic, part))
            if r is not None:
                r.setup_ms += ms

    def prepare_many(self, keys: list[tuple[str, int]], pool: ThreadPoolExecutor
                     ) -> list[tuple[tuple[str, int], BaseException]]:
        """A transaction per partition (a Spark task's share, ``read_path: executors``): start each partition's
        producer (on ``pool``'s threads; an exactly-once producer's start fences a zombie of its id), then read
        the exactly-once partitions' positions not known yet in one lookup a topic, as
        :meth:`prepare_shared_many` does for ``per_writer``. Returns the partitions that failed, with their
        errors; their first write tries again. Each partition's first write read its own position alone: a
        lookup reads the offset-sync topic's tail, some 0.5 s of a task's writer threads a partition."""
        return self._prepare_many(keys, pool, started=True)

    def prepare_shared(self, topic: str, part: int) -> None:
        """``transactions: per_writer``: fence the partition's own transactional id and read its position."""
        s = self.plan.settings.get(topic)
        if s is not None and s.delivery == "exactly_once":
            self._writer(topic, s).prepare_shared(part)

    def prepare_shared_many(self, keys: list[tuple[str, int]], pool: ThreadPoolExecutor,
                            stop: threading.Event | None = None, read_positions: bool = True
                            ) -> list[tuple[tuple[str, int], BaseException]]:
        """:meth:`prepare_shared` of many partitions: fence each (on ``pool``'s threads: a fence is a producer
        of its own), then read the positions of each topic's fenced partitions in one lookup (not with
        ``read_positions`` False: only the fences). Returns the partitions that failed, with their errors;
        their first write tries again. One lookup per partition read the sync topic's tail once for each: at
        1,000 partitions that was most of a writer's start."""
        return self._prepare_many(keys, pool, started=False, stop=stop, read_positions=read_positions)

    def _prepare_many(self, keys: list[tuple[str, int]], pool: ThreadPoolExecutor, started: bool,
                      stop: threading.Event | None = None, read_positions: bool = True
                      ) -> list[tuple[tuple[str, int], BaseException]]:
        """:meth:`prepare_many` (``started``: every partition's producer started) and :meth:`prepare_shared_many`
        (the exactly-once partitions' own ids fenced), then the exactly-once positions read a lookup a topic."""
        failed: list[tuple[tuple[str, int], BaseException]] = []
        writers: dict[str, tuple[PartitionWriter, list[int]]] = {}
        for topic, part in keys:
            s = self.plan.settings.get(topic)
            if s is not None and (started or s.delivery == "exactly_once"):
                writers.setdefault(topic, (self._writer(topic, s), []))[1].append(part)

        def first(item: tuple[PartitionWriter, int]) -> None:
            w, part = item
            if stop is not None and stop.is_set():
                return
            try:
                if started:
                    w.start(part)
                else:
                    w.fence_shared(part)
            except Exception as exc:  # noqa: BLE001 - the first write tries again
                failed.append(((w.s.source_topic, part), exc))

        def read(item: tuple[PartitionWriter, list[int]]) -> None:
            w, parts = item
            if stop is not None and stop.is_set():
                return
            try:
                w.read_positions(parts, started=started)
            except Exception as exc:  # noqa: BLE001 - the first write tries again
                unfenced = {key for key, _exc in failed}
                failed.extend(((w.s.source_topic, part), exc) for part in parts
                              if (w.s.source_topic, part) not in unfenced)

        list(pool.map(first, [(w, part) for w, parts in writers.values() for part in parts]))
        if read_positions:  # a partition not fenced is left to its first write
            list(pool.map(read, [(w, parts) for w, parts in writers.values() if w.s.delivery == "exactly_once"]))
        return failed

    def write_shared(self, txn: WriterTransaction, parts: dict[tuple[str, int], tuple[Columns, int]]
                     ) -> set[tuple[str, int]]:
        """``transactions: per_writer``: write ``parts`` (exactly-once partitions: their next records in offset
        order, and the upstream position after them) in transactions of ``txn``'s producer, each holding at
        most :data:`SHARED_TXN_PARTITIONS` partitions (see :meth:`_write_shared`). Returns the partitions to be
        written partition by partition instead (empty: all done).

        A transaction whose records are not all acknowledged within the writer's wait (the transaction's
        timeout) is lost: its producer is replaced (the new one fences it) and its partitions are written again
        as two transactions of half as many, halved again at each further timeout, for as long as a
        partition's own writer would wait for a destination that does not answer (the producers' delivery
        timeout, from the first); then the batch fails. Not partition by partition, which at thousands of
        partitions starts a producer for each.

        A transaction that fails with a producer error (fenced, a fatal error, an error that aborts it, a commit
        that timed out) is written again once the same way (on a new producer after a fatal error); its
        partitions are written partition by partition only when that fails too (the per-partition writer
        retries and says what is wrong). Without that second try, a transaction the broker had timed out at
        1,000 partitions started a producer for every partition and took minutes."""
        items = list(parts.items())
        left: set[tuple[str, int]] = set()
        for i in range(0, len(items), SHARED_TXN_PARTITIONS):
            left |= self._write_shared_riding(txn, dict(items[i:i + SHARED_TXN_PARTITIONS]))
        return left

    def _write_shared_riding(self, txn: WriterTransaction, parts: dict[tuple[str, int], tuple[Columns, int]]
                             ) -> set[tuple[str, int]]:
        from confluent_kafka import KafkaException

        #: pieces to write, each with whether it is already a second try after a producer error, and whether
        #: each of its records is reported (written again after another producer's marker landed among a run)
        todo = [(parts, False, False)]
        left: set[tuple[str, int]] = set()
        since: float | None = None
        limit = delivery_timeout(txn.producer_config)
        while todo:
            piece, again, reported = todo.pop(0)
            try:
                left |= self._write_shared(txn, piece, once_more=not again, reported=reported)
                continue
            except _AgainWithReports:
                # aborted; reporting every record, it cannot meet this again. In halves: a writer transaction may
                # hold 125 MiB, and its rewrite (after an abort, every record reported) keeps further from the
                # 60 s timeout so
                todo[0:0] = [(half, again, True) for half in _halves(piece)]
                continue
            except _ProducerFailed as exc:
                halves = _halves(piece)
                log.warning("%s: the writer's transaction of %d partitions failed (%s); writing them again as %s "
                            "(then, should that fail too, partition by partition)", self.plan.group, len(piece),
                            exc.why, _as_transactions(halves))
                todo[0:0] = [(half, True, reported) for half in halves]
                time.sleep(SHARED_RETRY_PAUSE)
                continue
            except _AckTimeout as exc:
                why = f"{exc.remaining} records not acknowledged within {exc.wait:.0f} s"
            except KafkaException as exc:  # the writer's new producer could not start
                if not clients.no_answer(exc.args[0]):
                    raise
                why = exc.args[0].str()
            now = time.monotonic()
            since = now if since is None else since
            if now - since >= limit:
                what = f"{len(piece)} partition{'s' if len(piece) != 1 else ''}"
                raise NotAcknowledged(f"{self.plan.group}: the writer's transaction of {what}: {why}, "
                                      f"and the destination has not kept up for {now - since:.0f} s; nothing of "
                                      f"it is visible")
            halves = _halves(piece)
            log.warning("%s: the writer's transaction of %d partitions was lost (%s); writing them again as %s "
                        "(waited %.0f s of up to %.0f s)", self.plan.group, len(piece), why, _as_transactions(halves),
                        now - since, limit)
            todo[0:0] = [(half, again, reported) for half in halves]
            time.sleep(SHARED_RETRY_PAUSE)
        return left

    def _write_shared(self, txn: WriterTransaction, parts: dict[tuple[str, int], tuple[Columns, int]],
                      once_more: bool = False, reported: bool = False) -> set[tuple[str, int]]:
        """One transaction of ``txn``'s producer holding ``parts``: records, dead letters and every partition's
        offset syncs commit together, or nothing does.

        Returns the partitions to be written partition by partition instead (:meth:`feed`; empty: all done):
        all of them, with nothing committed, on delivery reports that cannot be tied to records, a record the
        destination rejected as too large, or a producer error. The per-partition writer handles each of those
        (it retries, fences, learns the size limit, dead-letters) and says what is wrong when it cannot. A failure
        that one partition's writer would raise as well (``on_error: fail``, a dead letter not delivered, the
        destination topic gone) is raised here, after the abort; records not acknowledged within the wait raise
        :class:`_AckTimeout`, after the abort. With ``once_more``, a producer error of the transaction raises
        :class:`_ProducerFailed` (after the abort, or with the producer replaced) instead of handing every partition
        back. With ``reported``, every record gets a delivery report (none goes through the C loop's runs).

        With ``txn.transactional`` False (the writer's at-least-once partitions): the same, with the shared
        idempotent producer and no transaction: the records, then the offset syncs, are flushed once for all
        partitions. Once every record is acknowledged or rejected, only the partitions whose records cannot
        be settled (one too large, reports not tied to records) are handed back; the others' syncs go out as
        usual. What went out of a partition handed back is written again by the per-partition writer
        (at-least-once). The shared producer is gapless (runs of records go without reports): a record it
        loses (rejected, timed out) stops it with a fatal error, which fails every record produced after it
        whatever its partition; the reports still due are taken, the producer replaced, and the partitions
        whose records all landed keep them (their syncs go out on the new producer); the others are handed
        back."""
        from confluent_kafka import KafkaException

        transactional = txn.transactional

        todo = []
        for (topic, part), (cols, upstream_end) in parts.items():
            w = self._writer(topic, self.plan.settings[topic])
            w.resolve_ids(cols)  # a registry outage is waited out before the transaction opens
            todo.append((w, part, cols, upstream_end))
        #: the destination partitions that take a source partition's records under its own number (its runs)
        same_numbers = [(w.s.destination_topic, part) for w, part, _cols, _end in todo
                        if w.s.destination_partitions >= w.s.source_partitions]
        # the producer first: a new one's start fences every other holder of the writer's id (an attempt of the
        # same Spark task, a writer taken for dead), so the positions read next are the last ones committed
        producer = txn.producer()
        if transactional:
            self._read_positions([(w, part) for w, part, _cols, _end in todo if not w.position_known(part)])
        late = txn.late_markers(same_numbers) if transactional else set()
        # at_least_once: until the producer delivers or fails every record (a destination outage is ridden out)
        config = todo[0][0].s.producer_config if todo else {}
        wait = ack_wait("exactly_once" if transactional else "at_least_once", config)
        results: list[BatchResult] = []
        staged: list[tuple[PartitionWriter, Staged]] = []
        #: at-least-once partitions to write partition by partition (their records could not be settled), and why
        left: dict[tuple[str, int], str] = {}

        #: the commit was asked for: its outcome is not known after an error (it may have gone through). Before
        #: that nothing of the transaction can commit (an abort, a timeout, a new producer's fence all end it)
        committing = False

        def forget(positions: bool = True) -> None:
            """Forget the positions (unless ``positions`` is False, for a transaction that cannot have committed
            and is written again here: they still hold, and reading 250 again took 10-20 s at 1,000
            partitions) and hand back what an at-least-once write settled."""
            if positions:
                for w, part, _cols, _end in todo:
                    w.forget_position(part)
            if not transactional:  # every partition is handed back: what its dead letters got acknowledged
                for w, st in staged:
                    w.hand_back(st)

        try:
            if transactional:
                producer.begin_transaction()
            try:
                for w, part, cols, upstream_end, in_c in self._stage_order(txn, todo, late, not reported):
                    r, st = w.stage(part, cols, upstream_end, producer, in_c=in_c)
                    results.append(r)
                    if st is not None:
                        staged.append((w, st))
                t0 = time.monotonic()
                lost: KafkaException | None = None
                try:
                    remaining = flush_within(producer, wait, self.plan.group)
                except KafkaException as exc:
                    if transactional or not exc.args[0].fatal():
                        raise
                    lost, remaining = exc, 0
                    producer = self._after_a_lost_record(txn, producer, exc, wait)
                if remaining and transactional:
                    raise _AckTimeout(remaining, wait)
                if remaining:
                    log.warning("%s: %d records not acknowledged within %.0f s; writing the batch partition by "
                                "partition", self.plan.group, remaining, wait)
                    raise _Unmapped()
                t1 = time.monotonic()
                for w, st in staged:
                    try:
                        w.settle_staged(producer, st)
                    except (_Unmapped, KafkaException, WriterError) as exc:
                        # at least once, every record was acknowledged or rejected (flushed): the other partitions'
                        # syncs can still go out, and nothing of this one is left queued to land after its rewrite.
                        # After a lost record, whatever this partition's records or dead letters met (the stop
                        # failed them) is the per-partition writer's to meet again, or not
                        if lost is None and (transactional or isinstance(exc, WriterError) or (
                                isinstance(exc, KafkaException) and exc.args[0].fatal())):
                            raise
                        w.hand_back(st)
                        left[(w.s.source_topic, st.partition)] = (
                            f"not all its records landed: the shared producer lost a record ({lost.args[0].str()})"
                            if lost is not None else
                            "a record the destination rejected as too large, or reports not tied to records"
                            if isinstance(exc, _Unmapped) else exc.args[0].str())
                t2 = time.monotonic()
                with clients.fatal_unmasked():
                    if transactional:
                        committing = True
                        producer.commit_transaction(60)
                    remaining = 0 if transactional else flush_within(producer, wait, self.plan.group)
                if transactional:
                    # the next transaction goes out on the other producer while the broker writes these markers
                    # (in the partitions where they are late, it reports each record: WriterTransaction.late_markers)
                    txn.took_turn(same_numbers)
                elif remaining:
                    log.warning("%s: offset syncs not acknowledged within %.0f s; writing the batch partition by "
                                "partition", self.plan.group, wait)
                    raise _Unmapped()
                t3 = time.monotonic()
                commit_ms = (t3 - t0) * 1000
                log.debug("%s: writer transaction of %d partitions: flush %.0f ms, offset syncs %.0f ms, commit "
                          "%.0f ms", self.plan.group, len(staged), (t1 - t0) * 1000, (t2 - t1) * 1000,
                          (t3 - t2) * 1000)
            except (_Unmapped, KafkaException):
                raise
            except DestinationTopicError:
                txn.drop()  # records wait for partitions that are gone: an abort would wait for them
                forget()
                raise
            except BaseException:
                if not transactional or not _abort_quietly(producer):
                    txn.drop()
                forget()
                raise
        except _AckTimeout:
            # the transaction is lost (an abort would wait for the destination too): a new producer fences it
            forget(positions=False)
            txn.drop()
            raise
        except _Unmapped as exc:
            again = transactional and isinstance(exc, _RunsUnproven) and len(txn.txids) > 1
            forget(positions=not again)
            if again:
                # the other producer's commit markers landed among records produced without reports: the
                # transaction is written again with a report a record (one producer alone never meets its own
                # markers; the partitions' own producers, each fenced and started for it, took 17 s for 12
                # partitions on a loaded two-core machine), and this writer asks before each transaction where
                # the last commit's markers are still due
                txn.ask_always()
                log.info("%s: a commit marker of the writer's other producer landed among records produced "
                         "without delivery reports; the writer writes the transaction again, each record "
                         "reported, and from now on asks before each transaction where the last commit's "
                         "markers are still due", self.plan.group)
            else:
                log.info("%s: the writer %s was %s (delivery reports not tied to records, or a record the "
                         "destination rejected as too large); writing the batch partition by partition",
                         self.plan.group, *(("transaction", "aborted") if transactional else ("write", "stopped")))
            if not transactional:
                producer.purge()  # records still queued must not land after the per-partition writer's
                txn.drop()
            elif not _abort_quietly(producer):
                txn.drop()
            if again:
                raise _AgainWithReports() from None
            return set(parts)
        except KafkaException as exc:
            # fenced, fatal, abortable or a timeout: once more on a new producer, else partition by partition; from
            # positions read again if the commit was asked for (one that reported an error may have gone through)
            # or the producer was fenced or failed for good (whoever took its id over may have committed since)
            if transactional and once_more:
                forget(positions=committing or another_took_over(exc.args[0]))
                if exc.args[0].fatal() or not _abort_quietly(producer):
                    txn.drop()
                raise _ProducerFailed(exc.args[0].str()) from None
            forget()
            log.warning("%s: the writer %s failed (%s); writing the batch partition by partition",
                        self.plan.group, "transaction" if transactional else "write", exc.args[0].str())
            if exc.args[0].fatal() or not transactional or not _abort_quietly(producer):
                txn.drop()
            return set(parts)
        if left:
            (topic, part), why = min(left.items())
            log.info("%s: %d of %d partitions could not be settled in the writer's shared write (first %s[%d]: "
                     "%s); writing those partition by partition", self.plan.group, len(left), len(parts), topic,
                     part, why)
        results = [r for r in results if (r.topic, r.partition) not in left]
        share = commit_ms / max(1, len(results))
        for w, st in staged:
            if (w.s.source_topic, st.partition) not in left:
                w.committed_staged(st)
        with self._lock:
            for r in results:
                r.commit_ms += share
                _merge(self.results, r)
        return set(left)

    def _stage_order(self, txn: WriterTransaction, todo: list[tuple[PartitionWriter, int, Columns, int]],
                     late: set[tuple[str, int]], in_c: bool = True
                     ) -> Iterator[tuple[PartitionWriter, int, Columns, int, bool]]:
        """The partitions of a writer transaction in the order they are staged, each with whether it goes through
        the C loop: first those whose destination partition is not in ``late`` (where the last commit's markers had
        not landed yet when asked: :meth:`WriterTransaction.late_markers`); then, asking again every
        :data:`LATE_MARKERS_POLL_S` for up to :data:`LATE_MARKERS_WAIT_S`, each late one once its markers have
        landed, through the C loop too; the rest last, each record reported (a marker may land among them). The
        markers of a new topic's partitions land one after the other over seconds: those that land while the
        others are staged cost nothing. Without ``in_c``, every partition in order, each record reported."""
        def dest(item: tuple[PartitionWriter, int, Columns, int]) -> tuple[str, int]:
            return item[0].s.destination_topic, item[1]

        if not in_c:
            for item in todo:
                yield (*item, False)
            return
        waiting = []
        for item in todo:
            if dest(item) in late:
                waiting.append(item)
            else:
                yield (*item, True)
        if not waiting:
            return
        from mirror_core.direct import whole_number_env

        t0 = time.monotonic()
        deadline = t0 + whole_number_env(LATE_MARKERS_WAIT_ENV, LATE_MARKERS_WAIT_S, "seconds")
        total = len(waiting)
        while waiting and time.monotonic() < deadline:
            still = txn.still_late((dest(item) for item in waiting), max(0.2, deadline - time.monotonic()))
            for item in waiting:
                if dest(item) not in still:
                    yield (*item, True)
            waiting = [item for item in waiting if dest(item) in still]
            if waiting:
                time.sleep(min(LATE_MARKERS_POLL_S, max(0.0, deadline - time.monotonic())))
        log.debug("%s: the last writer transaction's commit markers were late in %d partitions: %d landed within "
                  "%.1f s (their records through the C loop), %d are reported record by record", self.plan.group,
                  total, total - len(waiting), time.monotonic() - t0, len(waiting))
        for item in waiting:
            yield (*item, False)

    def _read_positions(self, unknown: list[tuple[PartitionWriter, int]]) -> None:
        """``transactions: per_writer``: read the committed positions of ``unknown`` (partitions whose position
        this process does not know: forgotten after a failed transaction) before the transaction opens, several
        at once. Read one by one inside it, as its records were staged, 250 of them took past the transaction's
        60 s timeout at 1,000 partitions (a lookup reads the offset-sync topic), so the broker aborted it and the
        retry met the same. A lookup that fails here is only skipped: the staging reads it again and meets its
        error where a failure is handled."""
        if not unknown:
            return
        from mirror_core.direct import WARM_THREADS_PER_WRITER

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=min(WARM_THREADS_PER_WRITER, len(unknown)),
                                thread_name_prefix="mirrorflow-positions") as pool:
            failed = self.prepare_shared_many([(w.s.source_topic, part) for w, part in unknown], pool)
        for (topic, part), exc in failed:
            log.debug("%s: position of %s[%d] not read ahead: %s", self.plan.group, topic, part, exc)
        log.debug("%s: %d positions read again in %.1f s", self.plan.group, len(unknown), time.monotonic() - t0)

    def finish(self, topic: str, part: int, start: int | None = None) -> None:
        """The partition's range (from ``start``) was read to its end: move the position past trailing
        transaction markers / aborted records to the batch end, from the last record written, or, when the
        range held no records at all, from where the partition stands
        (:meth:`~mirror_core.replicate.PartitionWriter.advance_idle`)."""
        r = self.results.get((topic, part))
        end = self.plan.end_offsets.get(topic, {}).get(part)
        s = self.plan.settings.get(topic)
        if r is None and end is not None and s is not None:
            last = self._writer(topic, s).advance_idle(part, end, start)
            if last is not None:
                with self._lock:
                    self.results[(topic, part)] = BatchResult(topic, part, upstream_end=end, last_downstream=last)
            return
        if r is not None and end is not None and r.upstream_end is not None and end > r.upstream_end \
                and r.last_downstream is not None:
            self._writers[topic].advance(part, end, r.last_downstream)
            r.upstream_end = end

    def rows(self, input_ms: float = 0.0) -> list[dict[str, Any]]:
        share = input_ms / max(1, len(self.results))
        return [asdict(r) | {"input_ms": share} for r in self.results.values()]


class _AgainWithReports(Exception):  # noqa: N818  # internal signal, never leaves the writer
    """``transactions: per_writer``: the writer transaction was aborted and is to be written again, now that
    the writer reports every record."""


class _ProducerFailed(Exception):  # noqa: N818  # internal signal, never leaves the writer
    """``transactions: per_writer``, exactly_once: the writer transaction failed with a producer error (its
    producer aborted it or was replaced; when the error came from the commit, which may have gone through, or
    the producer was fenced, by a writer that may have committed since, its partitions' positions are read
    again, after the new producer's start): it is to be written again once."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _halves(piece: dict[tuple[str, int], tuple[Columns, int]]) -> list[dict[tuple[str, int], tuple[Columns, int]]]:
    """A writer transaction's partitions as two transactions of half as many (one, when it has one partition)."""
    if len(piece) < 2:
        return [piece]
    items = list(piece.items())
    return [dict(items[:len(items) // 2]), dict(items[len(items) // 2:])]


def _as_transactions(pieces: list[dict[tuple[str, int], tuple[Columns, int]]]) -> str:
    return f"two transactions of {len(pieces[0])} and {len(pieces[-1])}" if len(pieces) > 1 else "one"


class _AckTimeout(_Unmapped):  # noqa: N818  # internal signal, never leaves the writer
    """``transactions: per_writer``, exactly_once: records of the writer's transaction not acknowledged within
    the wait; the transaction is lost (its producer was replaced)."""

    def __init__(self, remaining: int, wait: float) -> None:
        super().__init__()
        self.remaining, self.wait = remaining, wait


def arrow_writer(plan: WriterPlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function: one Spark partition = one Kafka partition, in offset order."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        rows = write_batches(plan, batches)
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=_result_schema())

    return run


class CollectError(RuntimeError):
    """Spark failed while handing a micro-batch to the driver. Partitions written before it stay
    written: a rerun of the batch (the tasks, or a restart) skips them by their committed positions."""


def write_batches(plan: WriterPlan, batches: Iterable[Any]) -> list[dict[str, Any]]:
    """Write a micro-batch's Arrow batches as they arrive, with this process's long-lived producers and
    positions: a partition's writing starts while Spark still reads the partitions after it. The driver
    feeds it Spark's collect stream; a Spark task (:func:`arrow_writer`), its one partition's batches.

    Each partition is written by one thread at a time, in offset order (its own transactions); up to
    :data:`DRIVER_THREADS` partitions at once, so their flushes and commits overlap. A partition's
    batches arrive together (one Spark task per Kafka partition), so when a batch holds none of a
    partition's records, that partition's run is complete. An error while reading ``batches`` is
    raised as :class:`CollectError`; a writer's error as it is, once every partition has stopped."""
    quiet_gc()
    bw = BatchWriter(plan)
    failed: list[BaseException] = []
    runs: dict[tuple[str, int], Future[None]] = {}  # the latest run of each partition
    open_runs: dict[tuple[str, int], queue.SimpleQueue[Columns | None]] = {}
    last_offset: dict[tuple[str, int], int] = {}
    input_ms = 0.0  # waiting for Spark's batches and turning them into columns

    most = coalesce_records()

    def run(tp: tuple[str, int], q: queue.SimpleQueue[Columns | None], before: Future[None] | None) -> None:
        if before is not None:
            before.result()  # a partition seen again after a gap (not expected from Spark): after its earlier run
        # what Spark handed over while the last write went on goes with the next one (see COALESCE_RECORDS; a
        # transaction larger than replicate.CHUNK_BYTES is cut by the partition's writer)
        for taken in coalesced(q, lambda c: (len(c), 0), most):
            if failed:
                continue  # another partition failed: stop writing, only drain
            try:
                bw.feed(tp[0], tp[1], Columns.concat(taken), chunk_records=max(most, CHUNK_RECORDS))
            except BaseException as exc:
                failed.append(exc)

    def close_runs(keep: set[tuple[str, int]]) -> None:
        for tp in [tp for tp in open_runs if tp not in keep]:
            open_runs.pop(tp).put(None)

    it = iter(batches)
    complete = False
    with ThreadPoolExecutor(max_workers=DRIVER_THREADS, thread_name_prefix="mirrorflow-writer") as pool:
        try:
            while not failed:
                t_in = time.monotonic()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                except Exception as exc:
                    raise CollectError(str(exc)) from exc
                parts = list(columns_from_arrow(batch)) if batch.num_rows else []
                input_ms += (time.monotonic() - t_in) * 1000
                close_runs({(t, p) for t, p, _ in parts})
                for topic, part, cols in parts:
                    tp = (topic, part)
                    if cols.offsets[0] <= last_offset.get(tp, -1):
                        raise RuntimeError(f"{topic}[{part}]: Spark handed over offset {cols.offsets[0]} after "
                                           f"{last_offset[tp]}; a partition's records must arrive once, in order")
                    last_offset[tp] = cols.offsets[-1]
                    q = open_runs.get(tp)
                    if q is None:
                        q = open_runs[tp] = queue.SimpleQueue()
                        runs[tp] = pool.submit(run, tp, q, runs.get(tp))
                    q.put(cols)
            complete = not failed
        finally:
            close_runs(set())
            for f in runs.values():
                f.exception()  # wait: no partition is left mid-write when this returns or raises
            if not complete:
                _close_quietly(it)
        if failed:
            raise failed[0]
        # trailing transaction markers / aborted records: each partition's position to the batch end
        for _ in pool.map(lambda tp: bw.finish(*tp), list(bw.results)):
            pass
    return bw.rows(input_ms)


def _close_quietly(it: Iterator[Any]) -> None:
    """Stop a batch stream that is abandoned (Spark's side then fails to write, which is expected)."""
    close = getattr(it, "close", None)
    if close is not None:
        try:
            close()
        except Exception as exc:  # noqa: BLE001 - the error that made us stop is the one reported
            log.debug("closing the abandoned batch stream: %s", exc)


def _merge(results: dict[tuple[str, int], BatchResult], r: BatchResult) -> None:
    key = (r.topic, r.partition)
    if key not in results:
        results[key] = r
        return
    acc = results[key]
    for f in ("records_in", "mirrored", "bytes_out", "replayed_skipped", "provenance_skipped", "dead_lettered",
              "cache_misses", "setup_ms", "produce_ms", "commit_ms"):
        setattr(acc, f, getattr(acc, f) + getattr(r, f))
    acc.last_offset = r.last_offset if r.last_offset is not None else acc.last_offset
    acc.upstream_end = r.upstream_end
    acc.last_downstream = r.last_downstream if r.last_downstream is not None else acc.last_downstream
    acc.latency_ms = (acc.latency_ms + r.latency_ms)[-400:]


def _result_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64(),
             "array<double>": pa.list_(pa.float64())}
    return pa.schema([(n, types[t]) for n, t in RESULT_FIELDS])


def columns_from_arrow(batch: Any) -> Iterator[tuple[str, int, Columns]]:
    """Split an Arrow batch of Spark Kafka rows by (topic, partition) into :class:`Columns`, keeping
    offset order. Column-wise: no Python object per record beyond its key and value bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = batch.schema.names
    topic_col, part_col = batch.column(cols.index("topic")), batch.column(cols.index("partition"))
    if len(pc.unique(topic_col)) == 1 and len(pc.unique(part_col)) == 1:
        # the usual case: Spark's Kafka source gives each task exactly one Kafka partition
        yield topic_col[0].as_py(), part_col[0].as_py(), _columns(batch)
        return
    # several partitions in one Arrow batch (possible in a collected table): row indices per partition, in order
    rows: dict[tuple[str, int], list[int]] = {}
    for i, tp in enumerate(zip(topic_col.to_pylist(), part_col.to_pylist(), strict=True)):
        rows.setdefault(tp, []).append(i)
    for (t, p), idx in rows.items():
        yield t, p, _columns(batch.take(pa.array(idx, pa.int64())))


def _columns(batch: Any) -> Columns:
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = batch.schema.names
    ts_col = batch.column(cols.index("timestamp"))
    unit = getattr(ts_col.type, "unit", "us")
    ts_int = ts_col.cast(pa.int64())
    if unit == "s":
        ts_int = pc.multiply(ts_int, 1000)
    elif unit != "ms":
        ts_int = pc.divide(ts_int, {"us": 1000, "ns": 1_000_000}[unit])  # integer division: ms
    stamps = ts_int.fill_null(0).to_pylist()
    headers = None
    if "headers" in cols:
        hcol = batch.column(cols.index("headers"))
        if hcol.null_count < len(hcol) and pc.max(pc.list_value_length(hcol)).as_py():
            headers = [tuple((h["key"], h["value"]) for h in hs) if hs else () for hs in hcol.to_pylist()]
    return Columns(batch.column(cols.index("offset")).to_pylist(), batch.column(cols.index("key")).to_pylist(),
                   batch.column(cols.index("value")).to_pylist(), stamps, headers)
