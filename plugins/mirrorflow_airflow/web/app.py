"""The Mirrors page: a FastAPI app that Airflow's API server mounts (see ``plugins/mirrorflow_plugin.py``).

Airflow does not authenticate a plugin's app by itself: every route here depends on Airflow's own
check (a valid JWT from the UI's cookie or a bearer token, and read access to DAG XComs), so an
anonymous request gets 401. The data comes from Airflow's metadata database only (the lag samples
the ``offset_sync`` DAGs record and the stream DAGs' task states, read by ``store``): the page never talks to
Kafka and never reads the config or a connection, so it has no secret to show.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, Query
from fastapi.responses import HTMLResponse, JSONResponse

from mirrorflow_airflow.web import store
from mirrorflow_airflow.web.model import PageModel, build_page, group_of
from mirrorflow_airflow.web.render import as_json, render


def page_model(session: Any, hours: float, now: datetime | None = None, readable: set[str] | None = None
               ) -> PageModel:
    """The page's data: the groups whose DAGs are not stale; with ``readable``, only those of them. Besides,
    the groups whose DAGs went stale while their stream was active (a job nothing looks after any more), and
    whether the config's DAG files fail to import. What it reads is bounded per group whatever the window (see
    :mod:`mirrorflow_airflow.web.store`)."""
    now = now or datetime.now(UTC)
    synced, streamed = store.live_groups(session, "offset_sync"), store.live_groups(session, "stream")
    if readable is not None:
        synced, streamed = synced & readable, streamed & readable
    gone = store.live_groups(session, "stream", stale=True)
    if readable is not None:
        gone &= readable
    page = build_page(store.newest_samples(session, synced),
                      store.totals_history(session, synced, now - timedelta(hours=hours)),
                      store.stream_states(session, streamed), now, groups=synced)
    return replace(page, unmanaged=tuple(sorted(store.unmanaged_streams(session, gone).items())),
                   config_errors=store.config_import_errors(session))


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
