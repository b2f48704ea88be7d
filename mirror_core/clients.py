"""One place that turns a cluster definition into client configurations.

confluent-kafka (librdkafka) property names are the YAML's native dialect; the
Spark Kafka source runs the Java client, so :func:`java_kafka_options` maps the
common security settings across. Values returned here may contain secrets:
hand them to a client, never to a log.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from mirror_core.config import SECRET_KEY_RE, ClusterConfig
from mirror_core.errors import AccessDeniedError, KafkaOperationError
from mirror_core.logs import LIBRDKAFKA_LOG
from mirror_core.redaction import ClientConfig
from mirror_core.tls import write_private

#: librdkafka logs through ``logging`` (``librdkafka`` logger; connection failures at DEBUG)
_QUIET: dict[str, Any] = {"log_level": 3, "logger": LIBRDKAFKA_LOG}
#: every consumer's: assigned or subscribed, it commits only when asked to
_CONSUMER: dict[str, Any] = {"enable.auto.commit": False, "auto.offset.reset": "earliest"}


def principal(cluster: ClusterConfig) -> str:
    """Who the cluster sees connecting, in words (never a secret): the SASL user, the OAUTHBEARER client,
    the TLS client certificate, or nobody."""
    props = cluster.kafka_properties()
    proto = props.get("security.protocol", "PLAINTEXT").upper()
    mech = props.get("sasl.mechanism", "GSSAPI").upper()
    if proto.startswith("SASL"):
        if mech == "OAUTHBEARER":
            return f"OAUTHBEARER client {props.get('sasl.oauthbearer.client.id', '(token)')!r}"
        if mech == "GSSAPI":
            return f"Kerberos principal {props.get('sasl.kerberos.principal', '(default)')!r}"
        return f"user {props.get('sasl.username', '?')!r} ({mech})"
    if proto == "SSL" and (props.get("ssl.certificate.location") or props.get("ssl.keystore.location")):
        return f"the certificate in {props.get('ssl.certificate.location') or props.get('ssl.keystore.location')}"
    return "an anonymous client"


def refusal(alias: str, cluster: ClusterConfig, code: str | None, detail: str) -> str | None:
    """One line for an authentication, TLS or authorization failure on ``alias`` (None: not one of those)."""
    where = f"cluster {alias!r} (bootstrap {cluster.bootstrap_servers})"
    who = principal(cluster)
    text = detail.lower()
    if code == "_AUTHENTICATION" or "authentication failed" in text or "sasl authentication error" in text:
        return f"{where} refused {who}: authentication failed (wrong password, unknown user or mechanism)"
    if code == "_SSL" or "certificate verify failed" in text or "ssl handshake failed" in text:
        ca = cluster.kafka_properties().get("ssl.ca.location")
        trust = f"the CA in ssl.ca.location {ca!r}" if ca else "the system's CA certificates (no ssl.ca.location)"
        why = "the broker's certificate is not trusted by " + trust if "verify failed" in text else "TLS handshake failed"
        return f"{where} refused the TLS connection of {who}: {why}"
    if code and code.endswith("AUTHORIZATION_FAILED"):
        return (f"{where} denied {who}: {detail} - a missing ACL (`mirrorflow acls CONFIG` lists the ones the "
                "mirror needs)")
    return None


@contextmanager
def acting_on(alias: str, cluster: ClusterConfig) -> Iterator[None]:
    """Re-raise an authorization / authentication / TLS failure inside as one :class:`AccessDeniedError`
    line naming the cluster and its principal; other errors pass unchanged."""
    from confluent_kafka import KafkaException

    try:
        yield
    except AccessDeniedError:
        raise
    except KafkaOperationError as exc:
        line = refusal(alias, cluster, exc.code, str(exc))
        if line is None:
            raise
        raise _denied(line, exc.code) from None
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        code = err.name() if err is not None and hasattr(err, "name") else None
        detail = err.str() if err is not None and hasattr(err, "str") else str(exc)
        line = refusal(alias, cluster, code, detail)
        if line is None:
            raise
        raise _denied(line, code) from None


def _denied(line: str, code: str | None) -> AccessDeniedError:
    """The error for ``line`` (which already names the code), keeping the code for callers."""
    exc = AccessDeniedError(line)
    exc.code = code
    return exc


def check_transactional_access(alias: str, cluster: ClusterConfig, transactional_id: str,
                               timeout: float = 30.0) -> None:
    """Raise :class:`AccessDeniedError` (one line) when ``cluster`` refuses ``transactional_id`` to this
    principal. Writers find it out inside Spark tasks otherwise, where it surfaces as a stack trace."""
    from confluent_kafka import KafkaException

    p = producer(cluster, **{"transactional.id": transactional_id, "transaction.timeout.ms": 60000})
    try:
        with acting_on(alias, cluster):
            p.init_transactions(timeout)
    except AccessDeniedError as exc:
        raise _denied(f"{exc} (transactional id {transactional_id!r})", exc.code) from None
    except KafkaException:
        pass  # not an access problem (e.g. a slow coordinator): the writers will say more
    finally:
        del p


@contextmanager
def fatal_unmasked() -> Iterator[None]:
    """Around a producer call that serves delivery reports (``flush``, ``poll``, ``commit_transaction``,
    ``abort_transaction``): a fatal error of the producer (fenced by a newer instance with its transactional
    id, a record lost by a gapless one) comes out as the ``KafkaException`` it is.

    confluent-kafka raises a fatal error by leaving it pending in its error callback and serving on: a
    delivery callback of ours that runs after it in the same call fails at its first step with ``SystemError:
    ... returned a result with an exception set``, caused by the fatal error, and that SystemError is what the
    call raises. Callers handle a fence (a new producer, the chunk written again); a SystemError would fail
    the task."""
    try:
        yield
    except SystemError as exc:
        cause = fatal_cause(exc)
        if cause is None:
            raise
        raise cause from None


def fatal_cause(exc: BaseException) -> KafkaException | None:
    """The ``KafkaException`` a SystemError of a delivery callback was caused by (see :func:`fatal_unmasked`),
    following the chain of causes (each callback served after it adds one), or None. Only causes: Python
    sets the pending error as the SystemError's ``__cause__``; an exception merely being handled when a
    SystemError arose (its ``__context__``) did not cause it."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KafkaException):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__
    return None


