"""Malformed input: one line naming the file, the key or line, and the problem; exit 2 on the CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from importer_samples import FIXTURES, fixture_text
from typer.testing import CliRunner

from mirror_core.cli import app
from mirror_core.errors import ConfigError
from mirror_core.importers import import_config

MM2 = """clusters = A, B
A.bootstrap.servers = a:9092
B.bootstrap.servers = b:9092
A->B.enabled = true
"""
EDN_M = '{:source {:topic {:topic-name "a"}} :destination {:topic {:topic-name "b"}} :serdes [:string :avro]}'


def edn(mirror: str = EDN_M, group: str = "", top: str = "") -> str:
    return (f'{{:groups [{{:group-id-prefix "p" {group}\n'
            ' :source {:kafka {:bootstrap.servers "s:9092"} :schema-registry-url "http://s-sr:8081"}\n'
            ' :destination {:kafka {:bootstrap.servers "d:9092"} :schema-registry-url "http://d-sr:8081"}\n'
            f' :mirrors [{mirror}]}}] {top}}}')


STRIMZI = fixture_text("strimzi-bidirectional.yaml")
CONNECTOR = ('{"connector.class": "org.apache.kafka.connect.mirror.MirrorSourceConnector", "source.cluster.alias": "A", '
             '"target.cluster.alias": "B", "source.cluster.bootstrap.servers": "a:1", "target.cluster.bootstrap.servers": "b:1"}')

CASES = [
    # (id, format, input, where, problem)
    ("mm2-no-clusters", "mm2", "A.bootstrap.servers = a:9092\n", "clusters", "missing"),
    ("mm2-empty-clusters", "mm2", "clusters =\n", "clusters", "lists no cluster alias"),
    ("mm2-bad-alias", "mm2", MM2.replace("clusters = A, B", "clusters = A, B.x"), "clusters", "alias 'B.x'"),
    ("mm2-no-bootstrap", "mm2", MM2.replace("B.bootstrap.servers = b:9092\n", ""), "B.bootstrap.servers", "missing"),
    ("mm2-undefined-cluster", "mm2", MM2 + "A->C.enabled = true\n", "A->C.enabled", "undefined cluster 'C'"),
    ("mm2-self-flow", "mm2", MM2 + "A->A.enabled = true\n", "A->A.enabled", "to itself"),
    ("mm2-enabled-not-bool", "mm2", MM2.replace("A->B.enabled = true", "A->B.enabled = yes"), "A->B.enabled",
     "expected true or false"),
    ("mm2-bad-topics-regex", "mm2", MM2 + "A->B.topics = orders, (unclosed\n", "A->B.topics", "invalid regex '(unclosed'"),
    ("mm2-bad-groups-regex", "mm2", MM2 + "groups.exclude = [z-a]\n", "groups.exclude", "invalid regex"),
    ("mm2-bad-interval", "mm2", MM2 + "emit.checkpoints.interval.seconds = ten\n", "emit.checkpoints.interval.seconds",
     "whole number"),
    ("mm2-bad-rf", "mm2", MM2 + "A->B.replication.factor = 0\n", "A->B.replication.factor", "at least 1"),
    ("mm2-bad-eos", "mm2", MM2 + "exactly.once.source.support = maybe\n", "exactly.once.source.support",
     "enabled, preparing or disabled"),
    ("mm2-bad-syncs-location", "mm2", MM2 + "offset-syncs.topic.location = middle\n", "offset-syncs.topic.location",
     "source or target"),
    ("mm2-no-flow", "mm2", "clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\n", "clusters",
     "no flow"),
    ("mm2-bad-unicode-escape", "mm2", MM2 + "x.y = \\u12zz\n", "line 5", "invalid \\u escape"),
    ("viooh-unclosed", "viooh", edn()[:-1], "line 4", "unexpected end of input"),
    ("viooh-stray-bracket", "viooh", edn().replace(':mirrors [', ':mirrors ]['), "line 4", "unexpected ']'"),
    ("viooh-empty", "viooh", "  ; nothing\n", "line 1", "empty"),
    ("viooh-not-a-map", "viooh", "[:groups]", "line 1", "expected a map"),
    ("viooh-two-forms", "viooh", edn() + "\n{:x 1}", "EDN", "2 top-level forms"),
    ("viooh-no-groups", "viooh", "{:topics-mirroring {}}", ":groups", "missing"),
    ("viooh-pre-groups-format", "viooh", "{:mirrors []}", ":mirrors", "pre-groups format"),
    ("viooh-no-topic", "viooh", edn(EDN_M.replace('{:topic-name "b"}', "{}")), ":groups[0] :mirrors[0] :destination :topic :topic-name",
     "missing"),
    ("viooh-bad-topic", "viooh", edn(EDN_M.replace('"b"', '"bad topic"')),
     ":groups[0] :mirrors[0] :destination :topic :topic-name", "invalid topic name"),
    ("viooh-unknown-serde", "viooh", edn(EDN_M.replace(":avro", ":json")), ":groups[0] :mirrors[0] :serdes",
     "unknown value serde 'json'"),
    ("viooh-serdes-shape", "viooh", edn(EDN_M.replace("[:string :avro]", "[:string]")), ":groups[0] :mirrors[0] :serdes",
     "[key-serde value-serde]"),
    ("viooh-bad-mode", "viooh", edn(group=":mirror-mode :loose"), ":groups[0] :mirror-mode", ":strict or :lenient"),
    ("viooh-bad-count-type", "viooh", edn(top=":topics-mirroring {:partition-count {:type :auto}}"),
     ":groups[0] :topics-mirroring :partition-count :type", ":fix or :mirror-source"),
    # (a :replication-factor {:type :fix} takes :value 3 from viooh's DEFAULT-CONFIG; a partition count has none)
    ("viooh-fix-without-value", "viooh", edn(top=":topics-mirroring {:partition-count {:type :fix}}"),
     ":groups[0] :topics-mirroring :partition-count", "needs :value"),
    ("viooh-min-above-max", "viooh", edn(top=":topics-mirroring {:partition-count {:type :mirror-source :min 9 :max 3}}"),
     ":groups[0] :topics-mirroring :partition-count", "above :max"),
    ("viooh-bad-registry-url", "viooh", edn().replace('"http://s-sr:8081"', '"s-sr:8081"'),
     ":groups[0] :source :schema-registry-url", "not an http(s) URL"),
    ("viooh-no-bootstrap", "viooh", edn().replace('{:bootstrap.servers "d:9092"}', "{}"),
     ":groups[0] :destination :kafka :bootstrap.servers", "missing"),
    ("viooh-bad-compat", "viooh", edn(EDN_M.replace('{:topic-name "b"}', '{:topic-name "b"} :force-subject-compatibility-level "SOMETIMES"')),
     ":groups[0] :mirrors[0] :destination :force-subject-compatibility-level", "expected one of NONE"),
    ("viooh-unknown-tag", "viooh", "{:groups\n #foo/bar [1]}", "line 2", "unknown tag #foo/bar"),
    ("strimzi-bad-yaml", "strimzi", "spec:\n  clusters: [\n", "line 3", "invalid YAML"),
    ("strimzi-wrong-kind", "strimzi", "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaConnect\nspec: {}\n", "kind",
     "no KafkaMirrorMaker2 resource in the file (kinds found: KafkaConnect)"),
    ("strimzi-undefined-target", "strimzi", STRIMZI.replace("targetCluster: es-1", "targetCluster: es-3"),
     "spec.mirrors[1].targetCluster", "undefined cluster 'es-3'"),
    ("strimzi-no-bootstrap", "strimzi", STRIMZI.replace("      bootstrapServers: es-2-kafka-bootstrap.eventstreams.svc:9093\n", ""),
     "spec.clusters[1].bootstrapServers", "missing"),
    ("strimzi-scram-no-secret", "strimzi", STRIMZI.replace("""        passwordSecret:
          secretName: es-1-mm2-user
          password: password
