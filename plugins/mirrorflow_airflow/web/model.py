"""The Mirrors page's model: lag samples in, what the page shows out. Pure (no Airflow, no I/O).

The samples are the ``record_lag`` task's XComs of each group's ``offset_sync`` DAG (contract:
``{"group", "taken_at", "partitions": [{"source_topic", "destination_topic", "partition",
"lag_records", "lag_seconds", "source_end", "destination_end"}], "last_checkpoint_at", "stream_stopped"}``;
``stream_stopped`` is absent from samples taken before 7 December, and from one whose task could not read the
stop: the newest sample that has it decides). Only those fields are read, so nothing else a sample might carry
ever reaches the page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


def parse_time(value: Any) -> datetime | None:
    """An ISO-8601 timestamp (``Z`` or an offset; naive means UTC) as an aware datetime, else None."""
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@dataclass(frozen=True)
class PartitionLag:
    """One mirrored partition in one sample."""

    source_topic: str
    destination_topic: str
    partition: int
    lag_records: int
    lag_seconds: float | None
    source_end: int
    destination_end: int


@dataclass(frozen=True)
class LagSample:
    """One ``record_lag`` result: every mirrored partition of a group at ``taken_at``."""

    group: str
    taken_at: datetime
    partitions: tuple[PartitionLag, ...]
    last_checkpoint_at: datetime | None
    #: why a failover stopped the group's stream for good, or None
    stream_stopped: str | None = None
    #: whether the sample says (False: taken before the field, or the stop could not be read)
    stream_stopped_known: bool = False

    @property
    def total_lag_records(self) -> int:
        return sum(p.lag_records for p in self.partitions)

    @property
    def max_lag_seconds(self) -> float | None:
        known = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        return max(known) if known else None


def parse_sample(raw: Any) -> LagSample | None:
    """A sample from its XCom value, or None when it does not follow the contract (the page skips it)."""
    if not isinstance(raw, Mapping):
        return None
    taken = parse_time(raw.get("taken_at"))
    group = raw.get("group")
    parts = raw.get("partitions")
    if taken is None or not isinstance(group, str) or not isinstance(parts, list):
        return None
    out = []
    for p in parts:
        try:
            lag_s = p.get("lag_seconds")
            out.append(PartitionLag(
                source_topic=str(p["source_topic"]), destination_topic=str(p["destination_topic"]),
                partition=int(p["partition"]), lag_records=int(p["lag_records"]),
                lag_seconds=None if lag_s is None else float(lag_s),
                source_end=int(p["source_end"]), destination_end=int(p["destination_end"]),
            ))
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
    stopped = raw.get("stream_stopped")
    known = "stream_stopped" in raw and (stopped is None or isinstance(stopped, str))
    reason = stopped.strip() if isinstance(stopped, str) else ""
    return LagSample(group, taken, tuple(out), parse_time(raw.get("last_checkpoint_at")), reason or None, known)


@dataclass(frozen=True)
class PartitionRow:
    """A table row: the latest sample's figures for one partition, and its throughput since the one before."""

    source_topic: str
    destination_topic: str
    partition: int
    lag_records: int
    lag_seconds: float | None
    source_end: int
    destination_end: int
    #: records written to the destination per second between the last two samples (None with one sample)
    throughput: float | None


@dataclass(frozen=True)
class GroupView:
    """Everything the page shows for one mirror group."""

    group: str
    stream_state: str | None  # the stream DAG's latest run state; None: never ran
    stream_dag_id: str
    #: why a failover stopped the stream for good (the latest sample's), or None
    stream_stopped: str | None
    offset_sync_dag_id: str
    taken_at: datetime | None
    sample_age_seconds: float | None
    last_checkpoint_age_seconds: float | None
    rows: tuple[PartitionRow, ...]
    total_lag_records: int
    max_lag_seconds: float | None
    throughput: float | None
    #: (taken_at, total lag records, max lag seconds) per sample, oldest first: the lag-over-time plot
    series: tuple[tuple[datetime, int, float | None], ...]


@dataclass(frozen=True)
class PageModel:
    generated_at: datetime
    groups: tuple[GroupView, ...]


def dag_id(group: str, purpose: str) -> str:
    """The generated DAGs' ids: ``mirrorflow__<group>__<purpose>``."""
    return f"mirrorflow__{group}__{purpose}"


def group_of(dag: str, purpose: str) -> str | None:
    """The group of a generated DAG id of ``purpose``, else None."""
    prefix, suffix = "mirrorflow__", f"__{purpose}"
    if dag.startswith(prefix) and dag.endswith(suffix) and len(dag) > len(prefix) + len(suffix):
        return dag[len(prefix):-len(suffix)]
    return None


def _throughput(latest: LagSample, before: LagSample | None) -> tuple[dict[tuple[str, int], float], float | None]:
    if before is None:
        return {}, None
    dt = (latest.taken_at - before.taken_at).total_seconds()
    if dt <= 0:
        return {}, None
    prev = {(p.source_topic, p.partition): p.destination_end for p in before.partitions}
    per: dict[tuple[str, int], float] = {}
    for p in latest.partitions:
        key = (p.source_topic, p.partition)
        if key in prev:
            per[key] = max(0, p.destination_end - prev[key]) / dt
    return per, (sum(per.values()) if per else None)


def group_view(group: str, samples: Iterable[LagSample], stream_state: str | None, now: datetime) -> GroupView:
    """One group's view from its samples (any order) and its stream DAG's latest run state."""
    ordered = sorted((s for s in samples if s.group == group), key=lambda s: s.taken_at)
    latest = ordered[-1] if ordered else None
    before = ordered[-2] if len(ordered) > 1 else None
    per, total_tp = _throughput(latest, before) if latest else ({}, None)
    rows = tuple(
        PartitionRow(p.source_topic, p.destination_topic, p.partition, p.lag_records, p.lag_seconds,
                     p.source_end, p.destination_end, per.get((p.source_topic, p.partition)))
        for p in sorted(latest.partitions, key=lambda p: (p.source_topic, p.partition))
    ) if latest else ()
    ckpt = latest.last_checkpoint_at if latest else None
    return GroupView(
        group=group, stream_state=stream_state, stream_dag_id=dag_id(group, "stream"),
        stream_stopped=next((s.stream_stopped for s in reversed(ordered) if s.stream_stopped_known), None),
        offset_sync_dag_id=dag_id(group, "offset_sync"),
        taken_at=latest.taken_at if latest else None,
        sample_age_seconds=(now - latest.taken_at).total_seconds() if latest else None,
        last_checkpoint_age_seconds=(now - ckpt).total_seconds() if ckpt else None,
        rows=rows, total_lag_records=latest.total_lag_records if latest else 0,
        max_lag_seconds=latest.max_lag_seconds if latest else None, throughput=total_tp,
        series=tuple((s.taken_at, s.total_lag_records, s.max_lag_seconds) for s in ordered),
    )


def build_page(raw_samples: Iterable[Any], stream_states: Mapping[str, str | None], now: datetime,
               groups: Iterable[str] = ()) -> PageModel:
    """The page from raw XCom values (malformed ones skipped), the stream DAGs' latest run states by group,
    and the groups known otherwise (a group with a stream DAG but no sample yet is listed too)."""
    samples = [s for s in (parse_sample(r) for r in raw_samples) if s is not None]
    names = sorted({s.group for s in samples} | set(stream_states) | set(groups))
    return PageModel(now, tuple(group_view(g, samples, stream_states.get(g), now) for g in names))