#: client error codes that mean the cluster did not answer in time, rather than refused
_NO_ANSWER = frozenset({KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._MSG_TIMED_OUT,
                        KafkaError._ALL_BROKERS_DOWN, KafkaError.REQUEST_TIMED_OUT})


_NO_ANSWER_NAMES = frozenset(KafkaError(c).name() for c in _NO_ANSWER)


def no_answer(err: KafkaError) -> bool:
    """The cluster did not answer in time (a broken connection, no broker up, a request or a record timed
    out), rather than refused what was asked."""
    return err.code() in _NO_ANSWER


def unanswered(exc: BaseException) -> bool:
    """:func:`no_answer` of a ``KafkaException``'s error or of a :class:`KafkaOperationError`'s code; False for
    anything else."""
    if isinstance(exc, KafkaException):
        err = exc.args[0] if exc.args else None
        return isinstance(err, KafkaError) and no_answer(err)
    return isinstance(exc, KafkaOperationError) and exc.code in _NO_ANSWER_NAMES


def error_text(exc: BaseException) -> str:
    """One line for a client failure: a ``KafkaException``'s error text (without the exception's wrapping),
    else the exception's own message."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    return str(err.str()) if err is not None and hasattr(err, "str") else str(exc)


def kafka_config(cluster: ClusterConfig, **extra: Any) -> ClientConfig:
    """The cluster's librdkafka config (secrets revealed for the client, redacted when printed)."""
    return ClientConfig({**cluster.kafka_properties(), **extra})


def admin(cluster: ClusterConfig, **extra: Any) -> AdminClient:
    return AdminClient(kafka_config(cluster, **(_QUIET | extra)))


