"""mm2.properties -> mirrorflow: what maps, what is reported, and that secrets never reach the output."""

from __future__ import annotations

import re

import pytest
from importer_samples import fixture_text, load, printed_lines, readme_section, run_import

from mirror_core.config import resolve_mirrors
from mirror_core.errors import ConfigError
from mirror_core.importers import import_config

SECRET = "s3cr3t-Cloud-Passw0rd"


def _imp(text: str):
    return import_config("mm2", text, "mm2.properties")


BASE = """clusters = A, B
A.bootstrap.servers = a:9092
B.bootstrap.servers = b:9092
A->B.enabled = true
"""


def test_sample_maps_two_flows_with_security():
    res = run_import("mm2", "mm2.properties")
    cfg = load(res)
    assert sorted(g.name for g in cfg.groups) == ["cloud-to-onprem", "onprem-to-cloud"]
    cloud = cfg.clusters["cloud"].kafka_properties()
    assert cloud["security.protocol"] == "SASL_SSL" and cloud["sasl.mechanism"] == "PLAIN"
    assert cloud["sasl.username"] == "mm2-service"
    assert cloud["sasl.password"] == "value-of-CLOUD_SASL_PASSWORD"
    assert cloud["linger.ms"] == "20" and cloud["compression.type"] == "zstd"
    onprem = cfg.clusters["onprem"].kafka_properties()
    assert onprem["ssl.ca.location"] == "/etc/mm2/onprem-ca.pem"
    assert onprem["ssl.endpoint.identification.algorithm"] == "none"
    g = cfg.group("onprem-to-cloud")
    assert g.replication_policy == "prefix" and g.delivery == "exactly_once"
    assert g.spark.source_options == {"kafka.max.poll.records": "2000"}
    assert g.topics_mirroring.replication_factor.value == 3 and g.topics_mirroring.sync_acls is False
    flow = resolve_mirrors(g)[0].topics
    assert flow is not None
    assert flow.matches("orders-eu") and flow.matches("payments.card")
    assert not flow.matches("payments.card.tmp") and not flow.matches("returns")
    assert g.offsets.sync_group_offsets is False and g.offsets.interval == 10.0
    assert g.offsets.groups.matches("billing") and not g.offsets.groups.matches("test-1")
    assert not g.offsets.groups.matches("x.mirrorflow.y")  # mirrorflow's own groups
    assert g.checkpoints_topic == "onprem.checkpoints.internal"  # the topic MM2 wrote
    back = cfg.group("cloud-to-onprem")
    assert back.offsets.sync_group_offsets is True  # the per-flow override wins
    assert resolve_mirrors(back)[0].topics.matches("returns")  # type: ignore[union-attr]
    assert g.heartbeats.interval == 5.0


def test_secrets_become_placeholders_and_are_never_printed():
    res = run_import("mm2", "mm2.properties")
    assert SECRET not in res.yaml_text
    assert "${CLOUD_SASL_PASSWORD}" in res.yaml_text
    assert all(SECRET not in str(f) for f in res.findings)
    assert dict(res.env_vars).keys() == {"CLOUD_SASL_PASSWORD"}


def test_unmapped_keys_are_a_comment_and_a_finding_each():
    res = run_import("mm2", "mm2.properties")
    wheres = [f.where for f in res.findings]
    for key in ("tasks.max", "checkpoints.topic.replication.factor", "config.storage.replication.factor"):
        assert wheres.count(key) == 1, wheres
        assert re.search(rf"^\s*# {re.escape(key)}: ", res.yaml_text, re.M), key


def test_unknown_and_secret_keys_are_reported_without_their_value():
    res = _imp(BASE + "made.up.setting = 42\nB.ssl.truststore.password = hunter2\nB.some.token = tok-123\n")
    text = "\n".join(str(f) for f in res.findings) + res.yaml_text
    assert "made.up.setting: value '42'" in text
    assert "hunter2" not in text and "tok-123" not in text
    assert any(f.where == "B.some.token" and "secret" in f.message for f in res.findings)
    assert any(f.where == "B.ssl.truststore.password" for f in res.findings)


