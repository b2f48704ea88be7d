"""The mirrors YAML, as frozen pydantic models.

Loading happens in three steps, each collecting every problem it finds with
its YAML path before anything starts:

1. ``${VAR}`` / ``${VAR:-default}`` interpolation over the raw YAML tree
   (``$${`` escapes a literal ``${``);
2. pydantic validation (unknown keys, types, ranges, regexes);
3. cross checks (cluster references, duplicate names, destination clashes,
   mirroring a topic onto itself, policy names).

Group-level settings are merged into each mirror (the mirror wins), giving
:class:`ResolvedMirror` values with their derived names.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from mirror_core import redaction
from mirror_core.errors import ConfigError, ConfigIssue
from mirror_core.redaction import SecretUrl

NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
ALIAS_RE = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"
TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

#: Kafka client property names whose values are secrets (kept as SecretStr).
SECRET_KEY_RE = redaction.SECRET_KEY_RE

Serde = Literal["bytes", "string", "avro", "protobuf", "json_schema"]
BUILTIN_POLICIES = ("identity", "prefix")

_DURATION_RE = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|milliseconds?|s|secs?|seconds?|m|mins?|minutes?|h|hours?)\s*$"
)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(value: Any) -> float:
    """Seconds from ``10s``, ``500ms``, ``1 second``, ``2 minutes`` or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION_RE.match(str(value))
        if not m:
            raise ValueError(f"not a duration: {value!r} (use e.g. '500ms', '10s', '1 minute')")
        unit = m.group(2)
        key = "ms" if unit.startswith("milli") or unit == "ms" else unit[0]
        seconds = float(m.group(1)) * _DURATION_UNITS[key]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {value!r}")
    return seconds


Duration = Annotated[float, Field(gt=0)]


def _check_topic(v: str | None) -> str | None:
    if v is not None and not TOPIC_RE.match(v):
        raise ValueError(f"invalid topic name {v!r} (letters, digits, '.', '_', '-'; at most 249)")
    return v


def _compile(pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regex {pattern!r}: {exc}") from None


def _check_regex(pattern: str) -> str:
    _compile(pattern)
    return pattern


#: A string that must compile as a Python regex (checked per item, so errors carry the index).
Regex = Annotated[str, AfterValidator(_check_regex)]


class _Frozen(BaseModel):
    # a pydantic error's text (a hook's resolve, a caller's model_validate) shows no input: it may be a
    # password, a registry URL with credentials or a whole client config
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, hide_input_in_errors=True)


# --------------------------------------------------------------------------- clusters


