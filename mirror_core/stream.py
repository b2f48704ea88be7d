"""The streaming mirror's logic, independent of Spark.

:class:`MirrorRuntime` holds one group's state on the driver: what is mirrored
where, the schema-id map, and what happens after each micro-batch (committing
source offsets under each mirror's consumer group, metrics, provisioning topics
that a regex flow discovered). :func:`arrow_writer` is the function Spark runs
per partition through ``mapInArrow``; it only needs pyarrow and confluent-kafka.
"""

from __future__ import annotations

import json
import logging
import re
import statistics
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mirror_core import clients
from mirror_core.config import GroupConfig, MirrorsConfig, default_consumer_group, mirror_name, resolve_mirrors
from mirror_core.policy import ReplicationPolicy, TopicFilter, TopicSelection, build_replication_policy
from mirror_core.replicate import (
    BatchResult,
    PartitionWriter,
    SchemaIdTranslator,
    SourceRecord,
    WriterSettings,
    chunks,
    last_committed_sync,
)
from mirror_core.topics import ClusterState, read_state

log = logging.getLogger(__name__)

RESULT_FIELDS = (
    ("topic", "string"), ("partition", "int"), ("records_in", "long"), ("mirrored", "long"),
    ("bytes_out", "long"), ("replayed_skipped", "long"), ("provenance_skipped", "long"),
    ("dead_lettered", "long"), ("cache_misses", "long"), ("first_offset", "long"), ("last_offset", "long"),
    ("upstream_end", "long"), ("last_downstream", "long"), ("latency_ms", "array<double>"),
)
RESULT_DDL = ", ".join(f"{n} {t}" for n, t in RESULT_FIELDS)
CHUNK_RECORDS = 20000


@dataclass(frozen=True)
class WriterPlan:
    """What the executors need: settings per source topic, the id map, and how to resolve misses."""

    settings: dict[str, WriterSettings]
    id_map: dict[int, int]
    end_offsets: dict[str, dict[int, int]]
    destination_consumer_config: dict[str, Any]
    registries: tuple[Any, Any] | None  # (source SchemaRegistryConfig, destination SchemaRegistryConfig)


