"""`make airflow`: the admin password the failover uses to pause the stream DAG through the public API."""

from __future__ import annotations

import json
import stat

from mirrorflow_airflow.standalone import admin_password, api_connection, jwt_secret


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


def test_the_token_secret_is_long_private_and_kept_across_restarts(tmp_path):
    """Airflow's own generated secret (16 bytes) makes the API server warn at every request that it is too short
    for SHA-512 tokens; `make airflow` keeps one of 64 random bytes in its home, readable by its owner only."""
    first = jwt_secret(tmp_path)
    path = tmp_path / "jwt_secret"
    assert len(first) >= 86 and path.read_text().strip() == first  # 64 bytes, URL-safe base64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert jwt_secret(tmp_path) == first
    path.write_text("short\n")  # one too short is replaced
    path.chmod(0o644)
    again = jwt_secret(tmp_path)
    assert again != "short" and len(again) >= 86 and stat.S_IMODE(path.stat().st_mode) == 0o600