@pytest.mark.parametrize(("lines", "policy", "dst_name"), [
    ("", "prefix", "A.orders"),  # MM2's default is the prefix policy
    ("replication.policy.class = org.apache.kafka.connect.mirror.DefaultReplicationPolicy\n"
     "replication.policy.separator = _\n", "prefix", "A_orders"),
    ("replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n", "identity", "orders"),
])
def test_replication_policy_maps(lines, policy, dst_name):
    from mirror_core.policy import build_replication_policy

    g = load(_imp(BASE + lines)).groups[0]
    assert g.replication_policy == policy
    assert build_replication_policy(g).format_remote_topic("A", "orders") == dst_name


def test_custom_policy_is_reported():
    res = _imp(BASE + "replication.policy.class = com.example.MyPolicy\n")
    assert any(f.where == "replication.policy.class" and "custom policy" in f.message for f in res.findings)


def test_defaults_are_mm2s_not_mirrorflows():
    g = load(_imp(BASE)).groups[0]
    assert g.delivery == "at_least_once"  # exactly.once.source.support defaults to disabled
    assert g.offsets.sync_group_offsets is False and g.offsets.interval == 60.0
    assert g.topics_mirroring.sync_acls is True and g.topics_mirroring.replication_factor.value == 2
    flow = resolve_mirrors(g)[0].topics
    assert flow is not None and flow.matches("x") and not flow.matches("x.replica")
    assert not g.offsets.groups.matches("console-consumer-1") and not g.offsets.groups.matches("connect-x")


def test_file_wide_client_settings_apply_to_every_cluster():
    cfg = load(_imp(BASE + "security.protocol = SSL\nssl.truststore.type = PEM\nssl.truststore.location = /ca.pem\n"
                    "B.security.protocol = PLAINTEXT\n"))
    assert cfg.clusters["A"].kafka_properties()["security.protocol"] == "SSL"
    assert cfg.clusters["A"].kafka_properties()["ssl.ca.location"] == "/ca.pem"
    assert cfg.clusters["B"].kafka_properties()["security.protocol"] == "PLAINTEXT"


def test_flow_without_enabled_is_kept_disabled():
    res = _imp(BASE + "B->A.topics = x\n")
    cfg = load(res)
    assert cfg.group("B-to-A").enabled is False and cfg.group("A-to-B").enabled is True
    assert "MM2 runs no such flow by default" in res.yaml_text


def test_jks_stores_go_to_java_kafka_and_are_reported():
    res = _imp(BASE + "A.security.protocol = SSL\nA.ssl.truststore.location = /t.jks\nA.ssl.truststore.password = tpw\n"
               "A.ssl.keystore.location = /k.jks\nA.ssl.keystore.password = kpw\nA.ssl.key.password = keypw\n")
    a = load(res).clusters["A"]
    assert "ssl.ca.location" not in a.kafka_properties()  # librdkafka cannot read JKS: never guessed
    assert a.java_kafka_properties() == {
        "ssl.truststore.location": "/t.jks", "ssl.truststore.type": "JKS",
        "ssl.truststore.password": "value-of-A_SSL_TRUSTSTORE_PASSWORD",
        "ssl.keystore.location": "/k.jks", "ssl.keystore.type": "JKS",
        "ssl.keystore.password": "value-of-A_SSL_KEYSTORE_PASSWORD", "ssl.key.password": "value-of-A_SSL_KEY_PASSWORD"}
    assert sorted(f.where for f in res.findings) == ["A.ssl.keystore.location", "A.ssl.truststore.location"]
    assert not any(pw in res.yaml_text for pw in ("tpw", "kpw", "keypw"))


def test_oauthbearer_client_credentials_map_to_librdkafkas_oidc():
    res = _imp(BASE + "B.security.protocol = SASL_SSL\nB.sasl.mechanism = OAUTHBEARER\n"
               "B.sasl.oauthbearer.token.endpoint.url = https://idp.example/token\n"
               "B.sasl.login.callback.handler.class = "
               "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n"
               'B.sasl.jaas.config = org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
               'clientId="mm2" clientSecret="oauth-S3cret" scope="kafka";\n')
    b = load(res).clusters["B"].kafka_properties()
    assert b["sasl.oauthbearer.method"] == "oidc" and b["sasl.oauthbearer.client.id"] == "mm2"
    assert b["sasl.oauthbearer.scope"] == "kafka" and b["sasl.oauthbearer.token.endpoint.url"] == "https://idp.example/token"
    assert b["sasl.oauthbearer.client.secret"] == "value-of-B_SASL_OAUTHBEARER_CLIENT_SECRET"
    assert "oauth-S3cret" not in res.yaml_text and res.findings == ()