class SchemaRegistryConfig(_Frozen):
    """How to reach one schema registry (Confluent REST API; Apicurio's ccompat path works).

    ``url`` may carry credentials (``https://user:password@host/...``): it is a
    :class:`~mirror_core.redaction.SecretUrl`, shown everywhere without them.
    """

    url: SecretUrl
    basic_auth_user_info: SecretStr | None = Field(default=None, alias="basic.auth.user.info")
    #: CA bundle (PEM) that signs the registry's certificate; default: the system's trust store
    ssl_ca_location: str | None = Field(default=None, alias="ssl.ca.location")
    #: client certificate (PEM, chain allowed) and its private key, for registries that ask for one
    ssl_certificate_location: str | None = Field(default=None, alias="ssl.certificate.location")
    ssl_key_location: str | None = Field(default=None, alias="ssl.key.location")
    ssl_key_password: SecretStr | None = Field(default=None, alias="ssl.key.password")
    timeout: Duration = 10.0
    retries: int = Field(default=3, ge=0, le=20)
    breaker_failures: int = Field(default=5, ge=1)
    breaker_reset: Duration = 30.0
    #: a schema id the registry answers "not found" for is asked again this many times, with exponential
    #: back-off from ``not_found_backoff``, before its record is called unmirrorable (a lagging replica)
    not_found_retries: int = Field(default=4, ge=0, le=20)
    not_found_backoff: Duration = 0.5
    #: how long a record whose schema id is not cached yet waits for an unreachable (or failing)
    #: registry before the mirror stops with an error naming it; the record is never dead-lettered for it
    outage_deadline: Duration = 300.0

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, v: Any) -> Any:
        if isinstance(v, SecretStr):
            v = v.get_secret_value()
        if isinstance(v, str):
            if not re.match(r"^https?://[^/\s]+", v):
                # never the value itself: a URL without its scheme has no userinfo to tell apart
                host = redaction.url_host(v)
                raise ValueError("not an http(s) URL (it must start with http:// or https://)"
                                 + (f"; host {host!r}" if host else ""))
            after = v.split("//", 1)[1]
            authority = re.split(r"[/?#]", after, maxsplit=1)[0]
            rest = after[len(authority):]
            if "@" in rest or not redaction.url_host(authority):
                # a '/', '?' or '#' in the userinfo ends the host for every URL parser, and shows the rest of the
                # password as the path (or the port): never the value, only the host (the text after the last '@')
                host = redaction.url_host(v)
                raise ValueError("its user:password must be percent-encoded ('/' as %2F, '?' as %3F, '#' as %23): "
                                 "as written, the host is not where it ends"
                                 + (f"; host {host!r}" if host else ""))
            return v.rstrip("/")
        return v

    @field_validator("timeout", "breaker_reset", "not_found_backoff", "outage_deadline", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @model_validator(mode="after")
    def _client_cert(self) -> SchemaRegistryConfig:
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise ValueError("'ssl.certificate.location' and 'ssl.key.location' go together")
        return self


class ClusterConfig(_Frozen):
    """A Kafka cluster: librdkafka client properties, and optionally its registry.

    Instead of inline properties a cluster may name an Airflow connection (``connection``: the Kafka
    provider's ``kafka`` type, whose extra is a librdkafka config; ``schema_registry_connection``: an
    ``http`` connection). Those are resolved by an adapter at task run time (:meth:`resolved`), never
    while a DAG file is parsed; ``kafka`` properties given as well are laid over the connection's.
    """

    connection: str | None = Field(default=None, min_length=1)
    schema_registry_connection: str | None = Field(default=None, min_length=1)
    kafka: dict[str, str | SecretStr] | None = Field(default=None, validate_default=True)
    schema_registry: SchemaRegistryConfig | None = None
    #: Java client properties for Spark's Kafka source, over what mirrorflow derives from ``kafka``
    #: (e.g. JKS key/trust stores, which librdkafka cannot read); secrets stay SecretStr
    java_kafka: dict[str, str | SecretStr] = Field(default_factory=dict)
    _resolved: bool = PrivateAttr(default=False)

    @field_validator("kafka", "java_kafka", mode="before")
    @classmethod
    def _kafka_props(cls, v: Any) -> Any:
        if not isinstance(v, Mapping):
            return v
        out: dict[str, Any] = {}
        for key, value in v.items():
            if value is None:
                raise ValueError(f"property {key!r} has no value")
            if not isinstance(value, (str, int, float, bool)):
                raise ValueError(f"property {key!r} must be a string, number or boolean, got {type(value).__name__}")
            if isinstance(value, bool):
                value = "true" if value else "false"
            elif isinstance(value, (int, float)):
                value = str(value)
            if isinstance(value, str) and SECRET_KEY_RE.search(str(key)):
                value = SecretStr(value)
            out[str(key)] = value
        return out

    @field_validator("kafka")
    @classmethod
    def _bootstrap(cls, v: dict[str, str | SecretStr] | None, info: ValidationInfo) -> dict[str, str | SecretStr] | None:
        if info.data.get("connection"):
            return v
        if v is None:
            raise ValueError("required: the librdkafka properties, or 'connection' naming an Airflow connection")
        if not v.get("bootstrap.servers"):
            raise ValueError("'bootstrap.servers' is required")
        return v

    def java_kafka_properties(self) -> dict[str, str]:
        """The ``java_kafka`` overrides with secrets revealed; pass only to a client, never log."""
        return {
            k: (v.get_secret_value() if isinstance(v, SecretStr) else v) for k, v in self.java_kafka.items()
        }

    @model_validator(mode="after")
    def _registry_once(self) -> ClusterConfig:
        if self.schema_registry is not None and self.schema_registry_connection:
            raise ValueError("give either 'schema_registry' or 'schema_registry_connection', not both")
        return self

    @property
    def needs_connection(self) -> bool:
        """Names an Airflow connection that has not been resolved into properties yet."""
        return bool(self.connection or self.schema_registry_connection) and not self._resolved

    def resolved(self, kafka: Mapping[str, str] | None, registry: Mapping[str, Any] | None = None) -> ClusterConfig:
        """This cluster with its connection's properties filled in (``kafka``: librdkafka properties from
        the connection, under this cluster's own; ``registry``: the SchemaRegistryConfig fields)."""
        props: dict[str, Any] = dict(kafka or {})
        props.update(self.kafka_properties(_allow_unresolved=True))
        reg = self.schema_registry
        if registry is not None:
            reg = SchemaRegistryConfig.model_validate(dict(registry))
        out = ClusterConfig.model_validate({"connection": self.connection, "kafka": props})
        out = out.model_copy(update={"schema_registry_connection": self.schema_registry_connection,
                                     "schema_registry": reg, "java_kafka": self.java_kafka})
        out._resolved = True
        return out

    def kafka_properties(self, _allow_unresolved: bool = False) -> dict[str, str]:
        """The librdkafka properties with secrets revealed; pass only to a client, never log."""
        if self.needs_connection and not _allow_unresolved:
            raise ConfigError(ConfigIssue(
                "connection", f"cluster uses Airflow connection {self.connection or self.schema_registry_connection!r}, "
                "which is resolved only by Airflow tasks (or from the file MIRRORFLOW_CONNECTIONS_FILE names)"))
        return {
            k: (v.get_secret_value() if isinstance(v, SecretStr) else v) for k, v in (self.kafka or {}).items()
        }

    @property
    def bootstrap_servers(self) -> str:
        return str((self.kafka or {}).get("bootstrap.servers", ""))


# --------------------------------------------------------------------------- group settings


class CountRule(_Frozen):
    """Partition count or replication factor: a fixed value, or the source's clamped to [min, max]."""

    type: Literal["fix", "mirror_source"] = "mirror_source"
    value: int | None = Field(default=None, gt=0)
    min: int | None = Field(default=None, gt=0)
    max: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> CountRule:
        if self.type == "fix" and self.value is None:
            raise ValueError("type 'fix' needs 'value'")
        if self.type == "mirror_source" and self.value is not None:
            raise ValueError("'value' is only used with type 'fix' (use min/max to clamp)")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self

    def resolve(self, source_value: int) -> int:
        """The count for a topic whose source has ``source_value``."""
        if self.type == "fix":
            assert self.value is not None
            return self.value
        n = source_value
        if self.min is not None:
            n = max(n, self.min)
        if self.max is not None:
            n = min(n, self.max)
        return n


class TopicsMirroring(_Frozen):
    auto_create_topics: bool = True
    partition_count: CountRule = CountRule()
    replication_factor: CountRule = CountRule()
    sync_configs: bool = True
    config_exclude: tuple[Regex, ...] = ()
    sync_acls: bool = False
    #: when the source topic grows past what ``partition_count`` lets the destination have, the mirror
    #: refuses to switch its partitions from keeping their numbers to key hashing unless this is true
    allow_placement_change: bool = False


class Serdes(_Frozen):
    key: Serde = "bytes"
    value: Serde = "bytes"


class RegexFilter(_Frozen):
    include: str = ".*"
    exclude: str | None = None

    @field_validator("include", "exclude")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            _compile(v)
        return v

    def matches(self, name: str) -> bool:
        if not re.fullmatch(self.include, name):
            return False
        return not (self.exclude and re.fullmatch(self.exclude, name))


class OffsetsConfig(_Frozen):
    sync_group_offsets: bool = True
    emit_checkpoints: bool = True
    groups: RegexFilter = RegexFilter(include=".*", exclude=r"^_.*|.*\.mirrorflow\..*")
    interval: Duration = 10.0

    @field_validator("interval", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)


class HeartbeatsConfig(_Frozen):
    enabled: bool = True
    interval: Duration = 1.0
    topic: str = "heartbeats"

    @field_validator("interval", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("topic")
    @classmethod
    def _topic(cls, v: str) -> str:
        _check_topic(v)
        return v


class FailoverConfig(_Frozen):
    """The failover and failback DAGs' two approvals."""

    #: Airflow user ids who may answer them (the user name with the simple auth manager, the numeric id with
    #: FAB); empty: anyone who may act on the DAG run
    approvers: list[Annotated[str, Field(min_length=1)]] = []
    #: an approval left unanswered this long is answered Reject (the run ends where it is, and the next failover
    #: can start); null waits for good
    approval_timeout: Duration | None = 86400.0

    @field_validator("approval_timeout", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float | None:
        return None if v is None else parse_duration(v)


#: Spark Kafka source options mirrorflow sets itself, and why a user may not.
RESERVED_SOURCE_OPTIONS: dict[str, str] = {
    "subscribe": "the topics come from the group's mirrors",
    "subscribepattern": "the topics come from the group's mirrors",
    "assign": "the topics come from the group's mirrors",
    "startingoffsets": "a mirror starts from the earliest offset, then from its checkpoint",
    "startingoffsetsbytimestamp": "a mirror starts from the earliest offset, then from its checkpoint",
    "startingtimestamp": "a mirror starts from the earliest offset, then from its checkpoint",
    "startingoffsetsbytimestampstrategy": "a mirror starts from the earliest offset, then from its checkpoint",
    "endingoffsets": "a stream has no end offsets",
    "includeheaders": "headers are always mirrored",
    "failondataloss": ("the mirror reports records that expired on the source (mirrorflow_records_expired_total) "
                       "and mirrors a re-created topic from its start"),
    "minpartitions": "one Kafka partition must stay in one Spark task (order, one transactional writer)",
    "maxrecordsperpartition": "one Kafka partition must stay in one Spark task (order, one transactional writer)",
    "maxoffsetspertrigger": "use spark.max_offsets_per_trigger",
    "kafka.isolation.level": "a mirror reads read_committed: aborted records are never mirrored",
    "kafka.bootstrap.servers": "set by the source cluster's config",
    "kafka.group.id": "Spark's consumers must not join the mirror's consumer group",
    "groupidprefix": "Spark's consumers must not join the mirror's consumer group",
    "kafka.enable.auto.commit": "the mirror commits source offsets itself, after each batch",
    "kafka.auto.offset.reset": "a mirror starts from the earliest offset, then from its checkpoint",
    "kafka.key.deserializer": "records are copied as bytes",
    "kafka.value.deserializer": "records are copied as bytes",
}


def reserved_source_option(key: str) -> str | None:
    """Why ``key`` cannot be a user's Spark Kafka source option (None: it can)."""
    k = key.strip().lower()
    if k in RESERVED_SOURCE_OPTIONS:
        return RESERVED_SOURCE_OPTIONS[k]
    if k.startswith(("kafka.security.", "kafka.sasl.", "kafka.ssl.")):
        return "security settings come from the source cluster's config (secrets stay out of Spark options)"
    if not k or k == "kafka.":
        return "not an option name"
    return None


StreamMode = Literal["continuous", "available_now"]

#: ``transactions: per_writer``: the writer slots 0-15 a group's writer processes use, each with up to
#: :data:`WRITER_PRODUCERS_MAX` transactional producers (ids ``<stem>:writer-<slot>``, ``...-<slot>.1``, ...);
#: every start fences the ids its job does not use, so a writer of an earlier job with more processes or
#: producers cannot commit after the positions are read
WRITER_SLOTS = 16
WRITER_PRODUCERS_MAX = 4
WRITER_PRODUCERS_DEFAULT = 2
#: ``read_path: executors`` with ``transactions: per_writer``: the driver's writer (small batches) takes the last
#: slot, the tasks of a large batch the slots from 0 (at most this many tasks share a batch)
DRIVER_WRITER_SLOT = WRITER_SLOTS - 1


class SparkConfig(_Frozen):
    #: how Airflow runs the group's stream: one long-lived job (relaunched when it dies) or a scheduled
    #: drain (``--once``) every ``drain_every``
    mode: StreamMode = "continuous"
    drain_every: Duration = 300.0
    #: Airflow's Spark connection for spark-submit; when it does not exist, ``master`` is used
    airflow_conn_id: str = Field(default="mirrorflow_spark", min_length=1)
    #: relaunches of a dead continuous job by Airflow (exponential back-off from ``retry_delay``)
    retries: int = Field(default=10, ge=0)
    retry_delay: Duration = 10.0
    master: str = "local[2]"
    trigger: str = "1 second"
    #: where the group's Spark checkpoint (``<checkpoint_dir>/<group>``) and its lock live (and the key of a
    #: failover's stop, :mod:`mirror_core.stops`): a URI Spark's Hadoop file system reads, or a path; a relative path is relative to the config file's
    #: directory (:func:`resolve_state_dirs`)
    checkpoint_dir: str = ".state/checkpoints"
    max_offsets_per_trigger: int | None = Field(default=None, gt=0)
    #: micro-batches of at most this many records are written by the driver's long-lived writer (warm
    #: producers and positions); larger ones by one Spark task per Kafka partition. 0 = always by tasks
    driver_batch_max_records: int = Field(default=50000, ge=0)
    #: ... and at most about this many bytes (key + value, estimated from the previous batches)
    driver_batch_max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    #: who reads a micro-batch's records from the source: ``spark`` (Spark's Kafka source, then Arrow to the
    #: writer), ``direct`` (Spark only plans the batch and keeps its offset log; the driver reads each
    #: partition's range [start, end) from that log with a librdkafka consumer and writes it) or ``auto``
    #: (``direct`` on a ``local[...]`` master, where the driver's writer processes share the one host with
    #: whatever would read, or when an option below that only ``direct`` has is set; ``executors`` on a cluster
    #: master), or ``executors`` (Spark only plans the batch, as with ``direct``; a large batch's ranges are read
    #: and written by Spark tasks on the executors, each with a librdkafka consumer of its Python worker's, a
    #: small one by the driver as with ``direct``). See :attr:`reads_directly` and :attr:`reads_in_tasks`
    read_path: Literal["auto", "spark", "direct", "executors"] = "auto"
    #: with ``read_path: direct``: how many writer processes read and write the batches, each owning a share of
    #: the partitions (one Python process is bound by its GIL at about one core); 0 = one per CPU core of the
    #: driver's host, at most 4; 1 = the driver itself
    direct_processes: int = Field(default=0, ge=0, le=64)
    #: with ``read_path: direct``: a micro-batch's write runs on while Spark records the batch as done and plans
    #: the next one, which waits for it before it writes (one batch in flight at most); batches of up to 50,000
    #: records (a running mirror's), a larger one is written first (a drain gains nothing). A starting job reads
    #: from what its written log in the checkpoint says is on the destination (a write a crash cut short is
    #: read again; exactly_once writers skip what is there). Default ``false``: each batch is written before
    #: Spark goes on (opt-in: see README, The data path)
    overlap_writes: bool = False
    #: with ``read_path: direct``, in a running mirror (not ``--once``, not ``available_now``): after a small
    #: micro-batch (up to 50,000 offsets) is written, its writers go on writing what arrives on the batch's
    #: partitions, range by range from the source's last stable offsets, for up to this long before the batch
    #: returns to Spark; Spark's per-batch work (its offsets, planning, logs, the call into Python) is then paid
    #: once in this span instead of once per write. 0 = off (each batch returns after its own ranges)
    keep_writing_for: float = Field(default=0.0, ge=0)
    #: how the writers commit: ``per_partition`` (each partition's records commit in a transaction of their
    #: own, with a producer per partition; at_least_once mirrors: an idempotent producer per partition),
    #: ``per_writer`` (each writer process of the direct read path, or with ``read_path: executors`` each Spark
    #: task's share of a large batch, at most :data:`DRIVER_WRITER_SLOT` tasks, commits one transaction per
    #: micro-batch holding all its partitions, on producers taking turns, as a MirrorMaker 2 task shares one
    #: producer; its at_least_once mirrors share one idempotent producer) or ``auto`` (``per_writer`` whenever
    #: the records are read directly, see :attr:`reads_directly`, ``per_partition`` in Spark's tasks). See
    #: :attr:`writes_per_writer`
    transactions: Literal["auto", "per_partition", "per_writer"] = "auto"
    #: with ``transactions: per_writer``: the transactional producers each writer process takes turns with, a
    #: transaction each, so the next transaction need not wait while the broker writes the last one's commit
    #: markers (one per partition it held); 1 = one producer, each transaction after the last one's markers
    writer_producers: int = Field(default=WRITER_PRODUCERS_DEFAULT, ge=1, le=WRITER_PRODUCERS_MAX)
    metrics_port: int = Field(default=0, ge=0, le=65535)  # Prometheus /metrics on the driver; 0 = off
    #: where the Spark Kafka source's secrets are written (0600 files read by the Kafka clients on the
    #: driver and the executors); default: a private temporary directory on the driver's host. A relative
    #: path is relative to the config file's directory
    secrets_dir: str | None = None
    #: a stop (signal, Airflow task kill) ends the job's whole process tree within this many seconds:
    #: the running micro-batch may finish first, then whatever is left is killed
    stop_timeout: Duration = 30.0
    #: Spark options of the group's session; values whose names look secret (:data:`SECRET_KEY_RE`, e.g.
    #: ``spark.hadoop.fs.s3a.secret.key``) are kept as SecretStr and never go on a command line (see
    #: :meth:`public_conf`, :meth:`secret_conf`)
    conf: dict[str, str | SecretStr] = Field(default_factory=dict)
    #: extra options for Spark's Kafka source (``kafka.<consumer property>``, ``fetchOffset.*``, ...),
    #: over mirrorflow's defaults; not the ones the mirror's guarantees rest on (see RESERVED_SOURCE_OPTIONS)
    source_options: dict[str, str] = Field(default_factory=dict)

    @field_validator("drain_every", "retry_delay", mode="before")
    @classmethod
    def _dur(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("source_options")
    @classmethod
    def _source_options(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            why = reserved_source_option(key)
            if why:
                raise ValueError(f"{key!r} cannot be set here: {why}")
        return v

    @field_validator("conf", mode="before")
    @classmethod
    def _secret_conf(cls, v: Any) -> Any:
        """Secret-looking values become SecretStr, so the config's repr and dumps mask them."""
        if not isinstance(v, Mapping):
            return v
        return {k: SecretStr(x) if isinstance(x, str) and SECRET_KEY_RE.search(str(k)) else x for k, x in v.items()}

    @field_validator("conf")
    @classmethod
    def _conf(cls, v: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        speculation = str(v.get("spark.speculation", "false")).strip().lower()
        if speculation != "false":
            raise ValueError(f"'spark.speculation' cannot be {v['spark.speculation']!r}: a speculative copy of a "
                             "task writes the same records as the task itself, at the same time; mirrorflow turns "
                             "it off (a task that fails is run again once it has ended)")
        return v

    @field_validator("stop_timeout", mode="before")
    @classmethod
    def _stop_timeout(cls, v: Any) -> float:
        return parse_duration(v)

    @field_validator("keep_writing_for", mode="before")
    @classmethod
    def _keep_writing_for(cls, v: Any) -> float:
        return 0.0 if v in (0, "0") else parse_duration(v)  # 0 (off) or a duration

    @field_validator("trigger")
    @classmethod
    def _trigger(cls, v: str) -> str:
        if v != "available_now":
            try:
                parse_duration(v)
            except ValueError:
                raise ValueError(f"not a trigger: {v!r} (use 'available_now' or a duration like '1 second')") from None
        return v

    def public_conf(self) -> dict[str, str]:
        """The ``conf`` options that are not secrets: what may go on the command line of a JVM (``ps`` shows
        it to every user of the host), a log or a plan."""
        return {k: v for k, v in self.conf.items() if isinstance(v, str)}

    def secret_conf(self) -> dict[str, str]:
        """The ``conf`` options whose names look secret, revealed: for the driver JVM's private properties
        file only (``spark_jobs.mirror_stream.secret_conf_file``)."""
        return {k: v.get_secret_value() for k, v in self.conf.items() if isinstance(v, SecretStr)}

    @property
    def reads_directly(self) -> bool:
        """Whether the driver reads the records (the direct read path): ``read_path: direct``, or ``auto`` on
        a ``local[...]`` master or with ``transactions: per_writer``, ``keep_writing_for`` or
        ``overlap_writes`` set (options of the direct path only). The master is the one the job runs on
        (a job submitted by Airflow runs on the Spark connection's: :func:`with_master`)."""
        if self.read_path != "auto":
            return self.read_path == "direct"
        return (self.master.startswith("local") or self.transactions == "per_writer" or bool(self.keep_writing_for)
                or self.overlap_writes)

    @property
    def reads_in_tasks(self) -> bool:
        """Whether Spark's tasks read a large batch's ranges with mirrorflow's reader (``read_path: executors``,
        or ``auto`` on a cluster master unless an option of the direct path is set): the micro-batch DataFrame
        is never evaluated, each task reads and writes a share of the batch's partitions (a small batch, up to
        ``driver_batch_max_records``, is read and written by the driver). On a standalone cluster on the
        development machine it drained 3.2-12.7 times as fast as Spark's read path from the first batch to the
        last record, at a tenth to a twentieth of the CPU a record (README, The data path)."""
        if self.read_path != "auto":
            return self.read_path == "executors"
        return not self.reads_directly

    @property
    def plans_only(self) -> bool:
        """Whether Spark's driver JVM only plans micro-batches and never reads a record (``direct`` and
        ``executors``): mirrorflow's readers take each batch's ranges from Spark's offset log."""
        return self.reads_directly or self.reads_in_tasks

    @property
    def writes_per_writer(self) -> bool:
        """Whether each writer process commits one transaction per micro-batch for all its partitions
        (``transactions: per_writer``, or ``auto`` on the direct read path with at most :data:`WRITER_SLOTS`
        writer processes) rather than one per partition. ``auto`` takes it where it can: on the development
        machine it drained 100 B and 1 KB records at 0.99-1.29x a transaction per partition's rate (6
        partitions, both delivery modes and serdes), with less memory (a producer per writer process, not one
        per partition), and had half the latency at 24 partitions (README, The data path)."""
        if self.transactions != "auto":
            return self.transactions == "per_writer"
        return self.reads_directly and self.direct_processes <= WRITER_SLOTS

    @model_validator(mode="after")
    def _per_writer(self) -> SparkConfig:
        tasks_read = self.read_path in ("spark", "executors")  # Spark's tasks read: no option of the direct path
        if self.keep_writing_for:
            if tasks_read:
                raise ValueError(f"keep_writing_for needs read_path: direct or auto (with {self.read_path}, "
                                 "Spark's tasks read the records)")
            if self.overlap_writes:
                raise ValueError("keep_writing_for and overlap_writes cannot both be on (a batch that keeps "
                                 "writing is the one write in flight)")
        if self.overlap_writes and tasks_read:
            raise ValueError(f"overlap_writes needs read_path: direct or auto (with {self.read_path}, each batch "
                             "is written by the time Spark goes on)")
        if self.transactions == "per_writer":
            if self.read_path == "spark":
                raise ValueError("transactions: per_writer needs read_path: direct, executors or auto (with spark, "
                                 "Spark's tasks write a transaction per partition)")
            if self.direct_processes > WRITER_SLOTS:
                raise ValueError(f"transactions: per_writer allows at most {WRITER_SLOTS} direct_processes "
                                 f"(each has a transactional id of its own, and a start fences all {WRITER_SLOTS})")
        return self


class SchemasConfig(_Frozen):
    """Schema subject mirroring: on by default whenever a serde is schema-based."""

    enabled: bool = True
    id_preserving: bool = False


Compatibility = Literal[
    "NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE"
]


class MirrorSettings(_Frozen):
    """Settings a group gives all its mirrors and a mirror may override."""

    mirror_mode: Literal["strict", "lenient"] = "strict"
    delivery: Literal["exactly_once", "at_least_once"] = "exactly_once"
    serdes: Serdes = Serdes()
    topics_mirroring: TopicsMirroring = TopicsMirroring()
    force_subject_compatibility_level: Compatibility | None = None
    on_error: Literal["dead_letter", "fail"] = "dead_letter"
    provenance_headers: bool | None = None  # None: on for identity naming (stream.default_provenance)


class MirrorSpec(MirrorSettings):
    """One entry of ``mirrors``: an explicit pair or a regex flow, plus overrides."""

    source_topic: str | None = None
    destination_topic: str | None = None
    topics: RegexFilter | None = None
    consumer_group: str | None = None
    name: str | None = Field(default=None, pattern=NAME_RE)

    @field_validator("source_topic", "destination_topic")
    @classmethod
    def _topic(cls, v: str | None) -> str | None:
        return _check_topic(v)

    @model_validator(mode="after")
    def _one_form(self) -> MirrorSpec:
        if (self.source_topic is None) == (self.topics is None):
            raise ValueError("give exactly one of 'source_topic' (explicit pair) or 'topics' (regex flow)")
        if self.topics is not None and self.destination_topic is not None:
            raise ValueError("'destination_topic' only goes with 'source_topic'; a flow names topics by policy")
        return self


class GroupConfig(MirrorSettings):
    name: str = Field(pattern=NAME_RE)
    source: str
    destination: str
    enabled: bool = True
    replication_policy: str = "identity"
    replication_policy_separator: str = "."
    dead_letter_topic: str | None = None
    offset_syncs_topic: str | None = None
    stops_topic: str | None = None
    schemas: SchemasConfig = SchemasConfig()
    offsets: OffsetsConfig = OffsetsConfig()
    heartbeats: HeartbeatsConfig = HeartbeatsConfig()
    spark: SparkConfig = SparkConfig()
    failover: FailoverConfig = FailoverConfig()
    mirrors: list[MirrorSpec] = Field(min_length=1)

    @field_validator("replication_policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v in BUILTIN_POLICIES:
            return v
        if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)+", v):
            raise ValueError(
                f"unknown replication policy {v!r}: use 'identity', 'prefix' or a dotted path module.Class"
            )
        return v

    @field_validator("dead_letter_topic", "offset_syncs_topic", "stops_topic")
    @classmethod
    def _topic(cls, v: str | None) -> str | None:
        return _check_topic(v)

    @field_validator("stops_topic")
    @classmethod
    def _stops_topic(cls, v: str | None) -> str | None:
        if v is not None and not re.search(r"[.-]internal$", v):
            # a regex flow of the reverse group would mirror it, and a failover's stop with it
            raise ValueError(f"{v!r} must end in '.internal' or '-internal' (no mirror copies such topics)")
        return v

    @field_validator("replication_policy_separator")
    @classmethod
    def _sep(cls, v: str) -> str:
        if not v or not TOPIC_RE.match(v):
            raise ValueError(f"separator {v!r} must be non-empty and valid inside a topic name")
        return v

    @property
    def dlq_topic(self) -> str:
        return self.dead_letter_topic or f"{self.name}.mirrorflow.dlq"

    @property
    def offset_syncs(self) -> str:
        return self.offset_syncs_topic or f"mirrorflow-offset-syncs.{self.source}.internal"

    @property
    def stops(self) -> str:
        """The compacted topic on the destination where a failover stops the group's stream for good
        (:mod:`mirror_core.stops`)."""
        return self.stops_topic or "mirrorflow-stops.internal"

    @property
    def checkpoints_topic(self) -> str:
        return f"{self.source}.checkpoints.internal"


class MirrorsConfig(_Frozen):
    """The whole file."""

    clusters: dict[Annotated[str, Field(pattern=ALIAS_RE)], ClusterConfig] = Field(min_length=1)
    groups: list[GroupConfig] = Field(min_length=1)

    def cluster(self, alias: str) -> ClusterConfig:
        return self.clusters[alias]

    def group(self, name: str) -> GroupConfig:
        for g in self.groups:
            if g.name == name:
                return g
        raise ConfigError(ConfigIssue("groups", f"no group named {name!r} (have: {', '.join(g.name for g in self.groups)})"))

    def enabled_groups(self, name: str | None = None) -> list[GroupConfig]:
        if name is not None:
            return [self.group(name)]
        return [g for g in self.groups if g.enabled]

    def dead_letter_topics_on(self, alias: str) -> dict[str, str]:
        """The dead-letter topics this file's groups write on cluster ``alias`` (the same brokers under another
        alias count as the same cluster): topic -> its group. No regex flow reading that cluster mirrors them
        (:class:`mirror_core.policy.TopicFilter`): in a two-way setup the reverse flow would copy the dead
        letters back, whatever their name."""
        here = _brokers(self.clusters[alias]) if alias in self.clusters else None
        return {g.dlq_topic: g.name for g in self.groups
                if g.destination == alias
                or (here is not None and g.destination in self.clusters and _brokers(self.clusters[g.destination]) == here)}


# --------------------------------------------------------------------------- resolved mirrors


class ResolvedMirror(_Frozen):
    """A mirror with group settings merged in and its names derived."""

    group: str
    index: int
    source_cluster: str
    destination_cluster: str
    source_topic: str | None
    destination_topic: str | None
    topics: RegexFilter | None
    name: str
    consumer_group: str
    settings: MirrorSettings

    @property
    def is_flow(self) -> bool:
        return self.topics is not None

    @property
    def path(self) -> str:
        return f"mirrors[{self.index}]"


def mirror_name(group: str, source_topic: str, destination_topic: str) -> str:
    return f"{group}__{source_topic}__{destination_topic}"


def transactional_id(group: str, source_alias: str, source_topic: str, destination_topic: str) -> str:
    """The stem of a mirror's exactly-once ``transactional.id`` (the writer appends ``:<partition>``).

    The names are joined with ``:``, which no group name, cluster alias or topic name may contain, so two
    mirrors never get the same id (the dotted form before it gave ``a.b -> c`` and ``a -> b.c`` one
    producer, lock and position). It keeps the ``mirrorflow.`` prefix that prefixed ACLs match.
    """
    return "mirrorflow." + ":".join((group, source_alias, source_topic, destination_topic))


def writer_transactional_id(group: str, source_alias: str, slot: int, turn: int = 0) -> str:
    """``transactions: per_writer``: the transactional id of a group's writer process ``slot`` (its producer
    ``turn``: the first keeps the id of releases with one producer per writer). The empty source-topic field
    keeps it apart from every mirror's ids (a topic name is never empty)."""
    return transactional_id(group, source_alias, "", f"writer-{slot}" + (f".{turn}" if turn else ""))


def default_consumer_group(group: str, source_topic: str, destination_topic: str) -> str:
    return f"{group}.mirrorflow.{source_topic}__{destination_topic}"


#: Models that are one choice (``{type: fix, value: 6}``): a mirror replaces them whole, since
#: mixing a group's ``type: fix`` with a mirror's ``max`` would make a rule nobody wrote.
_WHOLE_VALUES: tuple[type[BaseModel], ...] = (CountRule, RegexFilter)


def _merge(base: BaseModel, override: BaseModel) -> dict[str, Any]:
    """Fields of ``override`` that were set explicitly win; nested models merge field by field."""
    out = dict(base)
    for field in override.model_fields_set:
        if field not in type(base).model_fields:
            continue
        bval, oval = getattr(base, field), getattr(override, field)
        if (
            isinstance(bval, BaseModel)
            and isinstance(oval, BaseModel)
            and type(bval) is type(oval)
            and not isinstance(bval, _WHOLE_VALUES)
        ):
            out[field] = type(bval)(**_merge(bval, oval))
        else:
            out[field] = oval
    return out


def flow_id(topics: RegexFilter) -> str:
    """A regex flow's stable id, from its regexes: reordering or inserting mirrors never renames a flow
    (its name and consumer group stay, and so do lag dashboards). Identical flows would clash, and the
    duplicate-name check rejects them."""
    digest = hashlib.sha1(f"{topics.include}\0{topics.exclude or ''}".encode()).hexdigest()[:8]
    return f"flow-{digest}"


def resolve_mirrors(group: GroupConfig) -> list[ResolvedMirror]:
    """Merge ``group``'s settings into each of its mirrors and derive names."""
    from mirror_core.policy import build_replication_policy

    policy = build_replication_policy(group)
    out = []
    for i, spec in enumerate(group.mirrors):
        merged = MirrorSettings(**{k: v for k, v in _merge(group, spec).items() if k in MirrorSettings.model_fields})
        if spec.source_topic is not None:
            dst = spec.destination_topic or policy.format_remote_topic(group.source, spec.source_topic)
            name = spec.name or mirror_name(group.name, spec.source_topic, dst)
            cg = spec.consumer_group or default_consumer_group(group.name, spec.source_topic, dst)
        else:
            dst = None
            fid = flow_id(spec.topics or RegexFilter())
            name = spec.name or f"{group.name}__{fid}"
            cg = spec.consumer_group or f"{group.name}.mirrorflow.{fid}"
        out.append(
            ResolvedMirror(
                group=group.name, index=i, source_cluster=group.source,
                destination_cluster=group.destination, source_topic=spec.source_topic,
                destination_topic=dst, topics=spec.topics, name=name, consumer_group=cg,
                settings=merged,
            )
        )
    return out


# --------------------------------------------------------------------------- loading


_VAR_RE = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")


def _path(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic's marker for a bad dict key; the key itself is the path
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def interpolate(tree: Any, env: Mapping[str, str], issues: list[ConfigIssue], loc: tuple[Any, ...] = ()) -> Any:
    """Replace ``${VAR}`` and ``${VAR:-default}`` in every string of ``tree``."""
    if isinstance(tree, dict):
        return {k: interpolate(v, env, issues, loc + (k,)) for k, v in tree.items()}
    if isinstance(tree, list):
        return [interpolate(v, env, issues, loc + (i,)) for i, v in enumerate(tree)]
    if not isinstance(tree, str) or "$" not in tree:
        return tree

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$${":
            return "${"
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        issues.append(ConfigIssue(_path(loc), f"environment variable ${{{name}}} is not set and has no default"))
        return ""

    return _VAR_RE.sub(sub, tree)


def _pydantic_issues(err: ValidationError) -> list[ConfigIssue]:
    issues = []
    for e in err.errors():
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        elif e["type"] == "literal_error":
            msg = f"{msg}, got {e.get('input')!r}"
        elif e["type"] == "string_pattern_mismatch" and e.get("ctx", {}).get("pattern") == ALIAS_RE:
            msg = f"invalid cluster alias {e.get('input')!r} (letters, digits, '_', '-')"
        elif e["type"] == "string_pattern_mismatch":
            msg = f"invalid name {e.get('input')!r} (letters, digits, '_', '-', '.')"
        issues.append(ConfigIssue(_path(loc), msg))
    return issues


_SCHEMA_SERDES = frozenset({"avro", "protobuf", "json_schema"})


def _brokers(cluster: ClusterConfig) -> frozenset[str]:
    """The brokers a ``bootstrap.servers`` list names (order and case ignored), to tell two
    aliases of one cluster apart from two clusters (a cluster known only by its Airflow connection
    is that connection)."""
    if not cluster.bootstrap_servers and cluster.connection:
        return frozenset({f"airflow-connection:{cluster.connection}"})
    return frozenset(h.strip().lower() for h in cluster.bootstrap_servers.split(",") if h.strip())


def _cross_check(cfg: MirrorsConfig) -> list[ConfigIssue]:
    from mirror_core.policy import PolicyError, build_replication_policy

    issues: list[ConfigIssue] = []
    seen_names: dict[str, str] = {}
    seen_groups: dict[str, int] = {}
    seen_dst: dict[tuple[frozenset[str], str], str] = {}
    seen_txids: dict[str, str] = {}
    for gi, g in enumerate(cfg.groups):
        gp = f"groups[{gi}]"
        if g.name in seen_groups:
            issues.append(ConfigIssue(f"{gp}.name", f"duplicate group name {g.name!r} (also groups[{seen_groups[g.name]}])"))
        seen_groups.setdefault(g.name, gi)
        bad_cluster = False
        for side in ("source", "destination"):
            alias = getattr(g, side)
            if alias not in cfg.clusters:
                bad_cluster = True
                issues.append(ConfigIssue(f"{gp}.{side}", f"undefined cluster {alias!r} (defined: {', '.join(sorted(cfg.clusters))})"))
        try:
            policy = build_replication_policy(g)
        except PolicyError as exc:
            issues.append(ConfigIssue(f"{gp}.replication_policy", str(exc)))
            continue
        if bad_cluster:
            continue
        dst_brokers = _brokers(cfg.clusters[g.destination])
        same_cluster = g.source == g.destination or _brokers(cfg.clusters[g.source]) == dst_brokers
        group_sources: dict[str, str] = {}  # explicit source topic -> the mirror that reads it
        for m in resolve_mirrors(g):
            mp = f"{gp}.{m.path}"
            serdes = m.settings.serdes
            for side_name in ("key", "value"):
                if getattr(serdes, side_name) in _SCHEMA_SERDES and g.schemas.enabled:
                    for alias in (g.source, g.destination):
                        if cfg.clusters[alias].schema_registry is None and not cfg.clusters[alias].schema_registry_connection:
                            issues.append(ConfigIssue(
                                f"{mp}.serdes.{side_name}",
                                f"serde {getattr(serdes, side_name)!r} needs a schema_registry on cluster {alias!r}",
                            ))
            if m.name in seen_names:
                issues.append(ConfigIssue(mp, f"duplicate mirror name {m.name!r} (also {seen_names[m.name]})"))
            seen_names.setdefault(m.name, mp)
            if m.destination_topic is None:
                probe = "mirrorflow-probe"
                if same_cluster and policy.format_remote_topic(g.source, probe) == probe:
                    issues.append(ConfigIssue(
                        f"{mp}.topics",
                        f"flow would mirror every matched topic onto itself on cluster {g.destination!r} "
                        f"(policy {g.replication_policy!r} keeps names; use 'prefix' or another cluster)",
                    ))
                continue
            if m.destination_topic and not TOPIC_RE.match(m.destination_topic):
                issues.append(ConfigIssue(mp, f"derived destination topic {m.destination_topic!r} is not a valid topic name"))
            if same_cluster and m.source_topic == m.destination_topic:
                issues.append(ConfigIssue(mp, f"mirrors topic {m.source_topic!r} onto itself on cluster {g.destination!r}"))
            if m.source_topic in group_sources:
                issues.append(ConfigIssue(mp, f"source topic {m.source_topic!r} is already mirrored by "
                                              f"{group_sources[m.source_topic]}; a group reads a topic once "
                                              f"(mirror it to a second destination from another group)"))
            group_sources.setdefault(m.source_topic or "", mp)
            txid = transactional_id(g.name, g.source, m.source_topic or "", m.destination_topic)
            if txid in seen_txids:
                issues.append(ConfigIssue(mp, f"its writers would share transactional id {txid!r} with "
                                              f"{seen_txids[txid]} (they would fence each other and share a position)"))
            seen_txids.setdefault(txid, mp)
            key = (dst_brokers, m.destination_topic)
            if key in seen_dst:
                issues.append(ConfigIssue(mp, f"destination topic {m.destination_topic!r} on {g.destination!r} is already written by {seen_dst[key]}"))
            seen_dst.setdefault(key, mp)
    return issues


def parse_config(raw: Any, env: Mapping[str, str] | None = None, source: str | None = None) -> MirrorsConfig:
    """Validate an already-parsed YAML tree; raises :class:`ConfigError` listing every issue."""
    env = os.environ if env is None else env
    if not isinstance(raw, dict):
        raise ConfigError(ConfigIssue("", "top level must be a mapping with 'clusters' and 'groups'"), source)
    issues: list[ConfigIssue] = []
    tree = interpolate(raw, env, issues)
    if issues:
        raise ConfigError(issues, source)
    try:
        cfg = MirrorsConfig.model_validate(tree)
    except ValidationError as err:
        raise ConfigError(_pydantic_issues(err), source) from None
    issues = _cross_check(cfg)
    if issues:
        raise ConfigError(issues, source)
    return cfg


def _read_yaml(p: Path) -> Any:
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(ConfigIssue("", f"cannot read: {exc.strerror}"), str(p)) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "?"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(ConfigIssue(where, f"invalid YAML: {problem}"), str(p)) from None


def _with_connections_env(cfg: MirrorsConfig, env: Mapping[str, str] | None) -> MirrorsConfig:
    conn_file = (os.environ if env is None else env).get(CONNECTIONS_FILE_ENV)
    if conn_file and any(c.needs_connection for c in cfg.clusters.values()):
        cfg = with_connections_file(cfg, conn_file)
    return cfg


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> MirrorsConfig:
    """Read, interpolate and validate the YAML file at ``path``: every group must be valid."""
    p = Path(path)
    raw = _read_yaml(p)
    return _with_connections_env(resolve_state_dirs(parse_config(raw, env, str(p)), p, str(p)), env)


@dataclass(frozen=True)
class InvalidGroup:
    """A group :func:`load_groups` left out, with the problems that are its own or its clusters'."""

    path: str  #: ``groups[i]`` in the file
    name: str | None  #: its ``name``, when that is a string
    issues: tuple[ConfigIssue, ...]

    def __str__(self) -> str:
        label = f"group {self.name!r} ({self.path})" if self.name else self.path
        return f"{label}: " + "; ".join(str(i) for i in self.issues)


_GROUP_PATH_RE = re.compile(r"^groups\[(\d+)\]")
_GROUP_REF_RE = re.compile(r"\bgroups\[(\d+)\]")
_CLUSTER_PATH_RE = re.compile(r"^clusters\.([^.\[]+)")


def load_groups(path: str | Path, env: Mapping[str, str] | None = None) -> tuple[MirrorsConfig, list[InvalidGroup]]:
    """:func:`load_config` for what runs one group at a time (the Airflow DAGs, their tasks, the Spark job they
    submit), where one group's mistake must not stop the others: a problem of a group's own keys, or of a
    cluster (say an unset ``${VAR}`` in its password), leaves out the groups it concerns, and the rest load as
    if those were not in the file. Returns the valid groups' config and the groups left out, in file order.

    Raises :class:`ConfigError` (every issue, located in the file) when the file cannot be read, when a problem
    is not confined to groups (a top-level key, an empty ``clusters``), or when no group is valid."""
    cfg, invalid = _valid_groups(path, env)
    return _with_connections_env(cfg, env), invalid


def _valid_groups(path: str | Path, env: Mapping[str, str] | None) -> tuple[MirrorsConfig, list[InvalidGroup]]:
    """:func:`load_groups` before the connections file is applied."""
    p, source = Path(path), str(path)
    env = os.environ if env is None else env
    raw = _read_yaml(p)
    raw_groups = raw.get("groups") if isinstance(raw, dict) else None
    if not isinstance(raw_groups, list) or not isinstance(raw.get("clusters"), dict):
        return load_config(p, env), []  # raises what is wrong at the top
    keep = list(range(len(raw_groups)))
    clusters = dict(raw["clusters"])
    found: dict[int, list[ConfigIssue]] = {}
    while True:
        tree = {**raw, "clusters": clusters, "groups": [raw_groups[i] for i in keep]}
        try:
            cfg = resolve_state_dirs(parse_config(tree, env, source), p, source)
        except ConfigError as exc:
            before = len(clusters)
            blamed, unconfined = _blame(exc.issues, keep, raw_groups, clusters, env, found)
            if unconfined or not (blamed or len(clusters) < before) or blamed >= set(keep):
                every = [i for k in sorted(found) for i in found[k]]
                raise ConfigError(every + [i for i in unconfined if i not in every], source) from None
            keep = [i for i in keep if i not in blamed]
            continue
        # a group that shares its name with one left out is left out too: its DAGs, checkpoint and stop would
        # otherwise pass from one to the other as the other's mistake comes and goes
        named = {_raw_name(raw_groups[i]): i for i in sorted(found, reverse=True) if _raw_name(raw_groups[i])}
        twins = [i for i in keep if _raw_name(raw_groups[i]) in named]
        if not twins:
            break
        for i in twins:
            found.setdefault(i, []).append(ConfigIssue(
                f"groups[{i}].name", f"group name {_raw_name(raw_groups[i])!r} is also groups[{named[_raw_name(raw_groups[i])]}]'s, "
                "which is left out"))
        keep = [i for i in keep if i not in twins]
        if not keep:
            raise ConfigError([i for k in sorted(found) for i in found[k]], source)
    invalid = [InvalidGroup(f"groups[{i}]", _raw_name(raw_groups[i]), tuple(found[i])) for i in sorted(found)]
    return cfg, invalid


def _raw_name(group: Any) -> str | None:
    name = group.get("name") if isinstance(group, dict) else None
    return name if isinstance(name, str) else None


def _blame(issues: list[ConfigIssue], keep: list[int], raw_groups: list[Any], clusters: dict[str, Any],
           env: Mapping[str, str], found: dict[int, list[ConfigIssue]]) -> tuple[set[int], list[ConfigIssue]]:
    """Sort one validation's ``issues`` by the groups they concern (``keep[k]`` is the file's index of the
    validated tree's ``groups[k]``, in paths and messages alike), into ``found``; a cluster's problem concerns
    every group of the file that uses it (one left out already stays out), and the cluster leaves ``clusters``.
    Returns (the kept groups blamed, the issues no group owns)."""
    blamed: set[int] = set()
    unconfined: list[ConfigIssue] = []

    def in_file(m: re.Match[str]) -> str:
        return f"groups[{keep[int(m.group(1))]}]"

    for issue in issues:
        issue = ConfigIssue(_GROUP_REF_RE.sub(in_file, issue.path), _GROUP_REF_RE.sub(in_file, issue.message))
        if m := _GROUP_PATH_RE.match(issue.path):
            users = [int(m.group(1))]
        elif m := _CLUSTER_PATH_RE.match(issue.path):
            alias = m.group(1)
            clusters.pop(alias, None)
            users = [i for i, g in enumerate(raw_groups) if isinstance(g, dict)
                     and alias in (interpolate(g.get(side), env, []) for side in ("source", "destination"))]
        else:
            users = []
        if not users:
            unconfined.append(issue)
        for i in users:
            found.setdefault(i, []).append(issue)
            if i in keep:
                blamed.add(i)
    return blamed, unconfined


def load_group(path: str | Path, name: str, env: Mapping[str, str] | None = None) -> MirrorsConfig:
    """What one group's job needs of the file at ``path`` (:func:`for_group`); else :class:`ConfigError` naming
    that group's own problems (or, from :func:`load_groups`, the file's)."""
    cfg, invalid = _valid_groups(path, env)
    return _with_connections_env(for_group(require_group(cfg, invalid, name, str(path)), name), env)


def for_group(cfg: MirrorsConfig, name: str) -> MirrorsConfig:
    """``cfg`` narrowed to the group ``name`` and the groups that mirror the other way between its two clusters
    (a failback's flow, and the reverse lookups of offset translation), with only the clusters they use: what one
    group's task or job needs. Another group's cluster is then neither looked up (its Airflow connection may be
    missing) nor handed on (its secrets)."""
    g = cfg.group(name)
    groups = [x for x in cfg.groups if x.name == name or (x.source == g.destination and x.destination == g.source)]
    aliases = {a for x in groups for a in (x.source, x.destination)}
    return cfg.model_copy(update={"groups": groups,
                                  "clusters": {a: c for a, c in cfg.clusters.items() if a in aliases}})


def require_group(cfg: MirrorsConfig, invalid: list[InvalidGroup], name: str, source: str | None) -> MirrorsConfig:
    """``cfg`` when it holds the group ``name``, else the :class:`ConfigError` that says why it does not."""
    if any(g.name == name for g in cfg.groups):
        return cfg
    for bad in invalid:
        if bad.name == name:
            raise ConfigError(list(bad.issues), source)
    cfg.group(name)  # no group of that name: says which there are
    return cfg


def location_scheme(location: str) -> str | None:
    """The URI scheme of a storage location (``s3a``, ``hdfs``, ``file``, lower case), or None for a plain path
    (a Windows drive letter is a path)."""
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", location)
    return None if m is None or len(m.group(1)) == 1 else m.group(1).lower()


def resolve_state_dirs(cfg: MirrorsConfig, path: str | Path, source: str | None = None,
                       cwd: Path | None = None) -> MirrorsConfig:
    """``cfg`` (read from the file at ``path``) with each group's relative ``spark.checkpoint_dir`` and
    ``spark.secrets_dir`` made absolute against the file's directory, so that every process that reads the
    file (the CLI from any directory, Airflow's tasks and DAG processor, the Spark job) finds the same checkpoint,
    lock and stop. Raises :class:`ConfigError` for a group whose checkpoint is only found against the
    working directory (``cwd``; where relative paths pointed before 7 December): started there, the job would
    begin a new checkpoint and read its sources again from the earliest offsets."""
    base = Path(os.path.abspath(Path(path).parent))  # symlinks kept: see mirrorflow_airflow.dagfile.config_path
    if cwd is None:
        try:
            cwd = Path.cwd()
        except FileNotFoundError:  # a working directory removed under the process: nothing to compare with
            cwd = base
    cwd = Path(os.path.abspath(cwd))
    groups, issues = [], []
    for i, g in enumerate(cfg.groups):
        update: dict[str, str] = {}
        for field in ("checkpoint_dir", "secrets_dir"):
            value = getattr(g.spark, field)
            if value is None or location_scheme(value) is not None or Path(value).is_absolute():
                continue
            update[field] = os.path.normpath(base / value)
            old = Path(os.path.normpath(cwd / value))
            if field == "checkpoint_dir" and old != Path(update[field]) and (old / g.name / "offsets").is_dir() \
                    and not (Path(update[field]) / g.name).exists():
                issues.append(ConfigIssue(
                    f"groups[{i}].spark.checkpoint_dir",
                    f"{value!r} is relative to this file's directory ({base}), and a checkpoint of a group named "
                    f"{g.name!r} is at {old / g.name}, relative to the working directory as before 7 December. If "
                    f"it is this group's, move it to {Path(update[field]) / g.name} (and "
                    f"{g.name}.stopped-by-failover beside it, if there is one), else the job would start a new "
                    "checkpoint and read the sources again from the earliest offsets; if it is not, run from "
                    "another directory or give the full path"))
        groups.append(g.model_copy(update={"spark": g.spark.model_copy(update=update)}) if update else g)
    if issues:
        raise ConfigError(issues, source)
    return cfg.model_copy(update={"groups": groups})


#: environment variable naming a JSON file of resolved Airflow connections (written 0600 by the Airflow
#: adapter for the Spark job, so that secrets never reach a command line)
CONNECTIONS_FILE_ENV = "MIRRORFLOW_CONNECTIONS_FILE"


def with_connections(cfg: MirrorsConfig, resolve: Any) -> MirrorsConfig:
    """``cfg`` with every cluster that names an Airflow connection resolved. ``resolve(cluster)`` returns
    ``(kafka properties or None, schema registry fields or None)`` for a :class:`ClusterConfig`."""
    clusters = {}
    for alias, c in cfg.clusters.items():
        if c.needs_connection:
            kafka, registry = resolve(c)
            c = c.resolved(kafka, registry)
        clusters[alias] = c
    return cfg.model_copy(update={"clusters": clusters})


#: environment variable naming the Spark master a job was submitted to (set by the Airflow adapter from the
#: group's Spark connection): the job runs there, whatever the group's ``spark.master`` says
SUBMITTED_MASTER_ENV = "MIRRORFLOW_SPARK_MASTER"


def with_master(group: GroupConfig, master: str | None) -> GroupConfig:
    """``group`` running on ``master`` (when given): its ``spark.master``, and so what depends on it (the
    read path of ``read_path: auto``, a local master's batch cap), is the one the job was submitted to."""
    if not master or master == group.spark.master:
        return group
    return group.model_copy(update={"spark": group.spark.model_copy(update={"master": master})})


def connections_payload(cfg: MirrorsConfig) -> dict[str, Any]:
    """The resolved connection properties of ``cfg``'s clusters, by alias (secrets revealed: write it
    only to a private file)."""
    out: dict[str, Any] = {}
    for alias, c in cfg.clusters.items():
        if not (c.connection or c.schema_registry_connection):
            continue
        reg = c.schema_registry
        out[alias] = {
            "kafka": c.kafka_properties() if c.connection else None,
            "schema_registry": None if reg is None or not c.schema_registry_connection else {
                "url": reg.url.get_secret_value(), "timeout": reg.timeout, "retries": reg.retries,
                "basic.auth.user.info": reg.basic_auth_user_info.get_secret_value() if reg.basic_auth_user_info else None,
            },
        }
    return out


def with_connections_file(cfg: MirrorsConfig, path: str) -> MirrorsConfig:
    """Resolve ``cfg``'s connection clusters from a file :func:`connections_payload` wrote."""
    import json

    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(ConfigIssue("", f"cannot read resolved connections: {exc}"), path) from None
    aliases = {id(c): a for a, c in cfg.clusters.items()}

    def resolve(c: ClusterConfig) -> tuple[Any, Any]:
        entry = data.get(aliases[id(c)]) or {}
        reg = entry.get("schema_registry")
        if reg is not None and reg.get("basic.auth.user.info") is None:
            reg = {k: v for k, v in reg.items() if k != "basic.auth.user.info"}
        return entry.get("kafka"), reg

    return with_connections(cfg, resolve)

