"""Prometheus metrics of the data path, served by the Spark driver.

Names (all labelled by ``group`` and ``mirror``):

- ``mirrorflow_records_mirrored_total`` — records written to the destination topic
- ``mirrorflow_bytes_mirrored_total`` — key + value bytes written
- ``mirrorflow_records_dead_lettered_total`` — records routed to the dead-letter topic
- ``mirrorflow_records_replay_skipped_total`` — records skipped because already mirrored (exactly-once)
- ``mirrorflow_records_loop_skipped_total`` — records not mirrored back (provenance header)
- ``mirrorflow_schema_id_cache_misses_total`` — schema ids resolved on the fly (registered on a miss)
- ``mirrorflow_source_offsets_rewound_total`` — offsets a source partition's end moved back by (topic
  deleted and re-created, or its log truncated); the partition is mirrored again from its start
- ``mirrorflow_records_expired_total`` — records removed from the source by retention before they were
  mirrored (a gap between the last mirrored offset and the next one read)
- ``mirrorflow_batch_duration_seconds`` — histogram of micro-batch durations (label ``group`` only)
- ``mirrorflow_writer_seconds_total`` — writer task time by ``phase`` (label ``group`` and ``phase``:
  ``input`` = waiting for Spark's Arrow batches and converting them, ``setup`` = producer start and
  position lookup, ``produce`` = producing until every record is
  acknowledged, ``commit`` = committing the transaction / the offset syncs)
- ``mirrorflow_replication_latency_ms`` — histogram of destination commit time minus source record
  timestamp, sampled per batch (MM2's ``replication-latency-ms``)

A run logs its group's counter samples when it ends (:func:`counter_samples`): a drain's ``/metrics`` is gone
by the time Prometheus would next scrape it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

REGISTRY = CollectorRegistry()
_L = ("group", "mirror")

RECORDS = Counter("mirrorflow_records_mirrored", "Records written to the destination", _L, registry=REGISTRY)
BYTES = Counter("mirrorflow_bytes_mirrored", "Key+value bytes written to the destination", _L, registry=REGISTRY)
DEAD = Counter("mirrorflow_records_dead_lettered", "Records routed to the dead-letter topic", _L, registry=REGISTRY)
REPLAYED = Counter("mirrorflow_records_replay_skipped", "Records skipped as already mirrored", _L,
                   registry=REGISTRY)
LOOPED = Counter("mirrorflow_records_loop_skipped", "Records not mirrored back (provenance)", _L, registry=REGISTRY)
MISSES = Counter("mirrorflow_schema_id_cache_misses", "Schema ids resolved on a cache miss", _L, registry=REGISTRY)
REWOUND = Counter("mirrorflow_source_offsets_rewound", "Offsets a source partition's end moved back by", _L,
                  registry=REGISTRY)
EXPIRED = Counter("mirrorflow_records_expired", "Records expired on the source before they were mirrored", _L,
                  registry=REGISTRY)
BATCH_SECONDS = Histogram("mirrorflow_batch_duration_seconds", "Micro-batch duration", ("group",),
                          registry=REGISTRY, buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120))
PHASE_SECONDS = Counter("mirrorflow_writer_seconds", "Writer task time by phase", ("group", "phase"),
                        registry=REGISTRY)
LATENCY_MS = Histogram("mirrorflow_replication_latency_ms", "Destination commit time minus source timestamp", _L,
                       registry=REGISTRY,
                       buckets=(10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000))


def serve(port: int) -> None:
    """Expose /metrics on ``port`` (0 = disabled)."""
    if port:
        start_http_server(port, addr="0.0.0.0", registry=REGISTRY)


def counter_samples(group: str) -> list[str]:
    """This process's counter samples of ``group`` that counted something, as ``/metrics`` prints them without
    the ``group`` label (``mirrorflow_records_dead_lettered_total{mirror="g__a__a"} 2.0``); the zeros are left out
    of the run's line."""
    out = []
    for family in REGISTRY.collect():
        if family.type != "counter":
            continue
        for s in family.samples:
            if not s.name.endswith("_total") or s.labels.get("group") != group or not s.value:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in s.labels.items() if k != "group")
            out.append(f"{s.name}{{{labels}}} {s.value}")
    return out
