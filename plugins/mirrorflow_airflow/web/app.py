"""The Mirrors page: a FastAPI app that Airflow's API server mounts (see ``plugins/mirrorflow_plugin.py``).

Airflow does not authenticate a plugin's app by itself: every route here depends on Airflow's own
check (a valid JWT from the UI's cookie or a bearer token, and read access to DAG XComs), so an
anonymous request gets 401. The data comes from Airflow's metadata database only (the lag samples
the ``offset_sync`` DAGs record and the stream DAGs' runs): the page never talks to Kafka and never
reads the config or a connection, so it has no secret to show.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from airflow.models.dag import DagModel
from airflow.models.dagrun import DagRun
from airflow.models.xcom import XComModel
from fastapi import Depends, FastAPI, Query
from fastapi.responses import HTMLResponse, JSONResponse
from sqlalchemy import func, select

from mirrorflow_airflow.web.model import PageModel, build_page, group_of
from mirrorflow_airflow.web.render import as_json, render

LAG_TASK = "record_lag"
MAX_SAMPLES = 5000  # newest first, across groups: bounds the page's work whatever the window


def load_samples(session: Any, since: datetime) -> list[Any]:
    """The ``record_lag`` XCom values of every ``mirrorflow__*__offset_sync`` DAG since ``since``."""
    q = (select(XComModel)
         .where(XComModel.task_id == LAG_TASK, XComModel.key == "return_value",
                XComModel.dag_id.like("mirrorflow\\_\\_%\\_\\_offset\\_sync", escape="\\"),
                XComModel.timestamp >= since)
         .order_by(XComModel.timestamp.desc()).limit(MAX_SAMPLES))
    return [XComModel.deserialize_value(r) for r in session.scalars(q)]


def load_stream_states(session: Any) -> dict[str, str | None]:
    """Per group with a stream DAG: the state of its latest run (None when it never ran)."""
    pattern = "mirrorflow\\_\\_%\\_\\_stream"
    states: dict[str, str | None] = {}
    for (dag,) in session.execute(select(DagModel.dag_id).where(DagModel.dag_id.like(pattern, escape="\\"),
                                                                DagModel.is_stale.is_(False))):
        g = group_of(dag, "stream")
        if g:
            states[g] = None
    latest = (select(DagRun.dag_id, func.max(DagRun.id).label("id"))
              .where(DagRun.dag_id.like(pattern, escape="\\")).group_by(DagRun.dag_id).subquery())
    for dag, state in session.execute(select(DagRun.dag_id, DagRun.state).join(latest, DagRun.id == latest.c.id)):
        g = group_of(dag, "stream")
        if g:
            states[g] = str(getattr(state, "value", state)) if state is not None else None
    return states


def page_model(session: Any, hours: float, now: datetime | None = None, readable: set[str] | None = None
               ) -> PageModel:
    """The page's data; with ``readable``, only those groups'."""
    now = now or datetime.now(UTC)
    samples = load_samples(session, now - timedelta(hours=hours))
    states = load_stream_states(session)
    if readable is not None:
        samples = [x for x in samples if isinstance(x, dict) and x.get("group") in readable]
        states = {g: st for g, st in states.items() if g in readable}
    return build_page(samples, states, now)


def readable_groups(user: Any, session: Any) -> set[str]:
    """The groups whose ``offset_sync`` DAG (where the lag samples come from) the user may read. The route's own
    check lets in any user who may read some DAG's XComs (and a ``?dag_id=`` names which): each group on the
    page is checked here."""
    dags = get_auth_manager().get_authorized_dag_ids(user=user, method="GET", session=session)
    return {g for d in dags if (g := group_of(d, "offset_sync"))}


#: Airflow's own authentication and authorization on every route: a user who may read DAG XComs
ACCESS = [Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.XCOM))]


def create_app() -> FastAPI:
    """The app the plugin mounts at ``/mirrorflow``."""
    app = FastAPI(title="mirrorflow Mirrors", dependencies=ACCESS, docs_url=None, redoc_url=None,
                  openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def mirrors_page(session: SessionDep, user: GetUserDep,
                     hours: float = Query(6.0, gt=0, le=24 * 14)) -> HTMLResponse:
        return HTMLResponse(render(page_model(session, hours, readable=readable_groups(user, session)), hours))

    @app.get("/api/lag")
    def mirrors_json(session: SessionDep, user: GetUserDep,
                     hours: float = Query(6.0, gt=0, le=24 * 14)) -> JSONResponse:
        return JSONResponse(as_json(page_model(session, hours, readable=readable_groups(user, session))))

    return app