def latest_offsets(admin: AdminClient, keys: list[tuple[str, int]], committed: bool,
                   timeout: float) -> dict[tuple[str, int], int]:
    """Each of ``keys``' end in one ListOffsets per leader: the last stable offset (``committed``) or the high
    watermark. Raises :class:`KafkaException` for a partition that did not answer."""
    from confluent_kafka import IsolationLevel, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    level = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest() for t, p in keys},
                                 isolation_level=level, request_timeout=timeout)
    return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}


def producer(cluster: ClusterConfig, **extra: Any) -> Producer:
    return Producer(kafka_config(cluster, **(_QUIET | extra)))


def consumer(cluster: ClusterConfig, group_id: str, **extra: Any) -> Consumer:
    return Consumer(_consumer_config(cluster, group_id, extra))


def native_reader(cluster: ClusterConfig, group_id: str, **extra: Any) -> Any:
    """A consumer of the C read loop's own (``native.Reader``), configured as :func:`consumer` would be."""
    from mirror_core import native

    conf = _consumer_config(cluster, group_id, extra)
    return native.Reader(conf, conf["logger"])


def _consumer_config(cluster: ClusterConfig, group_id: str, extra: dict[str, Any]) -> ClientConfig:
    return kafka_config(cluster, **(_QUIET | _CONSUMER | {"group.id": group_id} | extra))


#: librdkafka properties the Java client takes under the same name and meaning
_PASS_THROUGH = (
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "client.id",
    "sasl.oauthbearer.token.endpoint.url", "sasl.kerberos.service.name",
)
#: Java properties whose values are secrets: with a secrets directory they go to a 0600 file, and the
#: options name them through Kafka's FileConfigProvider (``${mirrorflowfile:<file>:<key>}``)
_JAVA_SECRET_KEYS = ("sasl.jaas.config", "ssl.key.password", "ssl.keystore.password", "ssl.truststore.password",
                     "ssl.keystore.key", "ssl.keystore.certificate.chain")
_PROVIDER = "mirrorflowfile"
_FILE_PROVIDER = "org.apache.kafka.common.config.provider.FileConfigProvider"
_OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"


def _jaas_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _jaas(props: dict[str, str]) -> str | None:
    """The Java ``sasl.jaas.config`` for librdkafka's SASL settings (PLAIN, SCRAM-*, OAUTHBEARER/OIDC)."""
    mech = props.get("sasl.mechanism", "GSSAPI").upper()
    user, password = props.get("sasl.username"), props.get("sasl.password")
    if mech == "OAUTHBEARER":
        fields = {"clientId": props.get("sasl.oauthbearer.client.id"),
                  "clientSecret": props.get("sasl.oauthbearer.client.secret"),
                  "scope": props.get("sasl.oauthbearer.scope")}
        for item in filter(None, (props.get("sasl.oauthbearer.extensions") or "").split(",")):
            k, _, v = item.partition("=")
            fields[f"extension_{k.strip()}"] = v.strip()
        body = " ".join(f"{k}={_jaas_quote(v)}" for k, v in fields.items() if v is not None)
        return f"org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required {body};".replace(
            "required ;", "required;")
    if user is None or password is None:
        return None
    module = ("org.apache.kafka.common.security.plain.PlainLoginModule" if mech == "PLAIN"
              else "org.apache.kafka.common.security.scram.ScramLoginModule")
    return f"{module} required username={_jaas_quote(user)} password={_jaas_quote(password)};"


