"""Operators: thin, templated adapters over ``mirror_core``.

Each operator keeps only names in ``__init__`` (config path, group name; no I/O), loads the config
through :class:`~mirrorflow_airflow.hooks.MirrorflowHook` when it runs (resolving Airflow connections
then), calls one core function and returns a JSON summary without secrets (``record_lag`` pushes its two
XComs by key instead).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException, AirflowSkipException

from mirror_core.config import CONNECTIONS_FILE_ENV, SUBMITTED_MASTER_ENV, with_master
from mirror_core.process import OWNER_ENV, owner_token
from mirrorflow_airflow.hooks import MirrorflowHook
from mirrorflow_airflow.sensors import STEP_REPORT_KEY
from mirrorflow_airflow.triggers import StreamStopTrigger
from mirrorflow_airflow.web.model import SAMPLE_KEY, TOTALS_KEY

#: Airflow ``http`` connection of Airflow's own public API (host = base URL, login / password), used
#: by the failover's finalize to pause the stream DAG; without it the pause is done through the
#: metadata database when the task may reach it (``dag.test()``), else only the group's stop (mirror_core.stops) acts.
AIRFLOW_API_CONN_ID = "mirrorflow_airflow_api"


class MirrorflowOperator(BaseOperator):
    """Base: a config path and a group name (both templated)."""

    template_fields: Sequence[str] = ("config_path", "group_name")
    ui_color = "#dff5e3"

    def __init__(self, *, config_path: str, group_name: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self.group_name = group_name

    def load(self) -> tuple[Any, Any]:
        """(config with connections resolved, the group)."""
        return MirrorflowHook(self.config_path).get_group(self.group_name)


# --------------------------------------------------------------------------- provisioning


class ValidateConfigOperator(MirrorflowOperator):
    """Validate the config and resolve the group's clusters (fails with one line per problem)."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.config import resolve_mirrors
        from mirror_core.errors import ConfigError

        try:
            cfg, group = self.load()
        except ConfigError as exc:
            raise AirflowFailException(f"{exc.source}: {exc}") from None
        return {"group": group.name, "source": group.source, "destination": group.destination,
                "mirrors": len(resolve_mirrors(group)), "clusters": sorted(cfg.clusters)}


def plan_table(plan: Any) -> str:
    """A provisioning plan as a plain-text table for the task log, then one line per error, schema error,
    skipped source topic, warning and note (what the CLI prints under its table)."""
    rows = [("action", "destination", "source", "partitions", "RF", "reason")]
    for a in plan.topics.actions:
        rows.append((a.kind, a.topic, a.source_topic or "-", str(a.partitions or "-"),
                     str(a.replication_factor or "-"), a.reason))
    if plan.schemas is not None:
        rows += [(f"schema {s.action}", s.subject, s.source_subject or "-", "-", "-", s.detail)
                 for s in plan.schemas.steps]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines + plan_findings(plan))


def plan_findings(plan: Any) -> list[str]:
    """What a plan says beside its actions, one line each: topic errors, schema errors (per mirror), source
    topics a mirror skipped (a mistyped ``source_topic`` among them), warnings, notes."""
    out = [f"error: {a.mirror}: {a.topic}: {a.reason}" for a in plan.topics.errors]
    if plan.schemas is not None:
        out += [f"schema error: {': '.join(e) if isinstance(e, tuple) else e}" for e in plan.schemas.errors]
    out += [f"skipped {t}: {reason}" for t, reason in plan.topics.skipped]
    out += [f"warning: {w}" for w in plan.topics.warnings]
    out += [f"note: {n}" for n in plan.topics.notes]
    return out