class MirrorRuntime:
    """Driver-side state of one group's streaming mirror."""

    def __init__(self, cfg: MirrorsConfig, group: GroupConfig):
        self.cfg = cfg
        self.group = group
        self.src = cfg.cluster(group.source)
        self.dst = cfg.cluster(group.destination)
        self.policy = build_replication_policy(group)
        self.mirrors = tuple(resolve_mirrors(group))
        self.settings: dict[str, WriterSettings] = {}
        self.consumer_groups: dict[str, str] = {}
        self._committers: dict[str, Any] = {}  # one long-lived consumer per mirror consumer group
        self.id_map: dict[int, int] = {}
        #: source topics already looked at (mirrored or deliberately not); any other topic a batch
        #: brings (a regex flow's new match, a heartbeats topic created later) triggers provisioning
        self.known_topics: set[str] = set()

    # -- setup

    def prepare(self) -> list[str]:
        """Provision the group (topics + schemas) and learn what is mirrored where. Returns what was done."""
        from mirror_core.provision import plan_group, provision_group

        plan = plan_group(self.cfg, self.group)
        if plan.topics.errors:
            raise_plan_errors(plan)
        res = provision_group(self.cfg, self.group, plan)
        for e in res.errors:
            log.error("%s: %s", self.group.name, e)
        self.id_map.update(res.id_map)
        self._refresh_settings()
        return res.done

    def _refresh_settings(self) -> None:
        src_state = read_state(clients.admin(self.src))
        dst_admin = clients.admin(self.dst)
        dst_state = read_state(dst_admin)
        chosen, _ = TopicFilter(self.mirrors, self.policy, self.group.source, self.group.destination).select(
            sorted(src_state.topics))
        hb = heartbeat_selection(self.group, self.policy, sorted(src_state.topics), chosen)
        if hb is not None:
            chosen.append(hb)
            if hb.destination_topic not in dst_state.topics:
                ensure_heartbeats_topic(dst_admin, hb.destination_topic, src_state, dst_state, hb.source_topic)
                dst_state = read_state(dst_admin)
        producer_cfg = clients.kafka_config(self.dst)
        self.known_topics = set(src_state.topics)
        for sel in chosen:
            m = sel.mirror
            dst_info = dst_state.topics.get(sel.destination_topic)
            if dst_info is None:
                self.known_topics.discard(sel.source_topic)  # provisioning failed: try again next batch
                continue
            provenance = m.settings.provenance_headers
            if provenance is None:
                provenance = self.group.replication_policy not in ("prefix",) and self._two_way()
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
                producer_config=producer_cfg,
                destination_max_message_bytes=int(max_bytes) if max_bytes else None,
            )
            self.consumer_groups[sel.source_topic] = m.consumer_group

    def _two_way(self) -> bool:
        """Another enabled group mirrors back from our destination to our source."""
        return any(g.source == self.group.destination and g.destination == self.group.source
                   for g in self.cfg.groups if g.enabled)

    # -- the Spark source

    def source_options(self, once: bool) -> dict[str, str]:
        """Options for Spark's Kafka source (``spark.readStream.format("kafka")``)."""
        opts = {f"kafka.{k}": v for k, v in clients.java_kafka_options(self.src).items()}
        opts |= {
            "kafka.isolation.level": "read_committed",
            "includeHeaders": "true",
            "startingOffsets": "earliest",
            "failOnDataLoss": "false",
        }
        if self.group.spark.max_offsets_per_trigger:
            opts["maxOffsetsPerTrigger"] = str(self.group.spark.max_offsets_per_trigger)
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
        return opts

    def checkpoint_dir(self) -> str:
        return str(Path(self.group.spark.checkpoint_dir) / self.group.name)

    # -- per batch

    def writer_plan(self, batch_id: int) -> WriterPlan:
        """Settings for this batch; provisions topics a flow has just discovered."""
        ends = read_batch_end_offsets(self.checkpoint_dir(), batch_id)
        unknown = [t for t in ends if t not in self.settings and t not in self.known_topics]
        if unknown:
            log.info("%s: new source topics %s; provisioning", self.group.name, unknown)
            self.prepare()
        regs = None
        if self.src.schema_registry and self.dst.schema_registry:
            regs = (self.src.schema_registry, self.dst.schema_registry)
        return WriterPlan(dict(self.settings), dict(self.id_map), ends,
                          clients.kafka_config(self.dst), regs)

    def after_batch(self, batch_id: int, rows: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
        """Commit source offsets under each mirror's consumer group, update metrics, return a summary."""
        from mirror_core import metrics

        commits: dict[str, list[tuple[str, int, int]]] = {}
        totals = {"records": 0, "mirrored": 0, "dead_lettered": 0, "replayed_skipped": 0, "bytes": 0}
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
            for lat in r["latency_ms"] or []:
                metrics.LATENCY_MS.labels(*labels).observe(lat)
            if r["upstream_end"] is not None:
                cg = self.consumer_groups[r["topic"]]
                commits.setdefault(cg, []).append((r["topic"], r["partition"], r["upstream_end"]))
            totals["records"] += r["records_in"]
            totals["mirrored"] += r["mirrored"]
            totals["dead_lettered"] += r["dead_lettered"]
            totals["replayed_skipped"] += r["replayed_skipped"]
            totals["bytes"] += r["bytes_out"]
        metrics.BATCH_SECONDS.labels(self.group.name).observe(seconds)
        self.commit_source_offsets(commits)
        lats = [x for r in rows for x in (r["latency_ms"] or [])]
        totals["latency_p50_ms"] = round(statistics.median(lats), 1) if lats else None
        totals["batch_id"] = batch_id
        totals["seconds"] = round(seconds, 3)
        return totals

    def commit_source_offsets(self, commits: dict[str, list[tuple[str, int, int]]]) -> None:
        """So kafka-consumer-groups and lag exporters see the mirror's position on the source."""
        from confluent_kafka import KafkaException, TopicPartition

        for cg, tps in commits.items():
            c = self._committers.get(cg)
            if c is None:
                c = self._committers[cg] = clients.consumer(self.src, cg)
            try:
                c.commit(offsets=[TopicPartition(t, p, off) for t, p, off in tps], asynchronous=False)
            except KafkaException as exc:
                # only monitoring depends on it (the mirror's own position is in the offset syncs): warn, go on;
                # the next batch commits again
                log.warning("%s: could not commit source offsets for %s: %s", self.group.name, cg,
                            exc.args[0].str())


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
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import NewTopic

    parts = source.topics[source_topic].partitions
    rf = max(1, min(3, destination.broker_count))
    fut = admin.create_topics([NewTopic(topic, parts, rf, config={"cleanup.policy": "compact"})])[topic]
    try:
        fut.result(30)
        log.info("created %s (%d partitions, RF %d) for mirrored heartbeats", topic, parts, rf)
    except KafkaException as exc:
        if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
            log.error("cannot create heartbeats topic %s: %s", topic, exc.args[0].str())


def raise_plan_errors(plan: Any) -> None:
    from mirror_core.errors import PlanError

    raise PlanError("; ".join(f"{a.topic}: {a.reason}" for a in plan.topics.errors))


def read_batch_end_offsets(checkpoint_dir: str, batch_id: int) -> dict[str, dict[int, int]]:
    """End offsets of micro-batch ``batch_id`` from Spark's offset log (written before the batch runs)."""
    path = Path(checkpoint_dir) / "offsets" / str(batch_id)
    if not path.exists():
        return {}
    lines = path.read_text().splitlines()
    out: dict[str, dict[int, int]] = {}
    for line in lines[2:]:
        line = line.strip()
        if not line.startswith("{"):
            continue
        for topic, parts in json.loads(line).items():
            out[topic] = {int(p): int(o) for p, o in parts.items()}
    return out


# --------------------------------------------------------------------------- executor side


def make_resolver(registries: tuple[Any, Any] | None, source_topic: str, destination_topic: str
                  ) -> Callable[[int], int | None] | None:
    """On a schema-id miss: register the source schema under the mapped subject on the destination."""
    if registries is None:
        return None
    from mirror_core import schemas

    return schemas.make_id_resolver(registries[0], registries[1], source_topic, destination_topic)


def arrow_writer(plan: WriterPlan) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """The ``mapInArrow`` function: one Spark partition = one Kafka partition, in offset order."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        results: dict[tuple[str, int], BatchResult] = {}
        writers: dict[str, PartitionWriter] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            for topic, part, records in _records_from_arrow(batch):
                s = plan.settings.get(topic)
                if s is None:
                    continue  # not selected by this group's mirrors (e.g. excluded by a flow)
                w = writers.get(topic)
                if w is None:
                    translator = SchemaIdTranslator(plan.id_map, make_resolver(plan.registries, topic,
                                                                               s.destination_topic))
                    def lookup(t: str, p: int, _s: WriterSettings = s,
                               _cc: dict[str, Any] = plan.destination_consumer_config) -> Any:
                        return last_committed_sync(_cc, _s.offset_syncs_topic, t, p)

                    w = writers[topic] = PartitionWriter(s, translator, lookup)
                for chunk in chunks(records, CHUNK_RECORDS):
                    end = plan.end_offsets.get(topic, {}).get(part)
                    is_last = end is not None and chunk[-1].offset >= end - 1
                    r = w.write(part, chunk, end if is_last else None)
                    _merge(results, r)
        for (topic, part), r in results.items():
            # trailing transaction markers / aborted records: move the position to the batch end
            end = plan.end_offsets.get(topic, {}).get(part)
            if end is not None and r.upstream_end is not None and end > r.upstream_end \
                    and r.last_downstream is not None:
                writers[topic].advance(part, end, r.last_downstream)
                r.upstream_end = end
        rows = [asdict(r) for r in results.values()]
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=_result_schema())

    return run


def _merge(results: dict[tuple[str, int], BatchResult], r: BatchResult) -> None:
    key = (r.topic, r.partition)
    if key not in results:
        results[key] = r
        return
    acc = results[key]
    for f in ("records_in", "mirrored", "bytes_out", "replayed_skipped", "provenance_skipped", "dead_lettered"):
        setattr(acc, f, getattr(acc, f) + getattr(r, f))
    acc.cache_misses = max(acc.cache_misses, r.cache_misses)
    acc.last_offset = r.last_offset
    acc.upstream_end = r.upstream_end
    acc.last_downstream = r.last_downstream if r.last_downstream is not None else acc.last_downstream
    acc.latency_ms = (acc.latency_ms + r.latency_ms)[-400:]


def _result_schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "array<double>": pa.list_(pa.float64())}
    return pa.schema([(n, types[t]) for n, t in RESULT_FIELDS])


def _records_from_arrow(batch: Any) -> Iterator[tuple[str, int, list[SourceRecord]]]:
    """Group an Arrow batch of Spark Kafka rows by (topic, partition), keeping offset order."""
    import pyarrow as pa

    cols = batch.schema.names
    topics = batch.column(cols.index("topic")).to_pylist()
    parts = batch.column(cols.index("partition")).to_pylist()
    offsets = batch.column(cols.index("offset")).to_pylist()
    keys = batch.column(cols.index("key")).to_pylist()
    values = batch.column(cols.index("value")).to_pylist()
    ts_col = batch.column(cols.index("timestamp"))
    ts = ts_col.cast(pa.int64()).to_pylist()
    unit = getattr(ts_col.type, "unit", "us")
    div = {"s": 0.001, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
    headers = batch.column(cols.index("headers")).to_pylist() if "headers" in cols else [None] * len(offsets)
    groups: dict[tuple[str, int], list[SourceRecord]] = {}
    for i in range(len(offsets)):
        hs = tuple((h["key"], h["value"]) for h in (headers[i] or ()))
        rec = SourceRecord(topics[i], parts[i], offsets[i], keys[i], values[i], hs,
                           int(ts[i] // div) if ts[i] is not None else 0)
        groups.setdefault((topics[i], parts[i]), []).append(rec)
    for (t, p), recs in groups.items():
        yield t, p, recs
