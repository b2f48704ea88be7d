"""Answering approvals (HITL) through Airflow's public API in process: what the demo and the DAG tests share.

``dag.test()`` keeps a run alive while a task awaits input and never answers it; a person answers in the UI.
These helpers let a thread do what that person does: find the tasks awaiting input, reach the public API as
an admin, and fail what still waits when a watchdog gives up.
"""

from __future__ import annotations

from typing import Any


def api_client() -> Any:
    """A test client of Airflow's public API app, logged in (simple auth manager) with a bearer token."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    client = TestClient(create_app())
    tok = client.get("/auth/token")
    if tok.status_code >= 400:
        tok = client.post("/auth/token")
    tok.raise_for_status()
    client.headers["Authorization"] = f"Bearer {tok.json()['access_token']}"
    return client


def awaiting_input(dag_id: str) -> list[tuple[str, str, int]]:
    """(task_id, run_id, map_index) of every task of ``dag_id`` that waits for a person's answer."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(select(TaskInstance.task_id, TaskInstance.run_id, TaskInstance.map_index).where(
            TaskInstance.dag_id == dag_id, TaskInstance.state == "awaiting_input")).all()
    return [(r[0], r[1], r[2]) for r in rows]


def fail_awaiting_input(dag_id: str) -> None:
    """Fail every task of ``dag_id`` still awaiting input (a watchdog's way to end a run nobody answers)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(TaskInstance).where(TaskInstance.dag_id == dag_id,
                                                   TaskInstance.state == "awaiting_input").values(state="failed"))
