"""Item 14 of issue 11: secret-aware URL values, redaction of text and logs, quiet libraries."""

from __future__ import annotations

import base64
import io
import logging
import pickle

import httpx
import pytest

from mirror_core.config import SchemaRegistryConfig
from mirror_core.logs import LIBRDKAFKA_LOG, setup_logging
from mirror_core.redaction import SecretUrl, redact_config, redact_text, redact_url
from mirror_core.registry import RegistryClient

URL = "https://alice:s3cr3t-pw@registry.example:8081/apis/ccompat/v7"


def test_item14_secret_url_shows_no_credentials():
    u = SecretUrl(URL)
    for shown in (str(u), repr(u), f"{u}", u.display, format(u, "")):
        assert "s3cr3t-pw" not in shown and "alice" not in shown
        assert "registry.example:8081/apis/ccompat/v7" in shown
    assert u.get_secret_value() == URL
    assert u == SecretUrl(URL) and u != SecretUrl(URL.replace("alice", "bob")) and hash(u) == hash(SecretUrl(URL))
    assert pickle.loads(pickle.dumps(u)) == u

    cfg = SchemaRegistryConfig(url=URL + "/")
    assert isinstance(cfg.url, SecretUrl) and cfg.url.get_secret_value() == URL
    for shown in (repr(cfg), str(cfg), cfg.model_dump_json(), str(cfg.model_dump())):
        assert "s3cr3t-pw" not in shown


def test_item14_bad_registry_url_error_hides_credentials():
    with pytest.raises(ValueError) as exc:
        SchemaRegistryConfig(url="ftp://alice:s3cr3t-pw@host/x")
    assert "s3cr3t-pw" not in str(exc.value).split("input_value")[0]


def test_item14_text_and_config_redaction():
    assert redact_url(URL) == "https://registry.example:8081/apis/ccompat/v7"
    assert redact_url("http://host/x@y") == "http://host/x@y"  # an @ in the path is not userinfo
    line = f"GET {URL} failed; retry http://bob:pw2@other/x"
    assert redact_text(line) == "GET https://registry.example:8081/apis/ccompat/v7 failed; retry http://other/x"
    safe = redact_config({"bootstrap.servers": "b:9092", "sasl.password": "pw", "sasl.jaas.config": "x",
                          "schema.registry.url": URL, "linger.ms": 5})
    assert safe == {"bootstrap.servers": "b:9092", "sasl.password": "**********", "sasl.jaas.config": "**********",
                    "schema.registry.url": "https://registry.example:8081/apis/ccompat/v7", "linger.ms": 5}


def test_item14_registry_client_sends_url_credentials_as_basic_auth_only():
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=["s"])

    client = RegistryClient.from_config(SchemaRegistryConfig(url=URL), http=httpx.Client(
        transport=httpx.MockTransport(handler)))
    assert client.subjects() == ["s"]
    req = seen[0]
    assert "s3cr3t-pw" not in str(req.url) and req.url.userinfo == b""
    assert req.headers["authorization"] == "Basic " + base64.b64encode(b"alice:s3cr3t-pw").decode()
    assert "s3cr3t-pw" not in repr(client) and "s3cr3t-pw" not in client.url


def test_item14_logging_keeps_libraries_quiet_and_redacts():
    buf = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers)
    try:
        setup_logging(verbose=True, stream=buf)
        for name in ("httpx", "httpcore", "py4j", "librdkafka"):
            assert not logging.getLogger(name).isEnabledFor(logging.INFO), name
        assert logging.getLogger("mirror_core.x").isEnabledFor(logging.DEBUG)
        logging.getLogger("httpx").info("HTTP Request: GET %s", URL)
        logging.getLogger("mirror_core.test").warning("calling %s", URL)
        try:
            raise RuntimeError(f"boom at {URL}")
        except RuntimeError:
            logging.getLogger("mirror_core.test").exception("failed")
        LIBRDKAFKA_LOG.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connect to x failed")
        out = buf.getvalue()
        assert "HTTP Request" not in out and "Connect to x failed" not in out
        assert "calling https://registry.example:8081" in out and "boom at https://registry.example" in out
        assert "s3cr3t-pw" not in out
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)



def test_inline_private_keys_are_secrets():
    """librdkafka's ssl.key.pem (what `mirrorflow import viooh` maps viooh's :private-key to) and Java's
    ssl.keystore.key hold a private key inline: kept as SecretStr and redacted like a password."""
    from pydantic import SecretStr

    from mirror_core.config import ClusterConfig

    pem = "-----BEGIN PRIVATE KEY-----MIIEv-----END PRIVATE KEY-----"
    c = ClusterConfig(kafka={"bootstrap.servers": "b:9092", "ssl.key.pem": pem},
                      java_kafka={"ssl.keystore.key": pem})
    assert isinstance(c.kafka["ssl.key.pem"], SecretStr) and isinstance(c.java_kafka["ssl.keystore.key"], SecretStr)
    assert "MIIEv" not in repr(c) and "MIIEv" not in str(redact_config({"ssl.key.pem": pem}))