def java_kafka_options(cluster: ClusterConfig, secrets_dir: Path | Callable[[], Path] | None = None,
                       name: str = "cluster") -> ClientConfig:
    """Java Kafka client properties for the same cluster (Spark's Kafka source, MirrorMaker 2).

    Maps librdkafka's security settings: SASL (PLAIN, SCRAM-*, OAUTHBEARER with OIDC client credentials)
    to a JAAS line; ``ssl.ca.location`` to a PEM trust store; ``ssl.certificate.location`` +
    ``ssl.key.location`` (+ ``ssl.key.password``) to a PEM key store; a PKCS#12 ``ssl.keystore.location``
    + ``ssl.keystore.password``; ``ssl.endpoint.identification.algorithm`` (librdkafka ``none`` is Java's
    empty value). The cluster's ``java_kafka`` properties come last (JKS stores, anything Java-only).

    With ``secrets_dir`` (a directory, or a callable that makes one: called only when there is a secret to
    write), no secret is returned: they are written to ``<secrets_dir>/<name>.properties``
    (0600) and the options refer to them through Kafka's FileConfigProvider, so they stay out of Spark's
    options, plans, logs and configuration dumps. A PEM key store (key and chain in one file, as Java
    wants it) is written there too. Without it, secrets are inline: hand the result to a client only (it prints redacted).
    """
    props = cluster.kafka_properties()
    out = {k: props[k] for k in _PASS_THROUGH if k in props}
    if "ssl.endpoint.identification.algorithm" in props:
        algo = props["ssl.endpoint.identification.algorithm"].strip().lower()
        out["ssl.endpoint.identification.algorithm"] = "" if algo in ("none", "") else algo
    jaas = props.get("sasl.jaas.config") or _jaas(props)
    if jaas:
        out["sasl.jaas.config"] = jaas
    if props.get("sasl.mechanism", "").upper() == "OAUTHBEARER" and props.get("sasl.oauthbearer.method") == "oidc":
        out["sasl.login.callback.handler.class"] = _OAUTH_HANDLER
    if "ssl.ca.location" in props:
        out["ssl.truststore.type"] = "PEM"
        out["ssl.truststore.location"] = props["ssl.ca.location"]
    if "ssl.certificate.location" in props and "ssl.key.location" in props:
        out["ssl.keystore.type"] = "PEM"
        key = Path(props["ssl.key.location"]).read_text()
        chain = Path(props["ssl.certificate.location"]).read_text()
        out["ssl.keystore.key"] = key
        out["ssl.keystore.certificate.chain"] = chain
        if "ssl.key.password" in props:
            out["ssl.key.password"] = props["ssl.key.password"]
    elif "ssl.keystore.location" in props:
        out["ssl.keystore.type"] = "PKCS12"
        out["ssl.keystore.location"] = props["ssl.keystore.location"]
        if "ssl.keystore.password" in props:
            out["ssl.keystore.password"] = props["ssl.keystore.password"]
        if "ssl.key.password" in props:
            out["ssl.key.password"] = props["ssl.key.password"]
    out.update(cluster.java_kafka_properties())
    if secrets_dir is None:
        return ClientConfig(out)
    secret = {k: out.pop(k) for k in _JAVA_SECRET_KEYS if k in out}
    secret |= {k: out.pop(k) for k in list(out) if SECRET_KEY_RE.search(k)}
    if not secret:
        return ClientConfig(out)
    path = (secrets_dir if isinstance(secrets_dir, Path) else secrets_dir()) / f"{name}.properties"
    write_private(path, properties_text(secret).encode())
    out["config.providers"] = _PROVIDER
    out[f"config.providers.{_PROVIDER}.class"] = _FILE_PROVIDER
    for k in secret:
        out[k] = f"${{{_PROVIDER}:{path}:{k}}}"
    return ClientConfig(out)


#: a job's private directory for the secrets files of :func:`java_kafka_options`: this, its process id, ``-``, its
#: host's :func:`_host_key`, ``-``
SECRETS_DIR_PREFIX = "mirrorflow-secrets-"


def private_secrets_dir(base: Path | None = None) -> Path:
    """A new directory (0700) under ``base`` (the temporary directory) for this process's secrets files, named
    after its process id and host; the caller removes it when the process exits. Such directories of this user
    and host whose process is gone are removed first: a job killed with SIGKILL never ran its exit handler, and
    its directory held secrets no process reads any more. (The host is in the name so that a temporary
    directory shared by containers, whose process ids are not each other's, never loses a live job's.)"""
    return private_dir(SECRETS_DIR_PREFIX, base)


