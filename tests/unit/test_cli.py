"""The CLI's exit codes and error lines (``mirror_core/cli.py``), with clusters and registries faked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from test_provision import FakeAdmin
from typer.testing import CliRunner

from mirror_core import provision, reach
from mirror_core.cli import app
from mirror_core.registry import RegistryClient

CONFIG = """
clusters:
  src:
    kafka: {{bootstrap.servers: "src:9092"}}
    schema_registry: {{url: "https://mirror:hunter2@{host}:8081", retries: 0}}
  dst:
    kafka: {{bootstrap.servers: "dst:9092"}}
    schema_registry: {{url: "https://mirror:hunter2@{host}-dst:8081", retries: 0}}
groups:
  - name: g
    source: src
    destination: dst
    serdes: {{key: string, value: avro}}
    mirrors: [{{source_topic: orders}}]
"""


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def timed_out(request: httpx.Request) -> httpx.Response:
    raise httpx.ReadTimeout("timed out", request=request)


def unavailable(request: httpx.Request) -> httpx.Response:
    return httpx.Response(503, json={"error_code": 50003, "message": "Service Unavailable"})


def unauthorized(request: httpx.Request) -> httpx.Response:
    return httpx.Response(401, json={"error_code": 40101, "message": "Unauthorized"})


def plan_with_registries_answering(answer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``mirrorflow plan`` of a group mirroring ``orders`` (Avro values) whose registries answered the up-front
    check, then answer every request with ``answer``."""
    file = tmp_path / "mirrors.yaml"
    file.write_text(CONFIG.format(host=f"sr-{answer.__name__}"))
    monkeypatch.setattr(reach, "require_reachable", lambda *a, **kw: None)
    monkeypatch.setattr(provision.clients, "admin", lambda cluster, **kw: FakeAdmin(["orders"]))
    monkeypatch.setattr(provision, "read_state", lambda admin, **kw: admin.state)

    def registries(cfg: Any, group: Any) -> tuple[RegistryClient, RegistryClient]:
        http = httpx.Client(transport=httpx.MockTransport(answer))
        return tuple(RegistryClient.from_config(cfg.cluster(a).schema_registry, http=http)  # type: ignore[return-value]
                     for a in (group.source, group.destination))

    monkeypatch.setattr(provision, "_registries", registries)
    return CliRunner().invoke(app, ["plan", str(file)])


@pytest.mark.parametrize("answer", [refused, timed_out, unavailable])
def test_plan_exits_1_naming_the_registry_when_it_fails_during_planning(answer, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The registries answered the up-front check, then failed while the plan read them: an outage is a runtime
    failure (exit 1, one line naming the registry without its credentials), not a mistake in the config (2)."""
    res = plan_with_registries_answering(answer, tmp_path, monkeypatch)
    host = f"sr-{answer.__name__}"
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: schema registry ") and f"https://{host}:8081" in lines[0], lines
    assert "hunter2" not in res.output and "Traceback" not in res.output


def test_plan_still_exits_2_when_the_registry_refuses_the_request(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry that answers, refusing (wrong credentials), is a problem of the config: the plan shows it, exit 2."""
    res = plan_with_registries_answering(unauthorized, tmp_path, monkeypatch)
    assert res.exit_code == 2, res.output
    assert "schema error: g__orders__orders: schema registry https://sr-unauthorized:8081" in res.stderr
    assert "hunter2" not in res.output


def test_finalize_writes_no_stop_when_the_offsets_could_not_be_synced_again(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """``failover --step finalize -c g1`` whose resync finds records still to mirror: exit 1, the reason and
    "nothing stopped" in its one line, and no stop written (the stream goes on mirroring them)."""
    from mirror_core import failover

    file = tmp_path / "mirrors.yaml"
    file.write_text(CONFIG.format(host="sr-finalize"))
    monkeypatch.setattr(reach, "require_reachable", lambda *a, **kw: None)
    monkeypatch.setattr(failover, "resync", lambda *_a: failover.StepReport(
        "resync", "g", False, "not drained: 500 records still to mirror", {"lag_records": 500}))

    def no_stop(*_a: Any, **_kw: Any) -> None:
        raise AssertionError("the stream's stop written with records still to mirror")
    monkeypatch.setattr(failover, "request_stream_stop", no_stop)
    res = CliRunner().invoke(app, ["failover", str(file), "--group", "g", "--step", "finalize", "-c", "g1"])
    assert res.exit_code == 1, res.output
    assert "g: resync: NOT OK: not drained: 500 records still to mirror; nothing stopped" in res.output
