"""`make airflow`: ``airflow standalone`` with mirrorflow's DAGs and Mirrors page, on the embedded clusters.

Starts the embedded clusters when they are not running (or uses the ones the ``MIRRORFLOW_SRC_*`` /
``MIRRORFLOW_DST_*`` variables name), writes the demo's sample data and half-consumed consumer group when
the source has none, then replaces this process with ``airflow standalone`` (API server and UI on
http://localhost:8080, scheduler, triggerer, DAG processor) with its home in ``.state/airflow``. The DAGs
are generated from ``config/local.yaml`` and start unpaused, so the stream and offset_sync DAGs run
by themselves and the Mirrors page fills up. The admin password is written to
``.state/airflow/simple_auth_manager_passwords.json.generated``, the API server's token-signing secret to
``.state/airflow/jwt_secret``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
from pathlib import Path

from mirror_core.tls import write_private
from mirrorflow_airflow.demo import CONFIG, ROOT, endpoints, seed

HOME = ROOT / ".state" / "airflow"


def environment(home: Path) -> dict[str, str]:
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "MIRRORFLOW_CONFIG": os.environ.get("MIRRORFLOW_CONFIG", str(CONFIG)),
        # the venv's python and spark-submit for the stream DAG's jobs
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), str(ROOT / "plugins"), os.environ.get("PYTHONPATH"))
                                      if p),
    }


def admin_password(home: Path) -> str:
    """The admin's password for the simple auth manager: the one in its password file, else a new one
    written there first (airflow keeps a password it finds in that file)."""
    path = home / "simple_auth_manager_passwords.json.generated"
    if path.exists():
        try:
            known = json.loads(path.read_text() or "{}").get("admin")
        except (ValueError, AttributeError):
            known = None
        if known:
            return str(known)
    password = secrets.token_urlsafe(12)
    write_private(path, (json.dumps({"admin": password}) + "\n").encode())
    return password


def jwt_secret(home: Path) -> str:
    """The API server's secret for signing its tokens: the one kept in ``home``, else a new one written there
    first, readable by its owner only. 64 random bytes: the one Airflow generates (16 bytes) is shorter than
    SHA-512 tokens want, and the API server then warns about it at every request."""
    path = home / "jwt_secret"
    if path.exists():
        known = path.read_text().strip()
        if len(known) >= 64:
            return known
    secret = secrets.token_urlsafe(64)
    write_private(path, (secret + "\n").encode())
    return secret


def api_connection(password: str, port: int = 8080) -> str:
    """The ``mirrorflow_airflow_api`` connection (as an ``AIRFLOW_CONN_*`` value) that lets the failover's
    finalize step pause the stream DAG through the public API: task processes have no database access."""
    return json.dumps({"conn_type": "http", "host": f"http://localhost:{port}", "login": "admin",
                       "password": password})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mirrorflow_airflow.standalone", description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=30000, help="sample records when the source has none")
    ap.add_argument("--fresh", action="store_true", help="start from an empty Airflow home (a new password)")
    args = ap.parse_args(argv)

    def say(msg: str) -> None:
        print(f"[airflow] {msg}", file=sys.stderr, flush=True)

    eps = endpoints(say)
    for side in ("src", "dst"):  # config/local.yaml reads its endpoints from these
        os.environ[f"MIRRORFLOW_{side.upper()}_BOOTSTRAP"] = str(eps[side]["bootstrap"])
        if eps[side]["registry"]:
            os.environ[f"MIRRORFLOW_{side.upper()}_REGISTRY"] = str(eps[side]["registry"])
    from mirror_core import demo as core_demo

    if not sum(core_demo.count_per_partition(str(eps["src"]["bootstrap"]), core_demo.TOPIC).values()):
        seed(eps, args.records, say)
    if args.fresh:
        shutil.rmtree(HOME, ignore_errors=True)
    HOME.mkdir(parents=True, exist_ok=True)
    os.environ.update(environment(HOME))
    # kept in the home, so that a restart keeps the UI's sessions; set in the environment, as the password below
    os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = jwt_secret(HOME)
    # set in the environment, not a file or the command line: the tasks' finalize step reads it
    os.environ["AIRFLOW_CONN_MIRRORFLOW_AIRFLOW_API"] = api_connection(admin_password(HOME))
    airflow = shutil.which("airflow", path=os.environ["PATH"])
    if airflow is None:
        say("the airflow command is not installed (make venv installs it)")
        return 2
    say(f"airflow standalone, home {HOME.relative_to(ROOT)}: UI on http://localhost:8080 — user admin, password in "
        f"{(HOME / 'simple_auth_manager_passwords.json.generated').relative_to(ROOT)}; Ctrl-C stops it")
    os.chdir(ROOT)
    os.execv(airflow, [airflow, "standalone"])
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
