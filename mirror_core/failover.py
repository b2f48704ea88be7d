"""Moving consumers from a group's source cluster to its destination: the migration steps.

Each step is a plain function that reads both clusters, may act, and returns a small frozen
:class:`StepReport`. Every step is idempotent: running it again after a crash or a retry gives the
same answer and changes nothing twice. The Airflow failover DAG only sequences them (with a person's
approval before the two irreversible moments); ``mirrorflow failover CONFIG --group G --step S`` runs
the same steps by hand.

The order, and what each step guarantees before the next one may run:

1. :func:`preflight`: the mirror has replicated every partition, destination topics and schema
   subjects are in sync with the source, and the consumer groups to move have committed offsets on
   the source and no active members on the destination.
2. :func:`lag_check`: replication lag is under the thresholds (a person then stops the producers).
3. :func:`quiet_check`: no new source records for ``quiet_seconds`` (and, while a stream runs, lag 0).
4. :func:`final_sync`: lag is 0; checkpoints are emitted and the groups' translated offsets written to
   the (idle) destination groups; every partition they committed on has an exact translation.
5. :func:`verify`: parity of every mirrored partition (counts and checksums); a mismatch fails.
6. :func:`finalize`: the group's stream is asked to stop for good (a record in the stops topic on its
   destination, :mod:`mirror_core.stops`, which the job, ``run`` and the stream DAG honour wherever they run)
   and the reverse group, if the config has one, is made ready.
7. :func:`render_report`: a markdown report and a JSON summary of where the run got to.

This module never imports Airflow; adapters pass in what only they know (is the stream job running?).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from mirror_core import clients, joblock, stops
from mirror_core.checkpoint import (
    NOTHING_TO_MIRROR,
    RoundReport,
    SourceTranslator,
    emit_checkpoints,
    load_sync_store,
    source_group_offsets,
    sync_selected_groups,
    topic_mappings,
)
from mirror_core.config import GroupConfig, MirrorsConfig, RegexFilter
from mirror_core.errors import ConfigError, ConfigIssue
from mirror_core.health import LagReport, replication_lag, verify_parity

STEPS = ("preflight", "lag", "quiet", "drain", "sync", "verify", "finalize", "report")


@dataclass(frozen=True)
class FailoverParams:
    """What a person chooses when starting a failover (validated before any step runs)."""

    consumer_groups: tuple[str, ...]
    max_lag_records: int = 1000
    max_lag_seconds: float = 60.0
    quiet_seconds: float = 30.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> FailoverParams:
        """Parse and validate params (from a DAG run's conf or the CLI); every problem names its key."""
        issues: list[ConfigIssue] = []
        groups = raw.get("consumer_groups")
        if isinstance(groups, str):
            groups = [g.strip() for g in groups.split(",") if g.strip()]
        if not isinstance(groups, (list, tuple)) or not groups or not all(isinstance(g, str) and g for g in groups):
            issues.append(ConfigIssue("consumer_groups", "give at least one consumer group id"))
            groups = []

        def number(key: str, default: float, integer: bool) -> float:
            value = raw.get(key, default)
            try:
                num = int(value) if integer else float(value)
            except (TypeError, ValueError):
                issues.append(ConfigIssue(key, f"not a number: {value!r}"))
                return default
            if num < 0:
                issues.append(ConfigIssue(key, f"must be >= 0, got {value!r}"))
            return num

        params = cls(tuple(groups), int(number("max_lag_records", cls.max_lag_records, True)),
                     number("max_lag_seconds", cls.max_lag_seconds, False),
                     number("quiet_seconds", cls.quiet_seconds, False))
        if issues:
            raise ConfigError(issues, "failover params")
        return params

    def as_dict(self) -> dict[str, Any]:
        return {"consumer_groups": list(self.consumer_groups), "max_lag_records": self.max_lag_records,
                "max_lag_seconds": self.max_lag_seconds, "quiet_seconds": self.quiet_seconds}


@dataclass(frozen=True)
class StepReport:
    """The outcome of one step: ``ok`` decides whether the migration may go on; ``details`` is JSON."""

    step: str
    group: str
    ok: bool
    summary: str
    details: Mapping[str, Any] = field(default_factory=dict)
    at: str = field(default_factory=lambda: utc_now())

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"details": dict(self.details)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepReport:
        return cls(d["step"], d["group"], bool(d["ok"]), d["summary"], dict(d.get("details") or {}), d.get("at", ""))


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def for_consumer_groups(group: GroupConfig, consumer_groups: Iterable[str]) -> GroupConfig:
    """``group`` with its offsets section narrowed to exactly these consumer groups (sync switched on)."""
    include = "|".join(re.escape(g) for g in consumer_groups)
    offsets = group.offsets.model_copy(update={"groups": RegexFilter(include=include), "sync_group_offsets": True,
                                               "emit_checkpoints": True})
    return group.model_copy(update={"offsets": offsets})


# --------------------------------------------------------------------------- 1. preflight


def preflight(cfg: MirrorsConfig, group: GroupConfig, params: FailoverParams,
              stream_running: bool | None = None) -> StepReport:
    """Is the group ready to fail over? ``stream_running``: what the adapter knows about the stream job
    (None: not known / not required, e.g. a scheduled drain)."""
    from mirror_core.provision import plan_group

    problems: list[str] = []
    mappings = topic_mappings(cfg, group)
    if not mappings:
        problems.append("the group mirrors no topic on the source")
    if stream_running is False:
        problems.append("the stream job is not running")
    lag = replication_lag(cfg, group, mappings=mappings)
    unmirrored = [f"{p.source_topic}[{p.partition}]" for p in lag.partitions
                  if p.mirrored_to is None and p.source_end > 0]
    if unmirrored:
        problems.append(f"not mirrored yet: {', '.join(unmirrored)}")
    plan = plan_group(cfg, group)
    pending = [f"{a.kind} {a.topic}" for a in plan.topics.actions if a.kind not in ("unchanged",)]
    if plan.schemas is not None:
        pending += [f"schema {s.action} {s.subject}" for s in plan.schemas.steps if s.action != "unchanged"]
        pending += [f"schema error {e}" for e in plan.schemas.errors]
    if pending:
        problems.append(f"destination not in sync with the source: {'; '.join(pending)}")
    src_offsets = source_group_offsets(cfg, for_consumer_groups(group, params.consumer_groups),
                                       {m.source_topic for m in mappings})
    for gid in params.consumer_groups:
        if gid not in src_offsets:
            problems.append(f"consumer group {gid!r} has no committed offsets on the mirrored topics")
    active = destination_members(cfg, group, params.consumer_groups)
    for gid, n in active.items():
        if n:
            problems.append(f"consumer group {gid!r} has {n} active member(s) on the destination")
    details = {"topics": len(mappings), "partitions": len(lag.partitions),
               "consumer_groups": {g: len(src_offsets.get(g, {})) for g in params.consumer_groups},
               "problems": problems}
    summary = "ready" if not problems else "; ".join(problems)
    return StepReport("preflight", group.name, not problems, summary, details)


def destination_members(cfg: MirrorsConfig, group: GroupConfig, consumer_groups: Sequence[str]) -> dict[str, int]:
    """Active members of each consumer group on the destination (0 = idle or unknown there)."""
    return _members(cfg, group.destination, consumer_groups)


def source_members(cfg: MirrorsConfig, group: GroupConfig, consumer_groups: Sequence[str]) -> dict[str, int]:
    """Active members of each consumer group on the source (0 = idle or unknown there)."""
    return _members(cfg, group.source, consumer_groups)


def _members(cfg: MirrorsConfig, alias: str, consumer_groups: Sequence[str]) -> dict[str, int]:
    admin = clients.admin(cfg.cluster(alias))
    futs = admin.describe_consumer_groups(list(consumer_groups), request_timeout=30)
    return {gid: len(fut.result(30).members) for gid, fut in futs.items()}


# --------------------------------------------------------------------------- 2. lag


def lag_totals(lag: LagReport) -> tuple[int, float | None]:
    """Records behind in total, and the worst lag in seconds (None if unknown)."""
    records = sum(p.lag_records for p in lag.partitions)
    secs = [p.lag_seconds for p in lag.partitions if p.lag_seconds is not None]
    return records, (max(secs) if secs else None)


def lag_check(cfg: MirrorsConfig, group: GroupConfig, params: FailoverParams) -> StepReport:
    """Replication lag under ``max_lag_records`` and ``max_lag_seconds``?"""
    lag = replication_lag(cfg, group)
    records, seconds = lag_totals(lag)
    ok = records <= params.max_lag_records and (seconds or 0.0) <= params.max_lag_seconds
    summary = (f"lag {records} records, {seconds if seconds is not None else '-'} s "
               f"(thresholds {params.max_lag_records} records, {params.max_lag_seconds} s)")
    return StepReport("lag", group.name, ok, summary, {"lag_records": records, "lag_seconds": seconds})


# --------------------------------------------------------------------------- 3. quiet


def source_ends(cfg: MirrorsConfig, group: GroupConfig) -> dict[str, int]:
    """``"topic:partition" -> end offset`` of every mirrored source partition (JSON-friendly keys)."""
    return {k: stable for k, (stable, _high) in _source_ends(cfg, group).items()}


def _source_ends(cfg: MirrorsConfig, group: GroupConfig) -> dict[str, tuple[int, int]]:
    """``"topic:partition" -> (last stable offset, high watermark)``: they differ while a transaction is open."""
    out: dict[str, tuple[int, int]] = {}
    src = cfg.cluster(group.source)
    for m in topic_mappings(cfg, group):
        stable = clients.end_offsets(src, m.source_topic)
        high = clients.end_offsets(src, m.source_topic, committed=False)
        for p, (_low, end) in stable.items():
            out[f"{m.source_topic}:{p}"] = (end, high.get(p, (0, end))[1])
    return out


def quiet_check(cfg: MirrorsConfig, group: GroupConfig, params: FailoverParams,
                baseline: Mapping[str, Any] | None = None, require_lag_zero: bool = True,
                now: float | None = None) -> StepReport:
    """Has the source been quiet (no new records) for ``quiet_seconds`` since ``baseline``, and is lag 0?

    ``baseline`` is the ``details`` of the previous call's report (source ends and when they were
    seen); the first call, or a call that sees new records, starts a new quiet period. Pass
    ``require_lag_zero=False`` when no stream runs between drains (the final drain comes next)."""
    now = time.time() if now is None else now
    both = _source_ends(cfg, group)
    ends = {k: stable for k, (stable, _high) in both.items()}
    # a transaction still open holds the last stable offset where it began: its records (and lag) cannot be seen
    # yet, and if its producer commits after the stream stopped, they are never mirrored
    open_txns = sorted(k for k, (stable, high) in both.items() if high > stable)
    since = now
    if baseline and baseline.get("ends") == ends and not open_txns:
        since = float(baseline["since"])
    quiet_for = now - since
    records = 0
    if require_lag_zero:
        records, _ = lag_totals(replication_lag(cfg, group))
    ok = quiet_for >= params.quiet_seconds and records == 0 and not open_txns
    summary = f"source quiet for {quiet_for:.1f} s of {params.quiet_seconds} s" + (
        f", lag {records} records" if require_lag_zero else "")
    if open_txns:
        shown = ", ".join(open_txns[:5]) + (f" and {len(open_txns) - 5} more" if len(open_txns) > 5 else "")
        summary += f"; a transaction is open on the source in {shown} (a producer not stopped?)"
    return StepReport("quiet", group.name, ok, summary, {"ends": ends, "since": since, "lag_records": records,
                                                         "open_transactions": open_txns})


def wait_quiet(cfg: MirrorsConfig, group: GroupConfig, params: FailoverParams, timeout: float,
               require_lag_zero: bool = True, poll: float = 2.0) -> StepReport:
    """:func:`quiet_check` repeated until it passes or ``timeout`` seconds have gone (CLI use)."""
    deadline = time.monotonic() + timeout
    rep = quiet_check(cfg, group, params, None, require_lag_zero)
    while not rep.ok and time.monotonic() < deadline:
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        rep = quiet_check(cfg, group, params, rep.details, require_lag_zero)
    return rep


# --------------------------------------------------------------------------- 4. final sync


def final_sync(cfg: MirrorsConfig, group: GroupConfig, params: FailoverParams) -> StepReport:
    """With lag 0: checkpoints and group offset sync for the chosen groups, then check that each
    destination group sits exactly at the translation of its source offset, partition by partition."""
    narrowed = for_consumer_groups(group, params.consumer_groups)
    mappings = topic_mappings(cfg, narrowed)
    store = load_sync_store(cfg, narrowed)
    lag = replication_lag(cfg, narrowed, store, mappings)
    behind, _ = lag_totals(lag)
    if behind:
        return StepReport("sync", group.name, False, f"not drained: {behind} records still to mirror",
                          {"lag_records": behind})
    round_report = RoundReport(group.name)
    checkpoints = emit_checkpoints(cfg, narrowed, store, mappings, round_report)
    sync_selected_groups(cfg, narrowed, mappings, checkpoints, round_report)
    by_src = {m.source_topic: m.destination_topic for m in mappings}
    src = source_group_offsets(cfg, narrowed, set(by_src))
    dst = destination_group_offsets(cfg, group, params.consumer_groups)
    rows, problems = [], []
    translator = SourceTranslator(cfg, narrowed, store)
    for gid in params.consumer_groups:
        for (topic, p), committed in sorted(src.get(gid, {}).items()):
            dst_topic = by_src[topic]
            tr = translator.translate(topic, p, committed, dst_topic)
            got = dst.get(gid, {}).get((dst_topic, p))
            # exact, or the destination's end where nothing was ever mirrored (nothing skipped either way); an
            # inexact "ahead of mirror" answer means records still to mirror (a race with lag 0): not synced
            placed = tr.exact or tr.reason == NOTHING_TO_MIRROR
            ok = tr.downstream_offset is not None and placed and got == tr.downstream_offset
            rows.append({"consumer_group": gid, "source_topic": topic, "destination_topic": dst_topic,
                         "partition": p, "source_committed": committed, "translated": tr.downstream_offset,
                         "destination_committed": got, "ok": ok})
            if not ok:
                problems.append(f"{gid} {dst_topic}[{p}]: destination at {got}, expected {tr.downstream_offset}"
                                + (f" ({tr.reason})" if tr.downstream_offset is None or not placed else ""))
    for g in round_report.groups:
        problems += [f"{g.group} {t}[{'*' if p is None else p}]: {why}" for t, p, why in g.skipped]
    summary = (f"{len(rows)} partition offsets synced" if not problems else "; ".join(problems))
    return StepReport("sync", group.name, not problems, summary, {"offsets": rows, "problems": problems})


def destination_group_offsets(cfg: MirrorsConfig, group: GroupConfig, consumer_groups: Sequence[str]
                              ) -> dict[str, dict[tuple[str, int], int]]:
    """Committed offsets of each consumer group on the destination."""
    from confluent_kafka import ConsumerGroupTopicPartitions

    admin = clients.admin(cfg.cluster(group.destination))
    out: dict[str, dict[tuple[str, int], int]] = {}
    for gid in consumer_groups:
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(gid)], request_timeout=30)[gid].result(30)
        out[gid] = {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions if tp.offset >= 0}
    return out