class PlanOperator(MirrorflowOperator):
    """Plan the group's provisioning (read-only) and log it as a table with its errors, skipped topics and
    warnings; fails if a topic cannot be provisioned as planned (as ``mirrorflow provision`` refuses to start;
    a missing permission to copy ACLs fails ``apply_topics`` instead, once the topics are there).
    Schema errors are reported here and fail ``mirror_schemas``, after the topics are provisioned."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.provision import plan_group

        cfg, group = self.load()
        plan = plan_group(cfg, group)
        self.log.info("plan for group %s:\n%s", group.name, plan_table(plan))
        if plan.topics.blocking:  # an ACL copy it may not do fails apply_topics, after the topics
            raise AirflowFailException(
                f"the plan for group {group.name} has {len(plan.topics.blocking)} topic error(s): "
                + "; ".join(f"{a.topic}: {a.reason}" for a in plan.topics.blocking))
        kinds: dict[str, int] = {}
        for a in plan.topics.actions:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
        if plan.schemas is not None:
            for s in plan.schemas.steps:
                kinds[f"schema {s.action}"] = kinds.get(f"schema {s.action}", 0) + 1
        return {"group": group.name, "actions": kinds,
                "schema_errors": len(plan.schemas.errors) if plan.schemas is not None else 0,
                "skipped": [t for t, _ in plan.topics.skipped]}


def _report(op: BaseOperator, group: str, res: Any, what: str) -> dict[str, Any]:
    """Log what was done and each error on a line of its own; fail (naming the errors) when there are any."""
    for line in res.done:
        op.log.info("%s: %s", group, line)
    for line in res.errors:
        op.log.error("%s: error: %s", group, line)
    if res.errors:
        raise AirflowFailException(f"{what} of group {group}: {len(res.errors)} error(s), done {len(res.done)}: "
                                   + "; ".join(res.errors))
    return {"group": group, "done": res.done}


class ApplyTopicsOperator(MirrorflowOperator):
    """Create / grow destination topics, sync their configs and ACLs: each topic on its own; fails, naming them,
    if the destination refused any."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.provision import apply_topics, plan_group

        cfg, group = self.load()
        return _report(self, group.name, apply_topics(cfg, group, plan_group(cfg, group)), "topics")


class MirrorSchemasOperator(MirrorflowOperator):
    """Mirror the group's schema subjects (after its topics exist); each error is logged with its mirror and the
    task fails if there is one."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.provision import apply_schemas, plan_group

        cfg, group = self.load()
        return _report(self, group.name, apply_schemas(cfg, group, plan_group(cfg, group)), "schema subjects")


# --------------------------------------------------------------------------- offsets


class CheckpointOperator(MirrorflowOperator):
    """Checkpoints for the selected source groups and their offsets synced into idle destination groups."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.checkpoint import run_round

        cfg, group = self.load()
        rep = run_round(cfg, group.model_copy(update={"heartbeats": group.heartbeats.model_copy(
            update={"enabled": False})}))
        out = {"group": group.name, "consumer_groups": [
            {"group": g.group, "checkpoints": g.checkpoints, "written": [list(w) for w in g.written],
             "skipped": [[t, p, why] for t, p, why in g.skipped]} for g in rep.groups],
            "syncs_refreshed": rep.syncs_refreshed}
        for g in rep.groups:
            self.log.info("%s: %d checkpoints, offsets written %s, skipped %s", g.group, g.checkpoints,
                          g.written or "-", g.skipped or "-")
        if rep.syncs_refreshed:
            self.log.info("offset syncs of %d idle partitions written again (kept past the sync topic's retention)",
                          rep.syncs_refreshed)
        return out


class HeartbeatOperator(MirrorflowOperator):
    """One MM2 heartbeat on the source (the stream mirrors it; lag in seconds uses it when idle)."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.checkpoint import emit_heartbeat

        cfg, group = self.load()
        if not group.heartbeats.enabled:
            return {"group": group.name, "heartbeat": "off"}
        if not emit_heartbeat(cfg, group):
            raise AirflowFailException("heartbeat not acknowledged")
        return {"group": group.name, "heartbeat": "sent"}


class RecordLagOperator(MirrorflowOperator):
    """A lag sample for the Mirrors page, as two XComs (contract in ``mirrorflow_airflow.web.model``): the sample
    with every partition (``lag_sample``), kept only in the newest run (this run deletes the one before), and
    its totals (``lag_totals``, a few hundred bytes), kept in every run: the page's lag-over-time history."""

    def execute(self, context: Any) -> None:
        from mirror_core.lag_samples import lag_sample, totals, with_throughput

        cfg, group = self.load()
        from airflow.sdk.execution_time.xcom import XCom

        ti = context["ti"]
        # the samples earlier runs kept (one, unless a delete failed): all of them, not the one of the latest run, whose
        # lookup logs an error line when there is none (the first run)
        kept = [x for x in XCom.get_all(key=SAMPLE_KEY, dag_id=ti.dag_id, task_id=self.task_id,
                                        run_id=context["run_id"], include_prior_dates=True) or ()
                if isinstance(x, dict)]
        previous = max(kept, key=lambda x: str(x.get("taken_at") or ""), default=None)
        sample = with_throughput(lag_sample(cfg, group), previous)
        sample["run_id"] = context["run_id"]  # the next run deletes this sample by it
        ti.xcom_push(SAMPLE_KEY, sample)
        ti.xcom_push(TOTALS_KEY, totals(sample))
        for stale_run in {x.get("run_id") for x in kept} - {context["run_id"]}:
            if isinstance(stale_run, str):
                XCom.delete(key=SAMPLE_KEY, task_id=self.task_id, dag_id=ti.dag_id, run_id=stale_run, map_index=-1)
        self.log.info("%s: lag %d records over %d partitions", group.name, sample["lag_records"],
                      len(sample["partitions"]))


