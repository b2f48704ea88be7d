"""Every mirrorflow DAG, generated from the mirrors YAML.

The config comes from ``$MIRRORFLOW_CONFIG``, else ``config/mirrors.yaml``, else ``config/local.yaml``
(next to this repository's ``dags/``). Parsing reads and validates it, nothing more: no connection is
looked up and no cluster is contacted until a task runs. A group with a problem of its own (or of a cluster
it uses) is left out, and ``mirrorflow_config_check.py`` is the import error that names it and each problem's
path; a problem no group owns is this file's import error, and no DAG is built.

Per enabled group ``G`` (dag ids ``mirrorflow__<G>__<purpose>``):

* ``provision``: validate -> plan -> apply_topics -> mirror_schemas (emits the group's Asset);
* ``stream``: the Spark mirror (``spark.mode``: continuous or a scheduled available_now drain);
* ``offset_sync``: checkpoint (+ idle group offset sync), heartbeat, record_lag, every offsets.interval;
* ``failover``: the migration to the destination, with two approvals;
* ``failback``: the same flow for the reverse group, when the config has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Asset, AssetOrTimeSchedule, Param
from airflow.sdk.definitions.timetables.trigger import DeltaTriggerTimetable
from mirrorflow_airflow import dagfile
from mirrorflow_airflow.operators import (
    ApplyTopicsOperator,
    CheckpointOperator,
    FailoverApprovalOperator,
    FailoverReportOperator,
    FailoverStepOperator,
    FinalizeFailoverOperator,
    HeartbeatOperator,
    MirrorSchemasOperator,
    MirrorStreamOperator,
    PlanOperator,
    RecordLagOperator,
    UpstreamFailedOperator,
    ValidateConfigOperator,
)
from mirrorflow_airflow.sensors import ReplicationLagSensor, SourceQuietSensor

from mirror_core.config import GroupConfig, MirrorsConfig, resolve_mirrors
from mirror_core.failover import reverse_group

ROOT = Path(__file__).resolve().parent.parent
START = pendulum.datetime(2024, 1, 1, tz="UTC")


def config_path(env: dict[str, str] | None = None) -> Path:
    """``$MIRRORFLOW_CONFIG``, else config/mirrors.yaml, else config/local.yaml."""
    return dagfile.config_path(ROOT, env)


def dag_id(group: str, purpose: str) -> str:
    return f"mirrorflow__{group}__{purpose}"


def group_asset(group: str) -> Asset:
    """Updated when the group's provisioning finished (topics and schema subjects in place)."""
    return Asset(name=dag_id(group, "provisioned"), uri=f"mirrorflow://{group}/provisioned")


def _tags(group: GroupConfig, purpose: str) -> list[str]:
    return ["mirrorflow", f"group:{group.name}", purpose]


def _describe(group: GroupConfig) -> str:
    n = len(resolve_mirrors(group))
    return (f"Group **{group.name}**: `{group.source}` -> `{group.destination}`, {n} mirror(s), "
            f"delivery {group.delivery}, stream mode {group.spark.mode}.")


def provision_dag(path: str, group: GroupConfig) -> DAG:
    with DAG(dag_id(group.name, "provision"), schedule=None, start_date=START, catchup=False,
             tags=_tags(group, "provision"), max_active_runs=1,
             doc_md=f"""### Provision {group.name}
{_describe(group)}

Manual. `validate` -> `plan` (read-only, logged as a table) -> `apply_topics` (create / grow topics,
configs, ACLs; each topic on its own) -> `mirror_schemas` (schema subjects; also when a topic failed). Updates the Asset `{group_asset(group.name).uri}`.
""") as dag:
        kw: dict[str, Any] = {"config_path": path, "group_name": group.name}
        plan = ValidateConfigOperator(task_id="validate", **kw) >> PlanOperator(task_id="plan", **kw)
        # a topic the destination refused fails apply_topics, not the group's schema subjects: they are mirrored
        # once the plan stands (a plan with topic errors provisions nothing, as `mirrorflow provision`)
        schemas = MirrorSchemasOperator(task_id="mirror_schemas", outlets=[group_asset(group.name)],
                                        trigger_rule="all_done_min_one_success", **kw)
        plan >> ApplyTopicsOperator(task_id="apply_topics", **kw) >> schemas
        plan >> schemas
    return dag


