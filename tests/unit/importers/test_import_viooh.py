"""viooh-mirror EDN -> mirrorflow: names and consumer groups kept, group settings merged, what is reported."""

from __future__ import annotations

from importer_samples import load, run_import

from mirror_core.config import resolve_mirrors
from mirror_core.importers import import_config


def _imp(text: str, env: str = "local"):
    return import_config("viooh", text, "viooh.edn", viooh_env=env)


def _cfg(mirrors: str, group_extra: str = "", top_extra: str = "") -> str:
    return f"""{{:groups [{{:group-id-prefix "prod" {group_extra}
  :source {{:kafka {{:bootstrap.servers "src-1.example:9092"}} :schema-registry-url "http://src-sr:8081"}}
  :destination {{:kafka {{:bootstrap.servers "dst-1.example:9092"}} :schema-registry-url "http://dst-sr:8081"}}
  :mirrors [{mirrors}]}}] {top_extra}}}"""


M1 = '{:source {:topic {:topic-name "a"}} :destination {:topic {:topic-name "a_copy"}} :serdes [:string :avro]}'


def test_readme_example_maps():
    res = run_import("viooh", "viooh-readme.edn", viooh_env="prd")
    cfg = load(res)
    g = cfg.group("prod")
    assert (g.source, g.destination) == ("source", "destination")
    assert cfg.clusters["source"].schema_registry.url.get_secret_value() == "http://source-sr:8081"  # type: ignore[union-attr]
    m = resolve_mirrors(g)[0]
    # viooh's mirror name and consumer group are kept, so lag tools and offsets carry on
    assert m.name == "prod__source-topic__mirror_test_copy_4"
    assert m.consumer_group == "prd.viooh-mirror.prod__source-topic__mirror_test_copy_4"
    assert (m.source_topic, m.destination_topic) == ("source-topic", "mirror_test_copy_4")
    assert (m.settings.serdes.key, m.settings.serdes.value) == ("string", "avro")
    tm = m.settings.topics_mirroring
    assert tm.replication_factor.type == "fix" and tm.replication_factor.value == 3
    assert (tm.partition_count.type, tm.partition_count.min, tm.partition_count.max) == ("mirror_source", 3, 12)
    assert tm.sync_configs is False  # viooh copied no topic configs
    assert g.spark.source_options == {"kafka.max.partition.fetch.bytes": "1000000", "kafka.max.poll.records": "50000"}
    assert g.replication_policy == "identity" and g.heartbeats.enabled is False
    assert [f.where for f in res.findings] == [":metrics"]
    assert "# :metrics: " in res.yaml_text
    assert "First run: viooh-mirror committed its progress" in res.yaml_text
    assert "did not preserve partitions" in res.yaml_text


def test_mirror_overrides_and_explicit_names():
    mirrors = M1 + ''' {:name "special" :consumer-group-id "legacy-group" :mirror-mode :lenient
      :source {:topic {:topic-name "b"}}
      :destination {:topic {:topic-name "b"} :force-subject-compatibility-level "NONE"}
      :serdes [:string :string] :topics-mirroring {:partition-count {:type :fix :value 6}}}'''
    cfg = load(_imp(_cfg(mirrors, ":mirror-mode :strict")))
    a, b = resolve_mirrors(cfg.groups[0])
    assert a.name == "prod__a__a_copy" and a.consumer_group == "local.viooh-mirror.prod__a__a_copy"
    assert b.name == "prod__special" and b.consumer_group == "legacy-group"
    assert b.settings.mirror_mode == "lenient" and a.settings.mirror_mode == "strict"
    assert b.settings.force_subject_compatibility_level == "NONE"
    assert b.settings.topics_mirroring.partition_count.value == 6


def test_disabled_mirror_lands_in_a_disabled_group_with_its_name():
    mirrors = M1 + ' {:enabled false :source {:topic {:topic-name "c"}} :destination {:topic {:topic-name "c2"}} :serdes [:string :string]}'
    cfg = load(_imp(_cfg(mirrors)))
    on, off = cfg.groups
    assert on.enabled and not off.enabled
    assert resolve_mirrors(off)[0].name == "prod__c__c2"