def test_pkcs12_keystore_maps_with_placeholders():
    res = _imp(BASE + "A.ssl.keystore.type = PKCS12\nA.ssl.keystore.location = /k.p12\nA.ssl.keystore.password = kpw\n"
               "A.ssl.key.password = keypw\n")
    props = load(res).clusters["A"].kafka_properties()
    assert props["ssl.keystore.location"] == "/k.p12"
    assert props["ssl.keystore.password"] == "value-of-A_SSL_KEYSTORE_PASSWORD"
    assert "kpw" not in res.yaml_text and "keypw" not in res.yaml_text


def test_exactly_once_and_offset_syncs_location():
    res = _imp(BASE + "exactly.once.source.support = enabled\noffset-syncs.topic.location = target\n")
    assert load(res).groups[0].delivery == "exactly_once"
    assert not any("offset-syncs" in f.where for f in res.findings)
    res = _imp(BASE + "offset-syncs.topic.location = source\n")
    assert [f.where for f in res.findings] == ["offset-syncs.topic.location"]


def test_output_is_byte_stable_and_reparses():
    a = run_import("mm2", "mm2.properties").yaml_text
    b = import_config("mm2", fixture_text("mm2.properties"), "elsewhere/mm2.properties").yaml_text
    assert a == b


def test_the_readmes_example_prints_what_the_import_prints():
    """README, *MirrorMaker 2*: its sample (an excerpt is shown, the whole is the fixture it links to), imported
    as ``mm2.properties``, prints exactly the lines the README says (`mirrorflow import` prints each finding and
    each placeholder's note, in that order), and the excerpt is the sample's own lines."""
    section = readme_section("### MirrorMaker 2 (`mm2`, dedicated mode)")
    props = section[section.index("```properties\n") + len("```properties\n"):]
    props = props[:props.index("```")]
    printed = section[section.index("-o mirrors.yaml` prints\n\n```\n") + len("-o mirrors.yaml` prints\n\n```\n"):]
    printed = printed[:printed.index("```")]
    sample = fixture_text("mm2.properties")
    for line in props.splitlines():  # the excerpt shows the sample's lines (its password elided)
        assert line.split("password=")[0] in sample, line
    lines = printed_lines(import_config("mm2", sample, "mm2.properties"), "mm2.properties")
    assert lines == printed.splitlines()


def test_blank_topics_and_groups_match_nothing_as_in_mm2():
    """``topics =`` (blank) is not unset: Kafka compiles no pattern for it and mirrors no topic."""
    cfg = load(_imp(BASE + "A->B.topics =\nA->B.groups = \n"))
    g = cfg.groups[0]
    flow = resolve_mirrors(g)[0].topics
    assert flow is not None and not flow.matches("orders") and not flow.matches("a")
    assert not g.offsets.groups.matches("billing")
    unset = load(_imp(BASE)).groups[0]
    assert resolve_mirrors(unset)[0].topics.matches("orders")  # type: ignore[union-attr]
    assert unset.offsets.groups.matches("billing")


def test_strimzi_blank_topics_pattern_matches_nothing():
    cr = """apiVersion: kafka.strimzi.io/v1beta2
kind: KafkaMirrorMaker2
metadata: {name: m}
spec:
  clusters: [{alias: a, bootstrapServers: "a:9092"}, {alias: b, bootstrapServers: "b:9092"}]
  mirrors: [{sourceCluster: a, targetCluster: b, sourceConnector: {}, topicsPattern: ""}]
"""
    res = import_config("strimzi", cr, "mm2.yaml")
    flow = resolve_mirrors(load(res).groups[0])[0].topics
    assert flow is not None and not flow.matches("orders")
    assert "spec.mirrors[0].topicsPattern is blank" in res.yaml_text


def test_values_with_url_credentials_or_private_keys_are_not_echoed():
    res = _imp(BASE + "A.schema.registry.url = https://svc:Sr-s3cret@sr:8081\n"
               "A->B.some.setting = -----BEGIN RSA PRIVATE KEY-----MIIEsecretkey-----END RSA PRIVATE KEY-----\n"
               "A.consumer.ssl.private.key = PKsecret\n")
    seen = "\n".join([res.yaml_text, *map(str, res.findings)])
    assert "Sr-s3cret" not in seen and "MIIEsecretkey" not in seen and "PKsecret" not in seen
    assert any(f.where == "A.schema.registry.url" and "https://sr:8081" in f.message for f in res.findings)