class UpstreamFailedOperator(BaseOperator):
    """Runs only when a task before it failed (trigger rule ``one_failed``; skipped otherwise) and fails, so that
    the DAG run fails: a run's state comes from its last tasks, and the one that failed may not be one of them
    (the offset_sync DAG's checkpoint round, after which the lag sample is taken all the same)."""

    def execute(self, context: Any) -> None:
        failed = sorted(self.upstream_task_ids)
        raise AirflowFailException(f"{', '.join(failed)} failed: see its log")


#: XCom key of a failover approval answered by its response timeout (True), not by a person
TIMED_OUT_KEY = "timed_out"


class FailoverApprovalOperator(ApprovalOperator):
    """An approval of the failover DAG that also records when its response timeout answered it (with its
    default, Reject), so that the report tells that from a person's Reject."""

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if event.get("timedout"):
            self.log.warning("nobody answered before the approval's response timeout: answered %s",
                             ", ".join(event.get("chosen_options") or []))
            context["ti"].xcom_push(key=TIMED_OUT_KEY, value=True)
        return super().execute_complete(context, event)


class VerifyOperator(MirrorflowOperator):
    """Parity of every mirrored partition (counts + checksums); fails on a mismatch."""

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core.failover import verify

        cfg, group = self.load()
        rep = verify(cfg, group)
        self.log.info("%s", rep.summary)
        if not rep.ok:
            raise AirflowFailException(rep.summary)
        return rep.as_dict()


# --------------------------------------------------------------------------- failover


class FailoverStepOperator(MirrorflowOperator):
    """One step of ``mirror_core.failover`` (preflight, sync, verify) with the run's validated params.

    The step's report goes to XCom (key ``step_report``) whether or not it passed; a failed step fails
    the task, so nothing after it runs."""

    template_fields: Sequence[str] = ("config_path", "group_name", "stream_dag_id")
    STEPS = ("preflight", "sync", "verify")

    def __init__(self, *, step: str, stream_dag_id: str | None = None, sibling_dag_ids: Sequence[str] = (),
                 **kwargs: Any) -> None:
        """``sibling_dag_ids``: the other DAGs that move the same group's consumers; the preflight refuses while
        a run of one is going on (two failovers of one flow at once stop and sync each other's steps)."""
        if step not in self.STEPS:
            raise ValueError(f"step must be one of {self.STEPS}, got {step!r}")
        super().__init__(**kwargs)
        self.step = step
        self.stream_dag_id = stream_dag_id
        self.sibling_dag_ids = list(sibling_dag_ids)

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core import failover
        from mirror_core.errors import ConfigError

        try:
            params = failover.FailoverParams.from_mapping(dict(context["params"]))
        except ConfigError as exc:
            raise AirflowFailException(f"invalid params: {exc}") from None
        cfg, group = self.load()
        if self.step == "preflight":
            ti = context["ti"]
            busy = [d for d in self.sibling_dag_ids if ti.get_dr_count(dag_id=d, states=["running"])]
            if busy:
                raise AirflowFailException(f"preflight: a run of {', '.join(busy)} moves the consumers of group "
                                           f"{group.name} already: let it end (or mark it failed) first")
            running = None
            if group.spark.mode == "continuous" and self.stream_dag_id:
                running = stream_jobs_running(ti, self.stream_dag_id) > 0
            rep = failover.preflight(cfg, group, params, stream_running=running)
        elif self.step == "sync":
            rep = failover.final_sync(cfg, group, params)
        else:
            rep = failover.verify(cfg, group)
        return push_report(self, context, rep)


