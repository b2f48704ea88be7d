"""Java Kafka client properties (MM2, MM1, viooh-mirror, Strimzi) -> mirrorflow's cluster settings.

mirrorflow's cluster ``kafka`` section speaks librdkafka; the Spark source speaks Java again
(``spark.source_options`` ``kafka.<consumer property>``). :func:`translate` sorts each Java property
into one of: the cluster's librdkafka settings, the reading group's Spark source options, a secret
placeholder, or a finding (no equivalent / different meaning). Secret values are never returned
or quoted, only their names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mirror_core.config import SECRET_KEY_RE
from mirror_core.redaction import redact_text

#: Same name and meaning in the Java client and librdkafka; connection-level, so on the cluster.
CLUSTER_SAME = frozenset({
    "bootstrap.servers", "security.protocol", "sasl.mechanism", "client.id", "client.rack",
    "sasl.kerberos.service.name", "metadata.max.age.ms", "reconnect.backoff.ms",
    "reconnect.backoff.max.ms", "retry.backoff.ms", "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms", "connections.max.idle.ms", "sasl.oauthbearer.token.endpoint.url",
})
_OAUTH_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"

#: Producer tuning with the same name in librdkafka: on the cluster, where mirrorflow's producers read it.
PRODUCER_SAME = frozenset({
    "linger.ms", "batch.size", "compression.type", "delivery.timeout.ms", "request.timeout.ms",
    "max.in.flight.requests.per.connection",
})

#: Java consumer tuning: Spark's Kafka source is a Java consumer, so these go to spark.source_options.
CONSUMER_TUNING = frozenset({
    "max.poll.records", "max.partition.fetch.bytes", "fetch.min.bytes", "fetch.max.bytes",
    "fetch.max.wait.ms", "receive.buffer.bytes", "send.buffer.bytes", "check.crcs",
    "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "default.api.timeout.ms",
})

_BYTES_SERDE = re.compile(r"org\.apache\.kafka\.common\.serialization\.ByteArray(Des|S)erializer")
_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>required|requisite|sufficient|optional)(?P<opts>.*?);?\s*$", re.S)
_JAAS_OPT = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+))')


#: names whose values are secrets beyond mirrorflow's own list: private keys under any spelling
#: (viooh's ``:private-key``, ``ssl.private.key``), passphrases and credentials
_MORE_SECRET_KEY_RE = re.compile(r"password|private[-._]?key|key[-._]?pem$|passphrase|credential", re.I)
#: a PEM private key (``-----BEGIN PRIVATE KEY-----``, ``... RSA PRIVATE KEY``, ``ENCRYPTED ...``) in any value
_PEM_PRIVATE_KEY_RE = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")


_JAAS_ESCAPE = re.compile(r"\\(?:([0-3][0-7]{0,2}|[4-7][0-7]?)|(.))", re.S)
_JAAS_CHAR = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _jaas_unquote(text: str) -> str:
    r"""A quoted JAAS option value as Java's JAAS parser (StreamTokenizer) reads it: ``\\`` is ``\``,
    ``\"`` is ``"``, ``\n`` and the other C escapes and octal ``\ooo`` are their characters."""
    def one(m: re.Match[str]) -> str:
        if m.group(1):
            return chr(int(m.group(1), 8))
        return _JAAS_CHAR.get(m.group(2), m.group(2))
    return _JAAS_ESCAPE.sub(one, text)


def is_secret(key: str) -> bool:
    return bool(SECRET_KEY_RE.search(key) or _MORE_SECRET_KEY_RE.search(key))


def holds_private_key(value: str) -> bool:
    """True when ``value`` carries a PEM private key, whatever its key is named."""
    return bool(_PEM_PRIVATE_KEY_RE.search(value))


def safe_text(value: str) -> str:
    """``value`` fit for a message: a PEM private key is replaced whole, URL credentials are dropped."""
    if holds_private_key(value):
        return "(a PEM private key, not copied)"
    return redact_text(value)


@dataclass
class ClientMapping:
    """Where one client's properties went."""

    cluster: dict[str, str] = field(default_factory=dict)
    source_options: dict[str, str] = field(default_factory=dict)  # ``kafka.X`` for the reading group
    secrets: dict[str, tuple[str, str]] = field(default_factory=dict)  # librdkafka key -> (env var, what)
    #: Java-only settings for Spark's source (the cluster's ``java_kafka``), e.g. JKS stores
    java: dict[str, str] = field(default_factory=dict)
    java_secrets: dict[str, tuple[str, str]] = field(default_factory=dict)
    notes: list[tuple[str, str]] = field(default_factory=list)  # (librdkafka key or "", comment)
    findings: list[tuple[str, str]] = field(default_factory=list)  # (input key, message)


