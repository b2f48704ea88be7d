"""Security settings handed to every client: the Java (Spark source) mapping, the registry's TLS, the
least-privilege ACL list and the local CA."""

from __future__ import annotations

import ssl
import stat
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from mirror_core import clients
from mirror_core.acls import literal_prefix, required_acls
from mirror_core.config import ClusterConfig, SchemaRegistryConfig, parse_config
from mirror_core.errors import SchemaMirrorError
from mirror_core.registry import tls_context
from mirror_core.tls import LocalCA

PLANTED = "pl4nted-S3cret"


def scram(**extra: str) -> ClusterConfig:
    return ClusterConfig(kafka={"bootstrap.servers": "b:9093", "security.protocol": "SASL_SSL",
                                "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "mirror",
                                "sasl.password": PLANTED, **extra})


def test_scram_maps_to_a_jaas_line_with_quoting():
    c = ClusterConfig(kafka={"bootstrap.servers": "b", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": 'a"b',
                             "sasl.password": 'p\\"q'})
    opts = clients.java_kafka_options(c)
    assert opts["sasl.jaas.config"] == ('org.apache.kafka.common.security.scram.ScramLoginModule required '
                                        'username="a\\"b" password="p\\\\\\"q";')


def test_with_a_secrets_dir_no_secret_is_in_the_options(tmp_path):
    ca = LocalCA(tmp_path / "ca")
    issued = ca.issue("client", server=False, key_password=PLANTED)
    c = scram(**{"ssl.ca.location": str(ca.ca_file), "ssl.certificate.location": str(issued.cert),
                 "ssl.key.location": str(issued.key), "ssl.key.password": PLANTED})
    opts = clients.java_kafka_options(c, tmp_path / "s", "g-source")
    assert PLANTED not in repr(opts)
    assert "BEGIN" not in repr(opts)  # the private key's PEM goes to the file too
    secret_file = tmp_path / "s" / "g-source.properties"
    assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
    assert opts["config.providers"] == "mirrorflowfile"
    assert opts["sasl.jaas.config"] == f"${{mirrorflowfile:{secret_file}:sasl.jaas.config}}"
    assert opts["ssl.key.password"] == f"${{mirrorflowfile:{secret_file}:ssl.key.password}}"
    assert opts["ssl.truststore.type"] == "PEM" and opts["ssl.truststore.location"] == str(ca.ca_file)
    assert opts["ssl.keystore.type"] == "PEM"
    text = secret_file.read_text()
    assert PLANTED in text and "\\nMII" in text or "\\n" in text  # multi-line PEM kept on one escaped line
    assert len(text.splitlines()) == 4  # jaas, key password, key, chain


def test_the_secrets_directory_is_made_only_for_a_cluster_with_secrets(tmp_path):
    """A job makes its private secrets directory only when the source has a secret to write there: an
    unsecured cluster's job leaves no directory behind."""
    made: list[Path] = []

    def make() -> Path:
        made.append(tmp_path / "s")
        return made[-1]

    plain = clients.java_kafka_options(ClusterConfig(kafka={"bootstrap.servers": "b:9092"}), make, "g-source")
    assert made == [] and "config.providers" not in plain
    secured = clients.java_kafka_options(scram(), make, "g-source")
    assert made == [tmp_path / "s"] and PLANTED not in repr(secured)
    assert PLANTED in (tmp_path / "s" / "g-source.properties").read_text()


def test_a_private_secrets_directory_replaces_those_of_processes_that_are_gone(tmp_path):
    """Each job's directory is named after its process and host and made 0700. Directories of this host's
    processes that are gone (killed with SIGKILL: their exit handler never removed them) are removed with the
    secrets they hold; a running process's, another host's and directories not named this way stay."""
    import os
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    host = clients._host_key()
    dead = tmp_path / f"{clients.SECRETS_DIR_PREFIX}{gone}-{host}-abc"
    live = tmp_path / f"{clients.SECRETS_DIR_PREFIX}{os.getppid()}-{host}-def"
    elsewhere = tmp_path / f"{clients.SECRETS_DIR_PREFIX}{gone}-0badc0de-ghi"  # another host's (container's)
    other = tmp_path / f"{clients.SECRETS_DIR_PREFIX}xyz"
    for d in (dead, live, elsewhere, other):
        d.mkdir()
        (d / "g-source.properties").write_text(f"sasl.jaas.config={PLANTED}")
    made = clients.private_secrets_dir(tmp_path)
    assert not dead.exists()
    assert live.exists() and elsewhere.exists() and other.exists()
    assert made.name.startswith(f"{clients.SECRETS_DIR_PREFIX}{os.getpid()}-{host}-") and made.parent == tmp_path
    assert stat.S_IMODE(made.stat().st_mode) == 0o700


