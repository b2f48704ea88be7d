"""Strimzi KafkaMirrorMaker2 and MirrorMaker 1 -> mirrorflow."""

from __future__ import annotations

from importer_samples import (
    FIXTURES,
    assert_excerpt,
    fixture_text,
    load,
    mm1_import,
    printed_lines,
    readme_section,
    run_import,
)

from mirror_core.config import resolve_mirrors
from mirror_core.importers import import_config


def test_strimzi_bidirectional_two_groups_with_secret_references():
    res = run_import("strimzi", "strimzi-bidirectional.yaml")
    cfg = load(res)
    assert [g.name for g in cfg.groups] == ["es-1-to-es-2", "es-2-to-es-1"]
    fwd, back = cfg.groups
    assert (fwd.source, fwd.destination, back.source, back.destination) == ("es-1", "es-2", "es-2", "es-1")
    es1 = cfg.clusters["es-1"].kafka_properties()
    assert es1["security.protocol"] == "SASL_SSL" and es1["sasl.mechanism"] == "SCRAM-SHA-512"
    assert es1["sasl.username"] == "es-1-mm2-user"
    assert es1["sasl.password"] == "value-of-ES_1_SASL_PASSWORD"
    assert es1["ssl.ca.location"] == "value-of-ES_1_SSL_CA_LOCATION"
    what = dict(res.env_vars)
    assert "secret es-1-mm2-user" in what["ES_1_SASL_PASSWORD"] and "es-1-cluster-ca-cert" in what["ES_1_SSL_CA_LOCATION"]
    # prefix policy both ways: es-1's orders arrive on es-2 as es-1.orders and are never mirrored back
    from mirror_core.policy import build_replication_policy

    flow = resolve_mirrors(back)[0].topics
    assert flow is not None and flow.matches("orders") and flow.matches("customers") and not flow.matches("refunds")
    assert build_replication_policy(back).topic_source("es-1.orders") == "es-1"
    assert fwd.replication_policy == "prefix" and fwd.offsets.sync_group_offsets and fwd.offsets.interval == 30.0
    assert fwd.topics_mirroring.sync_acls is False and fwd.topics_mirroring.replication_factor.value == 3
    wheres = [f.where for f in res.findings]
    for w in ("spec.replicas", "spec.resources", "spec.connectCluster", "spec.mirrors[0].sourceConnector.tasksMax",
              "spec.clusters[1].config.config.storage.replication.factor",
              "spec.mirrors[0].heartbeatConnector.config.heartbeats.topic.replication.factor"):
        assert w in wheres
        assert f"# {w}: " in res.yaml_text


def test_the_readmes_strimzi_example_shows_what_the_import_prints_and_writes():
    """README, *Strimzi*: its sample imported as ``kmm2.yaml`` prints the lines the README shows, in that
    order (the README leaves runs out with ``...``), and the YAML it shows is the written file's lines."""
    section = readme_section("### Strimzi (`strimzi`, a `KafkaMirrorMaker2` resource)")
    shown = section[section.index("```\n$ mirrorflow import strimzi kmm2.yaml -o mirrors.yaml\n"):]
    shown = shown[shown.index("\n") + 1:]
    shown = shown[shown.index("\n") + 1:shown.index("```")]
    written = section[section.index("```yaml\n") + len("```yaml\n"):]
    written = written[:written.index("```")]
    res = import_config("strimzi", fixture_text("strimzi-bidirectional.yaml"), "kmm2.yaml")
    assert len(shown.splitlines()) >= 6 and len(written.splitlines()) >= 15
    assert_excerpt(shown, printed_lines(res, "kmm2.yaml"))
    assert_excerpt(written, res.yaml_text.splitlines())
    load(res)  # and what it writes validates


def test_strimzi_tls_client_auth_maps_to_file_placeholders():
    text = fixture_text("strimzi-bidirectional.yaml").replace(
        """      authentication:
        type: scram-sha-512
        username: es-1-mm2-user
        passwordSecret:
          secretName: es-1-mm2-user
          password: password
""", """      authentication:
        type: tls
        certificateAndKey: {secretName: mm2-user, certificate: user.crt, key: user.key}
""")
    res = import_config("strimzi", text, "kmm2.yaml")
    props = load(res).clusters["es-1"].kafka_properties()
    assert props["security.protocol"] == "SSL"
    assert props["ssl.certificate.location"] == "value-of-ES_1_SSL_CERTIFICATE_LOCATION"
    assert props["ssl.key.location"] == "value-of-ES_1_SSL_KEY_LOCATION"


def test_strimzi_identity_policy_and_broker_default_replication_factor():
    text = fixture_text("strimzi-bidirectional.yaml").replace(
        "          replication.factor: 3\n          offset-syncs",
        '          replication.factor: -1\n          replication.policy.separator: ""\n'
        '          replication.policy.class: "io.strimzi.kafka.connect.mirror.IdentityReplicationPolicy"\n'
        "          offset-syncs", 1)
    res = import_config("strimzi", text, "kmm2.yaml")
    fwd = load(res).groups[0]
    assert fwd.replication_policy == "identity"
    assert fwd.topics_mirroring.replication_factor.type == "mirror_source"
    assert "spec.mirrors[0].sourceConnector.config.replication.factor" in [f.where for f in res.findings]


