"""A failover's stop of a group's stream, kept as a record on the group's destination cluster.

``finalize`` (the failover DAG's task, or ``mirrorflow failover --step finalize``) writes it; the stream DAG's
launch check, ``mirrorflow run`` and the running Spark driver read it, and a ``resume`` removes it. These may
run on different hosts (Celery or Kubernetes workers, a driver in a Spark cluster), and every one of them
reaches the destination: so the stop lives there, in a compacted topic (``stops_topic``, one partition),
keyed by the group's checkpoint location (:func:`key`): what stops for good is the job that runs on that
checkpoint. Two deployments that mirror into one cluster under one group name keep apart that way, as long as
their checkpoints differ.

Until 7 December the stop was a file beside a local checkpoint, and for an S3 or HDFS checkpoint a local file
relative to the working directory, which only processes on one host saw. Such a file is still honoured
(:func:`legacy_file`) and removed by a resume.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from pathlib import Path
from typing import Any, Protocol

from . import clients
from .config import ClusterConfig, GroupConfig, MirrorsConfig
from .errors import KafkaOperationError, MirrorError

log = logging.getLogger(__name__)

#: how long one read or write of the stops topic may wait for the destination
TIMEOUT_S = 30.0
#: the same for a running job's look once a second, after its first
WATCH_TIMEOUT_S = 5.0


class StopSignalError(MirrorError):
    """The stops topic could not be read or written: whether the group's stream must stay stopped is unknown."""


class Board(Protocol):
    """The stops of one destination cluster: {key: reason}."""

    def read(self) -> dict[str, str]:
        """Every stop in force (complete: raises :class:`StopSignalError` rather than answer from part)."""
        ...

    def put(self, key: str, reason: str | None) -> None:
        """Write a stop (``reason``) or remove it (None); acknowledged by the cluster when it returns."""
        ...

    def close(self) -> None: ...


def key(group: GroupConfig) -> str:
    """The stop's key: the group's checkpoint location (``<spark.checkpoint_dir>/<group>``); a local one with
    its links resolved, as every process on the host that reaches it through another link finds it."""
    from .joblock import local_path

    base = local_path(group.spark.checkpoint_dir)
    where = os.path.realpath(base) if base is not None else group.spark.checkpoint_dir.rstrip("/")
    return f"{where}/{group.name}"


def legacy_file(group: GroupConfig) -> Path:
    """Where a stop was written before 7 December: a file beside a local checkpoint (a remote checkpoint's was
    a local path made of its URI)."""
    from .joblock import local_path

    base = local_path(group.spark.checkpoint_dir)
    return (base if base is not None else Path(group.spark.checkpoint_dir)) / f"{group.name}.stopped-by-failover"


class KafkaBoard:
    """:class:`Board` on a compacted, one-partition topic. A board keeps its consumer: each :meth:`read` after
    the first reads only what was written since (one or two round trips when nothing was)."""

    def __init__(self, cluster: ClusterConfig, alias: str, topic: str, timeout: float = TIMEOUT_S):
        self.cluster, self.alias, self.topic, self.timeout = cluster, alias, topic, timeout
        self._consumer: Any = None
        self._next = 0
        self._stops: dict[str, str] = {}

    def where(self) -> str:
        return f"topic {self.topic} on {self.alias}"

    def read(self) -> dict[str, str]:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            if self._consumer is None:
                self._consumer = clients.consumer(self.cluster, "mirrorflow-stops", **{
                    "isolation.level": "read_committed", "enable.partition.eof": True})
            c = self._consumer
            md = c.list_topics(self.topic, timeout=self.timeout).topics.get(self.topic)
            if md is None or md.error is not None or 0 not in md.partitions:
                self._next, self._stops = 0, {}  # never written (or deleted): no stop
                return {}
            low, high = c.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=self.timeout)
            if high < self._next:  # the topic was deleted and made again
                self._next, self._stops = 0, {}
            for m in clients.scan(c, self.topic, 0, max(self._next, low), high, self.timeout):
                k = (m.key() or b"").decode("utf-8", "replace")
                if m.value() is None:
                    self._stops.pop(k, None)
                else:
                    self._stops[k] = _reason(m.value())
            self._next = max(self._next, high)
        except (KafkaException, KafkaOperationError) as exc:
            raise StopSignalError(f"cannot read the failover stops from {self.where()}: {_why(exc)}") from None
        return dict(self._stops)

    def put(self, key: str, reason: str | None) -> None:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        from .topics import create_topics

        try:
            admin = clients.admin(self.cluster)
            md = admin.list_topics(timeout=self.timeout)
            if self.topic not in md.topics:
                create_topics(admin, [NewTopic(self.topic, 1, min(3, len(md.brokers)),
                                               config={"cleanup.policy": "compact"})], self.timeout, exist_ok=True)
            value = None if reason is None else json.dumps({"reason": reason, "by": socket.gethostname()}).encode()
            failed: list[str] = []
            p = clients.producer(self.cluster, **{"enable.idempotence": True, "acks": "all"})
            p.produce(self.topic, key=key.encode(), value=value, partition=0,
                      on_delivery=lambda err, _msg: failed.append(err.str()) if err is not None else None)
            with clients.fatal_unmasked():
                unacked = p.flush(self.timeout)
        except (KafkaException, KafkaOperationError) as exc:
            raise StopSignalError(f"cannot write to {self.where()}: {_why(exc)}") from None
        if unacked or failed:
            raise StopSignalError(f"cannot write to {self.where()}: "
                                  f"{failed[0] if failed else f'not acknowledged within {self.timeout:.0f} s'}")

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def _reason(value: bytes) -> str:
    try:
        doc = json.loads(value)
        return str(doc["reason"])
    except (ValueError, KeyError, TypeError):
        return value.decode("utf-8", "replace")  # not ours: its text is the reason


