"""Deferrable sensors of the failover DAG: they hand their wait to a trigger (see triggers.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseSensorOperator
from airflow.sdk.exceptions import AirflowFailException

from mirrorflow_airflow.triggers import ReplicationLagTrigger, SourceQuietTrigger, _FailoverCheckTrigger

STEP_REPORT_KEY = "step_report"


class _FailoverSensor(BaseSensorOperator):
    """Defers to its trigger; the run's failover params (validated) go with it."""

    template_fields: Sequence[str] = ("config_path", "group_name")
    trigger_class: type[_FailoverCheckTrigger] = _FailoverCheckTrigger
    ui_color = "#e8f0fe"

    def __init__(self, *, config_path: str, group_name: str, poke_interval: float = 5.0,
                 timeout: float = 3600.0, **kwargs: Any) -> None:
        super().__init__(poke_interval=poke_interval, timeout=timeout, **kwargs)
        self.config_path = config_path
        self.group_name = group_name

    def _params(self, context: Any) -> dict[str, Any]:
        from mirror_core.failover import FailoverParams

        return FailoverParams.from_mapping(dict(context["params"])).as_dict()

    def _trigger(self, context: Any) -> _FailoverCheckTrigger:
        return self.trigger_class(self.config_path, self.group_name, self._params(context),
                                  poll_interval=self.poke_interval, timeout=self.timeout)

    def execute(self, context: Any) -> None:
        self.defer(trigger=self._trigger(context), method_name="execute_complete")

    def poke(self, context: Any) -> bool:
        return bool(self._trigger(context).check(None).ok)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        report = event.get("report")
        if report is not None:
            context["ti"].xcom_push(key=STEP_REPORT_KEY, value=report)
        if event.get("status") != "ok":
            raise AirflowFailException(event.get("message") or "check failed")
        self.log.info("%s", report["summary"] if report else "ok")
        return report or {}


class ReplicationLagSensor(_FailoverSensor):
    """Waits (deferred) until replication lag is under the run's max_lag_records / max_lag_seconds."""

    trigger_class = ReplicationLagTrigger


class SourceQuietSensor(_FailoverSensor):
    """Waits (deferred) until the source had no new records for quiet_seconds and (with a running
    stream) lag is 0."""

    trigger_class = SourceQuietTrigger

    def __init__(self, *, require_lag_zero: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.require_lag_zero = require_lag_zero

    def _trigger(self, context: Any) -> _FailoverCheckTrigger:
        return SourceQuietTrigger(self.config_path, self.group_name, self._params(context),
                                  poll_interval=self.poke_interval, timeout=self.timeout,
                                  require_lag_zero=self.require_lag_zero)
