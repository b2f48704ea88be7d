"""Clusters from Airflow connections; a planted password appears in no task log, rendered template,
XCom (nor anywhere else in the metadata DB), and no Spark process's command line."""

from __future__ import annotations

import json
import os
import stat
import threading
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.dags import support

pytestmark = [pytest.mark.integration, pytest.mark.spark]


class ProcessWatch:
    """Samples every process's command line (and the connections file a mirror job is given) until stopped."""

    def __init__(self) -> None:
        self.cmdlines: set[str] = set()
        self.conn_files: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit():
                    continue
                try:
                    cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    self.cmdlines.add(cmd)
                    if "mirror_stream" in cmd:
                        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                        for item in env:
                            if item.startswith(b"MIRRORFLOW_CONNECTIONS_FILE="):
                                path = item.split(b"=", 1)[1].decode()
                                self.conn_files[path] = stat.S_IMODE(os.stat(path).st_mode)
                except OSError:
                    continue
            self._stop.wait(0.3)

    def __enter__(self) -> ProcessWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_planted_password_never_leaks(clusters: Any, unique: Any, tmp_path: Path, airflow_db: Path,
                                        monkeypatch: Any, capfd: Any) -> None:
    secret = f"Planted-{uuid.uuid4().hex}"
    ids = {side: f"mf{side}{uuid.uuid4().hex[:8]}" for side in ("src", "dst", "srcreg", "dstreg")}
    for side, bootstrap in (("src", clusters.src_bootstrap), ("dst", clusters.dst_bootstrap)):
        monkeypatch.setenv(f"AIRFLOW_CONN_{ids[side].upper()}", json.dumps({
            "conn_type": "kafka", "extra": {"bootstrap.servers": bootstrap, "sasl.username": "mirror",
                                            "sasl.password": secret, "security.protocol": "PLAINTEXT"}}))
    for side, url in (("srcreg", clusters.src_registry), ("dstreg", clusters.dst_registry)):
        u = urlsplit(url)
        monkeypatch.setenv(f"AIRFLOW_CONN_{ids[side].upper()}", json.dumps({
            "conn_type": "http", "host": f"{u.scheme}://{u.hostname}", "port": u.port, "login": "mirror",
            "password": secret, "extra": {"path": u.path}}))
    clusters_yaml = (f"clusters:\n  src: {{connection: {ids['src']}, schema_registry_connection: {ids['srcreg']}}}\n"
                     f"  dst: {{connection: {ids['dst']}, schema_registry_connection: {ids['dstreg']}}}\n")
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=30, clusters_yaml=clusters_yaml)
    support.commit_source_group(s, {0: 4, 1: 6})
    assert secret not in s.config.read_text()
    dags = support.load_dags(s.config, monkeypatch)
    with ProcessWatch() as watch:
        for purpose in ("provision", "stream", "offset_sync"):
            dr = dags[s.dag_id(purpose)].test()
            assert dr.state == "success", (purpose, support.task_states(dr))
    # the connections were used: the destination has the records and the group's offsets
    dst_topic = f"{s.topic}.mirror"
    assert support.keys(s.dst, dst_topic, 0) == support.keys(s.src, s.topic, 0)
    assert support.resume_on_destination(s, dst_topic)[1] == support.keys(s.src, s.topic, 1, start=6)
    # the Spark job got the resolved connections in a private file, not on its command line
    assert watch.conn_files and set(watch.conn_files.values()) == {0o600}
    assert all(not Path(p).exists() for p in watch.conn_files)  # removed after the job
    assert any("mirror_stream.py" in c for c in watch.cmdlines)
    assert not [c for c in watch.cmdlines if secret in c]
    # task logs (dag.test() prints them), rendered templates, XComs: nothing anywhere
    out, err = capfd.readouterr()
    assert "mirror_stream.py" in out + err  # the spark-submit command was logged, without the secret
    assert secret not in out and secret not in err
    logs = [p for p in (airflow_db / "logs").rglob("*") if p.is_file()] if (airflow_db / "logs").exists() else []
    assert not [p for p in logs if secret.encode() in p.read_bytes()]
    for db in airflow_db.glob("airflow.db*"):
        assert secret.encode() not in db.read_bytes(), db
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rendered = session.scalars(select(RenderedTaskInstanceFields).where(
            RenderedTaskInstanceFields.dag_id.like(f"mirrorflow__{s.name}__%"))).all()
    assert rendered and not [r for r in rendered if secret in json.dumps(r.rendered_fields, default=str)]
