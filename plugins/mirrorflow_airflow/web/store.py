"""What the Mirrors page reads from Airflow's metadata database, and the bound on it.

One view of the page, for the G groups shown (those whose DAGs are not stale), reads at most:

* G ``lag_sample`` XComs: each group's newest (its size grows with the group's partitions, about 185 bytes
  a partition; the task keeps no other). The whole samples that runs before 7 December kept as ``return_value`` are
  not read;
* G x :data:`MAX_POINTS` ``lag_totals`` XComs in the window, a few hundred bytes each. When the window holds
  more of a group's records, every k-th is read (the newest first, k the smallest that fits), so the points
  still span the whole window; a busy group never takes another's share;
* G stream DAG runs with their ``mirror_stream`` task instance, and the groups' DAG rows;
* the same for the groups whose stream DAG is stale (to name those whose job may still run unattended), and a
  count of the config's DAG files that fail to import.

So a view's read does not grow with the history's length, the number of runs or the window.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.taskinstance import TaskInstance
from airflow.models.xcom import XComModel
from sqlalchemy import and_, func, or_, select

from mirrorflow_airflow.web.model import SAMPLE_KEY, TOTALS_KEY, dag_id, group_of

LAG_TASK = "record_lag"
STREAM_TASK = "mirror_stream"
#: the most history points read per group and view (the plot is 750 pixels wide)
MAX_POINTS = 1000


#: a stream task in one of these states has (or is about to have) a Spark job running
ACTIVE_STREAM_STATES = frozenset({"running", "deferred", "queued", "scheduled", "up_for_retry", "restarting"})
#: the DAG files whose import errors are the mirrors config's problems (a group left out, or the whole file)
CONFIG_DAG_FILES = ("mirrorflow_config_check.py", "mirrorflow_dags.py")


def live_groups(session: Any, purpose: str, stale: bool = False) -> set[str]:
    """The groups with a ``mirrorflow__<group>__<purpose>`` DAG that is not stale (a DAG no longer in the
    config is stale: its group is not shown); with ``stale``, those whose DAG is."""
    q = select(DagModel.dag_id).where(DagModel.dag_id.startswith("mirrorflow__", autoescape=True),
                                      DagModel.dag_id.endswith(f"__{purpose}", autoescape=True),
                                      DagModel.is_stale.is_(stale))
    return {g for d in session.scalars(q) if (g := group_of(d, purpose))}


def unmanaged_streams(session: Any, groups: Collection[str]) -> dict[str, str]:
    """Of ``groups`` (those whose stream DAG is stale: removed from the config, or left out of it for a
    problem), the ones whose ``mirror_stream`` task was last seen active, with its state: a Spark job of theirs
    may still run, and nothing relaunches or stops it any more."""
    return {g: s for g, s in stream_states(session, groups).items() if s in ACTIVE_STREAM_STATES}


def config_import_errors(session: Any) -> int:
    """How many of the mirrors config's DAG files fail to import (Airflow's DAG import errors name the groups
    left out and their problems)."""
    from airflow.models.errors import ParseImportError

    # Airflow keeps the file's path relative to its DAG bundle
    names = [c for f in CONFIG_DAG_FILES
             for c in (ParseImportError.filename == f, ParseImportError.filename.endswith(f"/{f}", autoescape=True))]
    return int(session.scalar(select(func.count()).select_from(ParseImportError).where(or_(*names))) or 0)


def _every_kth(session: Any, key: str, groups: Collection[str], keep: int, since: datetime | None = None
               ) -> list[Any]:
    """Per group, at most ``keep`` of its ``record_lag`` XComs under ``key`` (since ``since``): the newest,
    then every k-th older one, k = ceil(count / keep). Only the chosen rows' values are fetched."""
    if not groups:
        return []
    where = [XComModel.task_id == LAG_TASK, XComModel.key == key,
             XComModel.dag_id.in_([dag_id(g, "offset_sync") for g in groups])]
    if since is not None:
        where.append(XComModel.timestamp >= since)
    by_dag = {"partition_by": XComModel.dag_id}
    ranked = select(
        XComModel.dag_run_id, XComModel.map_index,
        func.row_number().over(**by_dag, order_by=(XComModel.timestamp.desc(), XComModel.dag_run_id.desc()))
        .label("rank"),
        func.count().over(**by_dag).label("n"),
    ).where(*where).subquery()
    stride = (ranked.c.n + (keep - 1)) // keep
    q = (select(XComModel)
         .join(ranked, and_(XComModel.dag_run_id == ranked.c.dag_run_id, XComModel.map_index == ranked.c.map_index))
         .where(XComModel.task_id == LAG_TASK, XComModel.key == key, (ranked.c.rank - 1) % stride == 0))
    return [XComModel.deserialize_value(x) for x in session.scalars(q)]


def newest_samples(session: Any, groups: Collection[str]) -> list[Any]:
    """Each group's newest ``lag_sample`` XCom value (at most one per group)."""
    return _every_kth(session, SAMPLE_KEY, groups, keep=1)


def totals_history(session: Any, groups: Collection[str], since: datetime, max_points: int = MAX_POINTS
                   ) -> list[Any]:
    """The groups' ``lag_totals`` XCom values since ``since``: at most ``max_points`` per group, spread over
    the whole window."""
    return _every_kth(session, TOTALS_KEY, groups, keep=max_points, since=since)


def stream_states(session: Any, groups: Collection[str]) -> dict[str, str | None]:
    """Per group: the state of the ``mirror_stream`` task in its stream DAG's latest run (``up_for_retry``
    while a crashed job waits to be relaunched, where the run itself says ``running``); ``no_status`` before the
    scheduler gave it one; None when the DAG never ran."""
    states: dict[str, str | None] = dict.fromkeys(groups)
    if not groups:
        return states
    latest = (select(DagRun.dag_id, func.max(DagRun.id).label("id"))
              .where(DagRun.dag_id.in_([dag_id(g, "stream") for g in groups])).group_by(DagRun.dag_id).subquery())
    q = (select(DagRun.dag_id, TaskInstance.state)
         .join(latest, DagRun.id == latest.c.id)
         .outerjoin(TaskInstance, and_(TaskInstance.dag_id == DagRun.dag_id, TaskInstance.run_id == DagRun.run_id,
                                       TaskInstance.task_id == STREAM_TASK, TaskInstance.map_index == -1)))
    for dag, state in session.execute(q):
        if (g := group_of(dag, "stream")) in states:
            states[g] = str(getattr(state, "value", state)) if state is not None else "no_status"
    return states
