"""Consumer group helpers for tests on real clusters."""

from __future__ import annotations

import time
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

#: what a commit gets while the cluster has no coordinator for the group yet (its offsets topic is being made)
_NO_COORDINATOR_YET = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                 KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def commit_offsets(bootstrap: str, group: str, offsets: Sequence[TopicPartition], timeout: float = 60) -> None:
    """Commit ``offsets`` for ``group`` on the cluster at ``bootstrap``, once it has a coordinator for the group
    (on a fresh cluster the first group's commit waits for the offsets topic); raises what else it gets."""
    deadline = time.monotonic() + timeout
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        while True:
            try:
                c.commit(offsets=list(offsets), asynchronous=False)
                return
            except KafkaException as exc:
                if exc.args[0].code() not in _NO_COORDINATOR_YET or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        c.close()