def test_disabled_group_stays_disabled():
    cfg = load(_imp(_cfg(M1, ":enabled false")))
    assert cfg.groups[0].enabled is False


def test_ssl_helper_private_key_is_never_copied():
    pem = "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBg-----END PRIVATE KEY-----"
    text = _cfg(M1).replace('{:bootstrap.servers "src-1.example:9092"}',
                            f'{{:bootstrap.servers "src-1.example:9093" :security.protocol "SSL" :private-key "{pem}" '
                            ':cert-pem "CERT" :ca-cert-pem "CA"}')
    res = _imp(text)
    assert "MIIEvQIBADANBg" not in res.yaml_text
    props = load(res).clusters["src-1"].kafka_properties()
    assert props["ssl.key.pem"] == "value-of-SRC_1_SSL_KEY_PEM"
    assert props["ssl.certificate.pem"] == "CERT" and props["ssl.ca.pem"] == "CA"


def test_registry_basic_auth_becomes_a_placeholder():
    text = _cfg(M1).replace(':schema-registry-url "http://src-sr:8081"',
                            ':schema-registry-url "http://src-sr:8081" :schema-registry-configs '
                            '{:basic.auth.user.info "user:pa55" :basic.auth.credentials.source "USER_INFO"}')
    res = _imp(text)
    assert "pa55" not in res.yaml_text
    sr = load(res).clusters["src-1"].schema_registry
    assert sr is not None and sr.basic_auth_user_info is not None
    assert sr.basic_auth_user_info.get_secret_value() == "value-of-SRC_1_REGISTRY_AUTH"


def test_registry_url_credentials_become_a_placeholder():
    res = _imp(_cfg(M1).replace('"http://src-sr:8081"', '"https://reg-user:reg-Pa55@src-sr:8081/apis"'))
    assert "reg-Pa55" not in res.yaml_text and "reg-user" not in res.yaml_text
    sr = load(res).clusters["src-1"].schema_registry
    assert sr is not None and sr.url.get_secret_value() == "https://src-sr:8081/apis"
    assert sr.basic_auth_user_info is not None
    assert sr.basic_auth_user_info.get_secret_value() == "value-of-SRC_1_REGISTRY_AUTH"


def test_unmapped_settings_are_reported_at_every_level():
    text = _cfg(M1.replace(":serdes", ":poll-interval 500 :serdes").replace('{:topic-name "a"}', '{:topic-name "a" :x 1}'),
                ':poll-interval 10000 :frobnicate 1 :name "ignored-by-viooh"',
                ":server {:port 9090} :mulog {:type :console}").replace(
                    ':schema-registry-url "http://dst-sr:8081"', ':schema-registry-url "http://dst-sr:8081" :retries 3')
    res = _imp(text)
    wheres = sorted(f.where for f in res.findings)
    assert wheres == [":groups[0] :destination :retries", ":groups[0] :frobnicate",
                      ":groups[0] :mirrors[0] :poll-interval", ":groups[0] :mirrors[0] :source :topic :x",
                      ":groups[0] :name", ":groups[0] :poll-interval", ":mulog", ":server"]
    for w in wheres:
        assert f"# {w}: " in res.yaml_text


def test_same_clusters_in_two_groups_share_aliases():
    one = _cfg(M1)
    two = one.replace('"prod"', '"stage"').replace('"a_copy"', '"a_stage"')
    group_one, group_two = (t[len("{:groups ["):-len("] }")] for t in (one, two))
    cfg = load(_imp("{:groups [" + group_one + " " + group_two + "]}"))
    assert sorted(cfg.clusters) == ["dst-1", "src-1"] and [g.name for g in cfg.groups] == ["prod", "stage"]


REG_KEY = "-----BEGIN PRIVATE KEY-----\\nREGISTRYSECRETKEY\\n-----END PRIVATE KEY-----"