def private_dir(prefix: str, base: Path | None = None) -> Path:
    """A new directory (0700) under ``base`` (the temporary directory), named ``prefix``, this process's id and
    host: what :func:`private_secrets_dir` makes, for any ``prefix``; directories of the same prefix, user and
    host whose process is gone are removed first."""
    base = Path(base or tempfile.gettempdir())
    host = _host_key()
    for old in base.glob(f"{prefix}*-{host}-*"):
        pid, _, rest = old.name[len(prefix):].partition("-")
        if not pid.isdigit() or not rest.startswith(f"{host}-") or int(pid) == os.getpid() \
                or psutil.pid_exists(int(pid)):
            continue
        try:
            if old.is_dir() and not old.is_symlink() and old.stat().st_uid == os.getuid():
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # gone meanwhile, or not ours to look at
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-{host}-", dir=base))


def _host_key() -> str:
    """This host's name as 8 hex digits (a name may hold any character; this one fits in a file name)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def properties_text(props: dict[str, str]) -> str:
    """``props`` as a Java properties file's lines, each value as Properties.load reads it back."""
    return "".join(f"{k}={_properties_escape(v)}\n" for k, v in props.items())


def _properties_escape(value: str) -> str:
    """A value as Java's Properties.load reads it back (backslashes, line breaks, leading blanks)."""
    v = value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    return "\\" + v if v[:1] in (" ", "\t") else v


def read_partition(cluster: ClusterConfig, topic: str, partition: int, start: int, end: int,
                   timeout: float = 60.0) -> Generator[Any, None, None]:
    """Committed records of ``topic``/``partition`` with offsets in [start, end), in order (read_committed).

    ``end`` should come from :func:`end_offsets`; transaction markers and aborted records occupy offsets
    without being returned, so reading stops at the end position, not at a record count.
    """
    if end <= start:
        return
    c = consumer(cluster, f"mirrorflow-reader-{uuid.uuid4().hex[:8]}", **{
        "isolation.level": "read_committed", "enable.partition.eof": True})
    try:
        yield from scan(c, topic, partition, start, end, timeout)
    finally:
        c.close()


#: how long one consume() of :func:`scan` waits for more records: the loop asks again until its deadline. It
#: returns when the wait is over, not at the partition's end, so a scan's last call waited it whole: at 50 ms
#: (until 7 December) a position lookup of 24 partitions took 75.9 ms on kept consumers, at 5 ms 29.3 ms
#: (bench/lookup.py); ``MIRRORFLOW_SCAN_WAIT_MS`` overrides it, for that A/B
SCAN_WAIT_S = 0.005
SCAN_WAIT_ENV = "MIRRORFLOW_SCAN_WAIT_MS"


def scan(c: Consumer, topic: str, partition: int, start: int, end: int, timeout: float = 60.0) -> Iterator[Any]:
    """Records of ``topic``/``partition`` in [start, end), in order, read with the consumer ``c`` (which
    must have ``enable.partition.eof``); stops at ``end`` whether or not a record sits there."""
    from confluent_kafka import KafkaError, TopicPartition

    if end <= start:
        return
    c.assign([TopicPartition(topic, partition, start)])
    wait = SCAN_WAIT_S
    if os.environ.get(SCAN_WAIT_ENV):
        try:
            wait = float(os.environ[SCAN_WAIT_ENV]) / 1000
        except ValueError:
            wait = 0.0
        if not wait > 0:
            raise ValueError(f"{SCAN_WAIT_ENV}={os.environ[SCAN_WAIT_ENV]!r}: not a number of milliseconds above 0")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # consume() returns when it has its count or its wait is over, not at the partition's end: a range of
        # fewer records than the count waited the whole second (each chunk of a position lookup took 1 s)
        msgs = c.consume(5000, wait)
        for m in msgs:
            err = m.error()
            offset = m.offset() or 0
            if err is not None:
                if err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    # the consumer only assigns and never commits: its group id is a formality librdkafka
                    # insists on, and a least-privilege principal has no ACL for it; the reads go on
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    if offset >= end or (c.position([TopicPartition(topic, partition)])[0].offset or 0) >= end:
                        return
                    continue
                raise KafkaOperationError(f"reading {topic}[{partition}]: {err.str()}", err.name())
            if offset >= end:
                return
            if offset < start or m.topic() != topic or m.partition() != partition:
                continue  # never expected (the assignment starts there); a reused consumer must not pass one on
            yield m
        if (c.position([TopicPartition(topic, partition)])[0].offset or 0) >= end:
            return
    raise KafkaOperationError(f"timed out reading {topic}[{partition}] up to offset {end}")


