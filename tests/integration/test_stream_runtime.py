"""Issue 11 on the driver's runtime (no Spark): what a group's mirrors are set up with, decided against the
real clusters."""

from __future__ import annotations

import pytest
import yaml
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core.config import parse_config
from mirror_core.stream import MirrorRuntime
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the result is in
    create_topics(admin, [NewTopic(topic, partitions, 1)])


def one_group(clusters, name: str, topic: str, policy: str, extra: str = "", source: str = "src",
              destination: str = "dst", mirror: str = ""):
    text = clusters.config_yaml(f"""
groups:
  - name: {name}
    source: {source}
    destination: {destination}
    replication_policy: {policy}
    serdes: {{key: bytes, value: bytes}}
    offset_syncs_topic: "{name}.syncs.internal"
    dead_letter_topic: "{name}.dlq"
    heartbeats: {{enabled: false}}
    topics_mirroring: {{replication_factor: {{type: fix, value: 1}}{extra}}}
    mirrors:
      - {{source_topic: {topic}{mirror}}}
""")
    cfg = parse_config(yaml.safe_load(text), env={})
    return cfg, cfg.groups[0]


def test_item15_identity_mirror_marks_provenance_without_the_reverse_group_in_its_file(clusters, unique):
    """A two-way identity setup run from two files (or MirrorMaker 2 the other way) must not loop: each
    file's identity group marks provenance on its own; prefixed or renamed topics are not mapped back by a
    reverse identity flow and stay unmarked (unless provenance_headers says otherwise)."""
    topic = unique("prov")
    create_topic(clusters.src_bootstrap, topic, 1)
    name = topic.replace("-", "")
    cfg, g = one_group(clusters, f"{name}f", topic, "identity")
    rt = MirrorRuntime(cfg, g)
    rt.prepare()
    assert rt.settings[topic].provenance is True
    for n, policy, mirror in (("p", "prefix", ""), ("r", "identity", f", destination_topic: {topic}.copy")):
        cfg, g = one_group(clusters, f"{name}{n}", topic, policy, mirror=mirror)
        rt = MirrorRuntime(cfg, g)
        rt.prepare()
        assert rt.settings[topic].provenance is False, policy
