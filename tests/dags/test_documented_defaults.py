"""The defaults the README states, one row each: the README still says it, and a minimal config and the DAGs built
from it still have it. Change a default and this table (and the README sentence it quotes) must change with it."""

from __future__ import annotations

import re
import textwrap
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from mirror_core.config import parse_config
from mirror_core.failover import FailoverParams
from tests.dags.test_dagbag import dagbag_of

README = re.sub(r"\s+", " ", (Path(__file__).resolve().parents[2] / "README.md").read_text())

MINIMAL = """
    clusters:
      a: {kafka: {bootstrap.servers: "a:9092"}, schema_registry: {url: "http://a:8081"}}
      b: {kafka: {bootstrap.servers: "b:9092"}}
    groups:
      - {name: g, source: a, destination: b, mirrors: [{source_topic: t}]}
"""

#: (what the README says, word for word, the value it says, where the config or the DAGs keep it)
ROWS: list[tuple[str, Any, str]] = [
    ("within `S` seconds (default `spark.stop_timeout`, 30 s;", 30.0, "spark.stop_timeout"),
    ("`spark.stop_timeout` (default 30 s; `mirrorflow run --stop-timeout`)", 30.0, "spark.stop_timeout"),
    ("`spark.driver_batch_max_records` records (default 50000:", 50000, "spark.driver_batch_max_records"),
    ("about `spark.driver_batch_max_bytes` (256 MiB)", 256 * 2**20, "spark.driver_batch_max_bytes"),
    ("`schema_registry.not_found_retries` times (default 4)", 4, "schema_registry.not_found_retries"),
    ("back-off from `not_found_backoff` (default 0.5 s)", 0.5, "schema_registry.not_found_backoff"),
    ("(`schema_registry.outage_deadline`, default 300 s)", 300.0, "schema_registry.outage_deadline"),
    ("(`approval_timeout`, default 24 h;", 24 * 3600.0, "failover.approval_timeout"),
    ("(`approval_timeout`, default 24 h;", timedelta(hours=24), "dag: approve_stop_producers.response_timeout"),
    ("(`approval_timeout`, default 24 h;", timedelta(hours=24), "dag: approve_switch_consumers.response_timeout"),
    ("`max_lag_records` (default 1000)", 1000, "dag param: max_lag_records"),
    ("`max_lag_records` (default 1000)", 1000, "params: max_lag_records"),
    ("`max_lag_seconds` (default 60)", 60, "dag param: max_lag_seconds"),
    ("`max_lag_seconds` (default 60)", 60, "params: max_lag_seconds"),
    ("`quiet_seconds` (default 30)", 30, "dag param: quiet_seconds"),
    ("`quiet_seconds` (default 30)", 30, "params: quiet_seconds"),
    ("(`wait_for_lag` up to 6 h,", timedelta(hours=6), "dag: wait_for_lag.timeout"),
    ("`wait_for_quiet` up to 1 h)", timedelta(hours=1), "dag: wait_for_quiet.timeout"),
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The minimal config's group and its failover DAG (DAGs built as the DAG processor builds them)."""
    with pytest.MonkeyPatch.context() as mp:
        bag = dagbag_of(tmp_path_factory.mktemp("defaults"), mp, MINIMAL)
    cfg = parse_config(yaml.safe_load(textwrap.dedent(MINIMAL)), env={})
    return {"spark": cfg.groups[0].spark, "failover": cfg.groups[0].failover,
            "schema_registry": cfg.cluster("a").schema_registry, "dag": bag.dags["mirrorflow__g__failover"]}


def value_at(built: dict[str, Any], where: str) -> Any:
    kind, _, name = where.partition(": ")
    if kind == "dag param":
        return built["dag"].params[name]
    if kind == "params":  # the CLI's and the DAG's, when the person starting the failover gives none
        return getattr(FailoverParams.from_mapping({"consumer_groups": ["c"]}), name)
    if kind == "dag":
        task, attr = name.split(".")
        got = getattr(built["dag"].get_task(task), attr)
        return got if isinstance(got, timedelta) else timedelta(seconds=got)
    section, field = where.split(".")
    return getattr(built[section], field)


@pytest.mark.parametrize(("readme", "stated", "where"), ROWS, ids=[f"{w}={s}" for _, s, w in ROWS])
def test_a_default_is_what_the_readme_says(built: dict[str, Any], readme: str, stated: Any, where: str) -> None:
    assert readme in README, f"the README no longer says {readme!r}"
    assert value_at(built, where) == stated, where
