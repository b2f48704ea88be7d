"""Waiting for a local Spark standalone cluster: a master still starting may answer its status page with
something that is not JSON yet (or drop the connection); the wait goes on until its workers register."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from types import SimpleNamespace

import pytest

from mirror_core import local_spark
from mirror_core.errors import LocalClusterError


def _serve(answers: list[bytes]) -> tuple[HTTPServer, list[int]]:
    """A status page answering ``answers`` in turn (the last one from then on); counts the requests."""
    asked = [0]

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = answers[min(asked[0], len(answers) - 1)]
            asked[0] += 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, asked


def _cluster(server: HTTPServer) -> local_spark.SparkCluster:
    me = os.getpid()  # "alive" daemons
    return local_spark.SparkCluster("spark://127.0.0.1:1", f"http://127.0.0.1:{server.server_port}", me, (me, me),
                                    ("", ""), "/tmp")


def test_a_master_answering_before_its_status_is_json_is_waited_for(monkeypatch) -> None:
    monkeypatch.setattr(local_spark.time, "sleep", lambda _s: None)
    alive = json.dumps({"workers": [{"state": "ALIVE"}, {"state": "ALIVE"}]}).encode()
    server, asked = _serve([b"<html>starting</html>", b"", json.dumps({"workers": [{"state": "ALIVE"}]}).encode(),
                            alive])
    try:
        local_spark.wait_workers(_cluster(server), 2, timeout=30)
    finally:
        server.shutdown()
    assert asked[0] == 4


def test_workers_that_never_register_end_the_wait_with_one_line(monkeypatch) -> None:
    server, _ = _serve([b"not json"])
    try:
        with pytest.raises(LocalClusterError, match=r"not ready before the deadline \(JSONDecodeError"):
            local_spark.wait_workers(_cluster(server), 2, timeout=1.0)
    finally:
        server.shutdown()


def test_the_workers_wait_for_a_master_that_leads(monkeypatch) -> None:
    """A worker that registers with a master not yet elected leader gets no answer and asks again only 8-13 s
    later; ``up`` starts the workers after this wait, which goes on through a page that is not JSON yet and a
    status other than ALIVE."""
    monkeypatch.setattr(local_spark.time, "sleep", lambda _s: None)
    server, asked = _serve([b"", json.dumps({"status": "STANDBY"}).encode(), json.dumps({"status": "ALIVE"}).encode()])
    try:
        local_spark.wait_master(f"http://127.0.0.1:{server.server_port}", os.getpid(), 30, "/tmp")
    finally:
        server.shutdown()
    assert asked[0] == 3


def test_a_master_that_never_leads_ends_the_wait_with_one_line() -> None:
    server, _ = _serve([json.dumps({"status": "RECOVERING"}).encode()])
    try:
        with pytest.raises(LocalClusterError, match=r"not ready before the deadline \(master status RECOVERING\)"):
            local_spark.wait_master(f"http://127.0.0.1:{server.server_port}", os.getpid(), 1.0, "/tmp")
    finally:
        server.shutdown()


def test_the_local_clusters_daemons_start_without_the_callers_secret_variables(monkeypatch, tmp_path) -> None:
    """Passwords a user sourced for the secure local config never reach the master, the workers or their
    executors' environment; Spark's own variables and ordinary settings still do."""
    import subprocess

    from mirror_core import local

    planted = "pl4nted-env-pw"
    monkeypatch.setenv("MIRRORFLOW_SOURCE_PASSWORD", planted)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", planted)
    monkeypatch.setenv("MIRRORFLOW_REGISTRY_TOKEN", planted)
    monkeypatch.setenv("MIRRORFLOW_GC", "1")
    monkeypatch.setenv("SPARK_WORKER_OPTS", "-Dx=1")
    monkeypatch.setattr(local, "find_java", lambda version: "java")
    # every daemon starts (a fake process each) and the master and workers come up at once
    monkeypatch.setattr(local_spark, "wait_master", lambda *args: None)
    monkeypatch.setattr(local_spark, "wait_workers", lambda *args: None)
    started: list[tuple[str, dict[str, str]]] = []

    def fake_popen(cmd: list[str], **kwargs: object) -> SimpleNamespace:
        role = next(c.rsplit(".", 1)[1] for c in cmd if c.startswith("org.apache.spark.deploy."))
        started.append((role, dict(kwargs["env"])))  # type: ignore[call-overload]
        return SimpleNamespace(pid=100_000 + len(started))

    monkeypatch.setattr(subprocess, "Popen", fake_popen)
    cluster = local_spark.up(local.LocalEnv(state_dir=tmp_path, cache=tmp_path / "cache"), workers=3)
    assert [role for role, _ in started] == ["Master", "Worker", "Worker", "Worker"]
    assert cluster.worker_pids == (100_002, 100_003, 100_004)
    for role, env in started:
        assert planted not in env.values(), role
        assert env["MIRRORFLOW_GC"] == "1" and env["SPARK_WORKER_OPTS"] == "-Dx=1", role
        assert env["PATH"] == os.environ["PATH"] and env["SPARK_LOCAL_IP"] == "127.0.0.1", role