def push_report(op: BaseOperator, context: Any, rep: Any) -> dict[str, Any]:
    """Log a step report, push it to XCom, fail the task when it did not pass."""
    data = rep.as_dict()
    context["ti"].xcom_push(key=STEP_REPORT_KEY, value=data)
    op.log.info("%s: %s", rep.step, rep.summary)
    if not rep.ok:
        raise AirflowFailException(f"{rep.step}: {rep.summary}")
    return data


class FinalizeFailoverOperator(MirrorflowOperator):
    """Sync the consumer groups' offsets once more (their consumers were stopped on the source before the
    approval; :func:`mirror_core.failover.resync`), stop the group's stream for good (its stop record on the
    destination, :mod:`mirror_core.stops`; the stream DAG paused; its job ended) and make the reverse group
    ready. The job has ended when no task of the stream DAG runs and no job holds the group's checkpoint (its
    lock, :mod:`mirror_core.joblock`): a job whose task died, or one started by hand, sees the stop within
    seconds."""

    template_fields: Sequence[str] = ("config_path", "group_name", "stream_dag_id")

    def __init__(self, *, stream_dag_id: str, stop_timeout: float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stream_dag_id = stream_dag_id
        self.stop_timeout = stop_timeout

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core import failover
        from mirror_core.errors import ConfigError

        try:
            params = failover.FailoverParams.from_mapping(dict(context["params"]))
        except ConfigError as exc:
            raise AirflowFailException(f"invalid params: {exc}") from None
        cfg, group = self.load()
        # the consumers were stopped on the source before the approval: their offsets follow them (before the
        # stream stops, which takes up to its stop timeout)
        resynced = failover.resync(cfg, group, params)
        self.log.info("resync: %s", resynced.summary)
        blocked = failover.stop_blocked(resynced)
        if blocked is not None:
            # nothing stopped yet: once it is fixed, clearing the task runs the step again
            raise AirflowFailException(blocked)
        try:
            where = failover.request_stream_stop(cfg, group, f"failover of group {group.name} to {group.destination}")
        except failover.stops.StopSignalError as exc:
            # nothing stopped yet: clearing the task runs the step again (its resync and stop are idempotent)
            raise AirflowFailException(f"the stream's stop not written: {exc}") from None
        self.log.info("stream stopped for good: %s", where)
        paused = pause_dag(self.stream_dag_id, self.log)
        stopped = failover.wait_stream_ended(group, self.stop_timeout,
                                             lambda: stream_jobs_running(context["ti"], self.stream_dag_id),
                                             say=self.log.info)
        rep = failover.finalize(cfg, group, stream_stopped=stopped, resynced=resynced, stop=where)
        rep = failover.StepReport(rep.step, rep.group, rep.ok, rep.summary,
                                  dict(rep.details) | {"stream_dag_paused": paused}, rep.at)
        return push_report(self, context, rep)


def stream_jobs_running(ti: Any, stream_dag_id: str) -> int:
    """How many ``mirror_stream`` task instances of the stream DAG are running (a running one is a live
    Spark job; a queued or retried one will see the stop and not start one). Counting tasks, not runs: a
    continuous DAG that could not be paused starts a new run, whose task waits (``deferred``, no job) until
    the stop is removed."""
    states = ti.get_task_states(dag_id=stream_dag_id, task_ids=["mirror_stream"])
    return sum(1 for by_task in states.values() for state in by_task.values() if str(state) == "running")


def pause_dag(dag_id: str, log: Any) -> bool | None:
    """Pause ``dag_id`` through Airflow's public API (connection ``mirrorflow_airflow_api``), else the
    metadata database when reachable; True/False, or None when neither is available."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(AIRFLOW_API_CONN_ID)
    except Exception:  # noqa: BLE001 - connection not defined (its lookup raises a not-found error)
        conn = None
    if conn is not None:
        import httpx

        base = conn.host if "://" in (conn.host or "") else f"http://{conn.host}"
        if conn.port:
            base = f"{base}:{conn.port}"
        try:
            with httpx.Client(base_url=base, timeout=30) as http:
                tok = http.post("/auth/token", json={"username": conn.login, "password": conn.password})
                tok.raise_for_status()
                headers = {"Authorization": f"Bearer {tok.json()['access_token']}"}
                r = http.patch(f"/api/v2/dags/{dag_id}", json={"is_paused": True}, headers=headers)
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            # the stop is written already: the failover goes on (the job sees the stop, the DAG's runs skip)
            log.warning("could not pause %s through the API at %s: %s", dag_id, base,
                        exc if isinstance(exc, httpx.HTTPError) else "no token in its answer")
            return None
        if r.status_code != 200:
            log.warning("could not pause %s through the API at %s: HTTP %d", dag_id, base, r.status_code)
            return False
        log.info("paused %s through the API", dag_id)
        return True
    try:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session
        from sqlalchemy import update

        with create_session() as session:
            session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_paused=True))
        log.info("paused %s", dag_id)
        return True
    except Exception as exc:  # noqa: BLE001 - no database access from this task
        log.warning("could not pause %s (%s); define the %s connection to let the failover pause it",
                    dag_id, type(exc).__name__, AIRFLOW_API_CONN_ID)
        return None


class FailoverReportOperator(BaseOperator):
    """The failover report: markdown in the log, a JSON summary as XCom. Runs whatever happened upstream
    (trigger rule all_done) and fails when a step failed; a rejection ends the run successfully."""

    template_fields: Sequence[str] = ("config_path", "group_name")

    def __init__(self, *, config_path: str, group_name: str, steps: Sequence[tuple[str, str]], **kwargs: Any) -> None:
        """``steps``: (task_id, kind) in order; kind is a failover step name or ``approval``."""
        super().__init__(**kwargs)
        self.config_path = config_path
        self.group_name = group_name
        self.steps = list(steps)

    def execute(self, context: Any) -> dict[str, Any]:
        from mirror_core import failover
        from mirror_core.config import load_group

        group = load_group(self.config_path, self.group_name).group(self.group_name)  # names only: no connection
        ti = context["ti"]
        reports: list[failover.StepReport] = []
        stopped_at: str | None = None
        reason = ""
        failed = False
        for task_id, kind in self.steps:
            if kind == "approval":
                # a Reject makes the ApprovalOperator skip what follows (its skip list is an XCom);
                # an Approve leaves no trace here but the task's success
                skipped = ti.xcom_pull(task_ids=task_id, key="skipmixin_key")
                if skipped:
                    stopped_at, reason = task_id, ("no answer before the approval's timeout: rejected"
                                                   if ti.xcom_pull(task_ids=task_id, key=TIMED_OUT_KEY)
                                                   else "rejected at the approval")
                    break
                state = _state(ti, task_id)
                if state != "success":
                    stopped_at, reason, failed = task_id, f"the approval did not complete ({state})", True
                    break
                continue
            if kind == "task":  # a step that reports nothing but its state (the final drain)
                state = _state(ti, task_id)
                if state != "success":
                    stopped_at, reason, failed = task_id, f"did not complete ({state})", True
                    break
                continue
            data = ti.xcom_pull(task_ids=task_id, key=STEP_REPORT_KEY)
            if data is None:
                stopped_at, reason, failed = task_id, "did not complete", True
                break
            rep = failover.StepReport.from_dict(data)
            reports.append(rep)
            if not rep.ok:
                stopped_at, reason, failed = task_id, rep.summary, True
                break
        markdown, summary = failover.render_report(group, reports, stopped_at, reason)
        self.log.info("failover report\n%s", markdown)
        if failed:
            ti.xcom_push(key="return_value", value=summary)
            raise AirflowFailException(f"failover stopped at {stopped_at}: {reason}")
        return summary


def _state(ti: Any, task_id: str) -> str:
    """The state of ``task_id`` in this task's DAG run (``none`` when it never ran)."""
    states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[task_id], run_ids=[ti.run_id])
    return str(states.get(ti.run_id, {}).get(task_id) or "none")


