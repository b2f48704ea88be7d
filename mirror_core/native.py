"""The writer's inner produce loop in C (``mirror_core/_native.c``), and the proof of the offsets it does
not report.

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

``MIRRORFLOW_NATIVE=0`` turns the C loop off (the Python loop then produces every record).
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
