"""Clusters from Airflow connections and inline ``${VAR}`` secrets: none of the planted secrets appears in a task
log, the test's output, a rendered template, an XCom (nor anywhere else in the metadata DB), the spark-submit
command the operator builds, or any process's command line.

Each secret has its own value, so that a check that passes because Airflow masks one value (a connection's
``password``, or an extra key it deems sensitive) cannot hide another that only mirrorflow protects: a Kafka extra
key Airflow does not know as a secret (``ssl.key.pem``: only :func:`mirrorflow_airflow.hooks._mask` registers it), and values
that come from the environment into the config file, which Airflow knows nothing about (a cluster's
``sasl.password``, a registry URL's userinfo, a secret ``spark.conf`` option)."""

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

#: failover params under which the lag sensor lets the run go on at once
FAILOVER_PARAMS = {"max_lag_records": 100000, "max_lag_seconds": 86400, "quiet_seconds": 2}


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


def found(secrets: dict[str, str], text: str | bytes) -> list[str]:
    """The names of the planted secrets that ``text`` holds."""
    data = text if isinstance(text, bytes) else text.encode(errors="replace")
    return [name for name, value in secrets.items() if value.encode() in data]


def test_planted_secrets_never_leak(clusters: Any, unique: Any, tmp_path: Path, airflow_db: Path,
                                    monkeypatch: Any, capfd: Any) -> None:
    secrets = {place: f"Planted{place.replace('_', '')}{uuid.uuid4().hex}" for place in (
        "kafka_extra_password",  # a Kafka connection's extra sasl.password (Airflow masks it by its key's name)
        "kafka_extra_key_pem",  # the same extra's ssl.key.pem: a secret Airflow does not know, masked by the hook only
        "registry_conn_password",  # the http connection's password (Airflow masks conn.password itself)
        "inline_sasl_password",  # ${VAR} in the config: the destination's sasl.password
        "inline_registry_userinfo",  # ${VAR} in the config: the destination registry URL's password
        "spark_conf_secret",  # ${VAR} in the config: spark.conf spark.hadoop.fs.s3a.secret.key
    )}
    ids = {side: f"mf{side}{uuid.uuid4().hex[:8]}" for side in ("src", "srcreg")}
    monkeypatch.setenv(f"AIRFLOW_CONN_{ids['src'].upper()}", json.dumps({
        "conn_type": "kafka", "extra": {
            "bootstrap.servers": clusters.src_bootstrap, "security.protocol": "PLAINTEXT", "sasl.username": "mirror",
            "sasl.password": secrets["kafka_extra_password"], "ssl.key.pem": secrets["kafka_extra_key_pem"]}}))
    u = urlsplit(clusters.src_registry)
    monkeypatch.setenv(f"AIRFLOW_CONN_{ids['srcreg'].upper()}", json.dumps({
        "conn_type": "http", "host": f"{u.scheme}://{u.hostname}", "port": u.port, "login": "mirror",
        "password": secrets["registry_conn_password"], "extra": {"path": u.path}}))
    env = {place: f"MF_TEST_{place.upper()}_{uuid.uuid4().hex[:6]}" for place in (
        "inline_sasl_password", "inline_registry_userinfo", "spark_conf_secret")}
    for place, var in env.items():
        monkeypatch.setenv(var, secrets[place])
    scheme, rest = clusters.dst_registry.split("://", 1)
    clusters_yaml = (
        f"clusters:\n  src: {{connection: {ids['src']}, schema_registry_connection: {ids['srcreg']}}}\n"
        f"  dst:\n    kafka: {{bootstrap.servers: \"{clusters.dst_bootstrap}\", sasl.username: mirror, "
        f"sasl.password: \"${{{env['inline_sasl_password']}}}\"}}\n"
        f"    schema_registry: {{url: \"{scheme}://mirror:${{{env['inline_registry_userinfo']}}}@{rest}\"}}\n")
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=30, clusters_yaml=clusters_yaml,
                         spark_yaml=f", conf: {{spark.hadoop.fs.s3a.secret.key: \"${{{env['spark_conf_secret']}}}\"}}")
    support.commit_source_group(s, {0: 4, 1: 6})
    assert found(secrets, s.config.read_text()) == []
    from mirror_core.config import load_config

    loaded = load_config(s.config)  # the ${VAR}s are what the clusters and the job get
    assert loaded.cluster("dst").kafka_properties()["sasl.password"] == secrets["inline_sasl_password"]
    assert secrets["inline_registry_userinfo"] in loaded.cluster("dst").schema_registry.url.get_secret_value()  # type: ignore[union-attr]
    assert loaded.group(s.name).spark.secret_conf() == {"spark.hadoop.fs.s3a.secret.key": secrets["spark_conf_secret"]}

    # the spark-submit commands the operator builds, as built (the process watch below only samples)
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    built: list[list[str]] = []
    build = SparkSubmitHook._build_spark_submit_command

    def recording(hook: SparkSubmitHook, application: str) -> list[str]:
        cmd = build(hook, application)
        built.append(cmd)
        return cmd

    monkeypatch.setattr(SparkSubmitHook, "_build_spark_submit_command", recording)
    dags = support.load_dags(s.config, monkeypatch)
    with ProcessWatch() as watch:
        for purpose in ("provision", "stream", "offset_sync"):
            dr = dags[s.dag_id(purpose)].test()
            assert dr.state == "success", (purpose, support.task_states(dr))
        # the failover DAG's preflight, lag report (rendered into the approval's body) and report, with every
        # secret in use; a Reject at its first approval ends it there (nothing changes)
        failover = dags[s.dag_id("failover")]
        approver = support.Approver(failover.dag_id, {"approve_stop_producers": "Reject"}, timeout=300)
        with approver.running():
            fdr = failover.test(run_conf={"consumer_groups": [s.consumer_group], **FAILOVER_PARAMS})
        assert not approver.errors and not approver.watchdog_fired, approver.errors
    assert fdr.state == "success", support.task_states(fdr)
    report = support.xcom(fdr.dag_id, fdr.run_id, "report")
    assert report["stopped_at"] == "approve_stop_producers" and report["steps"]["preflight"]["ok"], report
    # the connections and ${VAR}s were used: the destination has the records and the group's offsets
    dst_topic = f"{s.topic}.mirror"
    assert support.keys(s.dst, dst_topic, 0) == support.keys(s.src, s.topic, 0)
    assert support.resume_on_destination(s, dst_topic)[1] == support.keys(s.src, s.topic, 1, start=6)

    # the Spark job got the resolved connections in a private file, not on its command line
    assert watch.conn_files and set(watch.conn_files.values()) == {0o600}
    assert all(not Path(p).exists() for p in watch.conn_files)  # removed after the job
    assert built and all(any(a.endswith("mirror_stream.py") for a in cmd) for cmd in built)
    assert any("mirror_stream.py" in c for c in watch.cmdlines)
    out, err = capfd.readouterr()  # the task logs (dag.test() prints them) and the Spark job's output
    assert "mirror_stream.py" in out + err  # the spark-submit command was logged
    assert "failover report" in out + err  # so was the failover's report
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rendered = {f"rendered {r.dag_id.rsplit('__', 1)[1]}.{r.task_id}": json.dumps(r.rendered_fields, default=str)
                    for r in session.scalars(select(RenderedTaskInstanceFields).where(
                        RenderedTaskInstanceFields.dag_id.like(f"mirrorflow__{s.name}__%")))}
        xcoms = {f"xcom {x.dag_id.rsplit('__', 1)[1]}.{x.task_id}.{x.key}": json.dumps(x.value, default=str)
                 for x in session.scalars(select(XComModel).where(XComModel.dag_id.like(f"mirrorflow__{s.name}__%")))}
    assert {"rendered provision.validate", "rendered stream.mirror_stream", "rendered offset_sync.checkpoint",
            "rendered failover.approve_stop_producers"} <= set(rendered)
    assert {"xcom provision.validate.return_value", "xcom failover.preflight.step_report",
            "xcom failover.wait_for_lag.step_report", "xcom failover.report.return_value"} <= set(xcoms)
    # task log files, should Airflow write any (dag.test() prints the task logs: they are the captured output)
    logs = [p for p in (airflow_db / "logs").rglob("*") if p.is_file()] if (airflow_db / "logs").exists() else []
    # where each planted secret shows: nowhere
    places: dict[str, str | bytes] = {
        "captured stdout": out, "captured stderr": err,
        **{f"spark-submit command {i}": " ".join(cmd) for i, cmd in enumerate(built)},
        **{f"process {c[:120]}": c for c in watch.cmdlines},
        **{f"task log {p.relative_to(airflow_db)}": p.read_bytes() for p in logs},
        **{f"metadata DB {db.name}": db.read_bytes() for db in airflow_db.glob("airflow.db*")},  # HITL details too
        **rendered, **xcoms,
    }
    assert {where: names for where, text in places.items() if (names := found(secrets, text))} == {}
    # and every connection secret is known to Airflow's log masker (ssl.key.pem only because the hook registered it):
    # a line that shows one in the future is masked
    from airflow.sdk._shared.secrets_masker import redact

    assert [n for n in ("kafka_extra_password", "kafka_extra_key_pem", "registry_conn_password")
            if secrets[n] in str(redact(f"[{secrets[n]}]"))] == []
