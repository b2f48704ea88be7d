"""Lag samples: what the Airflow ``record_lag`` task records for the Mirrors page, as plain JSON values.

A sample holds every mirrored partition of a group at one moment (its size grows with the partitions); its
:func:`totals` are a few fields of fixed size (the page plots them over time). Both are pure dicts here: the
operator stores them (the sample only in the newest run, the totals in every run) and the page reads them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from mirror_core import clients, stops
from mirror_core.checkpoint import topic_mappings
from mirror_core.config import GroupConfig, MirrorsConfig
from mirror_core.errors import KafkaOperationError
from mirror_core.failover import lag_totals, utc_now
from mirror_core.health import LagReport, replication_lag

#: the longest failover reason a totals record keeps (the sample keeps it whole): the record stays small
MAX_REASON_CHARS = 300


def to_sample(group: str, lag: LagReport, destination_topics: Mapping[str, str],
              destination_ends: Mapping[tuple[str, int], int], last_checkpoint_at: str | None,
              taken_at: str | None = None, stream_stopped: str | None = None) -> dict[str, Any]:
    """The lag sample (its JSON contract is in the page's model): per mirrored partition, lag in records and
    seconds and both sides' end offsets, and the group's total lag and worst lag in seconds; ``stream_stopped``:
    why a failover stopped the group's stream for good (its lag then grows for good), or None."""
    parts = []
    for p in lag.partitions:
        dst_topic = destination_topics.get(p.source_topic, p.source_topic)
        parts.append({"source_topic": p.source_topic, "destination_topic": dst_topic, "partition": p.partition,
                      "lag_records": int(p.lag_records),
                      "lag_seconds": None if p.lag_seconds is None else float(p.lag_seconds),
                      "source_end": int(p.source_end),
                      "destination_end": int(destination_ends.get((dst_topic, p.partition), 0))})
    records, seconds = lag_totals(lag)
    return {"group": group, "taken_at": taken_at or utc_now(), "partitions": parts,
            "lag_records": records, "max_lag_seconds": seconds,
            "last_checkpoint_at": last_checkpoint_at, "stream_stopped": stream_stopped}


def with_throughput(sample: Mapping[str, Any], previous: Mapping[str, Any] | None) -> dict[str, Any]:
    """``sample`` with each partition's ``throughput``: records written to the destination per second since
    ``previous`` (the group's sample before it), None for a partition it lacks or without a usable one; and
    the group's ``throughput``, their sum (None when no partition has one)."""
    dt = _seconds_between(previous.get("taken_at"), sample.get("taken_at")) if previous else 0.0
    ends: dict[tuple[str, int], int] = {}
    if dt > 0 and previous:
        for p in previous.get("partitions") or ():
            try:
                ends[(str(p["source_topic"]), int(p["partition"]))] = int(p["destination_end"])
            except (KeyError, TypeError, ValueError):
                continue
    parts, rates = [], []
    for p in sample["partitions"]:
        end = ends.get((p["source_topic"], p["partition"]))
        rate = None if end is None else max(0, p["destination_end"] - end) / dt
        parts.append({**p, "throughput": rate})
        if rate is not None:
            rates.append(rate)
    return {**sample, "partitions": parts, "throughput": sum(rates) if rates else None}


#: the fields of a sample its totals keep
TOTALS_FIELDS = ("group", "taken_at", "lag_records", "max_lag_seconds", "throughput", "last_checkpoint_at")


def totals(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The sample's small record for the lag-over-time history: the group's figures and its number of partitions,
    not the partitions. ``stream_stopped`` only when the sample has it (a stop it could not read is left out)."""
    out = {k: sample.get(k) for k in TOTALS_FIELDS}
    out["partitions"] = len(sample.get("partitions") or ())
    if "stream_stopped" in sample:
        reason = sample["stream_stopped"]
        out["stream_stopped"] = reason[:MAX_REASON_CHARS] if isinstance(reason, str) else reason
    return out


def _seconds_between(earlier: Any, later: Any) -> float:
    """Seconds from one ISO-8601 time to another; 0 when either is missing or not a time."""
    try:
        return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()
    except (TypeError, ValueError):
        return 0.0


def lag_sample(cfg: MirrorsConfig, group: GroupConfig) -> dict[str, Any]:
    """Measure the group's lag now and return it as a :func:`to_sample` dict."""
    mappings = topic_mappings(cfg, group)
    # to the millisecond: the next sample's throughput divides by the time between them
    taken_at = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    lag = replication_lag(cfg, group, mappings=mappings)
    dst_topics = {m.source_topic: m.destination_topic for m in mappings}
    ends: dict[tuple[str, int], int] = {}
    for topic in set(dst_topics.values()):
        try:
            for p, (_low, high) in clients.end_offsets(cfg.cluster(group.destination), topic).items():
                ends[(topic, p)] = high
        except KafkaOperationError:
            continue
    sample = to_sample(group.name, lag, dst_topics, ends,
                       last_checkpoint_time(cfg, group, set(dst_topics.values())), taken_at)
    try:
        sample["stream_stopped"] = stops.requested(cfg, group, timeout=stops.WATCH_TIMEOUT_S)
    except stops.StopSignalError:
        del sample["stream_stopped"]  # the sample is about lag: a stop it cannot read is left out (not "none")
    return sample


def last_checkpoint_time(cfg: MirrorsConfig, group: GroupConfig, destination_topics: set[str],
                         tail: int = 1000) -> str | None:
    """When the newest checkpoint for one of these destination topics was written (ISO UTC), or None."""
    from mirror_core.offsets import Checkpoint

    dst = cfg.cluster(group.destination)
    try:
        ends = clients.end_offsets(dst, group.checkpoints_topic)
    except KafkaOperationError:
        return None
    newest: int | None = None
    for p, (low, high) in ends.items():
        for m in clients.read_partition(dst, group.checkpoints_topic, p, max(low, high - tail), high, timeout=20):
            try:
                cp = Checkpoint.from_record(m.key(), m.value())
            except Exception:  # noqa: BLE001 - a record that is not ours
                continue
            if cp.topic in destination_topics:
                newest = max(newest or 0, m.timestamp()[1])
    if newest is None:
        return None
    return datetime.fromtimestamp(newest / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
