"""Provisioning's wiring (``mirror_core/provision.py``), with both clusters faked: what a group selects and plans."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from mirror_core import provision
from mirror_core.config import MirrorsConfig, parse_config
from mirror_core.topics import ClusterState, TopicInfo


def two_way(ba_mirrors: list[dict[str, Any]] | None = None, **ab: Any) -> MirrorsConfig:
    """Group ``ab`` mirrors ``payments.*`` from a to b, group ``ba`` the same from b back to a (identity names)."""
    flow: list[dict[str, Any]] = [{"topics": {"include": "payments\\..*"}}]
    return parse_config({
        "clusters": {"a": {"kafka": {"bootstrap.servers": "a:9092"}},
                     "b": {"kafka": {"bootstrap.servers": "b:9092"}}},
        "groups": [{"name": "ab", "source": "a", "destination": "b", "mirrors": flow, **ab},
                   {"name": "ba", "source": "b", "destination": "a", "mirrors": flow + (ba_mirrors or [])}],
    }, {})


class FakeAdmin:
    """The metadata of one cluster: its topics (one partition, RF 1)."""

    def __init__(self, topics: list[str]):
        self.state = ClusterState({t: TopicInfo(t, 1, 1) for t in topics}, broker_count=1)

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics={t: SimpleNamespace(error=None) for t in self.state.topics})


@pytest.fixture
def topics_on(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Each cluster's topics (by bootstrap host), as the fake admin clients of ``provision`` see them."""
    topics: dict[str, list[str]] = {}
    monkeypatch.setattr(provision.clients, "admin", lambda cluster, **kw: FakeAdmin(
        topics[cluster.kafka_properties()["bootstrap.servers"].split(":")[0]]))
    monkeypatch.setattr(provision, "read_state", lambda admin, **kw: admin.state)
    return topics


def test_a_custom_dead_letter_topic_is_not_mirrored_back_by_the_reverse_flow(topics_on):
    """ab writes its dead letters to b's ``payments.dlq``, a name ba's flow matches: ba must not copy them to a
    (in a two-way setup each side would otherwise mirror the other's dead letters)."""
    cfg = two_way(dead_letter_topic="payments.dlq")
    topics_on.update(a=["payments.dlq", "payments.eu"], b=["payments.dlq", "payments.eu"])
    ba = cfg.group("ba")
    assert [m.source_topic for m in provision.selected_mirrors(cfg, ba)] == ["payments.eu"]
    plan = provision.plan_group(cfg, ba)
    assert [a.source_topic for a in plan.topics.actions if a.source_topic] == ["payments.eu"]
    assert dict(plan.topics.skipped)["payments.dlq"] == "dead-letter topic of group 'ab', never mirrored by a flow"
    # on a, "payments.dlq" is nobody's dead-letter topic: ab's flow mirrors it as any other
    assert [m.source_topic for m in provision.selected_mirrors(cfg, cfg.group("ab"))] == ["payments.dlq", "payments.eu"]


def test_an_explicit_mirror_of_a_dead_letter_topic_is_kept(topics_on):
    """Someone who names the dead-letter topic in an explicit mirror wants it copied (to inspect it elsewhere)."""
    cfg = two_way([{"source_topic": "payments.dlq", "destination_topic": "ab-dead-letters"}],
                  dead_letter_topic="payments.dlq")
    topics_on.update(a=[], b=["payments.dlq"])
    assert [(m.source_topic, m.destination_topic) for m in provision.selected_mirrors(cfg, cfg.group("ba"))] == [
        ("payments.dlq", "ab-dead-letters")]
