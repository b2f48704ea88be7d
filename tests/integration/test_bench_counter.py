"""The benchmark's drain counter on real brokers: the 10 %/90 % marks of a drain follow the destination's
last stable offsets (cheap for the machine being measured), and whether every record is there is decided
by reading them, so commit markers are never counted as records; and the switch of the ``-noverify``
contenders."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic, ResourceType

from bench.observe import DrainCounter
from bench.workload import VERIFICATION, transaction_verification
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration


def test_offsets_mark_the_window_and_reading_counts_records_not_commit_markers(clusters, unique):
    topic = unique("bench-counter")
    create_topics(AdminClient({"bootstrap.servers": clusters.dst_bootstrap}), [NewTopic(topic, 2, 1)])
    counter = DrainCounter(clusters.dst_bootstrap, topic, expected=100)
    try:
        p = Producer({"bootstrap.servers": clusters.dst_bootstrap, "transactional.id": topic, "log_level": 0})
        p.init_transactions(30)
        # five committed transactions of 20 records over both partitions, and one aborted of 7
        for t in range(6):
            p.begin_transaction()
            for i in range(7 if t == 3 else 20):
                p.produce(topic, b"v", partition=i % 2)
            if t == 3:
                p.flush(30)  # on the broker first: an abort would otherwise drop them unsent
                p.abort_transaction(30)
            else:
                p.commit_transaction(30)
            if t == 0:
                deadline = time.monotonic() + 30
                while counter.seen.count < 20 and time.monotonic() < deadline:
                    counter.poll()
                assert counter.seen.at_10 is not None and counter.seen.at_90 is None
        deadline = time.monotonic() + 30
        while counter.offsets_count < 119 and time.monotonic() < deadline:
            counter.poll()
        # the offsets hold 100 records, 7 aborted ones and a marker per partition per transaction
        assert counter.seen.at_90 is not None and counter.offsets_count == 100 + 7 + 6 * 2
        assert counter.count_records(time.monotonic() + 30) == 100
    finally:
        counter.close()


def test_a_noverify_contender_turns_the_destination_brokers_verification_off_and_the_next_back(clusters):
    # bench/run.py's -noverify A/B: the setting is the brokers' own again once such a contender is done
    admin = AdminClient({"bootstrap.servers": clusters.dst_bootstrap})
    ids = sorted(admin.list_topics(timeout=10).brokers)

    asked = [ConfigResource(ResourceType.BROKER, str(i)) for i in ids]

    def state() -> dict[str, tuple[str, int]]:
        entries = {r.name: f.result(10)[VERIFICATION] for r, f in admin.describe_configs(asked).items()}
        return {name: (e.value, e.source) for name, e in entries.items()}

    before = state()
    assert {value for value, _ in before.values()} == {"true"}  # Kafka's default
    try:
        assert transaction_verification(clusters.dst_bootstrap, off=True) == ids
        assert set(state().values()) == {("false", ConfigSource.DYNAMIC_BROKER_CONFIG.value)}
    finally:
        transaction_verification(clusters.dst_bootstrap, off=False)
    assert state() == before