def _everything(res) -> str:
    """All a user or a log sees: the YAML, each finding, each placeholder's description."""
    return "\n".join([res.yaml_text, *map(str, res.findings), *(w for _, w in res.env_vars)])


def test_registry_pem_helpers_map_to_files_and_the_key_is_never_shown():
    side = (f':schema-registry-url "https://src-sr:8081" :schema-registry-configs {{:private-key "{REG_KEY}" '
            ':cert-pem "-----BEGIN CERTIFICATE-----\\nMIID\\n-----END CERTIFICATE-----" '
            f':ssl.other.passphrase "pass-phrase-1" :stray "{REG_KEY}"}}')
    text = _cfg(M1).replace(':schema-registry-url "http://src-sr:8081"', side)
    res = _imp(text)
    seen = _everything(res)
    assert "REGISTRYSECRETKEY" not in seen and "pass-phrase-1" not in seen
    reg = load(res).clusters["src-1"].schema_registry
    assert reg is not None
    assert reg.ssl_key_location == "value-of-SRC_1_REGISTRY_SSL_KEY_LOCATION"
    assert reg.ssl_certificate_location == "value-of-SRC_1_REGISTRY_SSL_CERTIFICATE_LOCATION"


def test_kafka_ssl_helper_keys_select_ssl():
    pem = "-----BEGIN CERTIFICATE-----\\nMIIB\\n-----END CERTIFICATE-----"
    text = _cfg(M1).replace('{:bootstrap.servers "src-1.example:9092"}',
                            f'{{:bootstrap.servers "src-1.example:9093" :ca-cert-pem "{pem}"}}')
    cfg = load(_imp(text))
    assert cfg.clusters["src-1"].kafka_properties()["security.protocol"] == "SSL"
    own = text.replace(':ca-cert-pem', ':security.protocol "SASL_SSL" :ca-cert-pem')
    assert load(_imp(own)).clusters["src-1"].kafka_properties()["security.protocol"] == "SASL_SSL"


def test_viooh_default_topic_rules_apply_unless_set():
    """viooh deep-merged {:replication-factor {:type :fix :value 3} :partition-count {:type :mirror-source
    :min 3 :max 12}} under the user's :topics-mirroring."""
    res = _imp(_cfg(M1))
    tm = load(res).groups[0].topics_mirroring
    assert (tm.replication_factor.type, tm.replication_factor.value) == ("fix", 3)
    assert (tm.partition_count.type, tm.partition_count.min, tm.partition_count.max) == ("mirror_source", 3, 12)
    assert "viooh's default" in res.yaml_text
    own = _cfg(M1, group_extra=":topics-mirroring {:replication-factor {:type :mirror-source} "
                               ":partition-count {:type :fix :value 5}}")
    tm = load(_imp(own)).groups[0].topics_mirroring
    assert tm.replication_factor.type == "mirror_source"
    assert (tm.partition_count.type, tm.partition_count.value) == ("fix", 5)


def test_registry_url_scheme_any_case_and_errors_never_repeat_credentials():
    from mirror_core.errors import ConfigError

    upper = _cfg(M1).replace('"http://src-sr:8081"', '"HTTP://user:s3cr3t@src-sr:8081"')
    res = _imp(upper)
    reg = load(res).clusters["src-1"].schema_registry
    assert reg is not None and reg.url.get_secret_value() == "http://src-sr:8081"
    assert "s3cr3t" not in _everything(res)
    for bad in ('"http://user:s3cr3t@src-sr:80x"', '"ftp://user:s3cr3t@src-sr"', '"user:s3cr3t@src-sr:8081"',
                '"http:/user:s3cr3t@src-sr:8081"'):
        try:
            _imp(_cfg(M1).replace('"http://src-sr:8081"', bad))
        except ConfigError as exc:
            assert exc.issues[0].path == ":groups[0] :source :schema-registry-url"
            assert "s3cr3t" not in str(exc)
        else:
            raise AssertionError(f"{bad} was accepted")
