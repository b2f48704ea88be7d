"""A failover's stop of a group's stream, kept as a record on the group's destination cluster.

``finalize`` (the failover DAG's task, or ``mirrorflow failover --step finalize``) writes it; the stream DAG's
launch check, ``mirrorflow run`` and the running Spark driver read it, and a ``resume`` removes it. These may
run on different hosts (Celery or Kubernetes workers, a driver in a Spark cluster), and every one of them
reaches the destination: so the stop lives there, in a compacted topic (``stops_topic``, one partition),
keyed by the group's checkpoint location (:func:`keys`): what stops for good is the job that runs on that
checkpoint. Two deployments that mirror into one cluster under one group name keep apart that way, as long as
their checkpoints differ.

Until 7 December the stop was a file beside a local checkpoint, and for an S3 or HDFS checkpoint a local file
relative to the working directory, which only processes on one host saw. A local checkpoint's file is still
honoured (:func:`legacy_file`) and removed by a resume.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
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


def keys(group: GroupConfig) -> tuple[str, ...]:
    """The stop's keys: the group's checkpoint location (``<spark.checkpoint_dir>/<group>``) as the config gives
    it (made absolute against the config file's directory), which every host computes alike, and for a local
    checkpoint reached through a link, that location with its links resolved. A stop is written under the first;
    it is honoured (and removed) under any key that is one of these or, on this host, resolves to the second
    (another process may have reached the checkpoint through another link)."""
    from .joblock import local_path

    base = local_path(group.spark.checkpoint_dir)
    if base is None:
        return (f"{group.spark.checkpoint_dir.rstrip('/')}/{group.name}",)
    given = f"{os.path.normpath(base)}/{group.name}"
    resolved = f"{os.path.realpath(base)}/{group.name}"
    return (given,) if resolved == given else (given, resolved)


def key(group: GroupConfig) -> str:
    """The key a stop is written under (:func:`keys`)."""
    return keys(group)[0]


def legacy_file(group: GroupConfig) -> Path | None:
    """Where a stop was written before 7 December, for a local checkpoint: a file beside it. (A remote
    checkpoint's was a path relative to the working directory of whoever wrote it, which no other process can
    find: such a stop has to be written again, by finalize or ``--step finalize``.)"""
    from .joblock import local_path

    base = local_path(group.spark.checkpoint_dir)
    return None if base is None else base / f"{group.name}.stopped-by-failover"


def _legacy_reason(group: GroupConfig) -> str | None:
    path = legacy_file(group)
    if path is None:
        return None
    try:
        text = path.read_text(errors="replace").strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StopSignalError(f"cannot read {path}: {exc.strerror}") from None
    return f"{text or 'stopped'} (the file {path}, from before 7 December; `--step resume` removes it)"


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
        from confluent_kafka import KafkaError, KafkaException, TopicPartition

        try:
            with clients.acting_on(self.alias, self.cluster):
                if self._consumer is None:
                    self._consumer = clients.consumer(self.cluster, "mirrorflow-stops", **{
                        "isolation.level": "read_committed", "enable.partition.eof": True})
                c = self._consumer
                md = c.list_topics(self.topic, timeout=self.timeout).topics.get(self.topic)
                if md is None:
                    raise KafkaOperationError("the cluster did not describe the topic")
                if md.error is not None:
                    if md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        self._next, self._stops = 0, {}  # never written (or deleted): no stop
                        return {}
                    # refused (a missing ACL) or not served: not knowing is not "no stop"
                    raise KafkaOperationError(md.error.str(), md.error.name())
                low, high = c.get_watermark_offsets(TopicPartition(self.topic, 0), timeout=self.timeout)
                if high < self._next:  # the topic was deleted and made again
                    self._next, self._stops = 0, {}
                try:
                    for m in clients.scan(c, self.topic, 0, max(self._next, low), high, self.timeout):
                        k = (m.key() or b"").decode("utf-8", "replace")
                        if m.value() is None:
                            self._stops.pop(k, None)
                        else:
                            self._stops[k] = _reason(m.value())
                finally:
                    c.unassign()  # no fetching between looks
                self._next = max(self._next, high)
        except (KafkaException, KafkaOperationError) as exc:
            raise StopSignalError(f"cannot read the failover stops from {self.where()}: {clients.error_text(exc)}") from None
        return dict(self._stops)

    def put(self, key: str, reason: str | None) -> None:
        from concurrent.futures import TimeoutError as FutureTimeout

        from confluent_kafka import KafkaException
        from confluent_kafka.admin import NewTopic

        from .topics import compacted, create_topics

        # asking for the topic must not make it with the broker's defaults (auto.create.topics.enable): a
        # stop would then expire with the default retention
        no_auto = {"allow.auto.create.topics": False}
        failed: list[str] = []
        try:
            with clients.acting_on(self.alias, self.cluster):
                admin = clients.admin(self.cluster, **no_auto)
                md = admin.list_topics(self.topic, timeout=self.timeout)
                t = md.topics.get(self.topic)
                if t is None or t.error is not None:
                    create_topics(admin, [NewTopic(self.topic, 1, min(3, len(md.brokers)),
                                                   config={"cleanup.policy": "compact"})], self.timeout, exist_ok=True)
                if reason is not None:  # also after a create: someone else's may have won
                    policy = topic_policy(admin, self.topic, self.timeout)
                    if not compacted(policy):
                        raise StopSignalError(not_compacted(self.topic, self.alias, policy))
                value = None if reason is None else json.dumps({"reason": reason, "by": socket.gethostname()}).encode()
                p = clients.producer(self.cluster, **no_auto, **{
                    "enable.idempotence": True, "acks": "all", "message.timeout.ms": int(self.timeout * 1000)})
                p.produce(self.topic, key=key.encode(), value=value, partition=0,
                          on_delivery=lambda err, _msg: failed.append(err.str()) if err is not None else None)
                with clients.fatal_unmasked():
                    unacked = p.flush(self.timeout + 5)
        except (KafkaException, KafkaOperationError, FutureTimeout) as exc:
            why = f"no answer within {self.timeout:.0f} s" if isinstance(exc, FutureTimeout) else clients.error_text(exc)
            raise StopSignalError(f"cannot write to {self.where()}: {why}") from None
        if unacked or failed:
            raise StopSignalError(f"cannot write to {self.where()}: "
                                  f"{failed[0] if failed else f'not acknowledged within {self.timeout:.0f} s'}")

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def topic_policy(admin: Any, topic: str, timeout: float) -> str:
    """The topic's ``cleanup.policy``."""
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entry = admin.describe_configs([res], request_timeout=timeout)[res].result(timeout + 5).get("cleanup.policy")
    return str(entry.value) if entry is not None else "delete"


def not_compacted(topic: str, alias: str, policy: str) -> str:
    return (f"topic {topic} on {alias} has cleanup.policy={policy}: a failover's stop written there would expire "
            "with its retention, and the stopped stream start again; set it to compact")


#: a reason is shown in terminals, XComs and the Mirrors page: at most this many characters of it
REASON_MAX = 500


def _reason(value: bytes) -> str:
    try:
        text = str(json.loads(value)["reason"])
    except (ValueError, KeyError, TypeError):
        text = value.decode("utf-8", "replace")  # not ours: its text is the reason
    # printable only (no terminal escapes from someone else's record), one line, bounded
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return (text[:REASON_MAX] + "...") if len(text) > REASON_MAX else (text or "stopped")


def board(cfg: MirrorsConfig, group: GroupConfig) -> Board:
    """The board of the group's destination (where a failover moves its consumers)."""
    return KafkaBoard(cfg.cluster(group.destination), group.destination, group.stops)


def where(cfg: MirrorsConfig, group: GroupConfig) -> str:
    """The stop's place, for people: its key, topic and cluster."""
    return f"key {key(group)!r} of topic {group.stops} on {group.destination}"


def _matches(k: str, group: GroupConfig, own: tuple[str, ...]) -> bool:
    """Is ``k`` the key of the group's checkpoint (``own``: its :func:`keys`): one of them, or a local location
    that resolves to the same directory on this host (a stop written by a process that reached it through
    another link)?"""
    if k in own:
        return True
    folder, _, name = k.rpartition("/")
    return (name == group.name and folder.startswith("/") and own[0].startswith("/")
            and f"{os.path.realpath(folder)}/{name}" == own[-1])


def _in_force(stops: dict[str, str], group: GroupConfig) -> str | None:
    own = keys(group)
    for k, reason in stops.items():
        if _matches(k, group, own):
            return reason
    return None


def requested(cfg: MirrorsConfig, group: GroupConfig, on: Board | None = None,
              timeout: float | None = None) -> str | None:
    """Why the group's stream must not run (a failover's reason and time), or None. Raises
    :class:`StopSignalError` when the destination does not answer (within ``timeout`` a request, else
    :data:`TIMEOUT_S`): not knowing is not permission to run."""
    old = _legacy_reason(group)
    if old is not None:
        return old
    b = on if on is not None else board(cfg, group)
    if timeout is not None and isinstance(b, KafkaBoard):
        b.timeout = timeout
    try:
        return _in_force(b.read(), group)
    finally:
        if on is None:
            b.close()


def request(cfg: MirrorsConfig, group: GroupConfig, reason: str, at: str) -> bool:
    """Write the group's stop (``reason`` at ``at``) unless one is in force (kept as it is, with its time).
    True when this call wrote it. Raises :class:`StopSignalError`."""
    b = board(cfg, group)
    try:
        if _in_force(b.read(), group) is not None:
            return False
        b.put(key(group), f"{reason} at {at}")
        return True
    finally:
        b.close()


def clear(cfg: MirrorsConfig, group: GroupConfig) -> bool:
    """Remove the group's stop (a failback, or a failover called off), and a file from before 7 December;
    True if there was one. Raises :class:`StopSignalError`."""
    had = False
    b = board(cfg, group)
    try:
        stops, own = b.read(), keys(group)  # first: a destination that does not answer changes nothing
        path = legacy_file(group)
        if path is not None:
            try:
                path.unlink()
                had = True
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise StopSignalError(f"cannot remove {path}: {exc.strerror}") from None
        for k in stops:
            if _matches(k, group, own):
                b.put(k, None)
                had = True
    finally:
        b.close()
    return had


class Watch:
    """A running job's view of its stop. :meth:`first` reads it (and raises when the destination does not
    answer: the job does not start); then a thread looks again every ``every`` seconds, and a call returns what
    it last saw at once, so a signal's stop never waits for a slow cluster. A look that fails counts as no news,
    with one warning line per kind of failure (the job's own writes fail too then, and say so)."""

    def __init__(self, cfg: MirrorsConfig, group: GroupConfig, every: float = 1.0):
        self.cfg, self.group, self.every = cfg, group, every
        self._board = board(cfg, group)
        self._reason: str | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned = ""

    def first(self) -> str | None:
        if self._thread is not None:
            return self._reason  # the thread looks from now on (with the board's consumer)
        self._reason = requested(self.cfg, self.group, self._board)
        if self._reason is None and self._thread is None:
            if isinstance(self._board, KafkaBoard):
                self._board.timeout = WATCH_TIMEOUT_S
            self._thread = threading.Thread(target=self._run, name="mirrorflow-stop-watch", daemon=True)
            self._thread.start()
        return self._reason

    def __call__(self) -> str | None:
        return self._reason

    def _run(self) -> None:
        while not self._done.wait(self.every):
            try:
                self._reason = requested(self.cfg, self.group, self._board)
                self._warned = ""
            except Exception as exc:  # noqa: BLE001 - whatever failed, the thread must go on looking
                line = str(exc) if isinstance(exc, StopSignalError) else f"cannot read the failover stops: {exc!r}"
                if line != self._warned:
                    log.warning("%s: %s (the job goes on, and looks again)", self.group.name, line)
                    self._warned = line
            if self._reason is not None:
                return

    def close(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(1.0)
            if self._thread.is_alive():
                return  # a look still waits for the cluster: its consumer goes with the process
        self._board.close()