def test_exactly_once_on_the_target_cluster_decides_delivery():
    """The Kafka docs enable EOS as ``<target>.exactly.once.source.support``: the worker of A->B reads B's."""
    res = _imp(BASE + "B->A.enabled = true\nB.exactly.once.source.support = enabled\n")
    cfg = load(res)
    assert cfg.group("A-to-B").delivery == "exactly_once"
    assert cfg.group("B-to-A").delivery == "at_least_once"  # A's worker had it disabled
    assert not [f for f in res.findings if "exactly.once" in f.where]
    over = load(_imp(BASE + "B.exactly.once.source.support = enabled\nA->B.exactly.once.source.support = disabled\n"))
    assert over.groups[0].delivery == "at_least_once"  # the per-flow setting wins


def test_strimzi_exactly_once_in_the_target_cluster_config():
    cr = """apiVersion: kafka.strimzi.io/v1beta2
kind: KafkaMirrorMaker2
metadata: {name: m}
spec:
  clusters:
  - {alias: a, bootstrapServers: "a:9092"}
  - {alias: b, bootstrapServers: "b:9092", config: {exactly.once.source.support: enabled}}
  mirrors: [{sourceCluster: a, targetCluster: b, sourceConnector: {}}]
"""
    res = import_config("strimzi", cr, "mm2.yaml")
    assert load(res).groups[0].delivery == "exactly_once"
    assert not [f for f in res.findings if "exactly.once" in f.where]


def test_custom_separator_tells_that_the_checkpoints_topic_changes():
    """MM2's DefaultReplicationPolicy named it <src><sep>checkpoints<sep>internal; mirrorflow's is fixed."""
    res = _imp(BASE + "A->B.replication.policy.separator = _\n")
    g = load(res).groups[0]
    assert g.checkpoints_topic == "A.checkpoints.internal"
    found = [f for f in res.findings if f.where == "A->B.replication.policy.separator"]
    assert found and "A_checkpoints_internal" in found[0].message and "A.checkpoints.internal" in found[0].message
    assert "checkpoints go to A.checkpoints.internal on B, as MM2's did" not in res.yaml_text
    ident = _imp(BASE + "replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy\n"
                 "replication.policy.separator = -\n")
    assert "not used by the identity policy" not in ident.yaml_text
    assert any("A-checkpoints-internal" in f.message for f in ident.findings)
    off = _imp(BASE + "A->B.replication.policy.separator = _\n"
               "A->B.replication.policy.internal.topic.separator.enabled = false\n")
    assert "checkpoints go to A.checkpoints.internal on B, as MM2's did" in off.yaml_text


def test_java_inline_flags_apply_to_later_items_as_in_java():
    """``(?i)a.*, b.*`` is Java's ``(?i)a.*|b.*``: both alternatives ignore case."""
    g = load(_imp(BASE + "A->B.topics = x.*, (?i)orders.*, payments.*\n")).groups[0]
    flow = resolve_mirrors(g)[0].topics
    assert flow is not None and flow.matches("ORDERS.eu") and flow.matches("Payments.card")
    assert flow.matches("x1") and not flow.matches("X1")  # before the flag: case kept


@pytest.mark.parametrize(("topics", "problem"), [
    ("[a-z&&[^x]]+", "Java-only construct"),
    ("orders(?i)x", "inline flag"),
    ("(?d)orders", "inline flag(s) d"),
])
def test_java_only_regex_is_an_error_naming_the_input_key(topics, problem):
    with pytest.raises(ConfigError) as info:
        _imp(BASE + f"A->B.topics = {topics}\n")
    assert info.value.issues[0].path == "A->B.topics" and problem in info.value.issues[0].message


def test_jaas_quoted_values_are_unescaped_as_java_reads_them():
    from mirror_core.importers.javaclient import translate

    m = translate({"sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                       'username="CORP\\\\svc\\"x" password="p\\"w";'}, "A")
    assert m.cluster["sasl.username"] == 'CORP\\svc"x'
    assert "password" not in str(m.cluster) and 'p"w' not in str(m)