def _stream_task(path: str, group: GroupConfig, task_id: str, once: bool, **kw: Any) -> MirrorStreamOperator:
    return MirrorStreamOperator(task_id=task_id, config_path=path, group_name=group.name, once=once,
                                master=group.spark.master, conn_id=group.spark.airflow_conn_id, **kw)


def stream_dag(path: str, group: GroupConfig) -> DAG:
    continuous = group.spark.mode == "continuous"
    schedule: Any
    if continuous:
        schedule = "@continuous"
        how = (f"One long-lived Spark job (`@continuous`, one run at a time). A job that dies is relaunched "
               f"by Airflow (up to {group.spark.retries} retries, back-off from {group.spark.retry_delay:g} s) "
               "and resumes from its checkpoint.")
        stopped = ("the job ends, and a run started after that waits (its task deferred, a look a minute) until the "
                   "stop is removed, then starts the job; its log says what removes it.")
    else:
        schedule = AssetOrTimeSchedule(timetable=DeltaTriggerTimetable(timedelta(seconds=group.spark.drain_every)),
                                       assets=[group_asset(group.name)])
        how = (f"A drain (`--once`) every {group.spark.drain_every:g} s and after each provisioning: mirrors "
               "what is on the source, then stops.")
        stopped = "each drain's task is then skipped."
    with DAG(dag_id(group.name, "stream"), schedule=schedule, start_date=START, catchup=False, max_active_runs=1,
             tags=_tags(group, "stream"), doc_md=f"""### Stream {group.name}
{_describe(group)}

{how} Task `mirror_stream` runs `spark_jobs/mirror_stream.py` with spark-submit (connection
`{group.spark.airflow_conn_id}`, else master `{group.spark.master}`). A failover of the group stops it for
good (its stop, a record on the destination): {stopped}
""") as dag:
        _stream_task(path, group, "mirror_stream", once=not continuous, wait_while_stopped=continuous,
                     retries=group.spark.retries,
                     retry_delay=timedelta(seconds=group.spark.retry_delay), retry_exponential_backoff=2.0,
                     max_retry_delay=timedelta(minutes=10))
    return dag


def offset_sync_dag(path: str, group: GroupConfig) -> DAG:
    with DAG(dag_id(group.name, "offset_sync"), schedule=timedelta(seconds=group.offsets.interval), start_date=START,
             catchup=False, max_active_runs=1, tags=_tags(group, "offset_sync"), doc_md=f"""### Offset sync {group.name}
{_describe(group)}

Every {group.offsets.interval:g} s: `checkpoint` (MM2 checkpoints for the selected source consumer groups,
translated offsets written into idle destination groups), `heartbeat`, and `record_lag` (a lag sample
per partition for the Mirrors page: the newest kept whole, its totals kept for the history plot).
""") as dag:
        kw: dict[str, Any] = {"config_path": path, "group_name": group.name}
        # the sample after the round (it shows the round's checkpoint), and also when the round failed: that is
        # when the page is looked at. A run's state comes from its leaves: checkpoint_failed (which only a failed
        # round runs) fails the run then
        checkpoint = CheckpointOperator(task_id="checkpoint", **kw)
        checkpoint >> RecordLagOperator(task_id="record_lag", trigger_rule="all_done", **kw)
        checkpoint >> UpstreamFailedOperator(task_id="checkpoint_failed", trigger_rule="one_failed")
        HeartbeatOperator(task_id="heartbeat", **kw)
    return dag


