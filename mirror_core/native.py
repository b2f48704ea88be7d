"""The writer's inner produce loop and the direct reader's consume loop in C (``mirror_core/_native.c``),
and the proof of the offsets the produce loop does not report.

At 100-byte records most of a record's cost on the direct read path is the Python around
``Producer.produce``: the call's keyword parsing, the slicing of the schema-id rewrite, and a delivery
report (a ``Message`` object and a Python callback) per record. :func:`produce` hands a run of a
partition's records to librdkafka from C instead, with the interpreter lock released, and asks for no
delivery report for them.

The offsets of those records still follow exactly, from the records around them. The writer uses the C
loop only for records that keep their partition number, on a transactional producer, and never for the
first or the last record of a chunk: every run of C-produced records sits between two records produced
the Python way, whose delivery reports give their offsets ``a`` and ``b``. One idempotent producer's
records to one partition are written in the order produced, at strictly increasing offsets; a run of
``n`` records between them fills ``n`` distinct offsets strictly between ``a`` and ``b``. If
``b - a == n + 1`` there is no room for anything else, so the run sits at ``a + 1 .. a + n``
(:func:`fill_runs`). Otherwise (another producer's record or a transaction marker landed in between) the
offsets are not known and the writer writes the chunk again with a report per record, as it does for
any chunk whose reports it cannot map.

A record the broker rejects fails the whole transaction (librdkafka puts a transaction whose message
failed into the abortable state), so a record without a report is never lost unseen: the transaction
aborts and the writer retries the chunk with a report per record, which names the record.

The direct reader (:mod:`mirror_core.direct`) reads through :class:`Reader`, a librdkafka consumer of the C
module's own, whose ``consume`` returns the records of each partition's run as columns (offsets, keys, values, timestamps, headers), built in C,
instead of one ``Message`` object per record that Python then takes apart again.

``MIRRORFLOW_NATIVE=0`` turns both C loops off (the Python loops then produce and read every record);
``MIRRORFLOW_NATIVE_READ=0`` only the read loop.
"""

from __future__ import annotations

import logging
import os
from typing import Any

log = logging.getLogger(__name__)

#: :func:`produce` statuses
DONE, QUEUE_FULL, NEEDS_PYTHON = 0, 1, 2

_module: Any = None
_why_not: str | None = None


def _librdkafka_path() -> str | None:
    """The file the process loaded librdkafka from (confluent-kafka's own copy, or the system's)."""
    import confluent_kafka  # noqa: F401  # loads librdkafka

    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if "librdkafka" in os.path.basename(path):
                    return path
    except OSError:
        return None
    return None


def _load() -> None:
    global _module, _why_not
    if os.environ.get("MIRRORFLOW_NATIVE", "1") == "0":
        _why_not = "turned off (MIRRORFLOW_NATIVE=0)"
        return
    try:
        from mirror_core import _native  # type: ignore[attr-defined]
    except ImportError as exc:
        _why_not = f"not built ({exc})"
        return
    path = _librdkafka_path()
    if path is None:
        _why_not = "librdkafka's file not found in /proc/self/maps"
        return
    try:
        _native.load(path)
    except ImportError as exc:
        _why_not = str(exc)
        return
    _module = _native


_load()


def available() -> bool:
    return _module is not None


def reads() -> bool:
    """The direct reader takes its records through :class:`Reader` (``MIRRORFLOW_NATIVE_READ=0``: through
    confluent-kafka's ``consume()``, the C produce loop still on; for an A/B of the read loop alone)."""
    return _module is not None and os.environ.get("MIRRORFLOW_NATIVE_READ", "1") != "0"


def why_not() -> str | None:
    """Why the C loop is not used (None: it is)."""
    return _why_not


def usable(producer: Any) -> bool:
    """``producer`` is a confluent_kafka Producer whose librdkafka handle the C loop can use."""
    if _module is None:
        return False
    try:
        return "#producer-" in _module.name(producer)
    except (TypeError, RuntimeError):
        return False


