"""How long a command waits for a cluster or registry (mirror_core.reach): the README's "default 10"."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from mirror_core import reach
from mirror_core.config import parse_config

CONFIG = """
clusters:
  src: {kafka: {bootstrap.servers: "a:1"}}
  dst: {kafka: {bootstrap.servers: "b:1"}}
groups:
  - {name: g, source: src, destination: dst, mirrors: [{source_topic: t}]}
"""


def test_the_connect_timeout_is_10_s_when_neither_the_option_nor_the_variable_gives_one(monkeypatch):
    monkeypatch.delenv("MIRRORFLOW_CONNECT_TIMEOUT", raising=False)
    assert reach.connect_timeout() == 10.0
    waited: list[float] = []
    monkeypatch.setattr(reach, "kafka_problem", lambda alias, cluster, timeout: waited.append(timeout))
    cfg = parse_config(yaml.safe_load(CONFIG), env={})
    reach.require_reachable(cfg, cfg.groups)
    assert waited == [10.0, 10.0]  # source and destination, each asked for at most 10 s


@pytest.mark.parametrize(("raw", "seconds"), [("1.5", 1.5), ("", 10.0), ("soon", 10.0), ("0", 10.0)])
def test_the_variable_sets_the_connect_timeout_and_a_bad_value_keeps_the_default(monkeypatch, raw, seconds):
    monkeypatch.setenv("MIRRORFLOW_CONNECT_TIMEOUT", raw)
    assert reach.connect_timeout() == seconds


def test_the_option_sets_the_connect_timeout_for_the_command_and_the_job_it_starts(monkeypatch, tmp_path):
    """``--connect-timeout`` wins over the variable and is handed on in it (the Spark job reads the variable)."""
    from mirror_core.cli import app

    monkeypatch.setenv("MIRRORFLOW_CONNECT_TIMEOUT", "7")
    path = tmp_path / "m.yaml"
    path.write_text(CONFIG)
    res = CliRunner().invoke(app, ["--connect-timeout", "1", "validate", str(path)])
    assert res.exit_code == 0, res.output
    assert reach.connect_timeout() == 1.0