# --------------------------------------------------------------------------- 5. verify


def verify(cfg: MirrorsConfig, group: GroupConfig) -> StepReport:
    """Parity of every mirrored partition; any mismatch fails (before consumers are switched)."""
    res = verify_parity(cfg, group)
    bad = [r for r in res if not r.ok]
    rows = [{"source_topic": r.source_topic, "destination_topic": r.destination_topic, "partition": r.partition,
             "source_count": r.source_count, "destination_count": r.destination_count, "ok": r.ok,
             "first_mismatch_offset": r.first_mismatch_offset, "note": r.note} for r in res]
    records = sum(r.source_count for r in res if r.ok)
    summary = (f"{len(res)} partitions match, {records} records verified" if not bad else
               "MISMATCH: " + ", ".join(f"{r.source_topic}[{r.partition}] at source offset {r.first_mismatch_offset}"
                                        for r in bad))
    return StepReport("verify", group.name, not bad, summary, {"partitions": rows, "records_verified": records})


# --------------------------------------------------------------------------- 6. finalize


def stream_stop_requested(cfg: MirrorsConfig, group: GroupConfig) -> str | None:
    """Why the group's stream must not run (a failover's reason and time), or None
    (:func:`mirror_core.stops.requested`; raises :class:`mirror_core.stops.StopSignalError` when the
    destination does not answer)."""
    return stops.requested(cfg, group)