# --------------------------------------------------------------------------- the stream (Spark)


def stream_application() -> str:
    """Absolute path of ``spark_jobs/mirror_stream.py`` (located without importing pyspark)."""
    spec = find_spec("spark_jobs")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the spark_jobs package is not installed")
    return str(Path(next(iter(spec.submodule_search_locations))) / "mirror_stream.py")


def _spark_submit_on_path() -> None:
    """The provider runs ``spark-submit`` by name: when PATH has none, use pyspark's, next to this
    interpreter (the virtualenv that has mirror_core and pyspark)."""
    import shutil

    here = Path(sys.executable).parent
    if shutil.which("spark-submit") is None and (here / "spark-submit").exists():
        os.environ["PATH"] = f"{here}{os.pathsep}{os.environ.get('PATH', '')}"


class MirrorStreamOperator(SparkSubmitOperator):
    """``spark-submit spark_jobs/mirror_stream.py CONFIG --group G [--once]`` through the Spark provider.

    * The Spark connection (``spark.airflow_conn_id``) gives the master; when it does not exist the
      group's ``spark.master`` is used (the provider would otherwise silently submit to yarn).
    * Clusters that name Airflow connections are resolved here and handed to the job in a 0600 file
      named by an environment variable: never on the command line.
    * A group stopped by a failover (its stop, :mod:`mirror_core.stops`) is not launched: a drain is skipped;
      with ``wait_while_stopped`` (the continuous stream, whose ``@continuous`` DAG would start the next run at
      once after a skip, and so on for good) the task waits, deferred to a
      :class:`~mirrorflow_airflow.triggers.StreamStopTrigger` that looks every ``stop_poll_interval`` seconds,
      and starts the job once the stop is removed. When the destination does not answer whether the group is
      stopped, the task fails (and is retried).
    * spark-submit's JVM keeps its temporary files in a private directory, removed when the task ends
      (:func:`spark_jobs.jvm_archive.submit_tmpdir`).
    * The job is told this task's process (``MIRRORFLOW_OWNER``) and stops when it ends: a worker killed
      with SIGKILL leaves spark-submit running, and a retry would otherwise find the old job still mirroring.
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "config_path", "group_name")

    def __init__(self, *, config_path: str, group_name: str, once: bool = False, master: str = "local[2]",
                 conn_id: str = "mirrorflow_spark", wait_while_stopped: bool = False, stop_poll_interval: float = 60.0,
                 **kwargs: Any) -> None:
        python = sys.executable
        kwargs.setdefault("name", f"mirrorflow-{group_name}")
        kwargs.setdefault("conf", {"spark.pyspark.python": python, "spark.pyspark.driver.python": python})
        kwargs.setdefault("env_vars", {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python})
        super().__init__(application=stream_application(),
                         application_args=[config_path, "--group", group_name, *(["--once"] if once else [])],
                         conn_id=conn_id, **kwargs)
        self.config_path = config_path
        self.group_name = group_name
        self.once = once
        self.master = master
        self.spark_conn_id = conn_id
        self.wait_while_stopped = wait_while_stopped
        self.stop_poll_interval = stop_poll_interval

    def _ensure_connection(self) -> None:
        from airflow.sdk import BaseHook
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            BaseHook.get_connection(self.spark_conn_id)
        except AirflowNotFoundException:  # not defined: the group's master, in this task process
            # only that: a lookup that failed otherwise (a secrets backend refusing it) fails the task, rather than
            # submit the job somewhere else than the connection says
            self.log.info("Spark connection %r is not defined: using the group's master %s", self.spark_conn_id,
                          self.master)
            os.environ[f"AIRFLOW_CONN_{self.spark_conn_id.upper()}"] = json.dumps(
                {"conn_type": "spark", "host": self.master})

    def _hook_master(self) -> str:
        """The master spark-submit is given: the provider's reading of the Spark connection (host, port and
        type), or the group's master when the connection names none."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        return str(SparkSubmitHook(conn_id=self.spark_conn_id)._connection.get("master") or self.master)

    def prepare_submit(self, group: Any = None) -> None:
        """What spark-submit needs on this machine, decided when the task runs (never at parse time): the
        Spark connection (or the group's master), spark-submit on PATH, the Kafka connector jars from
        the local artifact cache (``--jars``: under spark-submit the driver JVM is already running when
        the session is built, so the job's own ``spark.jars`` comes too late for the Kafka source), and for
        the same reason the driver JVM's options the job's session would give it (its class-data sharing
        archive, its log configuration, and for a local master and checkpoint the file system that starts
        no chmod process; for a local master without a UI, the loopback address to bind to). The job is told
        the master it is submitted to (``MIRRORFLOW_SPARK_MASTER``): its session would otherwise set the group's
        ``spark.master``, which wins over spark-submit's ``--master``."""
        from mirror_core import artifacts
        from spark_jobs import jvm_archive

        if group is None:
            group = MirrorflowHook(self.config_path).get_group(self.group_name)[1]
        self._ensure_connection()
        _spark_submit_on_path()
        cache = artifacts.cache_dir()
        if not self.jars:
            self.jars = ",".join(artifacts.spark_kafka_jars(cache))
        master = self._hook_master()
        group = with_master(group, master)  # the job runs where it is submitted (SUBMITTED_MASTER_ENV below)
        # the group's secret spark.conf values never reach spark-submit's command line: its job's session sets them
        driver = jvm_archive.submit_conf(cache, master, group.spark.checkpoint_dir, group.spark.public_conf(),
                                         direct=group.spark.plans_only)
        own = dict(self.conf or {})
        for key, sep in (("spark.driver.extraJavaOptions", " "), ("spark.driver.extraClassPath", os.pathsep)):
            # the task's own driver options come after mirrorflow's instead of replacing them: a class path
            # without the local file system's jar would leave spark.hadoop.fs.file.impl naming a missing class
            if key in driver and own.get(key) and not own[key].startswith(driver[key]):
                own[key] = f"{driver[key]}{sep}{own[key]}"
        self.conf = {**driver, **own}
        self.env_vars = {**jvm_archive.driver_env(master, {**group.spark.public_conf(), **self.conf}),
                         **(self.env_vars or {}),
                         SUBMITTED_MASTER_ENV: master}

    def execute(self, context: Any) -> None:
        from mirror_core import failover
        from mirror_core.errors import MirrorError

        hook = MirrorflowHook(self.config_path)
        cfg, group = hook.get_group(self.group_name)
        try:
            reason = failover.stream_stop_requested(cfg, group)
        except MirrorError as exc:
            raise AirflowException(str(exc)) from None
        if reason and not self.wait_while_stopped:
            raise AirflowSkipException(f"not started: {reason}")
        if reason:
            self.log.info("%s: not started, stopped for good by a failover: %s (%s). This task waits (deferred, one "
                          "look every %g s) until that stop is removed, then starts the job; what removes it: %s. "
                          "To end the wait instead, pause this DAG, then mark this task success or failed.", group.name, reason,
                          failover.stops.where(cfg, group), self.stop_poll_interval,
                          failover.how_to_lift(cfg, group, self.config_path))
            self.defer(trigger=StreamStopTrigger(self.config_path, group.name, reason, self.stop_poll_interval),
                       method_name="resume_after_stop")
        self.prepare_submit(group)
        from spark_jobs.jvm_archive import submit_tmpdir

        own = self.conf
        with hook.connections_file() as path, submit_tmpdir(self.conf or {}) as conf:
            if path:
                self.env_vars = {**(self.env_vars or {}), CONNECTIONS_FILE_ENV: path}
            # the job stops if this task's process dies without killing spark-submit (a SIGKILLed worker)
            self.env_vars = {**(self.env_vars or {}), OWNER_ENV: owner_token()}
            self.conf = conf  # for this submission only: a retry in this process gets a directory of its own
            try:
                super().execute(context)
            finally:
                self.conf = own

    def resume_after_stop(self, context: Any, event: dict[str, Any]) -> None:
        """Back from the wait for the stop's removal: start the job (:meth:`execute` reads the stop again: one
        written meanwhile means another wait)."""
        if event.get("status") != "lifted":
            raise AirflowException(event.get("message") or f"the wait for the stop's removal ended: {event}")
        self.log.info("%s: the failover's stop is removed: starting the job", self.group_name)
        self.execute(context)
