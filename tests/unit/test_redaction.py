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
    """The whole error, not just its first line: pydantic appends the input (``input_value=...``) unless told
    not to, and a URL's userinfo is the secret."""
    with pytest.raises(ValueError) as exc:
        SchemaRegistryConfig(url="ftp://alice:s3cr3t-pw@host/x")
    for shown in (str(exc.value), repr(exc.value)):
        assert "s3cr3t-pw" not in shown and "alice" not in shown, shown
        assert "input_value" not in shown, shown
    assert "not an http(s) URL" in str(exc.value) and "'host'" in str(exc.value)


def test_item14_text_and_config_redaction():
    assert redact_url(URL) == "https://registry.example:8081/apis/ccompat/v7"
    # an @ after the host may still end a password holding an unencoded '/': shown less, never more
    assert redact_url("http://host/x@y") == "http://y"
    assert redact_url("http://bob:Le4k/Tail9@host/x") == "http://host/x"
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


# --------------------------------------------------------------------------- issue 15: whole client configs

PW = "pl4nted-pw"


def _planted_cluster_yaml(host: str) -> str:
    props = (f'bootstrap.servers: "{host}:9092", security.protocol: SASL_SSL, sasl.mechanism: PLAIN, '
             f'sasl.username: u, sasl.password: "{PW}", ssl.key.password: "{PW}"')
    return (f'{{kafka: {{{props}}}, schema_registry: {{url: "https://u:{PW}@reg:8081", '
            f'basic.auth.user.info: "u:{PW}"}}}}')


def test_client_config_is_a_plain_dict_to_clients_and_redacted_when_shown():
    from confluent_kafka import Producer

    from mirror_core.redaction import ClientConfig

    conf = ClientConfig({"bootstrap.servers": "h:1", "sasl.password": PW, "sasl.jaas.config": f'x password="{PW}";',
                         "log_level": 0})
    for shown in (repr(conf), str(conf), f"{conf}", repr([conf]), repr({"c": conf})):
        assert PW not in shown and "h:1" in shown
    assert conf["sasl.password"] == PW and dict(conf)["sasl.password"] == PW  # the client gets the value
    Producer(ClientConfig({k: v for k, v in conf.items() if k != "sasl.jaas.config"}))  # taken as the dict it is
    more = conf | {"acks": "all"}
    assert isinstance(more, ClientConfig) and more["acks"] == "all" and PW not in repr(more)
    assert isinstance({"x": "1"} | conf, ClientConfig)
    back = pickle.loads(pickle.dumps(conf))
    assert isinstance(back, ClientConfig) and back == conf
    with pytest.raises(TypeError, match="read-only"):
        conf["sasl.password"] = "other"
    with pytest.raises(TypeError, match="read-only"):
        conf.update({"a": "b"})


def test_settings_objects_that_hold_client_configs_print_no_secret(tmp_path):
    """WriterSettings and WriterPlan carry the destination's config to the executors; Java client options
    can carry a JAAS line: their reprs (what a log line or an exception shows) hide the secrets."""
    import yaml

    from mirror_core import clients
    from mirror_core.config import parse_config
    from mirror_core.replicate import WriterSettings
    from mirror_core.stream import MirrorRuntime, WriterPlan

    cfg = parse_config(yaml.safe_load(f"""
clusters: {{src: {_planted_cluster_yaml("a")}, dst: {_planted_cluster_yaml("b")}}}
groups:
  - {{name: g, source: src, destination: dst, serdes: {{key: bytes, value: bytes}}, mirrors: [{{source_topic: a}}]}}
"""), env={})
    dst = cfg.cluster("dst")
    ws = WriterSettings(
        group="g", mirror="m", source_alias="src", destination_alias="dst", source_topic="a", destination_topic="a",
        source_partitions=1, destination_partitions=1, delivery="exactly_once", key_serde="bytes",
        value_serde="bytes", on_error="dead_letter", dlq_topic="d", offset_syncs_topic="s", provenance=False,
        producer_config=dict(clients.kafka_config(dst)))  # even a plain dict given by a caller
    plan = WriterPlan({"a": ws}, {}, {}, dict(clients.kafka_config(dst)), (dst.schema_registry, dst.schema_registry))
    options = MirrorRuntime(cfg, cfg.groups[0]).source_options(once=True)
    assert ws.producer_config["sasl.password"] == PW  # what the client gets
    assert PW in clients.java_kafka_options(dst)["sasl.jaas.config"]  # inline without a secrets directory
    shown = [repr(ws), str(ws), repr(plan), repr(options), repr(cfg), repr(dst), repr(clients.kafka_config(dst)),
             repr(clients.java_kafka_options(dst)), repr(pickle.loads(pickle.dumps(ws)))]
    for text in shown:
        assert PW not in text, text
    assert "sasl.username" in repr(ws) and "**********" in repr(ws)


