"""The Mirrors page inside Airflow: the plugin mounts it, Airflow authenticates it, the data is the
``record_lag`` XComs and stream runs in Airflow's own database."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

PLANTED = "Pl4nted-s3cret-pw"


def _sample(group: str, at: datetime, dst_end: int, lag: int) -> dict[str, Any]:
    return {"group": group, "taken_at": at.isoformat().replace("+00:00", "Z"),
            "partitions": [{"source_topic": "orders", "destination_topic": "orders", "partition": 0,
                            "lag_records": lag, "lag_seconds": lag / 100, "source_end": dst_end + lag,
                            "destination_end": dst_end}],
            "lag_records": lag, "max_lag_seconds": lag / 100, "last_checkpoint_at": at.isoformat()}


def _recorded(sample: dict[str, Any], before: dict[str, Any] | None = None) -> Any:
    """A task that leaves what record_lag leaves of ``sample``: the whole sample and its totals."""
    from mirror_core.lag_samples import totals, with_throughput

    whole = with_throughput(sample, before)

    def push(ti: Any) -> None:
        ti.xcom_push("lag_sample", whole)
        ti.xcom_push("lag_totals", totals(whole))
    return push


def _run(dag_id: str, task_id: str, value: Any) -> None:
    """A DAG run whose one task returns ``value`` (its XCom ``return_value``), as the generated DAGs' do; a
    callable ``value`` is the task's callable instead."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1, tzinfo=UTC), catchup=False) as dag:
        PythonOperator(task_id=task_id, python_callable=value if callable(value) else lambda: value)
    DagBundlesManager().sync_bundles_to_db()
    bag = DagBag(dag_folder=os.devnull)  # not in the dags folder: registered by hand
    bag.bag_dag(dag)
    sync_bag_to_db(bag, "dags-folder", None)
    dr = dag.test()
    assert str(dr.state) == "success", dr.state


def _crash_and_wait_for_retry(dag_id: str) -> None:
    """What the scheduler records while a crashed Spark job waits for its next try: the run is still running,
    its mirror_stream task is up_for_retry."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagRun).where(DagRun.dag_id == dag_id).values(state="running"))
        session.execute(update(TaskInstance).where(TaskInstance.dag_id == dag_id,
                                                   TaskInstance.task_id == "mirror_stream")
                        .values(state="up_for_retry"))


def _mark_stale(dag_id: str) -> None:
    """What the DAG processor does to a DAG that is no longer in the dags folder."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import update

    with create_session() as session:
        session.execute(update(DagModel).where(DagModel.dag_id == dag_id).values(is_stale=True))


@pytest.fixture(scope="module")
def client(airflow_db: Any) -> Any:
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    group = "pagetest"
    now = datetime.now(UTC)
    # a group with two samples a minute apart (throughput 1200 records / 60 s) and a stream that ran
    first = _sample(group, now - timedelta(seconds=90), 1000, 500)
    _run(f"mirrorflow__{group}__offset_sync", "record_lag", _recorded(first))
    later = _sample(group, now - timedelta(seconds=30), 2200, 40)
    later["sasl.password"] = PLANTED  # whatever else a sample carried is never shown
    _run(f"mirrorflow__{group}__offset_sync", "record_lag", _recorded(later, first))
    _run(f"mirrorflow__{group}__stream", "mirror_stream", None)
    _crash_and_wait_for_retry(f"mirrorflow__{group}__stream")
    # a group no longer in the config: its DAGs are stale
    _run("mirrorflow__pagegone__offset_sync", "record_lag", _recorded(_sample("pagegone", now, 10, 1)))
    _mark_stale("mirrorflow__pagegone__offset_sync")
    client = TestClient(create_app())
    client.samples_at = now  # type: ignore[attr-defined]
    return client


def _token(client: Any) -> str:
    r = client.get("/auth/token")
    if r.status_code >= 400:
        r = client.post("/auth/token")
    r.raise_for_status()
    return r.json()["access_token"]