def test_mm1_maps_both_files_and_keeps_the_group():
    res = mm1_import()
    cfg = load(res)
    g = cfg.groups[0]
    m = resolve_mirrors(g)[0]
    assert m.consumer_group == "mm1-dc1-to-dc2"
    assert m.topics is not None and m.topics.matches("orders-x") and m.topics.matches("payments.a")
    assert not m.topics.matches("refunds")
    assert g.replication_policy == "identity"
    src = cfg.clusters[g.source].kafka_properties()
    assert src["sasl.mechanism"] == "SCRAM-SHA-256" and src["sasl.username"] == "mirror"
    assert "dc1-Pa55word" not in res.yaml_text
    dst = cfg.clusters[g.destination].kafka_properties()
    assert dst["linger.ms"] == "10" and dst["compression.type"] == "lz4"
    found = {(f.file, f.where) for f in res.findings}
    assert (None, "exclude.internal.topics") in found and (None, "partition.assignment.strategy") in found
    assert (str(FIXTURES / "mm1-producer.properties"), "buffer.memory") in found
    assert "# mm1-producer.properties: buffer.memory: " in res.yaml_text
    assert "First run: MirrorMaker 1 committed its progress" in res.yaml_text


def test_mm1_whitelist_is_a_plain_regex_too():
    m = resolve_mirrors(load(mm1_import(include="clicks|views")).groups[0])[0]
    assert m.topics is not None and m.topics.matches("views") and not m.topics.matches("clicks2")


def test_mm1_cli_takes_the_whitelist_from_mirror_makers_env_variable(tmp_path):
    from typer.testing import CliRunner

    from mirror_core.cli import app

    out = tmp_path / "m.yaml"
    res = CliRunner().invoke(app, ["import", "mm1", str(FIXTURES / "mm1-consumer.properties"), "--producer",
                                   str(FIXTURES / "mm1-producer.properties"), "-o", str(out)],
                             env={"MIRROR_MAKER_TOPIC_WHITELIST": "clicks.*"})
    assert res.exit_code == 0, res.output
    assert "include: clicks.*" in out.read_text()
    assert f"{FIXTURES / 'mm1-producer.properties'}: buffer.memory: " in res.stderr  # the producer's file named


_CR_HEAD = """apiVersion: kafka.strimzi.io/v1beta2
kind: KafkaMirrorMaker2
metadata: {name: m}
spec:
  connectCluster: b
  clusters:
  - {alias: a, bootstrapServers: "a:9092"}
  - alias: b
    bootstrapServers: "b:9092"
"""


def test_strimzi_runs_only_the_connectors_it_creates():
    """No sourceConnector: Strimzi's operator created no MirrorSourceConnector, so the mirror copied
    nothing; a missing or paused checkpoint / heartbeat connector wrote no checkpoints / heartbeats."""
    cr = _CR_HEAD + """  mirrors:
  - sourceCluster: a
    targetCluster: b
    sourceConnector: {}
    topicsPattern: "orders.*"
  - sourceCluster: b
    targetCluster: a
    checkpointConnector: {}
    heartbeatConnector: {}
  - sourceCluster: a
    targetCluster: b
    sourceConnector: {state: stopped}
    checkpointConnector: {pause: true}
    heartbeatConnector: {state: paused}
"""
    res = import_config("strimzi", cr, "mm2.yaml")
    cfg = load(res)
    copy, none, stopped = cfg.groups
    assert copy.enabled and not copy.offsets.emit_checkpoints and not copy.offsets.sync_group_offsets
    assert not copy.heartbeats.enabled
    assert not none.enabled and none.offsets.emit_checkpoints and none.heartbeats.enabled
    assert not stopped.enabled and not stopped.offsets.emit_checkpoints and not stopped.heartbeats.enabled
    assert "spec.mirrors[1].sourceConnector is not set" in res.yaml_text
    assert "spec.mirrors[2].sourceConnector.state is stopped" in res.yaml_text
    assert not [f for f in res.findings if "state" in f.where or "pause" in f.where]


def test_mm1_include_is_normalised_as_mirrormaker_1_did():
    """kafka.utils IncludeList: ',' -> '|', spaces and surrounding quotes removed, then a full match."""
    for include in ("orders.* | payments.*", '"orders.*,payments.*"', "(orders,payments)\\..*"):
        res = mm1_import(include=include)
        flow = resolve_mirrors(load(res).groups[0])[0].topics
        assert flow is not None and flow.matches("orders.x") and flow.matches("payments.y"), include
        assert not flow.matches("refunds")
        assert "MirrorMaker 1 read --include" in res.yaml_text


def test_mm1_cli_takes_the_regex_as_include_or_as_mirror_makers_whitelist(tmp_path):
    """The README's `--include / --whitelist`: both option names give the flow its regex."""
    from typer.testing import CliRunner

    from mirror_core.cli import app

    for option in ("--include", "--whitelist"):
        out = tmp_path / f"{option.strip('-')}.yaml"
        res = CliRunner().invoke(app, ["import", "mm1", str(FIXTURES / "mm1-consumer.properties"), "--producer",
                                       str(FIXTURES / "mm1-producer.properties"), option, "views|clicks", "-o",
                                       str(out)], env={"MIRROR_MAKER_TOPIC_WHITELIST": None})
        assert res.exit_code == 0, (option, res.output)
        assert "include: views|clicks" in out.read_text(), option