def shown(key: str, value: str) -> str:
    """The value for a message (``value '4'``), or a word that it is a secret."""
    if is_secret(key) or holds_private_key(value):
        return "secret value not copied"
    return f"value {redact_text(value)!r}"


def translate(props: dict[str, str], env_prefix: str, key_prefix: str = "") -> ClientMapping:
    """Sort Java client ``props`` (names without any alias / role prefix).

    ``env_prefix`` names the placeholders (``A`` -> ``${A_SASL_PASSWORD}``); ``key_prefix`` is how the
    input spells the keys (``A.``, ``A.consumer.``), for findings.
    """
    return _Translator(env_prefix, key_prefix).run({k.strip(): v.strip() for k, v in props.items()})


@dataclass
class _Translator:
    env_prefix: str
    key_prefix: str
    out: ClientMapping = field(default_factory=ClientMapping)

    def where(self, key: str) -> str:
        return f"{self.key_prefix}{key}"

    def secret(self, rd_key: str, what: str, java: bool = False) -> None:
        var = re.sub(r"[^A-Za-z0-9]+", "_", f"{self.env_prefix}_{rd_key}").upper()
        (self.out.java_secrets if java else self.out.secrets)[rd_key] = (var, what)

    def finding(self, key: str, message: str) -> None:
        self.out.findings.append((self.where(key), message))

    def run(self, p: dict[str, str]) -> ClientMapping:
        out = self.out
        for k in sorted(p):
            v = p[k]
            if k in CLUSTER_SAME or k in PRODUCER_SAME:
                out.cluster[k] = v
            elif k in CONSUMER_TUNING:
                out.source_options[f"kafka.{k}"] = v
            elif k == "max.request.size":
                out.cluster["message.max.bytes"] = v
                out.notes.append(("message.max.bytes", f"from {self.where(k)} (librdkafka's name)"))
            elif k == "ssl.endpoint.identification.algorithm":
                out.cluster[k] = v.lower() if v else "none"
            elif k == "acks":
                if v not in ("all", "-1"):
                    self.finding(k, f"acks = {v}: mirrorflow always produces with acks=all")
            elif k == "enable.idempotence":
                if v.lower() != "true":
                    self.finding(k, f"{k} = {v}: mirrorflow's producers are always idempotent")
            elif k in ("key.serializer", "value.serializer", "key.deserializer", "value.deserializer"):
                if not _BYTES_SERDE.fullmatch(v):
                    self.finding(k, f"{k} = {v}: mirrorflow copies records as bytes (serdes says how to read them)")
            elif k == "auto.offset.reset":
                if v != "earliest":
                    self.finding(k, f"{k} = {v}: a new mirror always starts at the earliest offset")
            elif k == "isolation.level":
                if v != "read_committed":
                    self.finding(k, f"{k} = {v}: mirrorflow always reads read_committed (aborted records are not mirrored)")
            elif k in ("enable.auto.commit", "auto.commit.interval.ms"):
                self.finding(k, f"{k} = {v}: mirrorflow commits the source offsets itself after each batch")
            elif k == "sasl.jaas.config":
                self.jaas(v)
            elif k == "sasl.login.callback.handler.class" and v == _OAUTH_HANDLER:
                pass  # the OIDC client-credentials login, which sasl.oauthbearer.method=oidc selects
            elif k.startswith(("ssl.truststore.", "ssl.keystore.")) or k == "ssl.key.password":
                pass  # handled as one store below
            else:
                self.finding(k, f"{shown(k, v)}: no librdkafka equivalent")
        self.stores(p)
        return out

    def jaas(self, value: str) -> None:
        where = self.where("sasl.jaas.config")
        m = _JAAS.match(value)
        module = m.group("module") if m else ""
        opts: dict[str, str] = {}
        if m:
            for name, quoted, bare in _JAAS_OPT.findall(m.group("opts")):
                opts[name] = _jaas_unquote(quoted) if quoted or not bare else bare
        if module.endswith(("PlainLoginModule", "ScramLoginModule")) and "username" in opts:
            self.out.cluster["sasl.username"] = opts["username"]
            self.secret("sasl.password", f"the SASL password in {where}")
            self.out.notes.append(("sasl.username", f"from {where} ({module.rsplit('.', 1)[-1]})"))
        elif module.endswith("OAuthBearerLoginModule") and "clientId" in opts:
            self.out.cluster["sasl.oauthbearer.method"] = "oidc"
            self.out.cluster["sasl.oauthbearer.client.id"] = opts["clientId"]
            if "scope" in opts:
                self.out.cluster["sasl.oauthbearer.scope"] = opts["scope"]
            if "clientSecret" in opts:
                self.secret("sasl.oauthbearer.client.secret", f"the OAuth client secret in {where}")
            self.out.notes.append(("sasl.oauthbearer.method", f"from {where} (OIDC client credentials)"))
            rest = sorted(set(opts) - {"clientId", "clientSecret", "scope"})
            if rest:
                self.out.findings.append((where, f"OAuth options {', '.join(rest)}: no librdkafka equivalent "
                                                 "(secret, not copied)"))
        elif module.endswith("OAuthBearerLoginModule"):
            self.out.findings.append((where, "OAUTHBEARER login without clientId: set librdkafka's "
                                             "sasl.oauthbearer.* settings by hand (secret, not copied)"))
        elif module.endswith("Krb5LoginModule"):
            self.out.findings.append((where, "Kerberos login: set librdkafka's sasl.kerberos.keytab and "
                                             "sasl.kerberos.principal by hand (secret, not copied)"))
        else:
            self.out.findings.append((where, "not a PLAIN / SCRAM login with a username (secret, not copied)"))

    def stores(self, p: dict[str, str]) -> None:
        """Trust and key stores: PEM / PKCS#12 map to librdkafka's settings; a JKS store goes to the
        cluster's ``java_kafka`` (Spark's source is Java and reads it) and is reported, since
        mirrorflow's librdkafka clients (writer, admin, checkpoints) cannot read it."""
        out = self.out
        keys = sorted(k for k in p if k.startswith(("ssl.truststore.", "ssl.keystore.")) or k == "ssl.key.password")
        ts, ks = p.get("ssl.truststore.location"), p.get("ssl.keystore.location")
        ts_type = p.get("ssl.truststore.type", "JKS").upper()
        ks_type = p.get("ssl.keystore.type", "JKS").upper()
        explained: set[str] = {"ssl.truststore.type", "ssl.keystore.type"}
        if ts is not None:
            explained |= {"ssl.truststore.location", "ssl.truststore.password"}
            if ts_type == "PEM":
                out.cluster["ssl.ca.location"] = ts
                out.notes.append(("ssl.ca.location", f"from {self.where('ssl.truststore.location')} (PEM)"))
            else:
                out.java |= {"ssl.truststore.location": ts, "ssl.truststore.type": ts_type}
                if "ssl.truststore.password" in p:
                    self.secret("ssl.truststore.password", "the truststore password", java=True)
                self.finding("ssl.truststore.location", f"{ts_type} truststore {ts}: kept in java_kafka for Spark's "
                             "source; mirrorflow's librdkafka clients read PEM: export the CA (keytool -exportcert "
                             "-rfc) and set ssl.ca.location")
        elif "ssl.truststore.certificates" in p:
            explained.add("ssl.truststore.certificates")
            out.cluster["ssl.ca.pem"] = p["ssl.truststore.certificates"]
        if ks is not None:
            explained |= {"ssl.keystore.location", "ssl.keystore.password", "ssl.key.password"}
            if ks_type == "PKCS12":
                out.cluster["ssl.keystore.location"] = ks
                if "ssl.keystore.password" in p:
                    self.secret("ssl.keystore.password", "the PKCS#12 keystore password")
                if "ssl.key.password" in p:
                    self.secret("ssl.key.password", "the private key's password")
            else:
                out.java |= {"ssl.keystore.location": ks, "ssl.keystore.type": ks_type}
                for k in ("ssl.keystore.password", "ssl.key.password"):
                    if k in p:
                        self.secret(k, f"the {ks_type} keystore's {k.split('.')[1]} password", java=True)
                self.finding("ssl.keystore.location", f"{ks_type} keystore {ks}: kept in java_kafka for Spark's "
                             "source; mirrorflow's librdkafka clients read PKCS#12 or PEM: convert it (keytool "
                             "-importkeystore -deststoretype PKCS12) and set ssl.keystore.location and "
                             "ssl.keystore.password")
        for k in keys:
            if k not in explained:
                self.finding(k, f"{shown(k, p[k])}: no store it belongs to, or no librdkafka equivalent")