def request_stream_stop(cfg: MirrorsConfig, group: GroupConfig, reason: str) -> str:
    """Stop the group's stream for good: a record in the stops topic on its destination, which the running job,
    ``run`` and the stream DAG read (idempotent: a stop in force is kept as it is). Returns where it is."""
    stops.request(cfg, group, reason, utc_now())
    return stops.where(cfg, group)


def clear_stream_stop(cfg: MirrorsConfig, group: GroupConfig) -> bool:
    """Remove the group's stop (a failback, or a failover that was called off); True if there was one."""
    return stops.clear(cfg, group)


def how_to_lift(cfg: MirrorsConfig, group: GroupConfig, config_path: str) -> str:
    """What removes the group's stop, for a person reading why its stream waits: ``resume`` by hand, or the
    finalize of a failover back (the reverse group's, which readies this one)."""
    by_hand = f"`mirrorflow failover {config_path} --group {group.name} --step resume`"
    rev = reverse_group(cfg, group)
    if rev is None:
        return by_hand
    return f"{by_hand}, or the finalize of a failover of the reverse group {rev.name!r}"


def wait_stream_ended(group: GroupConfig, timeout: float, tasks_running: Callable[[], int] | None = None,
                      say: Callable[[str], None] = lambda _line: None, poll: float = 2.0) -> bool | None:
    """Wait (at most ``timeout`` seconds) until the group's stream job has ended: no job holds its checkpoint
    (:mod:`mirror_core.joblock`; a job sees its stop within seconds) and, when the caller can count
    them (``tasks_running``: Airflow's running stream tasks), none runs. True: ended; False: still running at the
    timeout; None: nothing tells (a checkpoint not on this machine, and no task count). ``say`` gets a line when
    what it waits for changes, and every 30 s while it does not."""
    lock = joblock.lock_path(group.spark.checkpoint_dir, group.name)
    if lock is not None and not lock.exists():
        # no job of this version ran on the checkpoint, or it is not where this process looks (a relative
        # checkpoint_dir from another directory): not proof of anything
        say(f"no lock at {lock.resolve()}: cannot tell from the checkpoint whether a job runs")
        lock = None
    if lock is None and tasks_running is None:
        return None
    deadline = time.monotonic() + timeout
    said, said_at = "", 0.0
    while True:
        running = tasks_running() if tasks_running is not None else 0
        try:
            held = joblock.holder(lock) if lock is not None else None
        except joblock.CheckpointLockError as exc:
            say(f"{exc}: cannot tell from the checkpoint whether a job runs")
            lock = None
            if tasks_running is None:
                return None
            continue
        if not running and held is None:
            return True
        now = time.monotonic()
        if now >= deadline:
            return False
        line = (f"waiting for {running} running stream task(s) to end" if running or held is None
                else f"waiting for the job still running on the group's checkpoint to end: {held.describe()}")
        if line != said or now - said_at >= 30.0:
            say(line)
            said, said_at = line, now
        time.sleep(poll)


