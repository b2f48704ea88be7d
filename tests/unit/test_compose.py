"""docker-compose.yaml: structure only (no Docker engine needed), and its mirrors config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from mirror_core.config import load_config, resolve_mirrors

REPO = Path(__file__).resolve().parents[2]
COMPOSE = REPO / "docker-compose.yaml"
COMPOSE_CONFIG = REPO / "config" / "compose.yaml"

KAFKA = {"kafka-src": "19092", "kafka-dst": "29092"}
REGISTRIES = {"registry-src": "18081", "registry-dst": "28081"}


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict)
    return doc["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def _host_ports(service: dict[str, Any]) -> dict[str, str]:
    """host port -> container port."""
    out = {}
    for mapping in service.get("ports", []):
        host, _, container = str(mapping).rpartition(":")
        out[host.rpartition(":")[2]] = container
    return out


def test_services_present(services: dict[str, Any]) -> None:
    assert {"kafka-src", "kafka-dst", "registry-src", "registry-dst", "spark-master", "spark-worker", "airflow"} <= set(
        services
    )


def test_every_service_has_an_image_and_a_healthcheck(services: dict[str, Any]) -> None:
    for name, svc in services.items():
        assert svc.get("image"), name
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


@pytest.mark.parametrize(("name", "port"), sorted(KAFKA.items()))
def test_kafka_is_single_node_kraft(services: dict[str, Any], name: str, port: str) -> None:
    svc = services[name]
    env = _env(svc)
    assert svc["image"] == "apache/kafka:4.1.1"
    assert env["KAFKA_PROCESS_ROLES"].replace(" ", "") in ("broker,controller", "controller,broker")
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{env['KAFKA_NODE_ID']}@{name}:9093"
    assert f"PLAINTEXT://{name}:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert f"localhost:{port}" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert f":{port}" in env["KAFKA_LISTENERS"]
    assert _host_ports(svc) == {port: port}
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"  # exactly_once needs transactions


def test_kafka_clusters_are_distinct(services: dict[str, Any]) -> None:
    ids = {_env(services[name])["CLUSTER_ID"] for name in KAFKA}
    assert len(ids) == 2


@pytest.mark.parametrize(("name", "port"), sorted(REGISTRIES.items()))
def test_registries_are_apicurio_in_memory(services: dict[str, Any], name: str, port: str) -> None:
    svc = services[name]
    env = _env(svc)
    assert svc["image"].startswith("apicurio/apicurio-registry:3.")
    assert env["APICURIO_STORAGE_KIND"] == "sql"
    assert env["APICURIO_STORAGE_SQL_KIND"] == "h2"
    assert env["APICURIO_DATASOURCE_URL"].startswith("jdbc:h2:mem:")
    assert _host_ports(svc) == {port: "8080"}
    assert "/apis/ccompat/v7" in " ".join(svc["healthcheck"]["test"])


def test_spark_master_and_worker(services: dict[str, Any]) -> None:
    master, worker = services["spark-master"], services["spark-worker"]
    assert "org.apache.spark.deploy.master.Master" in master["command"]
    assert "org.apache.spark.deploy.worker.Worker" in worker["command"]
    assert "spark://spark-master:7077" in worker["command"]
    assert "7077" in _host_ports(master).values()


def test_airflow_standalone_with_project(services: dict[str, Any]) -> None:
    svc = services["airflow"]
    assert svc["image"] == "apache/airflow:3.3.2"
    assert "standalone" in str(svc["command"])
    mounts = {str(v).split(":")[1]: str(v).split(":")[0] for v in svc["volumes"]}
    assert mounts["/opt/airflow/dags"] == "./dags"
    assert mounts["/opt/airflow/plugins"] == "./plugins"
    assert mounts["/opt/airflow/config"] == "./config"
    assert mounts["/opt/mirrorflow"] == "./"
    env = _env(svc)
    assert "/opt/mirrorflow" in env["_PIP_ADDITIONAL_REQUIREMENTS"]
    assert env["MIRRORFLOW_CONFIG"] == "/opt/airflow/config/compose.yaml"
    assert {"kafka-src", "kafka-dst", "registry-src", "registry-dst"} <= set(svc["depends_on"])
    for dep in svc["depends_on"].values():
        assert dep["condition"] == "service_healthy"


def test_airflow_signs_its_tokens_with_a_long_secret_of_its_own(services: dict[str, Any], tmp_path: Path) -> None:
    """The container's command (run here with bash, an ``airflow`` of the test's on PATH) makes a secret of 64
    random bytes, owner-only, at the first start and keeps it at the next; Airflow reads it through
    ``AIRFLOW__API_AUTH__JWT_SECRET_CMD`` and starts standalone. Airflow's own would be 16 bytes."""
    import os
    import stat
    import subprocess
    import sys

    svc = services["airflow"]
    env = _env(svc)
    assert "AIRFLOW__API_AUTH__JWT_SECRET" not in env  # no secret written in the file
    command = svc["command"]
    assert command[:2] == ["bash", "-c"], command
    script = command[2].replace("$$", "$")  # compose's escape for a literal $
    secret = tmp_path / "jwt_secret"
    read_cmd = env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"].replace(env["MIRRORFLOW_JWT_SECRET_FILE"], str(secret))
    assert read_cmd == f"cat {secret}"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "airflow").write_text(f"#!/bin/bash\necho \"$1 $({read_cmd}) $(umask)\"\n")
    (bin_dir / "airflow").chmod(0o755)
    (bin_dir / "python").symlink_to(sys.executable)
    run_env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin:/bin", "MIRRORFLOW_JWT_SECRET_FILE": str(secret)}
    first = subprocess.run(["bash", "-c", f"umask 022; {script}"], env=run_env, capture_output=True, text=True,
                           check=True).stdout
    mode, value = stat.S_IMODE(secret.stat().st_mode), secret.read_text().strip()
    assert mode == 0o600, oct(mode)
    assert len(value) >= 86, value  # 64 bytes, URL-safe base64
    # the secret's umask stays the secret's: Airflow writes shared checkpoints the Spark containers must read
    assert first.split() == ["standalone", value, "0022"]
    again = subprocess.run(["bash", "-c", f"umask 022; {script}"], env=run_env, capture_output=True, text=True,
                           check=True).stdout
    assert again == first


