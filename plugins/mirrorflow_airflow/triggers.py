"""Triggers: the failover's waits (replication lag under thresholds, a quiet source) and a stopped stream's wait
for its stop to be removed.

They run in the triggerer; each check is blocking client I/O (confluent-kafka), so it runs in a
thread (``asyncio.to_thread``) and the event loop stays free. Only the config path, the group name,
the failover params and a stop's reason are serialized: never a cluster property or secret.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from mirror_core.errors import MirrorError, UnreachableError


class _FailoverCheckTrigger(BaseTrigger):
    """Polls one failover check until it passes, fails for good, or ``timeout`` seconds pass."""

    step = ""

    def __init__(self, config_path: str, group_name: str, params: dict[str, Any], poll_interval: float = 5.0,
                 timeout: float = 3600.0, started_at: float | None = None) -> None:
        super().__init__()
        self.config_path = config_path
        self.group_name = group_name
        self.params = dict(params)
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.started_at = time.time() if started_at is None else float(started_at)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "config_path": self.config_path, "group_name": self.group_name, "params": self.params,
            "poll_interval": self.poll_interval, "timeout": self.timeout, "started_at": self.started_at})

    def check(self, previous: dict[str, Any] | None) -> Any:
        """One blocking check; returns a failover.StepReport."""
        raise NotImplementedError

    def _load(self) -> tuple[Any, Any, Any]:
        from mirror_core.failover import FailoverParams
        from mirrorflow_airflow.hooks import MirrorflowHook

        cfg, group = MirrorflowHook(self.config_path).get_group(self.group_name)
        return cfg, group, FailoverParams.from_mapping(self.params)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        previous: dict[str, Any] | None = None
        said, said_at = "", 0.0
        while True:
            try:
                report = await asyncio.to_thread(self.check, previous)
            except Exception as exc:  # noqa: BLE001 - every failure ends as an event the task reports
                why = _why(exc)
                if not _no_answer(exc):  # the config, the params, a refusal, a missing topic: no wait mends it
                    yield TriggerEvent({"status": "error", "message": f"{self.step}: {why}"})
                    return
                # a cluster that does not answer for a while (a broker restarting): not yet, until the timeout;
                # the quiet period starts again once it answers
                if time.time() - self.started_at >= self.timeout:
                    yield TriggerEvent({"status": "timeout", "message": f"{self.step}: not reached within "
                                                                        f"{self.timeout:.0f} s; last: {why}"})
                    return
                previous = None
                if why != said or time.time() - said_at >= 60:
                    self.log.warning("%s: no answer, trying again: %s", self.step, why)
                    said, said_at = why, time.time()
                await asyncio.sleep(self.poll_interval)
                continue
            if report.ok:
                yield TriggerEvent({"status": "ok", "report": report.as_dict()})
                return
            if time.time() - self.started_at >= self.timeout:
                yield TriggerEvent({"status": "timeout", "report": report.as_dict(),
                                    "message": f"{self.step}: not reached within {self.timeout:.0f} s: {report.summary}"})
                return
            previous = dict(report.details)
            self.log.info("%s: %s", self.step, report.summary)
            await asyncio.sleep(self.poll_interval)


def _no_answer(exc: BaseException) -> bool:
    """Whether a check failed because a cluster did not answer (worth trying again), rather than refused or found
    something wrong (a config error, an ACL refusal, a topic that is gone: a wait does not mend those)."""
    from mirror_core import clients

    return isinstance(exc, (UnreachableError, OSError, TimeoutError)) or clients.unanswered(exc)


def _why(exc: BaseException) -> str:
    from confluent_kafka import KafkaException

    from mirror_core import clients

    if isinstance(exc, (KafkaException, MirrorError)):
        return clients.error_text(exc)
    return f"{type(exc).__name__}: {exc}"


class ReplicationLagTrigger(_FailoverCheckTrigger):
    """Fires when the group's replication lag is under ``max_lag_records`` and ``max_lag_seconds``."""

    step = "lag"

    def check(self, previous: dict[str, Any] | None) -> Any:
        from mirror_core import failover

        cfg, group, params = self._load()
        return failover.lag_check(cfg, group, params)


class SourceQuietTrigger(_FailoverCheckTrigger):
    """Fires when the source had no new records for ``quiet_seconds`` (and lag is 0, if required)."""

    step = "quiet"

    def __init__(self, *args: Any, require_lag_zero: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.require_lag_zero = bool(require_lag_zero)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        path, kwargs = super().serialize()
        return path, kwargs | {"require_lag_zero": self.require_lag_zero}

    def check(self, previous: dict[str, Any] | None) -> Any:
        from mirror_core import failover

        cfg, group, params = self._load()
        return failover.quiet_check(cfg, group, params, previous, self.require_lag_zero)


class StreamStopTrigger(BaseTrigger):
    """Fires once a failover's stop of the group's stream (:mod:`mirror_core.stops`) is removed, looking every
    ``poll_interval`` seconds (one read of the destination's stops topic). The stream task of a continuous group
    waits here, deferred, instead of skipping: its ``@continuous`` DAG would start the next run at once, which
    would skip too, for good.

    It never fails for a destination that does not answer (not knowing whether the stop is still there is no
    reason to end the wait, nor to start the job): it warns when that starts or changes, and every
    :data:`REMIND_S` while it lasts. ``reason`` is the stop the task saw; a line is logged only when what is
    seen changes."""

    #: how often a destination that still does not answer is warned about again
    REMIND_S = 600.0
    #: the clock of those warnings
    clock: Callable[[], float] = time.monotonic

    def __init__(self, config_path: str, group_name: str, reason: str, poll_interval: float = 60.0) -> None:
        super().__init__()
        self.config_path = config_path
        self.group_name = group_name
        self.reason = reason
        self.poll_interval = float(poll_interval)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (f"{type(self).__module__}.{type(self).__qualname__}", {
            "config_path": self.config_path, "group_name": self.group_name, "reason": self.reason,
            "poll_interval": self.poll_interval})

    def look(self) -> str | None:
        """The stop in force now (its reason), or None; blocking."""
        from mirror_core.failover import stream_stop_requested
        from mirrorflow_airflow.hooks import MirrorflowHook

        cfg, group = MirrorflowHook(self.config_path).get_group(self.group_name)
        return stream_stop_requested(cfg, group)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from mirror_core.stops import StopSignalError

        seen, unknown, warned_at = self.reason, "", 0.0
        while True:
            await asyncio.sleep(self.poll_interval)  # the task has just looked
            try:
                reason = await asyncio.to_thread(self.look)
            except Exception as exc:  # noqa: BLE001 - what no wait mends ends as an event the task reports
                why = _why(exc)
                if not isinstance(exc, StopSignalError) and not _no_answer(exc):
                    yield TriggerEvent({"status": "error", "message": f"cannot read the stream's stop: {why}"})
                    return
                if why != unknown or self.clock() - warned_at >= self.REMIND_S:
                    self.log.warning("%s: whether the stream's stop is still in force is not known: %s (waiting on; "
                                     "looking again every %g s)", self.group_name, why, self.poll_interval)
                    unknown, warned_at = why, self.clock()
                continue
            if unknown:
                self.log.info("%s: the stops are read again", self.group_name)
                unknown = ""
            if reason is None:
                self.log.info("%s: the stop is removed", self.group_name)
                yield TriggerEvent({"status": "lifted"})
                return
            if reason != seen:
                self.log.info("%s: still stopped, now by: %s", self.group_name, reason)
                seen = reason
