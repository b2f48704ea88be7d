"""Airflow test set-up: a temporary AIRFLOW_HOME with SQLite for this test session, removed when it ends.

Airflow reads its configuration once per process, when it is first imported, so the home is made
here, before any test module imports airflow; the metadata database is created on first use by the
``airflow_db`` fixture (only the dag.test() runs need it).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_HOME = Path(tempfile.mkdtemp(prefix="mirrorflow-airflow-home-"))
# removed when the test process ends, not by a fixture: Airflow may still write its logs after the last teardown
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
os.environ["AIRFLOW_HOME"] = str(_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(ROOT / "dags")
os.environ["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(ROOT / "plugins")  # the Mirrors page plugin
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_HOME / 'airflow.db'}"
os.environ["AIRFLOW__CORE__AUTH_MANAGER"] = (
    "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
os.environ["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS"] = "True"
# as `make airflow` and the demo do: the secret Airflow generates is too short for its SHA-512 tokens, and PyJWT
# warns at every token
os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = secrets.token_urlsafe(64)


@pytest.fixture(scope="session")
def airflow_home() -> Path:
    return _HOME


@pytest.fixture(scope="session")
def airflow_db(airflow_home: Path) -> Iterator[Path]:
    """The session's SQLite metadata database, migrated once."""
    from airflow.utils.db import initdb

    initdb()
    yield airflow_home