def test_pkcs12_jks_endpoint_identification_and_oauthbearer():
    p12 = scram(**{"ssl.keystore.location": "/k/client.p12", "ssl.keystore.password": PLANTED,
                   "ssl.endpoint.identification.algorithm": "none"})
    opts = clients.java_kafka_options(p12)
    assert (opts["ssl.keystore.type"], opts["ssl.keystore.location"], opts["ssl.keystore.password"]) == \
        ("PKCS12", "/k/client.p12", PLANTED)
    assert opts["ssl.endpoint.identification.algorithm"] == ""  # Java's way to switch host checks off
    jks = ClusterConfig(kafka={"bootstrap.servers": "b", "security.protocol": "SSL"},
                        java_kafka={"ssl.keystore.type": "JKS", "ssl.keystore.location": "/k/c.jks",
                                    "ssl.keystore.password": PLANTED, "ssl.key.password": PLANTED})
    assert "JKS" not in str(jks.kafka_properties())  # librdkafka never sees Java-only settings
    assert clients.java_kafka_options(jks)["ssl.keystore.type"] == "JKS"
    assert PLANTED not in repr(jks)
    oauth = ClusterConfig(kafka={"bootstrap.servers": "b", "security.protocol": "SASL_SSL",
                                 "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
                                 "sasl.oauthbearer.client.id": "mirror", "sasl.oauthbearer.client.secret": PLANTED,
                                 "sasl.oauthbearer.scope": "kafka",
                                 "sasl.oauthbearer.token.endpoint.url": "https://idp/token"})
    o = clients.java_kafka_options(oauth)
    assert o["sasl.jaas.config"] == ("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                                     f'required clientId="mirror" clientSecret="{PLANTED}" scope="kafka";')
    assert o["sasl.oauthbearer.token.endpoint.url"] == "https://idp/token"
    assert o["sasl.login.callback.handler.class"].endswith("OAuthBearerLoginCallbackHandler")


def test_local_ca_issues_what_python_ssl_and_pkcs12_load(tmp_path):
    ca = LocalCA(tmp_path)
    issued = ca.issue("svc", key_password="kp")
    ctx = ssl.create_default_context(cafile=str(ca.ca_file))
    ctx.load_cert_chain(str(issued.cert), str(issued.key), "kp")
    assert stat.S_IMODE(issued.key.stat().st_mode) == 0o600
    assert stat.S_IMODE(ca.pkcs12(issued, "p", key_password="kp").stat().st_mode) == 0o600
    assert issued.principal == "CN=svc"


def test_registry_tls_context_and_one_line_errors(tmp_path):
    ca = LocalCA(tmp_path)
    issued = ca.issue("client", key_password="right")
    good = SchemaRegistryConfig.model_validate({
        "url": "https://r:1/apis/ccompat/v7", "ssl.ca.location": str(ca.ca_file),
        "ssl.certificate.location": str(issued.cert), "ssl.key.location": str(issued.key),
        "ssl.key.password": "right"})
    assert isinstance(tls_context(good), ssl.SSLContext)
    bad = good.model_copy(update={"ssl_key_password": None})
    with pytest.raises(SchemaMirrorError) as err:
        tls_context(bad.model_copy(update={"ssl_ca_location": str(tmp_path / "missing.pem")}))
    assert "ssl.ca.location" in str(err.value) and "missing.pem" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(SchemaMirrorError) as err:
        tls_context(good.model_copy(update={"ssl_key_password": SecretStr("wrong-pw")}))
    assert "client certificate" in str(err.value) and "wrong-pw" not in str(err.value)
    with pytest.raises(ValueError, match="go together"):
        SchemaRegistryConfig.model_validate({"url": "https://r", "ssl.key.location": "/k"})
    assert tls_context(SchemaRegistryConfig(url="https://r")) is True


@pytest.mark.parametrize(("pattern", "prefix"), [
    (r"payments\..*", "payments."), ("orders", "orders"), (r"eu\.orders-v?", "eu.orders-"), (".*", ""),
    ("(a|b).*", ""),
])
def test_literal_prefix(pattern, prefix):
    assert literal_prefix(pattern) == prefix


def test_required_acls_for_the_shipped_secure_config():
    root = Path(__file__).resolve().parents[2]
    raw = yaml.safe_load((root / "config" / "local-secure.yaml").read_text())
    cfg = parse_config(raw, env={"MIRRORFLOW_SRC_PASSWORD": "a", "MIRRORFLOW_DST_PASSWORD": "b",
                                 "MIRRORFLOW_LOCAL_CA": "/ca.pem"})
    grants = required_acls(cfg, cfg.groups[0])
    src = {(g.resource_type, g.name, g.pattern): g.operations for g in grants if g.side == "source"}
    dst = {(g.resource_type, g.name, g.pattern): g.operations for g in grants if g.side == "destination"}
    assert {g.principal for g in grants if g.side == "source"} == {"User:mirror-source"}
    assert {g.principal for g in grants if g.side == "destination"} == {"User:mirror-destination"}
    # the source principal reads; the one topic it creates and writes is heartbeats (on, as in MM2)
    assert cfg.groups[0].heartbeats.enabled
    writes = {k for k, ops in src.items() if not set(ops) <= {"READ", "DESCRIBE", "DESCRIBE_CONFIGS"}}
    assert writes == {("TOPIC", "heartbeats", "LITERAL")}
    assert src[("TOPIC", "heartbeats", "LITERAL")] == ("CREATE", "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS")
    assert ("TOPIC", "heartbeats", "LITERAL") in dst  # its mirror (identity naming)
    assert src[("TOPIC", "secure.payments.", "PREFIXED")] == ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")
    assert ("TRANSACTIONAL_ID", "mirrorflow.secure:", "PREFIXED") in dst
    from mirror_core.config import transactional_id

    assert transactional_id("secure", "src", "secure.orders", "secure.orders").startswith("mirrorflow.secure:")
    assert ("TOPIC", "mirrorflow-offset-syncs.src.internal", "LITERAL") in dst
    assert not any(t == "CLUSTER" for t, _, _ in src | dst)
    cmd = grants[0].kafka_acls_command("b:9093")
    assert "--allow-principal User:mirror-source" in cmd and "--operation Read" in cmd