def reverse_group(cfg: MirrorsConfig, group: GroupConfig) -> GroupConfig | None:
    """The group mirroring the other way (destination -> source), if the config has one."""
    for g in cfg.groups:
        if g.name != group.name and g.source == group.destination and g.destination == group.source:
            return g
    return None


def resync(cfg: MirrorsConfig, group: GroupConfig, params: FailoverParams) -> StepReport:
    """:func:`final_sync` once more, as ``finalize``'s first step: the approval before it asks for the consumers to
    be stopped on the source, and what they read there since ``final_sync`` would otherwise be read again on the
    destination. Their destination offsets follow them forward (never back); a group that already has members on
    the destination is left as it is, and the report says so, as it does when the clusters did not answer or
    records are still to mirror. Any of these keeps finalize from stopping the stream (:func:`stop_blocked`)."""
    try:
        active = {gid: n for gid, n in source_members(cfg, group, params.consumer_groups).items() if n}
        if active:
            # what they read from here on would be read again on the destination: nothing is stopped yet, and
            # the step runs again once they are (see stop_blocked)
            who = ", ".join(f"{gid!r} has {n} active member(s)" for gid, n in sorted(active.items()))
            return StepReport("resync", group.name, False,
                              f"consumers still run on the source {group.source}: {who}; stop them there, then run "
                              "finalize again", {"source_members": active})
        rep = final_sync(cfg, group, params)
    except Exception as exc:  # noqa: BLE001 - reported; finalize stops nothing (stop_blocked)
        return StepReport("resync", group.name, False, f"could not sync them again: {exc}", {})
    return StepReport("resync", group.name, rep.ok, rep.summary, rep.details, rep.at)