""", ""), "spec.clusters[0].authentication.passwordSecret", "secretName, password"),
    ("strimzi-unknown-auth", "strimzi", STRIMZI.replace("type: scram-sha-512", "type: kerberos", 1),
     "spec.clusters[0].authentication.type", "unknown type 'kerberos'"),
    ("strimzi-no-mirrors", "strimzi", STRIMZI[: STRIMZI.index("  mirrors:")], "spec.mirrors", "non-empty list"),
    ("unknown-format", "mm3", MM2, "FORMAT", "unknown format 'mm3'"),
    ("connect-bad-json", "mm2", '{"connector.class": "MirrorSourceConnector",\n "topics": }', "line 2", "invalid JSON"),
    ("connect-not-mm2", "mm2", '{"connector.class": "io.confluent.connect.replicator.ReplicatorSourceConnector"}',
     "connector.class", "not one of MirrorMaker 2's connectors"),
    ("connect-no-class", "mm2", '{"name": "x", "config": {"topics": "a.*"}}', "connector.class", "missing"),
    ("connect-bad-alias", "mm2", f'{CONNECTOR[:-1]}, "source.cluster.alias": "dc 1"}}', "source.cluster.alias",
     "cannot be used"),
    ("connect-same-alias", "mm2", f'{CONNECTOR[:-1]}, "source.cluster.alias": "B"}}', "target.cluster.alias",
     "same alias"),
    ("connect-no-bootstrap", "mm2", '{"connector.class": "MirrorSourceConnector", "target.cluster.bootstrap.servers": "b:1"}',
     "source.cluster.bootstrap.servers", "missing"),
    ("connect-list-value", "mm2", f'{CONNECTOR[:-1]}, "topics": ["a", "b"]}}', "topics", "expected a string"),
    ("connect-bad-eos", "mm2", f'{CONNECTOR[:-1]}, "exactly.once.support": "always"}}', "exactly.once.support",
     "required or requested"),
    ("connect-bad-bool", "mm2", f'{CONNECTOR[:-1]}, "sync.topic.acls.enabled": "no"}}', "sync.topic.acls.enabled",
     "true or false"),
    ("connect-extra-key", "mm2", f'{{"name": "x", "config": {CONNECTOR}, "state": "RUNNING"}}', "state",
     "not part of a connector config"),
]


@pytest.mark.parametrize(("fmt", "text", "where", "problem"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_input_names_file_key_and_problem(fmt, text, where, problem):
    with pytest.raises(ConfigError) as info:
        import_config(fmt, text, "in/put.file")
    exc = info.value
    assert exc.exit_code == 2 and exc.source == "in/put.file"
    assert len(exc.issues) == 1, exc.issues
    issue = exc.issues[0]
    assert issue.path == where
    assert problem in issue.message, issue.message
    assert "\n" not in str(issue)


def test_enough_malformed_cases():
    assert len(CASES) >= 20


MM1_ARGS = {"producer_text": fixture_text("mm1-producer.properties"), "producer_source": "p/producer.properties"}


@pytest.mark.parametrize(("kw", "source", "where", "problem"), [
    ({"producer_text": None, "include": "x"}, "c.properties", "--producer", "producer.properties"),
    (MM1_ARGS, "c.properties", "--include", "missing"),
    (MM1_ARGS | {"include": "a, b(("}, "c.properties", "--include", "invalid regex 'a|b(('"),
    (MM1_ARGS | {"include": "a", "producer_text": "acks=all\n"}, "p/producer.properties", "bootstrap.servers", "missing"),
])
def test_mm1_malformed(kw, source, where, problem):
    with pytest.raises(ConfigError) as info:
        import_config("mm1", fixture_text("mm1-consumer.properties"), "c.properties", **kw)
    assert info.value.source == source and info.value.issues[0].path == where
    assert problem in info.value.issues[0].message


def test_cli_malformed_is_one_line_exit_2_no_traceback(tmp_path):
    bad = tmp_path / "mm2.properties"
    bad.write_text(MM2 + "A->C.enabled = true\n")
    res = CliRunner().invoke(app, ["import", "mm2", str(bad)])
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [f"{bad}: A->C.enabled: flow names undefined cluster 'C' (clusters = A, B)"]
    assert "Traceback" not in res.output
    res = CliRunner().invoke(app, ["import", "mm2", str(tmp_path / "missing.properties")])
    assert res.exit_code == 2 and "cannot read" in res.stderr


def test_cli_writes_yaml_and_lists_findings_on_stderr(tmp_path):
    out = tmp_path / "mirrors.yaml"
    res = CliRunner().invoke(app, ["import", "mm2", str(FIXTURES / "mm2.properties"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    lines = res.stderr.splitlines()
    finding_lines = [ln for ln in lines if ln.startswith(str(FIXTURES / "mm2.properties"))]
    assert len(finding_lines) == 3 and any(": tasks.max: " in ln for ln in finding_lines)
    assert "note: set CLOUD_SASL_PASSWORD before running" in res.stderr
    res = CliRunner().invoke(app, ["validate", str(out)], env={"CLOUD_SASL_PASSWORD": "x"})
    assert res.exit_code == 0, res.output


@pytest.mark.parametrize(("fmt", "name", "extra"), [
    ("viooh", "viooh-readme.edn", []),
    ("mm2", "mm2.properties", []),
    ("strimzi", "strimzi-bidirectional.yaml", []),
    ("mm1", "mm1-consumer.properties",
     ["--producer", str(FIXTURES / "mm1-producer.properties"), "--include", "orders.*"]),
    ("mm2", "connect/mm2-source.json",
     [str(FIXTURES / "connect" / n) for n in ("mm2-checkpoint.json", "mm2-heartbeat.properties")]),
])
def test_same_input_same_bytes_across_processes(fmt, name, extra):
    """Two runs with different hash seeds print the same YAML (nothing depends on set/dict hashing)."""
    outs = []
    for seed in ("1", "2"):
        env = os.environ | {"PYTHONHASHSEED": seed}
        p = subprocess.run([sys.executable, "-m", "mirror_core.cli", "import", fmt, str(FIXTURES / name), *extra],
                           capture_output=True, env=env, timeout=120)
        assert p.returncode == 0, p.stderr.decode()
        outs.append(p.stdout)
    assert outs[0] == outs[1] and outs[0].startswith(b"# mirrorflow config imported from")


@pytest.mark.parametrize(("fmt", "text", "where", "problem"), [
    ("strimzi", "apiVersion: kafka.strimzi.io/v1beta2\nkind: KafkaMirrorMaker\nmetadata: {name: m}\n"
                "spec: {consumer: {bootstrapServers: 'a:9092', groupId: g}, producer: {bootstrapServers: 'b:9092'}, "
                "include: 'orders.*'}\n", "kind", "mirrorflow import mm1"),
])
def test_unsupported_inputs_say_what_they_are(fmt, text, where, problem):
    with pytest.raises(ConfigError) as info:
        import_config(fmt, text, "in.txt")
    assert info.value.issues[0].path == where and problem in info.value.issues[0].message


@pytest.mark.parametrize(("fmt", "inputs", "source", "where", "problem"), [
    ("mm2", [CONNECTOR, CONNECTOR], "two.json", "connector.class",
     "a second MirrorSourceConnector for A->B (also one.json)"),
    ("mm2", [CONNECTOR, MM2], "two.json", "clusters", "dedicated-mode mm2.properties among connector configs"),
    ("mm2", [MM2, MM2], "two.json", "INPUT", "several files only when they are connector configs"),
    ("strimzi", [STRIMZI, STRIMZI], "two.json", "INPUT", "strimzi reads one input file"),
])
def test_several_inputs_that_do_not_go_together(fmt, inputs, source, where, problem):
    first, second = inputs
    with pytest.raises(ConfigError) as info:
        import_config(fmt, first, "one.json", more=[(second, "two.json")])
    assert (info.value.source, info.value.issues[0].path) == (source, where)
    assert problem in info.value.issues[0].message, info.value.issues[0].message
