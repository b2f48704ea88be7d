"""Logging set-up shared by the CLI and the Spark job, and librdkafka's log routed into ``logging``.

By default a person sees mirrorflow's own INFO lines and the warnings of everything else: HTTP
clients (httpx logs every request URL at INFO), py4j, urllib3 and librdkafka stay at WARNING even
with ``--verbose``, which only turns mirrorflow's own loggers to DEBUG
(``MIRRORFLOW_LIBRARY_LOG_LEVEL=DEBUG`` opens the libraries up too). Every line goes through
:class:`~mirror_core.redaction.RedactingFormatter`, so URL credentials never reach the output.

librdkafka's connection failures are logged at DEBUG: a client that cannot reach its cluster keeps
retrying (one line per attempt and client), and the operation that needed the cluster reports it
once, naming the cluster (see :func:`mirror_core.clients.check_reachable`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from mirror_core.redaction import RedactingFormatter

#: chatty libraries kept at WARNING by default
QUIET_LIBRARIES = ("httpx", "httpcore", "py4j", "urllib3", "hpack", "librdkafka", "kazoo", "asyncio")
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
#: librdkafka log facilities that report a failed connection (retried by the client itself)
_CONNECTION_FACILITIES = frozenset({"FAIL", "ERROR", "BROKERFAIL", "CONNECT"})


def quiet_library_warnings() -> None:
    """Leave out the warnings libraries print that nobody running mirrorflow can act on: the two deprecation
    notices announcing a move from httpx to httpx2, authlib's (reached from confluent-kafka's schema registry
    client and from Airflow) and starlette's test client's (from Airflow's ``dag.test()``); and pydantic's about
    the aliased parameters of Airflow's own execution API routes (``Path(alias="key")`` of its XCom route, a
    ``task_instance_id``; met when ``dag.test()`` tasks call it, as the failover's approvals do). authlib puts an "always" filter for its own warnings first when it
    is imported, so it is imported before this filter goes in front of it."""
    import warnings

    try:
        import authlib.deprecate  # noqa: F401
    except ImportError:
        pass
    warnings.filterwarnings("ignore", message=r"(The httpx module is deprecated|Using `httpx` with `starlette)")
    warnings.filterwarnings("ignore", message=r"The 'alias' attribute with value '\w+' was provided to the `Field\(\)`")


def setup_logging(verbose: bool = False, stream: Any = None, fmt: str = FORMAT) -> None:
    """Root logging for a mirrorflow process: one handler on ``stream`` (stderr), redacting formatter,
    mirrorflow at INFO (DEBUG when ``verbose``), chatty libraries at WARNING. Idempotent."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_mirrorflow", False)]:
        root.removeHandler(old)  # an earlier set-up in this process (its stream may be gone)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler._mirrorflow = True  # type: ignore[attr-defined]
    handler.setFormatter(RedactingFormatter(fmt))
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in ("mirror_core", "mirrorflow", "spark_jobs", "mirrorflow_airflow"):
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
    library_level = os.environ.get("MIRRORFLOW_LIBRARY_LOG_LEVEL", "WARNING").upper()
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(library_level)


class LibrdkafkaLog:
    """The ``logger`` object given to confluent-kafka clients: librdkafka's lines go to the
    ``librdkafka`` logger; connection failures at DEBUG (see the module notes), and lines with one of
    ``expected`` in them too (what the client's owner handles and reports in its own words).

    Picklable (it holds no state but ``expected``), so it may travel in a client config.
    """

    def __init__(self, expected: tuple[str, ...] = ()):
        self.expected = expected

    def log(self, level: int, fmt: str, *args: Any) -> None:
        logger = logging.getLogger("librdkafka")
        facility = str(args[0]) if args else ""
        if facility in _CONNECTION_FACILITIES or (self.expected and any(e in str(args[-1]) for e in self.expected)):
            level = logging.DEBUG
        if logger.isEnabledFor(level):
            logger.log(level, fmt, *args)

    def __reduce__(self) -> tuple[type[LibrdkafkaLog], tuple[tuple[str, ...]]]:
        return (LibrdkafkaLog, (self.expected,))


LIBRDKAFKA_LOG = LibrdkafkaLog()
