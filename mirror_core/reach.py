"""Can the clusters and registries a command needs be reached? Asked once, up front, with a bound.

A Kafka client that cannot reach its cluster retries forever and each operation waits out its own
timeout, so without this check a command against a dead cluster waits (and logs) per call before
failing with an error that names no cluster. :func:`require_reachable` asks every cluster and registry
the selected groups use, in parallel, for at most the connect timeout
(``MIRRORFLOW_CONNECT_TIMEOUT`` seconds, default 10), and raises one :class:`UnreachableError`
naming each one that did not answer (alias and bootstrap servers, or the registry URL without
credentials) with what the client saw.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import KafkaError, KafkaException

from mirror_core import clients
from mirror_core.config import ClusterConfig, GroupConfig, MirrorsConfig, SchemaRegistryConfig, resolve_mirrors
from mirror_core.errors import UnreachableError
from mirror_core.schemas import SCHEMA_SERDES

DEFAULT_CONNECT_TIMEOUT = 10.0
ENV = "MIRRORFLOW_CONNECT_TIMEOUT"


def connect_timeout() -> float:
    """Seconds to wait for a cluster or registry: ``MIRRORFLOW_CONNECT_TIMEOUT`` or 10."""
    raw = os.environ.get(ENV)
    try:
        value = float(raw) if raw else DEFAULT_CONNECT_TIMEOUT
    except ValueError:
        value = DEFAULT_CONNECT_TIMEOUT
    return value if value > 0 else DEFAULT_CONNECT_TIMEOUT


def kafka_problem(alias: str, cluster: ClusterConfig, timeout: float) -> str | None:
    """None when ``cluster`` answers a metadata request within ``timeout``; else one line saying why not.

    A refused login or an untrusted certificate is reported as soon as the client sees it (naming the
    principal), not after the timeout: retrying would not change the answer."""
    seen: list[KafkaError] = []

    def on_error(err: KafkaError) -> None:
        if err.code() != KafkaError._ALL_BROKERS_DOWN:
            seen.append(err)

    admin = clients.admin(cluster, error_cb=on_error)
    deadline = time.monotonic() + timeout
    last: KafkaException | None = None
    while True:
        try:
            admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            return None
        except KafkaException as exc:
            last = exc
        admin.poll(0)  # deliver the client's own errors (why it could not connect)
        for err in seen:
            line = clients.refusal(alias, cluster, err.name(), err.str())
            if line is not None:
                return line
        if time.monotonic() >= deadline:
            break
    why = seen[-1].str() if seen else last.args[0].str()
    bootstrap = cluster.kafka_properties().get("bootstrap.servers", "?")
    return f"cluster {alias!r} (bootstrap {bootstrap}) is unreachable: {why} (waited {timeout:g}s)"


def registry_problem(alias: str, registry: SchemaRegistryConfig, timeout: float) -> str | None:
    """None when the registry answers within ``timeout``; else one line saying why not."""
    from mirror_core.registry import RegistryClient, RegistryError

    with RegistryClient.from_config(registry) as client:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                client.ping(timeout=max(0.1, remaining))
                return None
            except RegistryError as exc:
                if not exc.transient:
                    return f"schema registry of cluster {alias!r} ({client.url}) refused the request: {exc}"
                if time.monotonic() + 0.5 >= deadline:
                    return (f"schema registry of cluster {alias!r} ({client.url}) is unreachable: {exc.reason} "
                            f"(waited {timeout:g}s)")
            time.sleep(0.5)


def needs_registries(group: GroupConfig) -> bool:
    """Whether the group's mirroring talks to schema registries (schema serdes with schemas enabled)."""
    return group.schemas.enabled and any(
        m.settings.serdes.key in SCHEMA_SERDES or m.settings.serdes.value in SCHEMA_SERDES for m in resolve_mirrors(group))


def require_reachable(cfg: MirrorsConfig, groups: Sequence[GroupConfig], *, registries: bool = False,
                      timeout: float | None = None) -> None:
    """Raise :class:`UnreachableError` (one line naming each) when a cluster of ``groups`` — or, with
    ``registries``, a registry those groups mirror schemas with — does not answer within ``timeout``."""
    timeout = connect_timeout() if timeout is None else timeout
    checks: list[Callable[[], str | None]] = []
    aliases: list[str] = []
    reg_aliases: list[str] = []
    for g in groups:
        for alias in (g.source, g.destination):
            if alias not in aliases:
                aliases.append(alias)
            if registries and needs_registries(g) and alias not in reg_aliases:
                reg_aliases.append(alias)
    for alias in aliases:
        checks.append(lambda a=alias: kafka_problem(a, cfg.cluster(a), timeout))  # type: ignore[misc]
    for alias in reg_aliases:
        reg = cfg.cluster(alias).schema_registry
        if reg is not None:
            checks.append(lambda a=alias, r=reg: registry_problem(a, r, timeout))  # type: ignore[misc]
    if not checks:
        return
    with ThreadPoolExecutor(max_workers=len(checks), thread_name_prefix="mirrorflow-reach") as pool:
        problems = [p for p in pool.map(lambda check: check(), checks) if p]
    if problems:
        raise UnreachableError("; ".join(problems))
