"""`mirrorflow failover` by hand, step by step, without Airflow: the group moves with no gap and no re-read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from mirror_core import joblock
from mirror_core.cli import app
from mirror_core.config import load_config
from tests.dags import support

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def step(s: support.Scenario, name: str, *extra: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", name, "--json", *extra])
    assert res.exit_code == 0, res.output
    return json.loads(res.output[res.output.index("{"):])


def test_failover_by_hand(clusters: Any, unique: Any, tmp_path: Path) -> None:
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=40)
    support.commit_source_group(s, {0: 5, 1: 12})
    cg = ["--consumer-group", s.consumer_group]
    res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "preflight", *cg])
    assert res.exit_code == 1 and "not mirrored yet" in res.output  # nothing mirrored yet: not ready
    assert step(s, "drain")["ok"]
    assert step(s, "preflight", *cg)["ok"]
    assert step(s, "lag", "--max-lag-records", "0")["details"]["lag_records"] == 0
    assert step(s, "quiet", "--quiet-seconds", "1", "--no-stream")["ok"]
    sync = step(s, "sync", *cg)
    assert sorted((o["partition"], o["source_committed"]) for o in sync["details"]["offsets"]) == [(0, 5), (1, 12)]
    assert step(s, "verify")["details"]["records_verified"] == 40
    # a job still on the group's checkpoint (one started by hand, say): finalize waits until it has ended
    lock = joblock.lock_path(load_config(s.config).group(s.name).spark.checkpoint_dir, s.name)
    assert lock is not None
    with support.job_holding(lock, 3) as job:
        res = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "finalize", "--json"])
        assert res.exit_code == 0, res.output
        assert job.poll() is not None  # finalize returned only once the job had ended
    assert f"waiting for the job still running on the group's checkpoint to end: a streaming job, pid {job.pid}" \
        in res.output
    fin = json.loads(res.output[res.output.index("{"):])
    assert fin["details"]["stream_stopped"] is True and fin["summary"].startswith("stream stopped")
    assert Path(fin["details"]["stop_marker"]).exists()
    resumed = support.resume_on_destination(s, f"{s.topic}.mirror")
    assert resumed[0] == support.keys(s.src, s.topic, 0, start=5)
    assert resumed[1] == support.keys(s.src, s.topic, 1, start=12)
    # a stopped group's stream does not start again until the marker is removed
    out = CliRunner().invoke(app, ["failover", str(s.config), "--group", s.name, "--step", "resume"])
    assert out.exit_code == 0 and "removed" in out.output
    assert not Path(fin["details"]["stop_marker"]).exists()
