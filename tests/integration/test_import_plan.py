"""Acceptance: each sample config imports, validates and plans against the real local clusters.

The imported YAML is kept as written except where it names the users' own brokers: bootstrap servers
and registries are rewritten to the local clusters (security settings dropped with them, since the local
clusters are plaintext), fixed replication factors are lowered to the single local broker, and the
explicit viooh topic names get a unique suffix so that tests never share topics.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic
from typer.testing import CliRunner

from mirror_core.cli import app
from mirror_core.topics import create_topics

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "importers"))
from importer_samples import FIXTURES  # noqa: E402

pytestmark = pytest.mark.integration


def _import(tmp_path: Path, fmt: str, name: str, *extra: str) -> tuple[Path, str]:
    out = tmp_path / f"{fmt}.yaml"
    res = CliRunner().invoke(app, ["import", fmt, str(FIXTURES / name), "-o", str(out), *extra])
    assert res.exit_code == 0, res.output
    return out, res.stderr


def _validate_as_written(path: Path) -> None:
    """`mirrorflow validate` on the file as imported, with the placeholders it lists set."""
    env = {m: "set" for m in re.findall(r"\$\{([A-Z0-9_]+)\}", path.read_text())}
    res = CliRunner().invoke(app, ["validate", str(path)], env=env)
    assert res.exit_code == 0, res.output
    assert ": OK" in res.stdout


def _localise(path: Path, clusters: Any, sides: dict[str, str]) -> Path:
    tree = yaml.safe_load(path.read_text())
    for alias, side in sides.items():
        c = tree["clusters"][alias]
        c["kafka"] = {"bootstrap.servers": getattr(clusters, f"{side}_bootstrap")}
        if "schema_registry" in c or getattr(clusters, f"{side}_registry"):
            c["schema_registry"] = {"url": getattr(clusters, f"{side}_registry")}
    for g in tree["groups"]:
        for holder in [g, *g["mirrors"]]:
            rf = holder.get("topics_mirroring", {}).get("replication_factor")
            if rf and rf.get("type") == "fix":
                rf["value"] = 1
    local = path.with_name(path.stem + "-local.yaml")
    local.write_text(yaml.safe_dump(tree, sort_keys=False))
    return local


def _plan(path: Path) -> dict[str, dict[str, Any]]:
    res = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert res.exit_code == 0, res.output
    return {p["group"]: p for p in json.loads(res.stdout)}


def _create(bootstrap: str, *topics: str, partitions: int = 3) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [NewTopic(t, partitions, 1) for t in topics])


def _actions(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["topic"]: a for a in plan["topics"]}


def test_mm2_two_flows_with_security_plans(clusters, unique, tmp_path):
    out, stderr = _import(tmp_path, "mm2", "mm2.properties")
    assert "tasks.max" in stderr
    _validate_as_written(out)
    topic = unique("orders")
    _create(clusters.src_bootstrap, topic)
    plans = _plan(_localise(out, clusters, {"onprem": "src", "cloud": "dst"}))
    a = _actions(plans["onprem-to-cloud"])[f"onprem.{topic}"]  # MM2's prefix policy kept
    assert a["kind"] == "create" and a["partitions"] == 3 and a["replication_factor"] == 1
    assert "cloud-to-onprem" in plans


def test_mm2_connect_connectors_plan(clusters, unique, tmp_path):
    """The three connector configs of one pair, given together, plan as one group."""
    out, stderr = _import(tmp_path, "mm2", "connect/mm2-source.json",
                          *(str(FIXTURES / "connect" / n) for n in ("mm2-checkpoint.json", "mm2-heartbeat.properties")))
    assert "mm2-checkpoint.json: tasks.max" in stderr
    _validate_as_written(out)
    topic = f"orders.{unique('eu')}"
    _create(clusters.src_bootstrap, topic)
    plans = _plan(_localise(out, clusters, {"onprem": "src", "cloud": "dst"}))
    a = _actions(plans["onprem-to-cloud"])[f"onprem.{topic}"]  # the prefix policy of the connectors kept
    assert a["kind"] == "create" and a["partitions"] == 3 and a["replication_factor"] == 1


def test_strimzi_bidirectional_plans(clusters, unique, tmp_path):
    out, _ = _import(tmp_path, "strimzi", "strimzi-bidirectional.yaml")
    _validate_as_written(out)
    there, back = unique("orders"), unique("orders")
    _create(clusters.src_bootstrap, there)
    _create(clusters.dst_bootstrap, back)
    plans = _plan(_localise(out, clusters, {"es-1": "src", "es-2": "dst"}))
    assert _actions(plans["es-1-to-es-2"])[f"es-1.{there}"]["kind"] == "create"
    assert _actions(plans["es-2-to-es-1"])[f"es-2.{back}"]["kind"] == "create"


def test_mm1_plans(clusters, unique, tmp_path):
    topic = unique("payments")
    out, stderr = _import(tmp_path, "mm1", "mm1-consumer.properties", "--producer",
                          str(FIXTURES / "mm1-producer.properties"), "--include", f"{topic}, {topic}-x")
    assert "buffer.memory" in stderr
    _validate_as_written(out)
    _create(clusters.src_bootstrap, topic, partitions=2)
    tree = yaml.safe_load(out.read_text())
    plans = _plan(_localise(out, clusters, {tree["groups"][0]["source"]: "src", tree["groups"][0]["destination"]: "dst"}))
    a = _actions(plans["mm1"])[topic]  # MM1 kept names: identity
    assert a["kind"] == "create" and a["partitions"] == 2


def test_viooh_readme_example_plans(clusters, unique, tmp_path):
    out, stderr = _import(tmp_path, "viooh", "viooh-readme.edn", "--env", "prd")
    assert ":metrics" in stderr
    _validate_as_written(out)
    src_topic, dst_topic = unique("source-topic"), unique("mirror_test_copy_4")
    text = out.read_text().replace("source-topic", src_topic).replace("mirror_test_copy_4", dst_topic)
    out.write_text(text)
    _create(clusters.src_bootstrap, src_topic, partitions=2)
    plans = _plan(_localise(out, clusters, {"source": "src", "destination": "dst"}))
    a = _actions(plans["prod"])[dst_topic]
    # viooh's {:type :mirror-source :min 3 :max 12} partition rule: 2 source partitions -> 3
    assert a["kind"] == "create" and a["partitions"] == 3 and a["source_topic"] == src_topic
