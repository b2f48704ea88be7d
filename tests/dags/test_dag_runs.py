"""dag.test() of the provision, stream (available_now) and offset_sync DAGs against the real clusters."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.dags import support

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def subject_versions(registry: str, subject: str) -> list[int]:
    try:
        with urllib.request.urlopen(f"{registry}/subjects/{subject}/versions", timeout=10) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise


def test_provision_stream_and_offset_sync_leave_the_destination_right(clusters: Any, unique: Any, tmp_path: Path,
                                                                       airflow_db: Path, monkeypatch: Any) -> None:
    s = support.scenario(clusters, unique, tmp_path, partitions=2, records=60)
    support.commit_source_group(s, {0: 10, 1: 20})  # a consumer group half-way through the topic
    dags = support.load_dags(s.config, monkeypatch)
    dst_topic = f"{s.topic}.mirror"

    dr = dags[s.dag_id("provision")].test()
    assert dr.state == "success", support.task_states(dr)
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": s.dst}).list_topics(timeout=10)
    assert len(md.topics[dst_topic].partitions) == 2
    assert subject_versions(s.dst_registry, f"{dst_topic}-value") == [1]
    plan = support.xcom(dr.dag_id, dr.run_id, "plan")
    assert plan["actions"]["create"] >= 1  # the mirrored topic, its offset-syncs and dead-letter topics

    dr = dags[s.dag_id("stream")].test()
    assert dr.state == "success", support.task_states(dr)
    for p in range(2):
        assert support.keys(s.dst, dst_topic, p) == support.keys(s.src, s.topic, p)

    dr = dags[s.dag_id("offset_sync")].test()
    assert dr.state == "success", support.task_states(dr)
    # the group resumes on the destination exactly where it stopped on the source
    resumed = support.resume_on_destination(s, dst_topic)
    assert resumed[0] == support.keys(s.src, s.topic, 0, start=10)
    assert resumed[1] == support.keys(s.src, s.topic, 1, start=20)
    sample = support.xcom(dr.dag_id, dr.run_id, "record_lag", "lag_sample")
    assert sample["group"] == s.name and sample["last_checkpoint_at"]
    assert sorted((p["partition"], p["lag_records"], p["source_end"]) for p in sample["partitions"]) == [
        (0, 0, 30), (1, 0, 30)]
    assert all(p["destination_topic"] == dst_topic and p["destination_end"] >= 30 for p in sample["partitions"])
    assert sample["throughput"] is None  # the group's first sample
    # the next run: a rate since this sample, whose whole copy it deletes (the totals of both runs stay)
    first = dr
    dr = dags[s.dag_id("offset_sync")].test()
    assert dr.state == "success", support.task_states(dr)
    sample = support.xcom(dr.dag_id, dr.run_id, "record_lag", "lag_sample")
    assert [p["throughput"] for p in sample["partitions"]] == [0.0, 0.0] and sample["throughput"] == 0.0
    assert support.xcom(first.dag_id, first.run_id, "record_lag", "lag_sample") is None
    for run in (first, dr):
        t = support.xcom(run.dag_id, run.run_id, "record_lag", "lag_totals")
        assert (t["group"], t["lag_records"], t["partitions"]) == (s.name, 0, 2)
    cp = support.xcom(dr.dag_id, dr.run_id, "checkpoint")
    assert [g["group"] for g in cp["consumer_groups"]] == [s.consumer_group]