def test_anonymous_requests_get_401(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With real users (not the all-admins mode the other tests run in, where Airflow itself makes every
    request an admin's): no credential is 401, a bad one is refused, a user's token is let in."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    token = _token(client)  # an admin's token, signed with this process's secret
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    strict = TestClient(create_app())
    for path in ("/mirrorflow/", "/mirrorflow/api/lag"):
        r = strict.get(path)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])
        assert PLANTED not in r.text
    assert strict.get("/mirrorflow/", headers={"Authorization": "Bearer not-a-token"}).status_code in (401, 403)
    assert strict.get("/mirrorflow/", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def test_the_page_shows_lag_throughput_checkpoint_age_stream_state_and_a_plot(client: Any) -> None:
    headers = {"Authorization": f"Bearer {_token(client)}"}
    r = client.get("/mirrorflow/", headers=headers)
    assert r.status_code == 200, r.text[:500]
    html = r.text
    assert "pagetest" in html and "mirrorflow__pagetest__stream" in html
    assert '"state up_for_retry"' in html  # the stream task, not its run (which says running)
    assert "pagegone" not in html  # a stale group
    assert ">40<" in html and ">0.4<" in html  # the latest sample's lag (records, seconds)
    assert ">20.0<" in html  # (2200 - 1000) records / 60 s
    assert re.search(r"<b>\d+(s|m) ago</b><span>last checkpoint</span>", html)
    # one plot per group (the dags folder's own groups are listed too)
    assert html.count('alt="lag over time, group pagetest" src="data:image/svg+xml;base64,') == 1
    assert PLANTED not in html

    data = client.get("/mirrorflow/api/lag", headers=headers).json()
    (g,) = [g for g in data["groups"] if g["group"] == "pagetest"]
    assert g["stream_state"] == "up_for_retry" and g["total_lag_records"] == 40 and g["throughput"] == 20.0
    assert [h["lag_records"] for h in g["history"]] == [500, 40]
    # the last checkpoint was 30 s before the samples were made
    elapsed = (datetime.now(UTC) - client.samples_at).total_seconds()
    assert 30 <= g["last_checkpoint_age_seconds"] <= 30 + elapsed
    assert PLANTED not in str(data)


def test_the_plugin_puts_the_page_in_the_navigation(client: Any) -> None:
    headers = {"Authorization": f"Bearer {_token(client)}"}
    plugins = client.get("/api/v2/plugins", headers=headers).json()["plugins"]
    (ours,) = [p for p in plugins if p["name"] == "mirrorflow"]
    assert [(v["name"], v["href"], v["destination"]) for v in ours["external_views"]] == \
        [("Mirrors", "/mirrorflow/", "nav")]
    assert [a["url_prefix"] for a in ours["fastapi_apps"]] == ["/mirrorflow"]


def test_a_user_sees_only_the_groups_whose_dags_they_may_read(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The route lets in a user who may read some DAG's XComs (``?dag_id=`` even names which); each group on the
    page is one whose offset_sync DAG the user may read."""
    from mirrorflow_airflow.web import app as page

    headers = {"Authorization": f"Bearer {_token(client)}"}

    class _Auth:
        def get_authorized_dag_ids(self, user: Any, method: str, session: Any) -> set[str]:
            return {"mirrorflow__othergroup__offset_sync", "mirrorflow__pagetest__stream"}
    monkeypatch.setattr(page, "get_auth_manager", _Auth)
    data = client.get("/mirrorflow/api/lag?dag_id=mirrorflow__othergroup__offset_sync", headers=headers).json()
    assert [g["group"] for g in data["groups"]] == []
    html = client.get("/mirrorflow/", headers=headers).text
    assert "pagetest" not in html
    monkeypatch.setattr(_Auth, "get_authorized_dag_ids",
                        lambda self, user, method, session: {"mirrorflow__pagetest__offset_sync"})
    data = client.get("/mirrorflow/api/lag", headers=headers).json()
    assert [g["group"] for g in data["groups"]] == ["pagetest"]
