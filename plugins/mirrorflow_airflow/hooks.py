"""Hooks: the mirrors config with its clusters' Airflow connections resolved, at task run time.

A cluster in the YAML may name an Airflow connection instead of inline properties:

* ``connection``: the Kafka provider's ``kafka`` connection type. Its extra is a librdkafka config
  (``bootstrap.servers``, ``security.protocol``, ...); a login / password on the connection become
  ``sasl.username`` / ``sasl.password`` unless the extra sets them.
* ``schema_registry_connection``: an ``http`` connection. ``host`` (with its scheme, or ``schema`` as
  the scheme) and ``port`` make the URL, extra ``path`` is appended (``/apis/ccompat/v7`` for
  Apicurio); login / password become basic auth.

Connections are looked up only inside a running task or trigger (never when a DAG file is parsed),
and every secret value found is registered with Airflow's log masker.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from airflow.sdk import BaseHook

from mirror_core.config import (
    CONNECTIONS_FILE_ENV,
    SECRET_KEY_RE,
    ClusterConfig,
    GroupConfig,
    InvalidGroup,
    MirrorsConfig,
    connections_payload,
    for_group,
    load_groups,
    require_group,
    with_connections,
)

#: a task's private directory for its connections file (:meth:`MirrorflowHook.connections_file`): this, its
#: process id, ``-``, its host's hash, ``-`` (see :func:`mirror_core.clients.private_dir`)
CONNECTIONS_DIR_PREFIX = "mirrorflow-connections-"


def _mask(value: Any) -> None:
    if value:
        from airflow.sdk.log import mask_secret

        mask_secret(str(value))


def kafka_properties(conn: Any) -> dict[str, str]:
    """librdkafka properties from a ``kafka`` connection (extra + login/password)."""
    extra = conn.extra_dejson or {}
    props = {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in extra.items()}
    if conn.login and "sasl.username" not in props:
        props["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in props:
        props["sasl.password"] = conn.password
    if "bootstrap.servers" not in props and conn.host:
        props["bootstrap.servers"] = f"{conn.host}:{conn.port}" if conn.port else conn.host
    for k, v in props.items():
        if SECRET_KEY_RE.search(k):
            _mask(v)
    return props


def registry_fields(conn: Any) -> dict[str, Any]:
    """SchemaRegistryConfig fields from an ``http`` connection."""
    extra = conn.extra_dejson or {}
    host = conn.host or ""
    url = host if "://" in host else f"{conn.schema or 'http'}://{host}"
    if conn.port:
        url = f"{url.rstrip('/')}:{conn.port}"
    if extra.get("path"):
        url = url.rstrip("/") + "/" + str(extra["path"]).lstrip("/")
    out: dict[str, Any] = {"url": url}
    for key in ("timeout", "retries", "breaker_failures", "breaker_reset"):
        if key in extra:
            out[key] = extra[key]
    if conn.login or conn.password:
        _mask(conn.password)
        out["basic.auth.user.info"] = f"{conn.login or ''}:{conn.password or ''}"
    return out


class MirrorflowHook(BaseHook):
    """The mirrors config of ``config_path`` with connection-backed clusters resolved."""

    conn_name_attr = "config_path"
    hook_name = "mirrorflow"

    def __init__(self, config_path: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.config_path = config_path
        self._cfg: MirrorsConfig | None = None
        self._invalid: list[InvalidGroup] = []

    def resolve_cluster(self, cluster: ClusterConfig) -> tuple[dict[str, str] | None, dict[str, Any] | None]:
        kafka = kafka_properties(self.get_connection(cluster.connection)) if cluster.connection else None
        registry = (registry_fields(self.get_connection(cluster.schema_registry_connection))
                    if cluster.schema_registry_connection else None)
        return kafka, registry

    def get_config(self, group: str | None = None) -> MirrorsConfig:
        """Load, validate and resolve (once per hook): the file's valid groups (a task runs one group, and another
        group's mistake does not stop it; see :func:`mirror_core.config.load_groups`). With ``group``, only what
        that group needs (:func:`mirror_core.config.for_group`): another group's connections are not looked up,
        nor handed to its job."""
        if self._cfg is None:
            cfg, self._invalid = load_groups(self.config_path)
            if group is not None:
                cfg = for_group(require_group(cfg, self._invalid, group, self.config_path), group)
            if any(c.needs_connection for c in cfg.clusters.values()):
                cfg = with_connections(cfg, self.resolve_cluster)
            self._cfg = cfg
        return self._cfg

    def get_group(self, name: str) -> tuple[MirrorsConfig, GroupConfig]:
        cfg = require_group(self.get_config(name), self._invalid, name, self.config_path)
        return cfg, cfg.group(name)

    @contextmanager
    def connections_file(self) -> Iterator[str | None]:
        """A private (0600) file holding the resolved connections, for a child process (the Spark job) that
        cannot ask Airflow; None when the config names no connection. It lives in a private directory of this
        process (:func:`mirror_core.clients.private_dir`, :data:`CONNECTIONS_DIR_PREFIX`), removed when the block
        ends; one a SIGKILLed task left behind, passwords and all, is removed when the next task on the host
        makes its own."""
        cfg = self.get_config()
        payload = connections_payload(cfg)
        if not payload:
            yield None
            return
        # here, not at the top: DAG files import this module as they are parsed, and clients loads Kafka's client
        from mirror_core.clients import private_dir
        from mirror_core.tls import write_private

        directory = private_dir(CONNECTIONS_DIR_PREFIX)
        try:
            path = write_private(directory / "connections.json", json.dumps(payload).encode())
            yield str(path)
        finally:
            shutil.rmtree(directory, ignore_errors=True)


__all__ = ["CONNECTIONS_FILE_ENV", "MirrorflowHook", "kafka_properties", "registry_fields"]