def test_every_airflow_connection_set_is_one_mirrorflow_reads(services: dict[str, Any]) -> None:
    """A connection set in the environment that no group or cluster names, and that the failover's pause does
    not use, does nothing: a user reading the file would think it picks the Spark master (it once set
    spark_default, which mirrorflow never reads)."""
    import ast

    cfg = load_config(COMPOSE_CONFIG, env={})
    operators = ast.parse((REPO / "plugins" / "mirrorflow_airflow" / "operators.py").read_text())
    api = [node.value.value for node in operators.body if isinstance(node, ast.Assign)
           and any(getattr(t, "id", "") == "AIRFLOW_API_CONN_ID" for t in node.targets)]
    assert len(api) == 1, "operators.AIRFLOW_API_CONN_ID not found"
    read = {g.spark.airflow_conn_id for g in cfg.groups} | set(api)
    for alias in ("src", "dst"):
        cluster = cfg.cluster(alias)
        read |= {c for c in (cluster.connection, cluster.schema_registry_connection) if c}
    for service in services.values():
        for name in _env(service):
            if name.startswith("AIRFLOW_CONN_"):
                assert name.removeprefix("AIRFLOW_CONN_").lower() in read, name


def test_spark_checkpoints_are_shared(services: dict[str, Any]) -> None:
    for name in ("airflow", "spark-master", "spark-worker"):
        assert "mirrorflow-state:/state" in services[name]["volumes"], name


def test_compose_mirrors_config_validates_against_in_network_names(services: dict[str, Any]) -> None:
    cfg = load_config(COMPOSE_CONFIG, env={})
    for alias, svc_name in (("src", "kafka-src"), ("dst", "kafka-dst")):
        cluster = cfg.cluster(alias)
        assert cluster.bootstrap_servers == f"{svc_name}:9092"
        assert cluster.schema_registry is not None
        assert cluster.schema_registry.url.get_secret_value() == f"http://registry-{alias}:8080/apis/ccompat/v7"
    group = cfg.groups[0]
    assert group.spark.master == "spark://spark-master:7077"
    assert group.spark.checkpoint_dir.startswith("/state/")
    assert group.topics_mirroring.replication_factor.resolve(3) == 1  # single-node clusters
    assert resolve_mirrors(group)