def stop_blocked(resynced: StepReport | None) -> str | None:
    """Why finalize must not stop the stream after :func:`resync`, or None. Any failed resync blocks it:
    consumers still running on the source (the approval said they were stopped; they were not), records still to
    mirror (a producer wrote after ``quiet``, or a transaction committed late: stopped for good, the stream would
    never bring them, and the switched consumers would never read them), a group not placed where its consumers
    stopped (they would read again what they read since ``sync``), or clusters that did not answer. Nothing is
    stopped; the step runs again once that is fixed. Without consumer groups (``resynced`` None) nothing blocks."""
    if resynced is None or resynced.ok:
        return None
    return (f"{resynced.summary}; nothing stopped: run finalize again once that is fixed (a group its consumers "
            "may re-read on the destination can be left out of it)")


def finalize(cfg: MirrorsConfig, group: GroupConfig, stream_stopped: bool | None = None,
             resynced: StepReport | None = None, stop: str | None = None) -> StepReport:
    """Stop the group's stream for good (its stop, :func:`request_stream_stop`) and make the reverse group ready to start.

    ``stream_stopped``: the adapter's answer to "has the job ended?" (None: it could not tell). ``resynced``: the
    consumer groups' offsets synced again at the start of the step (:func:`resync`), which must have passed.
    ``stop``: where the adapter wrote the stream's stop before its wait (:func:`request_stream_stop`); without
    it, it is written here. The reverse group is made ready only once the stop is written."""
    written = stop is not None
    if stop is None:
        try:
            stop, written = request_stream_stop(cfg, group, f"failover of group {group.name} to {group.destination}"), True
        except stops.StopSignalError as exc:
            stop = f"NOT written: {exc}"
    rev = reverse_group(cfg, group)
    details: dict[str, Any] = {"stop": stop, "stream_stopped": stream_stopped,
                               "reverse_group": rev.name if rev else None}
    ok = stream_stopped is not False and written
    summary = ("stream stopped" if stream_stopped else "stream asked to stop" if stream_stopped is None
               else "the stream job is still running")
    if not written:
        summary = f"the stream's stop {stop}; {summary}"
    if rev is not None and not written:
        details["reverse_stop_cleared"] = None
        summary += f"; reverse group {rev.name!r} left as it was (the stream is not stopped for good)"
    elif rev is not None:
        try:
            details["reverse_stop_cleared"] = clear_stream_stop(cfg, rev)
            summary += f"; reverse group {rev.name!r} ready to start"
        except stops.StopSignalError as exc:
            # the failover itself is done; the reverse group's own stop (an earlier failover's) is still there
            details["reverse_stop_cleared"] = None
            summary += (f"; reverse group {rev.name!r} NOT ready: {exc} (`mirrorflow failover --group {rev.name} "
                        "--step resume` removes its stop)")
            ok = False
    else:
        summary += "; no reverse group in the config"
    if resynced is not None:
        details["resync"] = {"ok": resynced.ok, "summary": resynced.summary,
                             "offsets": resynced.details.get("offsets", [])}
        ok = ok and resynced.ok
        summary = (f"consumer offsets synced again: {resynced.summary}; " if resynced.ok else
                   f"consumer offsets NOT synced again: {resynced.summary}; ") + summary
    return StepReport("finalize", group.name, ok, summary, details)