def produce(producer: Any, topic: str, partition: int, values: list[bytes | None], keys: list[bytes | None],
            timestamps: list[int], headers: list[Any] | None, start: int, stop: int,
            value_map: dict[bytes, bytes] | None, key_map: dict[bytes, bytes] | None,
            limit: int | None) -> tuple[int, int, int]:
    """Produce records [start, stop) of the columns without delivery reports; see ``_native.c``.
    Returns (index reached, status, key and value bytes produced)."""
    result: tuple[int, int, int] = _module.produce(producer, topic, partition, values, keys, timestamps, headers,
                                                   start, stop, value_map, key_map, -1 if limit is None else limit)
    return result


#: what :meth:`Reader.consume` returns for a run of one partition's records, and for an event
RUN, EVENT = 0, 1
#: librdkafka's syslog levels as ``logging`` levels
_LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR, 4: logging.WARNING,
           5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}


class Reader:
    """A librdkafka consumer of the C module's own (not a confluent_kafka ``Consumer``), for the direct
    reader: :meth:`consume` gives what ``Consumer.consume()`` would, as columns (see ``_native.c``).

    confluent-kafka registers its error and throttle callbacks on every client it makes, and librdkafka calls
    them inside whichever call serves the consumer's queue; from C, outside confluent-kafka's own calls, they
    would abort the process. This consumer has no callbacks: errors come as events, and librdkafka's log
    lines are kept by C and logged here after each call, as confluent-kafka's clients log them."""

    def __init__(self, config: dict[str, Any], logger: Any):
        props = [(k, _text(v)) for k, v in config.items() if k != "logger" and not callable(v)]
        self._c = _module.Reader(props)
        self._logger = logger

    def assign(self, parts: list[tuple[str, int, int]]) -> None:
        self._c.assign(parts)

    def unassign(self, parts: list[tuple[str, int]]) -> None:
        self._c.unassign(parts)

    def pause(self, parts: list[tuple[str, int]]) -> None:
        self._c.pause(parts)

    def resume(self, parts: list[tuple[str, int]]) -> None:
        self._c.resume(parts)

    def assignment(self) -> list[tuple[str, int]]:
        result: list[tuple[str, int]] = self._c.assignment()
        return result

    def consume(self, count: int, timeout: float) -> list[tuple[Any, ...]]:
        """Each run of one partition's records as ``(RUN, topic, partition, offsets, keys, values, timestamps,
        headers)`` (``headers`` None when no record of the run has any, else a tuple of (name, value) pairs per
        record), each error or end-of-partition event as ``(EVENT, topic, partition, offset, code, name,
        text)``, in the order librdkafka gave them."""
        try:
            result: list[tuple[Any, ...]] = self._c.consume(count, max(0, int(timeout * 1000)))
            return result
        finally:
            self._log()

    def _log(self) -> None:
        lines, dropped = self._c.logs()
        for level, facility, text in lines:
            self._logger.log(_LEVELS.get(level, logging.DEBUG), "%s [%s] %s", facility, "direct-read", text)
        if dropped:
            self._logger.log(logging.DEBUG, "%s [%s] %s", "LOG", "direct-read", f"{dropped} more lines left out")

    def close(self) -> None:
        try:
            self._c.close()
        finally:
            self._log()


def _text(value: Any) -> str:
    """A property's value as librdkafka takes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def fill_runs(sent: int, reported: list[int | None], runs: list[tuple[int, int]]) -> list[int] | None:
    """Every record's downstream offset, in produce order, from the reports of the records produced with
    one and the C-produced runs between them; None when that cannot be proven.

    ``sent`` records were produced in all; ``runs`` are (first position, length) of the C-produced runs in
    produce order; ``reported`` holds the reports of the others, in order."""
    offs: list[int | None] = [None] * sent
    in_run = [False] * sent
    for first, length in runs:
        in_run[first:first + length] = [True] * length
    reports = iter(reported)
    for pos in range(sent):
        if not in_run[pos]:
            offs[pos] = next(reports, None)
            if offs[pos] is None:
                return None  # a report missing, or one without an offset
    if next(reports, None) is not None:
        return None  # more reports than records
    for first, length in runs:
        before = offs[first - 1] if first > 0 else None
        after = offs[first + length] if first + length < sent else None
        # a run first or last, or two in a row, has no report on one side; otherwise the run fills exactly the
        # offsets between its neighbours, or something else landed among it
        if before is None or after is None or after - before != length + 1:
            return None
        offs[first:first + length] = range(before + 1, after)
    return offs  # type: ignore[return-value]  # every position filled (checked above)
