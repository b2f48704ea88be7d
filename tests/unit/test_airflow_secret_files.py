"""Files of the Airflow adapter that hold resolved secrets are swept like the job's own secrets directory."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

from mirror_core import clients

PLANTED = "pl4nted-Conn-pw"


def test_a_connections_file_left_by_a_killed_task_is_swept(tmp_path, monkeypatch):
    """The connections file (resolved Airflow connections, passwords included) is in a 0700 directory named after
    the task's process and host: one a SIGKILLed task left is removed when the next task makes its own, and the
    task's own is removed when its block ends."""
    from mirrorflow_airflow import hooks

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    dead = tmp_path / f"{hooks.CONNECTIONS_DIR_PREFIX}{gone}-{clients._host_key()}-abc"
    dead.mkdir()
    (dead / "connections.json").write_text(json.dumps({"a": {"sasl.password": PLANTED}}))
    payload = {"src": {"kafka": {"bootstrap.servers": "b:9092", "sasl.password": PLANTED}}}
    monkeypatch.setattr(hooks, "connections_payload", lambda cfg: payload)
    hook = hooks.MirrorflowHook("unused.yaml")
    monkeypatch.setattr(hook, "get_config", lambda: None)

    with hook.connections_file() as name:
        assert name is not None
        path = Path(name)
        assert not dead.exists()
        assert path.parent.parent == tmp_path
        assert path.parent.name.startswith(f"{hooks.CONNECTIONS_DIR_PREFIX}{os.getpid()}-{clients._host_key()}-")
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700 and stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text()) == payload
    assert not path.parent.exists()
    assert list(tmp_path.iterdir()) == []