def _approval_args(owner: GroupConfig) -> tuple[dict[str, Any], str]:
    """The approvals' arguments from the DAG owner's ``failover`` settings (who may answer, and how long an
    unanswered one waits before it is answered Reject), and the sentence that tells the approver so."""
    settings = owner.failover
    args: dict[str, Any] = {}
    if settings.approvers:
        args["assigned_users"] = [{"id": u, "name": u} for u in settings.approvers]
    if settings.approval_timeout is None:
        return args, ""
    args.update(response_timeout=timedelta(seconds=settings.approval_timeout), defaults="Reject")
    return args, f" Unanswered for {_duration(settings.approval_timeout)}, this is answered Reject."


def _approvals_doc(owner: GroupConfig) -> str:
    settings = owner.failover
    who = ", ".join(f"`{u}`" for u in settings.approvers) or "anyone who may act on this DAG's runs"
    wait = ("waits for good" if settings.approval_timeout is None
            else f"is answered Reject after {_duration(settings.approval_timeout)}")
    return f"Approvals: answered by {who}; an unanswered one {wait} (`failover` in the group's config)."


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


FAILOVER_PARAMS_DOC = """Params: `consumer_groups` (the source consumer groups to move), `max_lag_records` and
`max_lag_seconds` (when the lag sensor lets the run ask to stop producers), `quiet_seconds` (how long the
source must stay without new records once producers are stopped)."""