@pytest.mark.parametrize("quiet", [True, False])
def test_library_notices_about_httpx2_are_left_out_of_a_users_output(quiet):
    """The bench and the demos import confluent-kafka's schema registry client, whose import makes authlib
    print a deprecation notice nobody running mirrorflow can act on; ``quiet_library_warnings`` leaves it
    out (the other case shows the notice is there to leave out)."""
    import subprocess
    import sys

    code = ("from mirror_core.logs import quiet_library_warnings\n" + ("quiet_library_warnings()\n" if quiet else "")
            + "from confluent_kafka.schema_registry import SchemaRegistryClient\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert ("httpx2" in err) is not quiet, err


@pytest.mark.parametrize("quiet", [True, False])
def test_pydantics_notice_about_airflows_xcom_route_is_left_out_of_a_users_output(quiet):
    """``make demo``'s failover printed pydantic's warning about the ``Path(alias="key")`` of Airflow's execution
    API (its XCom route) in the middle of its lines, and the failover DAG test one about a ``task_instance_id``;
    the same construct, in a process of its own."""
    import subprocess
    import sys

    code = ("import warnings\nwarnings.simplefilter('always')\n"
            "from mirror_core.logs import quiet_library_warnings\n" + ("quiet_library_warnings()\n" if quiet else "")
            + "from typing import Annotated\nfrom pydantic import Field, TypeAdapter\n"
            + "TypeAdapter(Annotated[str, Field(alias='key', min_length=1)])\n"
            + "TypeAdapter(Annotated[str, Field(alias='task_instance_id')])\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    for alias in ("key", "task_instance_id"):
        assert (f"The 'alias' attribute with value '{alias}'" in err) is not quiet, err


# --------------------------------------------------------------------------- secret property names

#: secret-valued properties the name pattern once missed: librdkafka 2.16's JWT-bearer assertion (sensitive there)
#: and its OAUTHBEARER config line, and Hadoop's object store keys as a group's spark.conf gives them
MISSED_SECRET_KEYS = [
    "sasl.oauthbearer.assertion.private.key.passphrase",
    "sasl.oauthbearer.assertion.private.key.pem",
    "sasl.oauthbearer.config",
    "spark.hadoop.fs.s3a.access.key",
    "spark.hadoop.fs.s3a.encryption.key",
    "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
]
SECRET = "Passphr4se-s3cret"


@pytest.mark.parametrize("key", MISSED_SECRET_KEYS)
def test_secret_property_names_are_masked_everywhere_they_show(key, tmp_path, monkeypatch):
    """A cluster's value under such a name is a SecretStr (config repr and dumps), masked in a ClientConfig,
    registered with Airflow's log masker, and written to the 0600 secrets file instead of Spark's options."""
    import importlib
    from types import SimpleNamespace

    from mirror_core import clients
    from mirror_core.config import ClusterConfig
    from mirror_core.redaction import ClientConfig, is_secret_key

    assert is_secret_key(key)
    c = ClusterConfig.model_validate({"kafka": {"bootstrap.servers": "b:9092", key: SECRET},
                                      "java_kafka": {key: SECRET}})
    assert c.kafka_properties()[key] == SECRET  # what the client gets
    for shown in (repr(c), str(c.model_dump()), c.model_dump_json(), repr(clients.kafka_config(c)),
                  repr(ClientConfig({key: SECRET}))):
        assert SECRET not in shown, shown
    options = clients.java_kafka_options(c, tmp_path, "g-source")
    assert SECRET not in str(dict(options))
    assert SECRET in (tmp_path / "g-source.properties").read_text()

    hooks = importlib.import_module("mirrorflow_airflow.hooks")
    masked: list[str] = []
    monkeypatch.setattr(hooks, "_mask", masked.append)
    hooks.kafka_properties(SimpleNamespace(extra_dejson={"bootstrap.servers": "b:9092", key: SECRET},
                                           login=None, password=None, host=None, port=None))
    assert masked == [SECRET]


@pytest.mark.parametrize("key", [
    "bootstrap.servers", "ssl.key.location", "ssl.certificate.pem", "ssl.ca.pem", "ssl.keystore.location",
    "sasl.oauthbearer.assertion.private.key.file", "sasl.oauthbearer.client.id", "bearer.auth.credentials.source",
    "spark.hadoop.fs.s3a.aws.credentials.provider", "spark.hadoop.fs.s3a.endpoint", "key.serializer",
])
def test_ordinary_property_names_are_not_secrets(key):
    from mirror_core.redaction import is_secret_key

    assert not is_secret_key(key)


# --------------------------------------------------------------------------- registry URLs a parser might misread

#: passwords with what once ended the redaction early: a quote, an unencoded ``@``; and a plain one
TRICKY_PASSWORDS = ["Le4k'Tail9", 'Le4k"Tail9', "Le4k@Tail9", "Le4kTail9"]


def _leaks(pw: str, text: str) -> list[str]:
    """The pieces of ``pw`` (split at its quote, ``@``, ``/``, ``?`` or ``#``) that ``text`` shows."""
    import re

    return [part for part in re.split(r"['\"@/?#]", pw) if part in text]


def _formatted(message: str) -> str:
    from mirror_core.redaction import RedactingFormatter

    record = logging.LogRecord("mirror_core.test", logging.ERROR, __file__, 1, "%s", (message,), None)
    return RedactingFormatter("%(message)s").format(record)


@pytest.mark.parametrize("pw", TRICKY_PASSWORDS)
def test_registry_url_passwords_with_quotes_or_at_signs_never_show(pw, tmp_path):
    """A registry URL's password, whatever it holds, is in none of: str/repr of SecretUrl, the repr and dumps of
    its config, the tls_context error, a log line through the formatter."""
    from mirror_core.errors import SchemaMirrorError
    from mirror_core.registry import split_userinfo, tls_context

    url = f"https://svc:{pw}@reg.example:8081/apis"
    u = SecretUrl(url)
    cfg = SchemaRegistryConfig.model_validate({"url": url, "ssl.ca.location": str(tmp_path / "missing.pem")})
    with pytest.raises(SchemaMirrorError) as err:
        tls_context(cfg)
    shown = [str(u), repr(u), u.display, repr(cfg), cfg.model_dump_json(), str(err.value),
             _formatted(f"GET {url} failed"), _formatted(f"failed: {cfg!r} {(url,)!r}")]
    for text in shown:
        assert _leaks(pw, text) == [], text
    assert "reg.example:8081/apis" in str(u) and "reg.example:8081" in str(err.value)
    assert cfg.url.get_secret_value() == url and split_userinfo(url)[1] == ("svc", pw)  # the client still has it


@pytest.mark.parametrize("pw", TRICKY_PASSWORDS)
@pytest.mark.parametrize("form", ["svc:{pw}@reg.example:8081", "https//svc:{pw}@reg.example:8081",
                                  "ftp://svc:{pw}@reg.example:8081"])
def test_a_malformed_registry_url_is_not_echoed(pw, form):
    """A URL without ``scheme://`` (or with a typo in it) is named by its field and host only: in the config
    error (CLI stderr, the DAG import error), pydantic's own error, str/repr of a SecretUrl holding it, a log
    line through the formatter."""
    from mirror_core.config import parse_config
    from mirror_core.errors import ConfigError

    bad = form.format(pw=pw)
    raw = {"clusters": {"a": {"kafka": {"bootstrap.servers": "b:9092"}, "schema_registry": {"url": bad}},
                        "b": {"kafka": {"bootstrap.servers": "c:9092"}}},
           "groups": [{"name": "g", "source": "a", "destination": "b", "mirrors": [{"source_topic": "t"}]}]}
    with pytest.raises(ConfigError) as err:
        parse_config(raw, env={})
    with pytest.raises(ValueError) as direct:
        SchemaRegistryConfig(url=bad)
    text = str(err.value)
    assert "clusters.a.schema_registry.url" in text and "reg.example:8081" in text
    for shown in (text, str(direct.value), str(SecretUrl(bad)), repr(SecretUrl(bad)), _formatted(text)):
        assert _leaks(pw, shown) == [], shown


@pytest.mark.parametrize("pw", ["Le4k/Tail9", "Le4k?Tail9", "Le4k#Tail9", "Le4k/Ta@il9"])
def test_a_registry_password_with_an_unencoded_slash_is_refused_and_never_shown(pw):
    """A ``/``, ``?`` or ``#`` in a URL's password ends its host for every URL parser: the client would call a
    host named after the password's first part, and its error ("Invalid port: 'Le4k'") showed that part. The
    config refuses such a URL, naming its field and host, and asks for the percent-encoded form, which works;
    a log line holding the raw URL shows none of the password."""
    from urllib.parse import quote

    from mirror_core.config import parse_config
    from mirror_core.errors import ConfigError
    from mirror_core.registry import split_userinfo

    def raw(url: str) -> dict:
        return {"clusters": {"a": {"kafka": {"bootstrap.servers": "b:9092"}, "schema_registry": {"url": url}},
                             "b": {"kafka": {"bootstrap.servers": "c:9092"}}},
                "groups": [{"name": "g", "source": "a", "destination": "b", "mirrors": [{"source_topic": "t"}]}]}

    url = f"https://svc:{pw}@reg.example:8081/apis/ccompat/v7"
    with pytest.raises(ConfigError) as err:
        parse_config(raw(url), env={})
    text = str(err.value)
    assert "clusters.a.schema_registry.url" in text and "percent-encoded" in text and "'/' as %2F" in text
    assert "reg.example:8081" in text
    for shown in (text, str(SecretUrl(url)), repr(SecretUrl(url)), _formatted(f"GET {url} failed"),
                  _formatted(f"failed: {(url,)!r}")):
        assert _leaks(pw, shown) == [], shown
    encoded = f"https://svc:{quote(pw, safe='')}@reg.example:8081/apis/ccompat/v7"
    cfg = parse_config(raw(encoded), env={})
    reg = cfg.clusters["a"].schema_registry
    assert reg is not None and split_userinfo(reg.url.get_secret_value())[1] == ("svc", pw)
    assert str(reg.url) == "https://reg.example:8081/apis/ccompat/v7"


def test_a_url_whose_path_holds_an_at_sign_is_shown_without_it():
    """The text redaction runs to the last ``@`` of a URL: one with an ``@`` in its path loses its host too
    (shown less, never more); an ``@`` after a blank is another word's."""
    assert redact_text("GET https://reg:8081/subjects/a@b.c failed") == "GET https://b.c failed"
    assert redact_text("https://u:p@reg:8081/x, mail ops@example.com") == "https://reg:8081/x, mail ops@example.com"


@pytest.mark.parametrize(("variable", "level"), [(None, logging.WARNING), ("DEBUG", logging.DEBUG),
                                                 ("info", logging.INFO)])
def test_the_library_log_level_variable_opens_the_libraries_up(monkeypatch, variable, level):
    """README: chatty libraries stay at WARNING; ``MIRRORFLOW_LIBRARY_LOG_LEVEL=DEBUG`` opens them up (still
    redacted), and leaves mirrorflow's own level as it was."""
    libraries = ("httpx", "httpcore", "py4j", "urllib3", "librdkafka")
    if variable is None:
        monkeypatch.delenv("MIRRORFLOW_LIBRARY_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("MIRRORFLOW_LIBRARY_LOG_LEVEL", variable)
    buf = io.StringIO()
    root = logging.getLogger()
    before = list(root.handlers)
    levels = {name: logging.getLogger(name).level for name in (*libraries, "mirror_core")}
    try:
        setup_logging(verbose=False, stream=buf)
        assert {name: logging.getLogger(name).getEffectiveLevel() for name in libraries} == \
            dict.fromkeys(libraries, level)
        assert logging.getLogger("mirror_core").getEffectiveLevel() == logging.INFO
        logging.getLogger("httpx").debug("HTTP Request: GET %s", URL)
        out = buf.getvalue()
        assert ("HTTP Request: GET https://registry.example" in out) == (level == logging.DEBUG), out
        assert "s3cr3t-pw" not in out
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
        for name, old in levels.items():
            logging.getLogger(name).setLevel(old)
