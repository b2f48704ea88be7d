"""MirrorMaker 2's own Java classes read what mirrorflow writes (and write what it reads).

A small Java probe (``java/Mm2Probe.java``, compiled here against the cached Kafka jars) calls MM2's
``Checkpoint`` / ``Heartbeat`` / ``OffsetSync`` (de)serializers and
``RemoteClusterUtils.translateOffsets``. What MM2's client does (checked in connect-mirror-client
4.1.1's ``MirrorClient.remoteConsumerOffsets``): it reads partition 0 of
``replicationPolicy.checkpointsTopic(alias)`` (``<alias>.checkpoints.internal`` for the default policy)
from the beginning, keeps the last checkpoint per partition of the asked group, skips records it cannot
decode, and does not filter topic names: the checkpoint's topic is handed back as is, so, as MM2 does,
we write the destination (remote) topic name, here ``<alias>.<topic>`` as DefaultReplicationPolicy
names it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from mirror_core import artifacts
from mirror_core.offsets import (
    Checkpoint,
    Heartbeat,
    OffsetFormatError,
    OffsetSync,
    OffsetSyncStore,
    checkpoint_for,
    syncs_for_batch,
)
from mirror_core.topics import create_topics

pytestmark = pytest.mark.integration

PROBE_SRC = Path(__file__).resolve().parent / "java" / "Mm2Probe.java"
PROBE_CLASS = "org.apache.kafka.connect.mirror.Mm2Probe"


@dataclass(frozen=True)
class Probe:
    classpath: str

    def run(self, *commands: tuple[object, ...], timeout: float = 120) -> list[list[list[str]]]:
        """Run commands in one JVM; per command, its answer lines split on tabs."""
        stdin = "".join("\t".join(str(f) for f in cmd) + "\n" for cmd in commands)
        proc = subprocess.run(["java", "-cp", self.classpath, PROBE_CLASS], input=stdin, capture_output=True,
                              text=True, encoding="utf-8", timeout=timeout)
        assert proc.returncode == 0, proc.stderr[-3000:]
        answers: list[list[list[str]]] = [[]]
        for line in proc.stdout.splitlines():
            if not line.startswith(">>"):
                continue  # logging
            if line == ">>END":
                answers.append([])
            else:
                answers[-1].append(line[2:].split("\t"))
        assert len(answers) == len(commands) + 1, proc.stdout[-3000:]
        return answers[:-1]


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Probe:
    artifacts.require_tool("javac", "compile the MM2 interop probe")
    lib = artifacts.fetch_kafka(artifacts.cache_dir())
    out = tmp_path_factory.mktemp("mm2probe")
    cp = f"{lib}/*"
    subprocess.run(["javac", "-d", str(out), "-cp", cp, str(PROBE_SRC)], check=True, capture_output=True, timeout=120)
    return Probe(f"{out}:{cp}")


# --------------------------------------------------------------------------- byte formats, no broker

CHECKPOINTS = [Checkpoint("g1", "src.orders", 7, 42, 40, "meta"),
               Checkpoint("grüppe ✓", "ß.topic", 0, 2**62, 0, ""),
               Checkpoint("g", "t" * 249, 2**31 - 1, 0, 2**63 - 1, "m" * 500)]
HEARTBEATS = [Heartbeat("us", "eu", 1_700_000_000_000), Heartbeat("é", "", 0)]
SYNCS = [OffsetSync("orders", 3, 1000, 2000), OffsetSync("ö", 0, 2**63 - 1, 0)]


def test_mm2_decodes_our_records(probe: Probe) -> None:
    answers = probe.run(
        *[("decode-checkpoint", c.key_bytes().hex(), c.value_bytes().hex()) for c in CHECKPOINTS],
        *[("decode-heartbeat", h.key_bytes().hex(), h.value_bytes().hex()) for h in HEARTBEATS],
        *[("decode-offsetsync", s.key_bytes().hex(), s.value_bytes().hex()) for s in SYNCS],
    )
    want = ([[c.group, c.topic, str(c.partition), str(c.upstream_offset), str(c.downstream_offset), c.metadata]]
            for c in CHECKPOINTS)
    want_h = ([[h.source_cluster_alias, h.target_cluster_alias, str(h.timestamp_ms)]] for h in HEARTBEATS)
    want_s = ([[s.topic, str(s.partition), str(s.upstream_offset), str(s.downstream_offset)]] for s in SYNCS)
    assert answers == [*want, *want_h, *want_s]


def test_mm2_encodes_the_same_bytes_we_do(probe: Probe) -> None:
    answers = probe.run(
        *[("encode-checkpoint", c.group, c.topic, c.partition, c.upstream_offset, c.downstream_offset, c.metadata)
          for c in CHECKPOINTS],
        *[("encode-heartbeat", h.source_cluster_alias, h.target_cluster_alias, h.timestamp_ms) for h in HEARTBEATS],
        *[("encode-offsetsync", s.topic, s.partition, s.upstream_offset, s.downstream_offset) for s in SYNCS],
    )
    ours = [*CHECKPOINTS, *HEARTBEATS, *SYNCS]
    assert answers == [[[r.key_bytes().hex(), r.value_bytes().hex()]] for r in ours]
    for (key, value), rec in zip((a[0] for a in answers), ours, strict=True):
        assert type(rec).from_record(bytes.fromhex(key), bytes.fromhex(value)) == rec


def test_truncated_bytes_are_rejected_by_both(probe: Probe) -> None:
    cp = CHECKPOINTS[0]
    key, value = cp.key_bytes(), cp.value_bytes()[:-3]
    (answer,) = probe.run(("decode-checkpoint", key.hex(), value.hex()))
    assert answer[0][0] == "ERROR"
    with pytest.raises(OffsetFormatError):
        Checkpoint.from_record(key, value)


# --------------------------------------------------------------------------- RemoteClusterUtils, real broker

#: upstream offsets of the records a read_committed reader sees, per source partition, in batches;
#: gaps stand for compaction, aborted transactions and transaction markers on the source
UPSTREAM = {
    0: [list(range(0, 10)), list(range(15, 25)), list(range(30, 40))],
    1: [list(range(100, 120)), list(range(120, 130))],
}
UPSTREAM_END = {0: 41, 1: 130}  # next offset to read after the last batch (p0 ends with a marker)


def _mirror_downstream(bootstrap: str, topic: str, txn_id: str) -> OffsetSyncStore:
    """Write UPSTREAM to ``topic`` one destination transaction per batch; the syncs, as the writer emits."""
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id})
    p.init_transactions(30)
    store = OffsetSyncStore()
    for partition, batches in UPSTREAM.items():
        last_d: int | None = None
        for i, batch in enumerate(batches):
            offsets: dict[int, int] = {}

            def delivered(err: KafkaError | None, msg, _offsets: dict[int, int] = offsets) -> None:
                assert err is None, err
                _offsets[int(msg.value())] = msg.offset()

            p.begin_transaction()
            for u in batch:
                p.produce(topic, value=str(u).encode(), partition=partition, on_delivery=delivered)
            assert p.flush(30) == 0
            p.commit_transaction(30)
            pairs = [(u, offsets[u]) for u in batch]
            if last_d is not None:
                assert pairs[0][1] == last_d + 2  # the previous transaction's commit marker sits between
            last_d = pairs[-1][1]
            end = batches[i + 1][0] if i + 1 < len(batches) else UPSTREAM_END[partition]
            store.add_all(syncs_for_batch("orders", partition, pairs, end))
    return store


def _read_values(bootstrap: str, group: str, topic: str, partition: int, start: int, count: int) -> list[int]:
    """Read from ``start`` to the end as a read_committed consumer would (assigned; nothing committed)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, partition, start)])
    got: list[int] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            msg = c.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    break
                raise AssertionError(msg.error())
            got.append(int(msg.value()))
        else:
            raise AssertionError(f"no end of {topic}[{partition}] within 30 s (read {got})")
    finally:
        c.close()
    assert len(got) == count, got
    return got


