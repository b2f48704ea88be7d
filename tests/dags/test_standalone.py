"""`make airflow`: the admin password the failover uses to pause the stream DAG through the public API."""

from __future__ import annotations

import json
import stat

from mirrorflow_airflow.standalone import admin_password, api_connection


def test_the_admin_password_is_kept_when_airflow_already_wrote_one(tmp_path):
    (tmp_path / "simple_auth_manager_passwords.json.generated").write_text('{"admin": "kept-pw"}\n')
    assert admin_password(tmp_path) == "kept-pw"


def test_a_new_admin_password_is_written_private_and_reused(tmp_path):
    first = admin_password(tmp_path)
    path = tmp_path / "simple_auth_manager_passwords.json.generated"
    assert json.loads(path.read_text()) == {"admin": first} and len(first) >= 12
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin_password(tmp_path) == first


def test_the_api_connection_names_the_local_api_server_and_the_admin():
    conn = json.loads(api_connection("pw", port=8080))
    assert conn == {"conn_type": "http", "host": "http://localhost:8080", "login": "admin", "password": "pw"}