def _why(exc: BaseException) -> str:
    err = exc.args[0] if exc.args else None
    return str(err.str()) if err is not None and hasattr(err, "str") else str(exc)


def board(cfg: MirrorsConfig, group: GroupConfig) -> Board:
    """The board of the group's destination (where a failover moves its consumers)."""
    return KafkaBoard(cfg.cluster(group.destination), group.destination, group.stops)


def where(cfg: MirrorsConfig, group: GroupConfig) -> str:
    """The stop's place, for people: its key, topic and cluster."""
    return f"key {key(group)!r} of topic {group.stops} on {group.destination}"


def requested(cfg: MirrorsConfig, group: GroupConfig, on: Board | None = None) -> str | None:
    """Why the group's stream must not run (a failover's reason and time), or None. Raises
    :class:`StopSignalError` when the destination does not answer: not knowing is not permission to run."""
    try:
        text = legacy_file(group).read_text().strip()
        return text or f"stop requested ({legacy_file(group)})"
    except OSError:
        pass
    b = on if on is not None else board(cfg, group)
    try:
        return b.read().get(key(group))
    finally:
        if on is None:
            b.close()


def request(cfg: MirrorsConfig, group: GroupConfig, reason: str, at: str) -> bool:
    """Write the group's stop (``reason`` at ``at``) unless one is in force (kept as it is, with its time).
    True when this call wrote it. Raises :class:`StopSignalError`."""
    b = board(cfg, group)
    try:
        if b.read().get(key(group)) is not None:
            return False
        b.put(key(group), f"{reason} at {at}")
        return True
    finally:
        b.close()


def clear(cfg: MirrorsConfig, group: GroupConfig) -> bool:
    """Remove the group's stop (a failback, or a failover called off), and a file from before 7 December;
    True if there was one. Raises :class:`StopSignalError`."""
    had = False
    try:
        legacy_file(group).unlink()
        had = True
    except FileNotFoundError:
        pass
    b = board(cfg, group)
    try:
        if b.read().get(key(group)) is not None:
            b.put(key(group), None)
            had = True
    finally:
        b.close()
    return had


class Watch:
    """The running job's view of its stop, asked once a second: one kept board. The first answer is
    :func:`requested`'s (it raises); after that an unanswered read counts as no stop, with one warning line
    per kind of failure (the job's own writes fail too then, and say so)."""

    def __init__(self, cfg: MirrorsConfig, group: GroupConfig):
        self.cfg, self.group = cfg, group
        self._board = board(cfg, group)
        self._first = True
        self._warned = ""

    def __call__(self) -> str | None:
        if self._first:
            reason = requested(self.cfg, self.group, self._board)
            self._first = False
            return reason
        if isinstance(self._board, KafkaBoard):
            self._board.timeout = WATCH_TIMEOUT_S  # a stop (a signal) waits for the read in progress
        try:
            return requested(self.cfg, self.group, self._board)
        except StopSignalError as exc:
            if str(exc) != self._warned:
                log.warning("%s: %s (the job goes on; it looks again in a second)", self.group.name, exc)
                self._warned = str(exc)
            return None

    def close(self) -> None:
        self._board.close()