def failover_dag(path: str, owner: GroupConfig, flow: GroupConfig, purpose: str,
                 siblings: Sequence[str] = ()) -> DAG:
    """The migration of ``flow``'s consumers from its source to its destination (``owner`` names the DAG:
    for a failback, ``flow`` is the owner's reverse group). ``siblings``: the other DAGs that move the same
    flow (with both directions in the config, ``B__failover`` and ``A__failback`` both do): the preflight
    refuses while one of them runs."""
    continuous = flow.spark.mode == "continuous"
    stream_id = dag_id(flow.name, "stream")
    with DAG(dag_id(owner.name, purpose), schedule=None, start_date=START, catchup=False, max_active_runs=1,
             tags=_tags(owner, purpose), params={
                 "consumer_groups": Param([], type="array", items={"type": "string", "minLength": 1}, minItems=1,
                                          description="Source consumer groups to move to the destination."),
                 "max_lag_records": Param(1000, type="integer", minimum=0,
                                          description="Lag (records) under which the run asks to stop producers."),
                 "max_lag_seconds": Param(60, type="number", minimum=0,
                                          description="Lag (seconds) under which the run asks to stop producers."),
                 "quiet_seconds": Param(30, type="number", minimum=0,
                                        description="How long the source must stay quiet once producers stop."),
             }, doc_md=f"""### {purpose.capitalize()} of {flow.name}: `{flow.source}` -> `{flow.destination}`
Manual. `preflight` -> `wait_for_lag` (deferrable) -> **approve_stop_producers** -> `wait_for_quiet`
{'-> `final_drain` ' if not continuous else ''}-> `final_sync` (checkpoints + group offsets) -> `verify_parity`
-> **approve_switch_consumers** -> `finalize` (group offsets synced again, stream `{stream_id}` stopped and
paused) -> `report`.
A Reject at either approval ends the run: nothing changes after it, and the report says where it stopped.
{_approvals_doc(owner)}

{FAILOVER_PARAMS_DOC}
""") as dag:
        kw: dict[str, Any] = {"config_path": path, "group_name": flow.name}
        asking, unanswered = _approval_args(owner)
        preflight = FailoverStepOperator(task_id="preflight", step="preflight", stream_dag_id=stream_id,
                                         sibling_dag_ids=list(siblings), **kw)
        lag = ReplicationLagSensor(task_id="wait_for_lag", poke_interval=5, timeout=6 * 3600, **kw)
        stop_producers = FailoverApprovalOperator(
            task_id="approve_stop_producers", subject=f"Stop the producers on {flow.source}", **asking,
            body=(f"Group **{flow.name}** is ready to fail over to `{flow.destination}`.\n\n"
                  "{{ (ti.xcom_pull(task_ids='wait_for_lag', key='step_report') or {}).get('summary', "
                  "'(no lag report: the sensor was marked done by hand)') }}\n\n"
                  f"Approve once every producer writing the mirrored topics on `{flow.source}` is stopped. "
                  f"Reject to call the failover off (nothing has been changed).{unanswered}"))
        quiet = SourceQuietSensor(task_id="wait_for_quiet", poke_interval=2, timeout=3600,
                                  require_lag_zero=continuous, **kw)
        sync = FailoverStepOperator(task_id="final_sync", step="sync", **kw)
        parity = FailoverStepOperator(task_id="verify_parity", step="verify", **kw)
        switch = FailoverApprovalOperator(
            task_id="approve_switch_consumers", subject=f"Switch consumers to {flow.destination}", **asking,
            body=("{{ (ti.xcom_pull(task_ids='final_sync', key='step_report') or {}).get('summary', "
                  "'(no sync report: the step was marked done by hand)') }}; "
                  "{{ (ti.xcom_pull(task_ids='verify_parity', key='step_report') or {}).get('summary', "
                  "'(no parity report: the step was marked done by hand)') }}.\n\n"
                  "Stop the consumers of {{ params.consumer_groups | join(', ') }} on "
                  f"`{flow.source}`, then Approve: `finalize` moves their "
                  f"offsets on `{flow.destination}` up to where they stopped and stops the mirror `{flow.source}` -> "
                  f"`{flow.destination}` for good. Start the consumers on `{flow.destination}` once it has "
                  "ended. Reject to stop here (destination offsets are synced, the mirror keeps its state)."
                  f"{unanswered}"))
        finalize = FinalizeFailoverOperator(task_id="finalize", stream_dag_id=stream_id, **kw)
        steps = [("preflight", "preflight"), ("wait_for_lag", "lag"), ("approve_stop_producers", "approval"),
                 ("wait_for_quiet", "quiet"), *([] if continuous else [("final_drain", "task")]),
                 ("final_sync", "sync"), ("verify_parity", "verify"), ("approve_switch_consumers", "approval"),
                 ("finalize", "finalize")]
        report = FailoverReportOperator(task_id="report", steps=steps, trigger_rule="all_done", **kw)
        if continuous:
            preflight >> lag >> stop_producers >> quiet >> sync
        else:
            drain = _stream_task(path, flow, "final_drain", once=True)
            preflight >> lag >> stop_producers >> quiet >> drain >> sync
        sync >> parity >> switch >> finalize >> report
    return dag


def build(cfg: MirrorsConfig, path: str) -> dict[str, DAG]:
    """Every DAG of every enabled group, by dag id."""
    dags: dict[str, DAG] = {}
    moves: list[tuple[GroupConfig, GroupConfig, str]] = []  # (owner, flow, purpose) of each failover DAG
    for group in cfg.enabled_groups():
        for d in (provision_dag(path, group), stream_dag(path, group), offset_sync_dag(path, group)):
            dags[d.dag_id] = d
        moves.append((group, group, "failover"))
        rev = reverse_group(cfg, group)
        if rev is not None:
            moves.append((group, rev, "failback"))
    for owner, flow, purpose in moves:
        siblings = [dag_id(o.name, p) for o, f, p in moves
                    if f.name == flow.name and (o.name, p) != (owner.name, purpose)]
        d = failover_dag(path, owner, flow, purpose, siblings)
        dags[d.dag_id] = d
    return dags


_PATH = config_path()
# the valid groups; mirrorflow_config_check.py is the import error naming the others
globals().update(build(dagfile.load(_PATH)[0], str(_PATH)))
