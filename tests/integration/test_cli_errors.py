"""Item 16 of issue 11: an unreachable cluster or registry is one clear line, exit 1, after a bounded wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DEAD = "127.0.0.1:1"  # nothing listens on port 1: connections are refused
DEAD_REGISTRY = "http://127.0.0.1:1/apis/ccompat/v7"
CONNECT_TIMEOUT = 1.5
#: the bound on a whole command: the connect timeout plus Python's start-up on a busy 2-core machine
BOUND = CONNECT_TIMEOUT + 20.0
COMMANDS = ("plan", "provision", "checkpoint", "lag", "verify", "run")


def write_config(tmp_path: Path, clusters, topic: str, src_bootstrap: str, src_registry: str) -> Path:
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"""
clusters:
  src:
    kafka: {{bootstrap.servers: "{src_bootstrap}"}}
    schema_registry: {{url: "{src_registry}"}}
  dst:
    kafka: {{bootstrap.servers: "{clusters.dst_bootstrap}"}}
    schema_registry: {{url: "{clusters.dst_registry}"}}
groups:
  - name: g16
    source: src
    destination: dst
    serdes: {{key: bytes, value: avro}}
    offset_syncs_topic: "{topic}.syncs.internal"
    dead_letter_topic: "{topic}.dlq"
    topics_mirroring:
      replication_factor: {{type: fix, value: 1}}
    spark: {{master: "local[1]", checkpoint_dir: "{tmp_path / 'ckpt'}"}}
    mirrors:
      - {{source_topic: {topic}, destination_topic: {topic}.mirror}}
""")
    return cfg


def run_cli(cfg: Path, command: str, *options: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """``mirrorflow [options] command cfg``; without options, with MIRRORFLOW_CONNECT_TIMEOUT=1.5 in the env."""
    args = [*options, command, str(cfg)] + (["--group", "g16", "--once"] if command == "run" else [])
    env = {k: v for k, v in os.environ.items() if k != "MIRRORFLOW_CONNECT_TIMEOUT"}
    if not options:
        env["MIRRORFLOW_CONNECT_TIMEOUT"] = str(CONNECT_TIMEOUT)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                         timeout=180, env=env)
    return res, time.monotonic() - t0


@pytest.fixture
def topic(clusters, unique) -> str:
    name = unique("item16")
    admin = AdminClient({"bootstrap.servers": clusters.src_bootstrap})
    create_topics(admin, [NewTopic(name, 1, 1)])
    return name


@pytest.mark.parametrize("command", COMMANDS)
def test_item16_unreachable_cluster_one_line(clusters, topic, tmp_path, command):
    cfg = write_config(tmp_path, clusters, topic, DEAD, clusters.src_registry)
    res, took = run_cli(cfg, command)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 1, (res.returncode, res.stderr[-3000:])
    assert len(lines) == 1, res.stderr[-3000:]
    assert "'src'" in lines[0] and DEAD in lines[0] and "unreachable" in lines[0], lines[0]
    assert lines[0].endswith("(waited 1.5s)"), lines[0]  # the variable's timeout, not the default
    assert "Traceback" not in res.stdout + res.stderr and "|FAIL|" not in res.stdout + res.stderr
    assert took < BOUND, took


def test_item16_the_connect_timeout_option_bounds_the_wait(clusters, topic, tmp_path):
    """``--connect-timeout 1``, no MIRRORFLOW_CONNECT_TIMEOUT: the line says how long it waited."""
    cfg = write_config(tmp_path, clusters, topic, DEAD, clusters.src_registry)
    res, took = run_cli(cfg, "lag", "--connect-timeout", "1")
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 1 and len(lines) == 1, (res.returncode, res.stderr[-3000:])
    assert "'src'" in lines[0] and "unreachable" in lines[0] and lines[0].endswith("(waited 1s)"), lines[0]
    assert took < 1 + 20.0, took


@pytest.mark.parametrize("command", COMMANDS)
def test_item16_unreachable_registry_one_line(clusters, topic, tmp_path, command):
    cfg = write_config(tmp_path, clusters, topic, clusters.src_bootstrap, DEAD_REGISTRY)
    res, took = run_cli(cfg, command)
    assert took < BOUND, took
    if command in ("checkpoint", "lag", "verify"):
        # these never talk to a registry: a registry outage must not stop them (an on-call engineer
        # watching lag during a registry incident still gets the numbers)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "error" not in res.stderr.lower(), res.stderr[-3000:]
        return
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 1, (res.returncode, res.stderr[-3000:])
    assert len(lines) == 1, res.stderr[-3000:]
    assert "schema registry" in lines[0] and "'src'" in lines[0] and "127.0.0.1:1" in lines[0], lines[0]
    assert "unreachable" in lines[0] and lines[0].endswith("(waited 1.5s)"), lines[0]


def test_item16_validate_needs_no_cluster(clusters, tmp_path):
    cfg = write_config(tmp_path, clusters, "t16", DEAD, DEAD_REGISTRY)
    res, took = run_cli(cfg, "validate")
    assert res.returncode == 0 and "OK" in res.stdout and not res.stderr.strip(), res.stderr
    assert took < 20