class TransactionOpenError(KafkaOperationError):
    """A transaction open below a partition's high watermark did not end in time (:func:`settled_end`)."""

    def __init__(self, topic: str, partition: int, stable: int, high: int, waited: float):
        self.topic, self.partition, self.stable, self.high, self.waited = topic, partition, stable, high, waited
        super().__init__(f"{topic}[{partition}]: a transaction open below offset {high} (last stable offset "
                         f"{stable}) did not end within {waited:.0f} s", "TRANSACTION_OPEN")


def settled_end(committed: Consumer, uncommitted: Consumer, topic: str, partition: int, timeout: float,
                settle_timeout: float, on_wait: Callable[[int, int], None] | None = None) -> int:
    """The partition's last stable offset once it has passed the high watermark read at the start: every
    transaction with a record below that mark has ended (committed or aborted), so a read_committed scan
    up to the returned offset sees every commit that happened before this call. ``committed`` and
    ``uncommitted`` read with those isolation levels; ``on_wait(stable, high)`` is called once if it has to
    wait. Raises :class:`TransactionOpenError` after ``settle_timeout`` seconds.

    ``commit_transaction`` returns once the coordinator has logged the commit, before the brokers hold its
    markers, so even a reader right after a commit of its own may have to wait a few milliseconds."""
    from confluent_kafka import TopicPartition

    tp = TopicPartition(topic, partition)
    high = int(uncommitted.get_watermark_offsets(tp, timeout=timeout)[1])
    deadline = time.monotonic() + settle_timeout
    waited = False
    delay = 0.02
    while True:
        stable = int(committed.get_watermark_offsets(tp, timeout=timeout)[1])
        if stable >= high:
            return stable
        if time.monotonic() >= deadline:
            raise TransactionOpenError(topic, partition, stable, high, settle_timeout)
        if not waited and on_wait is not None:
            on_wait(stable, high)
        waited = True
        time.sleep(delay)  # polling the broker's LSO, bounded by the deadline above
        delay = min(0.5, delay * 2)


def end_offsets(cluster: ClusterConfig, topic: str, committed: bool = True,
                timeout: float = 30.0, settled: bool = False) -> dict[int, tuple[int, int]]:
    """{partition: (low, high)}; with ``committed`` the high mark is the last stable offset, and with
    ``settled`` too, it is taken once every transaction that ended before the call lies below it
    (:func:`settled_end`, waiting up to ``timeout`` per partition)."""
    from confluent_kafka import TopicPartition

    isolation = "read_committed" if committed else "read_uncommitted"
    c = consumer(cluster, "mirrorflow-offsets", **{"isolation.level": isolation})
    u = consumer(cluster, "mirrorflow-offsets", **{"isolation.level": "read_uncommitted"}) if settled and committed \
        else None
    try:
        md = c.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            raise KafkaOperationError(f"topic {topic!r} does not exist", "UNKNOWN_TOPIC_OR_PART")
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout) for p in sorted(md.partitions)}
        if u is not None:
            ends = {p: (low, settled_end(c, u, topic, p, timeout, timeout)) for p, (low, _) in ends.items()}
        return ends
    finally:
        c.close()
        if u is not None:
            u.close()


def read_topic(cluster: ClusterConfig, topic: str, timeout: float = 60.0) -> Iterator[Any]:
    """Every committed record of ``topic`` from the beginning to the current end, partition by partition."""
    for p, (low, high) in end_offsets(cluster, topic, timeout=timeout).items():
        yield from read_partition(cluster, topic, p, low, high, timeout)