# --------------------------------------------------------------------------- 7. report


def render_report(group: GroupConfig, reports: Sequence[StepReport], stopped_at: str | None = None,
                  reason: str = "") -> tuple[str, dict[str, Any]]:
    """Markdown for a person and a JSON summary: each step's outcome, per consumer group and partition
    source committed -> destination committed, records verified, and where the run stopped."""
    by_step = {r.step: r for r in reports}
    completed = "finalize" in by_step and by_step["finalize"].ok and stopped_at is None
    lines = [f"# Failover of group `{group.name}`: {group.source} -> {group.destination}", ""]
    lines.append("**Completed: consumers can move to the destination.**" if completed else
                 f"**Stopped at `{stopped_at or '?'}`**" + (f": {reason}" if reason else "") +
                 ". Nothing was changed after that point.")
    lines += ["", "| step | result | summary |", "|---|---|---|"]
    for r in reports:
        lines.append(f"| {r.step} | {'ok' if r.ok else 'FAILED'} | {r.summary} |")
    offsets = list(by_step["sync"].details.get("offsets", [])) if "sync" in by_step else []
    if offsets:
        lines += ["", "| consumer group | topic | partition | source committed | destination committed |",
                  "|---|---|---|---|---|"]
        lines += [f"| {o['consumer_group']} | {o['destination_topic']} | {o['partition']} | {o['source_committed']} | "
                  f"{o['destination_committed']} |" for o in offsets]
    verified = by_step["verify"].details.get("records_verified") if "verify" in by_step else None
    if verified is not None:
        lines += ["", f"Records verified: {verified}"]
    summary = {"group": group.name, "source": group.source, "destination": group.destination,
               "completed": completed, "stopped_at": None if completed else stopped_at, "reason": reason,
               "steps": {r.step: {"ok": r.ok, "summary": r.summary} for r in reports},
               "offsets": offsets, "records_verified": verified}
    return "\n".join(lines) + "\n", summary
