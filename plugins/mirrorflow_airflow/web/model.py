"""The Mirrors page's model: lag samples in, what the page shows out. Pure (no Airflow, no I/O).

The data are two XComs of each run of the ``record_lag`` task of a group's ``offset_sync`` DAG
(``mirror_core.lag_samples`` makes them):

* ``lag_sample``, kept only in the group's newest run: ``{"group", "taken_at", "partitions": [{"source_topic",
  "destination_topic", "partition", "lag_records", "lag_seconds", "source_end", "destination_end",
  "throughput"}], "lag_records", "max_lag_seconds", "throughput", "last_checkpoint_at", "stream_stopped"}``;
* ``lag_totals``, kept in every run, a few hundred bytes: the same without ``partitions`` (their number instead).
  The lag-over-time plot reads only these.

``stream_stopped`` is absent when the task could not read the stop: the newest record that has it decides.
``throughput`` is records written to the destination per second since the group's sample before (None for the
first). Only these fields are read, so nothing else a record might carry ever reaches the page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

#: the ``record_lag`` task's XCom keys: the newest sample with every partition, and every sample's totals
SAMPLE_KEY = "lag_sample"
TOTALS_KEY = "lag_totals"


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
    """One mirrored partition in one sample (a row of the page's table)."""

    source_topic: str
    destination_topic: str
    partition: int
    lag_records: int
    lag_seconds: float | None
    source_end: int
    destination_end: int
    #: records written to the destination per second since the sample before (None without one)
    throughput: float | None = None


@dataclass(frozen=True)
class LagTotals:
    """One sample's group figures: a point of the lag-over-time history."""

    group: str
    taken_at: datetime
    lag_records: int
    max_lag_seconds: float | None
    #: why a failover stopped the group's stream for good, or None
    stream_stopped: str | None = None
    #: whether the record says (False: the task could not read the stop)
    stream_stopped_known: bool = False


@dataclass(frozen=True)
class LagSample:
    """One ``record_lag`` result: every mirrored partition of a group at ``taken_at``."""

    group: str
    taken_at: datetime
    partitions: tuple[PartitionLag, ...]
    last_checkpoint_at: datetime | None
    #: why a failover stopped the group's stream for good, or None
    stream_stopped: str | None = None
    #: whether the sample says (False: the stop could not be read)
    stream_stopped_known: bool = False
    #: the partitions' throughput summed (None when none has one)
    throughput: float | None = None

    @property
    def total_lag_records(self) -> int:
        return sum(p.lag_records for p in self.partitions)

    @property
    def max_lag_seconds(self) -> float | None:
        known = [p.lag_seconds for p in self.partitions if p.lag_seconds is not None]
        return max(known) if known else None


def _number(value: Any) -> float | None:
    """A float from a JSON number, None from None; anything else raises ValueError or TypeError."""
    return None if value is None else float(value)


def _stop(raw: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(why a failover stopped the stream, or None; whether the record says)."""
    stopped = raw.get("stream_stopped")
    known = "stream_stopped" in raw and (stopped is None or isinstance(stopped, str))
    reason = stopped.strip() if isinstance(stopped, str) else ""
    return reason or None, known


def parse_sample(raw: Any) -> LagSample | None:
    """A ``lag_sample`` from its XCom value, or None when it does not follow the contract (the page skips it)."""
    if not isinstance(raw, Mapping):
        return None
    taken = parse_time(raw.get("taken_at"))
    group = raw.get("group")
    parts = raw.get("partitions")
    if taken is None or not isinstance(group, str) or not isinstance(parts, list):
        return None
    out = []
    try:
        for p in parts:
            out.append(PartitionLag(
                source_topic=str(p["source_topic"]), destination_topic=str(p["destination_topic"]),
                partition=int(p["partition"]), lag_records=int(p["lag_records"]),
                lag_seconds=_number(p.get("lag_seconds")),
                source_end=int(p["source_end"]), destination_end=int(p["destination_end"]),
                throughput=_number(p.get("throughput")),
            ))
        throughput = _number(raw.get("throughput"))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    reason, known = _stop(raw)
    return LagSample(group, taken, tuple(out), parse_time(raw.get("last_checkpoint_at")), reason, known, throughput)


def parse_totals(raw: Any) -> LagTotals | None:
    """A ``lag_totals`` record from its XCom value, or None when it does not follow the contract (skipped)."""
    if not isinstance(raw, Mapping):
        return None
    taken = parse_time(raw.get("taken_at"))
    group = raw.get("group")
    if taken is None or not isinstance(group, str):
        return None
    try:
        records, seconds = int(raw["lag_records"]), _number(raw.get("max_lag_seconds"))
    except (KeyError, TypeError, ValueError):
        return None
    return LagTotals(group, taken, records, seconds, *_stop(raw))


@dataclass(frozen=True)
class GroupView:
    """Everything the page shows for one mirror group."""

    group: str
    #: the ``mirror_stream`` task's state in the stream DAG's latest run (Airflow's names: ``running``,
    #: ``up_for_retry``, ``failed``...; ``no_status`` before the scheduler set one); None: never ran
    stream_state: str | None
    stream_dag_id: str
    #: why a failover stopped the stream for good (the latest sample's), or None
    stream_stopped: str | None
    offset_sync_dag_id: str
    taken_at: datetime | None
    sample_age_seconds: float | None
    last_checkpoint_age_seconds: float | None
    #: the newest sample's partitions, by topic and partition
    rows: tuple[PartitionLag, ...]
    total_lag_records: int
    max_lag_seconds: float | None
    throughput: float | None
    #: (taken_at, total lag records, max lag seconds) per totals record, oldest first: the lag-over-time plot
    series: tuple[tuple[datetime, int, float | None], ...]


@dataclass(frozen=True)
class PageModel:
    generated_at: datetime
    groups: tuple[GroupView, ...]
    #: groups no longer in the config (or left out of it) whose stream task was last active: (group, state)
    unmanaged: tuple[tuple[str, str], ...] = ()
    #: the config's DAG files that fail to import (groups left out for a problem, or the whole config)
    config_errors: int = 0


def dag_id(group: str, purpose: str) -> str:
    """The generated DAGs' ids: ``mirrorflow__<group>__<purpose>``."""
    return f"mirrorflow__{group}__{purpose}"


def group_of(dag: str, purpose: str) -> str | None:
    """The group of a generated DAG id of ``purpose``, else None."""
    prefix, suffix = "mirrorflow__", f"__{purpose}"
    if dag.startswith(prefix) and dag.endswith(suffix) and len(dag) > len(prefix) + len(suffix):
        return dag[len(prefix):-len(suffix)]
    return None


def group_view(group: str, latest: LagSample | None, history: Iterable[LagTotals], stream_state: str | None,
               now: datetime) -> GroupView:
    """One group's view from its newest sample (the table and figures), its totals in the window (any order: the
    plot) and its stream task's state."""
    ordered = sorted((t for t in history if t.group == group), key=lambda t: t.taken_at)
    latest = latest if latest is not None and latest.group == group else None
    rows = tuple(sorted(latest.partitions, key=lambda p: (p.source_topic, p.partition))) if latest else ()
    stops = [(t.taken_at, t.stream_stopped) for t in ordered if t.stream_stopped_known]
    if latest and latest.stream_stopped_known:
        stops.append((latest.taken_at, latest.stream_stopped))
    ckpt = latest.last_checkpoint_at if latest else None
    return GroupView(
        group=group, stream_state=stream_state, stream_dag_id=dag_id(group, "stream"),
        stream_stopped=max(stops, key=lambda s: s[0])[1] if stops else None,
        offset_sync_dag_id=dag_id(group, "offset_sync"),
        taken_at=latest.taken_at if latest else None,
        sample_age_seconds=(now - latest.taken_at).total_seconds() if latest else None,
        last_checkpoint_age_seconds=(now - ckpt).total_seconds() if ckpt else None,
        rows=rows, total_lag_records=latest.total_lag_records if latest else 0,
        max_lag_seconds=latest.max_lag_seconds if latest else None,
        throughput=latest.throughput if latest else None,
        series=tuple((t.taken_at, t.lag_records, t.max_lag_seconds) for t in ordered),
    )


def build_page(raw_samples: Iterable[Any], raw_totals: Iterable[Any], stream_states: Mapping[str, str | None],
               now: datetime, groups: Iterable[str] = ()) -> PageModel:
    """The page from raw XCom values (malformed ones skipped): the groups' newest ``lag_sample`` (the newest
    per group counts), their ``lag_totals`` in the window, their stream task's states, and the groups known
    otherwise (a group with a DAG but no sample yet is listed too)."""
    newest: dict[str, LagSample] = {}
    for s in (parse_sample(r) for r in raw_samples):
        if s is not None and (s.group not in newest or s.taken_at > newest[s.group].taken_at):
            newest[s.group] = s
    history = [t for t in (parse_totals(r) for r in raw_totals) if t is not None]
    names = sorted(set(newest) | {t.group for t in history} | set(stream_states) | set(groups))
    return PageModel(now, tuple(group_view(g, newest.get(g), history, stream_states.get(g), now) for g in names))