def test_remote_cluster_utils_translates_our_checkpoints(clusters, unique: Callable[[str], str], probe: Probe) -> None:
    bootstrap = clusters.dst_bootstrap
    alias = unique("srcalias")  # no dots: DefaultReplicationPolicy splits names on "."
    remote_topic = f"{alias}.orders"
    checkpoints_topic = f"{alias}.checkpoints.internal"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    create_topics(admin, [
        NewTopic(remote_topic, 2, 1),
        NewTopic(checkpoints_topic, 1, 1, config={"cleanup.policy": "compact"}),
    ])
    store = _mirror_downstream(bootstrap, remote_topic, unique("txn"))

    group_a, group_b, other = unique("group-a"), unique("group-b"), unique("other")
    # upstream committed offsets per group and partition (12: in a gap; 117: inside a run; 41: caught up)
    committed = {group_a: {0: 12, 1: 117}, group_b: {0: 41}, other: {0: 3}}
    records: list[Checkpoint] = []
    expected: dict[str, dict[int, int]] = {}
    for group, parts in committed.items():
        for partition, upstream in parts.items():
            # an older checkpoint first: MM2's client keeps the last one per partition
            previous = checkpoint_for(group, remote_topic, partition, UPSTREAM[partition][0][0],
                                      store.translate("orders", partition, UPSTREAM[partition][0][0]), None)
            assert previous is not None
            t = store.translate("orders", partition, upstream)
            assert t.exact and t.downstream_offset is not None, t
            cp = checkpoint_for(group, remote_topic, partition, upstream, t, previous,
                                metadata="mf" if group == group_b else "")
            assert cp is not None
            records += [previous, cp]
            expected.setdefault(group, {})[partition] = t.downstream_offset

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for cp in records:
        p.produce(checkpoints_topic, key=cp.key_bytes(), value=cp.value_bytes(), partition=0)
    assert p.flush(30) == 0

    answers = probe.run(*[("translate", bootstrap, alias, g, 30_000) for g in (group_a, group_b, unique("nobody"))])
    assert answers[0] == [[remote_topic, "0", str(expected[group_a][0]), ""],
                          [remote_topic, "1", str(expected[group_a][1]), ""]]
    assert answers[1] == [[remote_topic, "0", str(expected[group_b][0]), "mf"]]
    assert answers[2] == []

    # a consumer placed where MM2's client says reads exactly the records at or after its upstream position
    for group, parts in committed.items():
        for partition, upstream in parts.items():
            want = [u for batch in UPSTREAM[partition] for u in batch if u >= upstream]
            got = _read_values(bootstrap, unique("reader"), remote_topic, partition, expected[group][partition],
                               len(want))
            assert got == want, (group, partition)
