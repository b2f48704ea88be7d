"""`make demo`: the main job on the embedded clusters, end to end.

Starts the local clusters (unless they already run), writes sample Avro
orders across three schema versions to ``demo.orders`` on ``src``, provisions
the destination, runs the Spark mirror once (drain and stop), and prints a
per-partition comparison of both sides.
"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import clients, local
from mirror_core.config import ClusterConfig
from mirror_core.errors import KafkaOperationError
from mirror_core.logs import quiet_library_warnings
from mirror_core.topics import create_topics

Say = Callable[[str], None]
ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config" / "local.yaml"
TOPIC = "demo.orders"

ORDER_V1: dict[str, Any] = {"type": "record", "name": "Order", "namespace": "demo",
            "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}
ORDER_V2: dict[str, Any] = {**ORDER_V1, "fields": ORDER_V1["fields"] + [{"name": "currency", "type": "string", "default": "EUR"}]}
ORDER_V3: dict[str, Any] = {**ORDER_V2, "fields": ORDER_V2["fields"] + [
    {"name": "note", "type": ["null", "string"], "default": None}]}


def ensure_clusters(say: Say) -> dict[str, dict[str, str | None]]:
    """The running local clusters, started if needed. Fresh clusters get a fresh Spark checkpoint: the old
    one holds offsets of topics that no longer exist, and Spark would resume from them."""
    env = local.LocalEnv.from_environment()
    st = local.status(env)
    if not st.get("running"):
        say("starting local clusters...")
        local.up(env, local.default_spec(), progress=say)
        from mirror_core.config import load_config

        ckpt = Path(load_config(CONFIG).group("demo").spark.checkpoint_dir)
        shutil.rmtree(ckpt if ckpt.is_absolute() else ROOT / ckpt, ignore_errors=True)
    return local.running_endpoints(env)


def produce_sample(bootstrap: str, registry: str, records: int, say: Say) -> dict[int, int]:
    """Avro-framed orders over three schema versions; returns records per partition."""
    quiet_library_warnings()  # before the registry client's import, which prints one
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from fastavro import parse_schema, schemaless_writer

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        create_topics(admin, [NewTopic(TOPIC, 3, 1)], timeout=30, exist_ok=True)  # served before it is written
    sr = SchemaRegistryClient({"url": registry})
    versions = []
    for schema in (ORDER_V1, ORDER_V2, ORDER_V3):
        sid = sr.register_schema(f"{TOPIC}-value", Schema(json.dumps(schema), "AVRO"))
        versions.append((sid, parse_schema(schema)))
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5, "log_level": 3})
    per_partition: dict[int, int] = {}
    rnd = random.Random(7)
    for i in range(records):
        sid, parsed = versions[i * 3 // records]
        rec = {"id": i, "amount": round(rnd.uniform(1, 500), 2), "currency": "EUR", "note": None}
        buf = BytesIO()
        schemaless_writer(buf, parsed, rec)
        value = b"\x00" + struct.pack(">I", sid) + buf.getvalue()
        part = i % 3
        p.produce(TOPIC, key=f"order-{i}".encode(), value=value, partition=part,
                  headers=[("source", b"demo")])
        per_partition[part] = per_partition.get(part, 0) + 1
        if i % 1000 == 0:
            p.poll(0)
    p.flush(60)
    say(f"produced {records} Avro records (3 schema versions) to {TOPIC} on src")
    return per_partition


def count_per_partition(bootstrap: str | ClusterConfig, topic: str) -> dict[int, int]:
    """Records a read_committed consumer sees per partition (transaction markers occupy offsets too)."""
    cluster = bootstrap if isinstance(bootstrap, ClusterConfig) else ClusterConfig(kafka={"bootstrap.servers": bootstrap})
    try:
        ends = clients.end_offsets(cluster, topic)
    except KafkaOperationError:
        return {}
    return {p: sum(1 for _ in clients.read_partition(cluster, topic, p, lo, hi)) for p, (lo, hi) in ends.items()}


def run(records: int = 30000, say: Say = print) -> int:
    t0 = time.monotonic()
    eps = ensure_clusters(say)
    src, dst = eps["src"], eps["dst"]
    assert src["registry"] and dst["registry"]
    before = count_per_partition(str(dst["bootstrap"]), TOPIC)
    produced = produce_sample(str(src["bootstrap"]), str(src["registry"]), records, say)
    say("mirroring with Spark (provision, then drain once)...")
    rc = subprocess.call([sys.executable, "-m", "spark_jobs.mirror_stream", str(CONFIG), "--group", "demo", "--once"],
                         cwd=ROOT)
    if rc != 0:
        say(f"the mirror job failed (exit {rc})")
        return 1
    src_counts = count_per_partition(str(src["bootstrap"]), TOPIC)
    dst_counts = count_per_partition(str(dst["bootstrap"]), TOPIC)
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{TOPIC}: src -> dst")
    for col in ("partition", "produced now", "src records", "dst records (before)", "dst records", "match"):
        table.add_column(col, justify="right")
    ok = True
    for p in sorted(src_counts):
        match = src_counts[p] == dst_counts.get(p, 0)
        ok &= match
        table.add_row(str(p), str(produced.get(p, 0)), str(src_counts[p]), str(before.get(p, 0)),
                      str(dst_counts.get(p, 0)), "yes" if match else "NO")
    Console().print(table)
    # a consumer group that read half of each partition on the source resumes exactly there on dst
    half = {p: n // 2 for p, n in src_counts.items()}
    c = Consumer({"bootstrap.servers": str(src["bootstrap"]), "group.id": "demo-app", "log_level": 3})
    c.commit(offsets=[TopicPartition(TOPIC, p, o) for p, o in half.items()], asynchronous=False)
    c.close()
    for cmd in (["checkpoint"], ["lag"], ["verify"]):
        say(f"$ mirrorflow {' '.join(cmd)} config/local.yaml")
        rc = subprocess.call([sys.executable, "-m", "mirror_core.cli", *cmd, str(CONFIG)], cwd=ROOT)
        ok &= rc == 0
    say(f"demo {'OK' if ok else 'MISMATCH'} in {time.monotonic() - t0:.1f}s — clusters keep running; "
        "`make down` stops them")
    return 0 if ok else 1


# --------------------------------------------------------------------------- the summary table (both demos)


@dataclass(frozen=True)
class TopicSummary:
    """One mirrored topic after a demo: what a newcomer checks to believe the mirror."""

    source_topic: str
    destination_topic: str
    source_records: int
    destination_records: int
    subjects: str       # "subject: source versions -> destination versions", per subject
    group_offsets: str  # "partition: source committed -> destination committed (the exact translation)"
    lag_records: int
    parity: str         # "ok (n partitions)" or where it differs
    ok: bool


def _versions(registry: Any, subject: str) -> list[int]:
    from mirror_core.registry import RegistryClient

    if registry is None:
        return []
    with RegistryClient.from_config(registry) as client:
        return client.versions(subject)


def _committed(cluster: ClusterConfig, group_id: str, topic: str, partitions: list[int]) -> dict[int, int | None]:
    c = Consumer(clients.kafka_config(cluster) | {"group.id": group_id, "enable.auto.commit": False})
    try:
        got = c.committed([TopicPartition(topic, p) for p in partitions], timeout=10)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in got}
    finally:
        c.close()


def summarize(cfg: Any, group: Any, consumer_group: str) -> list[TopicSummary]:
    """Per mirrored topic of ``group``: records on both sides, schema subjects and their versions, the
    consumer group's committed offsets on the source and on the destination, replication lag and parity."""
    from mirror_core.checkpoint import load_sync_store, topic_mappings
    from mirror_core.health import replication_lag, verify_parity

    src, dst = cfg.cluster(group.source), cfg.cluster(group.destination)
    store, maps = load_sync_store(cfg, group), topic_mappings(cfg, group)
    lag = replication_lag(cfg, group, store, maps)
    parity = verify_parity(cfg, group, store, maps)
    out = []
    for m in maps:
        if m.source_topic == group.heartbeats.topic:
            continue
        s_counts = count_per_partition(src, m.source_topic)
        d_counts = count_per_partition(dst, m.destination_topic)
        subjects = []
        for suffix in ("key", "value"):
            sv = _versions(src.schema_registry, f"{m.source_topic}-{suffix}")
            dv = _versions(dst.schema_registry, f"{m.destination_topic}-{suffix}")
            if sv or dv:
                subjects.append((f"{m.destination_topic}-{suffix}", sv, dv))
        parts = sorted(s_counts)
        s_off = _committed(src, consumer_group, m.source_topic, parts)
        d_off = _committed(dst, consumer_group, m.destination_topic, parts)
        p_rows = [r for r in parity if r.source_topic == m.source_topic]
        bad = [r for r in p_rows if not r.ok]
        behind = sum(p.lag_records for p in lag.partitions if p.source_topic == m.source_topic)
        # the destination's committed offset must be the exact translation of the source's (offsets differ
        # between the clusters: transaction markers take offsets on the destination)
        want = {p: store.translate(m.source_topic, p, o).downstream_offset for p, o in s_off.items() if o is not None}
        ok = (sum(s_counts.values()) == sum(d_counts.values()) and not bad and behind == 0
              and all(sv == dv for _, sv, dv in subjects)
              and all(d_off.get(p) == want[p] for p in want))
        out.append(TopicSummary(
            m.source_topic, m.destination_topic, sum(s_counts.values()), sum(d_counts.values()),
            "; ".join(f"{name}: v{sv} -> v{dv}" for name, sv, dv in subjects) or "-",
            ", ".join(f"p{p}: {s_off[p]} -> {d_off.get(p)}" + ("" if d_off.get(p) == want[p] else f" (want {want[p]})")
                      for p in parts if s_off[p] is not None) or "-",
            behind,
            (f"MISMATCH at {', '.join(f'p{r.partition}@{r.first_mismatch_offset}' for r in bad)}" if bad
             else f"ok ({len(p_rows)} partitions)"),
            ok,
        ))
    return out


def print_summary(rows: list[TopicSummary], title: str) -> bool:
    """The summary as a table on stdout; True when every topic matches."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in ("topic (src -> dst)", "records src/dst", "subjects: versions src -> dst",
                "consumer group offsets src -> dst", "lag", "parity", "match"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(f"{r.source_topic} -> {r.destination_topic}", f"{r.source_records}/{r.destination_records}",
                      r.subjects, r.group_offsets, str(r.lag_records), r.parity, "yes" if r.ok else "NO")
    Console(width=max(160, Console().width)).print(table)
    return bool(rows) and all(r.ok for r in rows)
