"""viooh-mirror's EDN config -> mirrorflow groups (one per viooh group and cluster pair).

viooh merges each group's settings (and the top-level ``:topics-mirroring``) into its mirrors; so do
mirrorflow groups. Names are kept: a viooh mirror is ``<prefix>__<source>__<destination>`` (mirrorflow
derives the same), and its consumer group ``<ENV>.viooh-mirror.<mirror name>`` is written out, so
lag dashboards and ``kafka-consumer-groups`` keep showing the same group.

viooh produced every record with its key re-serialised and the producer choosing the partition;
mirrorflow keeps each record's partition and offset order. The header of the output says what that
means for the first run.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import edn_format
from edn_format import Keyword

from mirror_core.config import NAME_RE, TOPIC_RE
from mirror_core.importers import common
from mirror_core.importers.draft import Draft, Path
from mirror_core.importers.javaclient import safe_text, shown, translate
from mirror_core.redaction import redact_text, url_host

# edn_format's lexer logs its whole grammar at INFO when first used
logging.getLogger("edn_format").setLevel(logging.WARNING)

_SERDES = {"string": "string", "avro": "avro"}
_COMPAT = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE")
_TOPIC_NAME_STRATEGY = "io.confluent.kafka.serializers.subject.TopicNameStrategy"
#: viooh's kafka-ssl-helper keys (PEM text inline) -> librdkafka's inline PEM settings
_SSL_HELPER = {"ca-cert-pem": "ssl.ca.pem", "cert-pem": "ssl.certificate.pem", "private-key": "ssl.key.pem"}
#: viooh's DEFAULT-CONFIG :topics-mirroring, deep-merged under the user's config (mirrorflow's defaults differ)
VIOOH_DEFAULT_TM: dict[str, Any] = {"replication-factor": {"type": "fix", "value": 3},
                                    "partition-count": {"type": "mirror-source", "min": 3, "max": 12}}
_DEFAULT_TEXT = {"replication-factor": "{:type :fix :value 3}",
                 "partition-count": "{:type :mirror-source :min 3 :max 12}"}
#: the same keys in :schema-registry-configs -> mirrorflow's registry TLS settings (files, not inline PEM)
_REGISTRY_SSL_HELPER = {"ca-cert-pem": ("ssl.ca.location", "the CA certificate"),
                        "cert-pem": ("ssl.certificate.location", "the client certificate"),
                        "private-key": ("ssl.key.location", "the client's private key")}



def _name(x: Any) -> str:
    return x.name if isinstance(x, Keyword) else str(x)


def _plain(x: Any) -> Any:
    """EDN values as plain Python (keywords -> their names, maps with string keys)."""
    if isinstance(x, Keyword):
        return x.name
    if isinstance(x, Mapping):
        return {_name(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) or type(x).__name__ == "ImmutableList":
        return [_plain(v) for v in x]
    return x


def parse_edn(draft: Draft, text: str) -> dict[str, Any]:
    try:
        forms = list(edn_format.loads_all(text))
    except edn_format.EDNDecodeError as exc:
        raise draft.error(_edn_where(text, exc), f"invalid EDN: {_edn_problem(exc)}") from None
    except NotImplementedError as exc:  # an unknown #tag
        tag = re.search(r"#[A-Za-z][\w.*+!?$%&=<>/:-]*", text)
        where = f"line {text[: tag.start()].count(chr(10)) + 1}" if tag else "EDN"
        raise draft.error(where, f"invalid EDN: unknown tag {tag.group(0) if tag else '(' + str(exc) + ')'}") from None
    if not forms:
        raise draft.error("line 1", "empty: expected a map with :groups")
    if len(forms) > 1:
        raise draft.error("EDN", f"{len(forms)} top-level forms: expected one map with :groups")
    top = _plain(forms[0])
    if not isinstance(top, dict):
        raise draft.error("line 1", f"top level is a {type(top).__name__}, expected a map with :groups")
    return top


def _edn_where(text: str, exc: Exception) -> str:
    tok = exc.args[0] if exc.args else None
    pos = getattr(tok, "lexpos", None)  # the lexer counts characters, not lines
    if isinstance(pos, int):
        return f"line {text[:pos].count(chr(10)) + 1}"
    return f"line {text.rstrip().count(chr(10)) + 1}"


def _edn_problem(exc: Exception) -> str:
    tok = exc.args[0] if exc.args else None
    if hasattr(tok, "value"):
        return f"unexpected {tok.value!r}"  # type: ignore[union-attr]
    msg = str(tok)
    return "unexpected end of input (an unclosed { [ or \")" if msg == "EOF Reached" else msg


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


def _map(draft: Draft, where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise draft.error(where, f"expected a map, got {type(value).__name__}")
    return value


def _registry_url(draft: Draft, where: str, url: Any) -> str:
    """A registry URL as mirrorflow reads it (scheme in lower case, as URL schemes compare). Errors
    never repeat the URL's credentials."""
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url, re.I):
        host = url_host(url) if isinstance(url, str) else None
        raise draft.error(where, "not an http(s) URL" + (f" (host {host})" if host else "")
                          + ("" if isinstance(url, str) else f": a {type(url).__name__}"))
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - urlsplit checks the port only when asked
    except ValueError:
        raise draft.error(where, f"invalid port in {redact_text(url)!r}") from None
    return urlunsplit(parts._replace(scheme=parts.scheme.lower()))


class _Clusters:
    """Cluster definitions seen so far: identical ones share an alias."""

    def __init__(self, draft: Draft):
        self.draft = draft
        self.by_key: dict[str, str] = {}
        self.source_options: dict[str, dict[str, str]] = {}

    def alias(self, side: dict[str, Any], where: str) -> str:
        kafka = {str(k): v for k, v in _map(self.draft, f"{where} :kafka", side.get("kafka")).items()}
        if not kafka.get("bootstrap.servers"):
            raise self.draft.error(f"{where} :kafka :bootstrap.servers", "missing: the brokers to connect to")
        for k, v in kafka.items():
            if not isinstance(v, (str, int, float, bool)):
                raise self.draft.error(f"{where} :kafka :{k}", f"expected a string or number, got {type(v).__name__}")
        url = side.get("schema-registry-url")
        if url is not None:
            url = _registry_url(self.draft, f"{where} :schema-registry-url", url)
        sr_cfg = _map(self.draft, f"{where} :schema-registry-configs", side.get("schema-registry-configs"))
        ident = repr((sorted((k, str(v)) for k, v in kafka.items()), url, sorted(sr_cfg.items())))
        if ident in self.by_key:
            return self.by_key[ident]
        alias = common.host_alias(str(kafka["bootstrap.servers"]), list(self.by_key.values()), "cluster")
        self.by_key[ident] = alias
        self._define(alias, kafka, url, sr_cfg, where)
        return alias

    def _define(self, alias: str, kafka: dict[str, Any], url: str | None, sr_cfg: dict[str, Any], where: str) -> None:
        d = self.draft
        java = {k: ("true" if v is True else "false" if v is False else str(v))
                for k, v in kafka.items() if k not in _SSL_HELPER}
        m = translate(java, alias, f"{where} :kafka :")
        for helper, rd_key in _SSL_HELPER.items():
            if helper in kafka:
                if helper == "private-key":
                    m.secrets[rd_key] = (f"{alias}_SSL_KEY_PEM".upper().replace("-", "_"), "the client's private key (PEM)")
                else:
                    m.cluster[rd_key] = str(kafka[helper])
                    m.notes.append((rd_key, f"from {where} :kafka :{helper} (viooh's kafka-ssl-helper)"))
        if ("ca-cert-pem" in kafka or {"cert-pem", "private-key"} <= set(kafka)) and "security.protocol" not in m.cluster:
            # viooh's ssl-opts merged {:security.protocol "SSL"} under the user's own keys
            m.cluster["security.protocol"] = "SSL"
            m.notes.append(("security.protocol", "SSL: viooh's kafka-ssl-helper set it with its PEM keys"))
        registry: dict[str, Any] | None = None
        if url is not None:
            parts = urlsplit(url)
            registry = {"url": url}
            if parts.username or parts.password:  # credentials in the URL: never copied
                netloc = parts.netloc.rsplit("@", 1)[1]
                registry["url"] = urlunsplit(parts._replace(netloc=netloc))
                var = f"{alias}_REGISTRY_AUTH".upper().replace("-", "_")
                registry["basic.auth.user.info"] = d.secret(var, f"the registry's user:password, cluster {alias}")
                d.note(("clusters", alias, "schema_registry"), f"the credentials in {where} :schema-registry-url "
                       f"are not copied: set {var}")
            for k, v in sorted(sr_cfg.items()):
                if k == "basic.auth.user.info" and "basic.auth.user.info" not in registry:
                    var = f"{alias}_REGISTRY_AUTH".upper().replace("-", "_")
                    registry["basic.auth.user.info"] = d.secret(var, f"the registry's user:password (cluster {alias})")
                elif k in _REGISTRY_SSL_HELPER:
                    self._registry_pem(alias, registry, k, f"{where} :schema-registry-configs :{k}")
                elif k != "basic.auth.credentials.source":
                    d.unmapped(f"{where} :schema-registry-configs :{k}", f"{shown(k, str(v))}: no equivalent "
                               "(mirrorflow's registry settings are url, basic.auth.user.info and timeouts)",
                               ("clusters", alias))
        common.put_cluster(d, alias, m, registry)
        common.report(d, m, ("clusters", alias))
        self.source_options[alias] = m.source_options

    def _registry_pem(self, alias: str, registry: dict[str, Any], helper: str, where: str) -> None:
        """viooh's registry client took PEM text inline; mirrorflow's reads PEM files, so the setting
        becomes a placeholder for a file holding that text (the text itself, a key above all, is not copied)."""
        rd_key, what = _REGISTRY_SSL_HELPER[helper]
        var = f"{alias}_REGISTRY_{rd_key}".upper().replace("-", "_").replace(".", "_")
        registry[rd_key] = self.draft.secret(var, f"a PEM file holding {what} from {where}")
        self.draft.note(("clusters", alias, "schema_registry", rd_key),
                        f"set {var} to a file holding the PEM text of {where} (not copied)")


def import_viooh(text: str, source: str, env: str = "local") -> Draft:
    draft = Draft(source)
    cfg = parse_edn(draft, text)
    if "groups" not in cfg:
        if "mirrors" in cfg:
            raise draft.error(":mirrors", "top-level :mirrors is viooh-mirror's pre-groups format: put them in "
                              ":groups [{:group-id-prefix ... :mirrors [...]}]")
        raise draft.error(":groups", "missing: expected :groups [{:group-id-prefix ... :mirrors [...]}]")
    groups_in = cfg["groups"]
    if not isinstance(groups_in, list) or not groups_in:
        raise draft.error(":groups", "expected a non-empty vector of groups")
    user_tm = _map(draft, ":topics-mirroring", cfg.get("topics-mirroring"))
    top_tm = _deep_merge(VIOOH_DEFAULT_TM, user_tm)
    clusters = _Clusters(draft)
    draft.tree["clusters"] = {}
    out_groups: list[dict[str, Any]] = []
    draft.tree["groups"] = out_groups
    for key, value in cfg.items():
        if key in ("groups", "topics-mirroring"):
            continue
        _top_level(draft, key, value)
    for gi, g in enumerate(groups_in):
        gw = f":groups[{gi}]"
        g = _map(draft, gw, g)
        _group(draft, gi, gw, g, top_tm, clusters, env, out_groups, user_tm)
    for line in reversed(common.first_run("viooh-mirror", ":consumer-group-id")):
        draft.comments.setdefault(("groups",), []).insert(0, line)
    return draft


def _note_defaults(draft: Draft, at: Path, out_tm: dict[str, Any], user_rules: list[dict[str, Any]]) -> None:
    """Say where viooh's DEFAULT-CONFIG decided a topic rule of a group: mirrorflow's own defaults differ
    (the source's replication factor, the exact partition count), so the import writes viooh's out.
    ``user_rules`` are the file's top-level and the group's own ``:topics-mirroring``."""
    for key, out_key in (("replication-factor", "replication_factor"), ("partition-count", "partition_count")):
        rules = [r[key] for r in user_rules if isinstance(r.get(key), dict)]
        where = at + ("topics_mirroring", out_key)
        if not rules:
            draft.note(where, f"{_DEFAULT_TEXT[key]}: viooh's default (its DEFAULT-CONFIG)")
        elif out_tm.get(out_key, {}).get("type") == "mirror_source" and any(
                k in out_tm[out_key] and all(k not in r for r in rules) for k in ("min", "max")):
            draft.note(where, f"min / max from viooh's default {_DEFAULT_TEXT[key]} (its DEFAULT-CONFIG, merged under yours)")


def _top_level(draft: Draft, key: str, value: Any) -> None:
    if key == "metrics":
        v = value if isinstance(value, dict) else {}
        kind = v.get("type")
        hint = ("mirrorflow serves Prometheus metrics from the Spark driver: set spark.metrics_port "
                "(there is no push gateway)") if kind == "prometheus" else "mirrorflow serves Prometheus metrics: set spark.metrics_port"
        draft.unmapped(":metrics", f"{_edn_short(value)}: no equivalent; {hint}", ("groups",))
    elif key == "server":
        draft.unmapped(":server", f"{_edn_short(value)}: no equivalent (the Airflow DAGs and Spark UI report health)", ("groups",))
    elif key == "mulog":
        draft.unmapped(":mulog", f"{_edn_short(value)}: no equivalent (mirrorflow logs through Python logging)", ("groups",))
    else:
        draft.unmapped(f":{key}", f"{_edn_short(value)}: not a viooh-mirror setting mirrorflow maps", ("groups",))


def _edn(value: Any) -> str:
    """A value written back in EDN's notation (keywords lost their colon when parsed; maps get it back)."""
    if isinstance(value, dict):
        return "{" + " ".join(f":{k} {_edn(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + " ".join(_edn(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value + '"'
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _edn_short(value: Any) -> str:
    text = safe_text(_edn(value))
    return text if len(text) <= 80 else text[:77] + "..."


# viooh drops a group's :name (mirrors are named from the prefix), so a group :name is reported
_GROUP_KEYS = {"group-id-prefix", "enabled", "mirror-mode", "source", "destination", "mirrors", "topics-mirroring",
               "poll-interval", "serdes", "key-subject-name-strategy", "value-subject-name-strategy",
               "subject-naming-strategy", "consumer-group-id"}
_MIRROR_KEYS = (_GROUP_KEYS - {"group-id-prefix", "mirrors"}) | {"name"}
_SIDE_KEYS = ("topic", "kafka", "schema-registry-url", "schema-registry-configs", "force-subject-compatibility-level")


def _group(draft: Draft, gi: int, gw: str, g: dict[str, Any], top_tm: dict[str, Any], clusters: _Clusters,
           env: str, out_groups: list[dict[str, Any]], user_tm: dict[str, Any]) -> None:
    prefix = g.get("group-id-prefix")
    if prefix is not None and (not isinstance(prefix, str) or not re.match(NAME_RE, prefix)):
        raise draft.error(f"{gw} :group-id-prefix", f"{prefix!r} cannot name a group (letters, digits, '_', '-', '.')")
    mirrors = g.get("mirrors")
    if not isinstance(mirrors, list) or not mirrors:
        raise draft.error(f"{gw} :mirrors", "expected a non-empty vector of mirrors")
    group_enabled = g.get("enabled", True)
    if not isinstance(group_enabled, bool):
        raise draft.error(f"{gw} :enabled", f"expected true or false, got {group_enabled!r}")
    for k in g:
        if k not in _GROUP_KEYS:
            draft.unmapped(f"{gw} :{k}", f"{_edn_short(g[k])}: not a viooh-mirror group setting mirrorflow maps",
                           ("groups",))
    _side_extras(draft, gw, g, ("groups",))
    shared = _deep_merge({"topics-mirroring": top_tm}, {k: v for k, v in g.items() if k not in ("mirrors", "name")})
    # mirrorflow groups, keyed by (source alias, destination alias, enabled)
    made: dict[tuple[str, str, bool], int] = {}
    for mi, m in enumerate(mirrors):
        mw = f"{gw} :mirrors[{mi}]"
        m = _map(draft, mw, m)
        for k in m:
            if k not in _MIRROR_KEYS:
                draft.unmapped(f"{mw} :{k}", f"{_edn_short(m[k])}: not a viooh-mirror mirror setting mirrorflow maps",
                               ("groups",))
        eff = _deep_merge(shared, m)
        src_side = _map(draft, f"{mw} :source", eff.get("source"))
        dst_side = _map(draft, f"{mw} :destination", eff.get("destination"))
        src_topic = _topic(draft, f"{mw} :source :topic :topic-name", src_side)
        dst_topic = _topic(draft, f"{mw} :destination :topic :topic-name", dst_side)
        src_alias = clusters.alias(src_side, f"{gw} :source" if "source" not in m or "kafka" not in m["source"] else f"{mw} :source")
        dst_alias = clusters.alias(dst_side, f"{gw} :destination" if "destination" not in m or "kafka" not in m["destination"] else f"{mw} :destination")
        m_enabled = m.get("enabled", True)
        if not isinstance(m_enabled, bool):
            raise draft.error(f"{mw} :enabled", f"expected true or false, got {m_enabled!r}")
        key = (src_alias, dst_alias, bool(group_enabled and m_enabled))
        if key not in made:
            made[key] = len(out_groups)
            out_groups.append(_new_group(draft, len(out_groups), gw, g, shared, prefix, key, clusters, out_groups))
            own_tm = g.get("topics-mirroring")
            _note_defaults(draft, ("groups", made[key]), out_groups[-1]["topics_mirroring"],
                           [user_tm] + ([own_tm] if isinstance(own_tm, dict) else []))
            if group_enabled and not m_enabled:
                draft.note(("groups", made[key], "enabled"), f"holds the mirrors of {gw} with :enabled false "
                           "(mirrorflow enables groups, not single mirrors)")
        oi = made[key]
        group = out_groups[oi]
        viooh_name = m.get("name")
        base = f"{viooh_name}" if viooh_name else f"{src_topic}__{dst_topic}"
        full = f"{prefix}__{base}" if prefix else base
        spec: dict[str, Any] = {"source_topic": src_topic, "destination_topic": dst_topic}
        if full != f"{group['name']}__{src_topic}__{dst_topic}":
            spec["name"] = full
        cg = m.get("consumer-group-id") or eff.get("consumer-group-id")
        spec["consumer_group"] = str(cg) if cg else f"{env}.viooh-mirror.{full}"
        at: Path = ("groups", oi, "mirrors", len(group["mirrors"]))
        if not cg:
            draft.note(at, f"consumer_group: viooh's own for ENV={env} (--env to change)")
        _mirror_settings(draft, mw, m, shared, spec, at)
        group["mirrors"].append(spec)


def _topic(draft: Draft, where: str, side: dict[str, Any]) -> str:
    topic = side.get("topic")
    name = topic.get("topic-name") if isinstance(topic, dict) else None
    if not isinstance(name, str) or not name:
        raise draft.error(where, "missing: the topic to mirror")
    if not TOPIC_RE.match(name):
        raise draft.error(where, f"invalid topic name {name!r}")
    return name


def _new_group(draft: Draft, oi: int, gw: str, g: dict[str, Any], shared: dict[str, Any], prefix: str | None,
               key: tuple[str, str, bool], clusters: _Clusters, out_groups: list[dict[str, Any]]) -> dict[str, Any]:
    src, dst, enabled = key
    taken = {x["name"] for x in out_groups}
    name = base = prefix or f"viooh-{oi}"
    n = 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    at: Path = ("groups", oi)
    out: dict[str, Any] = {"name": name, "source": src, "destination": dst, "enabled": enabled,
                           "replication_policy": "identity"}
    draft.note(at + ("replication_policy",), "viooh names every destination topic explicitly")
    mode = shared.get("mirror-mode")
    if mode is not None:
        out["mirror_mode"] = _mode(draft, f"{gw} :mirror-mode", mode)
    if "serdes" in g:
        out["serdes"] = _serdes(draft, f"{gw} :serdes", g["serdes"])
    out["topics_mirroring"] = _topics_mirroring(draft, f"{gw} :topics-mirroring", shared.get("topics-mirroring") or {})
    if "poll-interval" in g:
        draft.unmapped(f"{gw} :poll-interval", f"{g['poll-interval']!r}: no equivalent (spark.trigger sets how often "
                       "a mirror reads)", at)
    _strategies(draft, gw, g, at)
    out["offsets"] = {"sync_group_offsets": False}
    draft.note(at + ("offsets",), "viooh synced no consumer groups; checkpoints are written (set "
               "sync_group_offsets: true to move idle destination groups too)")
    out["heartbeats"] = {"enabled": False}
    draft.note(at + ("heartbeats",), "viooh wrote no heartbeats (enabled: true writes a 'heartbeats' topic on the source)")
    opts = clusters.source_options.get(src)
    if opts:
        out["spark"] = {"source_options": dict(sorted(opts.items()))}
        draft.note(at + ("spark",), f"consumer settings of {src} (Spark's Kafka source is the consumer)")
    out["mirrors"] = []
    return out


def _mode(draft: Draft, where: str, v: Any) -> str:
    if v not in ("strict", "lenient"):
        raise draft.error(where, f"expected :strict or :lenient, got {v!r}")
    return str(v)


def _serdes(draft: Draft, where: str, v: Any) -> dict[str, str]:
    if not isinstance(v, list) or len(v) != 2:
        raise draft.error(where, f"expected [key-serde value-serde], got {_edn_short(v)}")
    out = {}
    for side, s in zip(("key", "value"), v, strict=True):
        if s not in _SERDES:
            raise draft.error(where, f"unknown {side} serde {s!r} (viooh-mirror has :string and :avro)")
        out[side] = _SERDES[s]
    return out


def _count_rule(draft: Draft, where: str, v: Any) -> dict[str, Any]:
    v = _map(draft, where, v)
    kind = v.get("type")
    if kind not in ("fix", "mirror-source"):
        raise draft.error(f"{where} :type", f"expected :fix or :mirror-source, got {kind!r}")
    rule: dict[str, Any] = {"type": "fix" if kind == "fix" else "mirror_source"}
    for k in ("value", "min", "max"):
        if k in v:
            if not isinstance(v[k], int) or isinstance(v[k], bool) or v[k] < 1:
                raise draft.error(f"{where} :{k}", f"expected a positive whole number, got {v[k]!r}")
            rule[k] = v[k]
    if kind == "fix" and "value" not in rule:
        raise draft.error(where, "{:type :fix} needs :value")
    if kind == "fix":
        rule = {"type": "fix", "value": rule["value"]}
    else:
        rule.pop("value", None)
    if "min" in rule and "max" in rule and rule["min"] > rule["max"]:
        raise draft.error(where, f":min {rule['min']} is above :max {rule['max']}")
    return rule


def _topics_mirroring(draft: Draft, where: str, tm: dict[str, Any]) -> dict[str, Any]:
    tm = _map(draft, where, tm)
    out: dict[str, Any] = {}
    if "auto-create-topics" in tm:
        if not isinstance(tm["auto-create-topics"], bool):
            raise draft.error(f"{where} :auto-create-topics", f"expected true or false, got {tm['auto-create-topics']!r}")
        out["auto_create_topics"] = tm["auto-create-topics"]
    if "partition-count" in tm:
        out["partition_count"] = _count_rule(draft, f"{where} :partition-count", tm["partition-count"])
    if "replication-factor" in tm:
        out["replication_factor"] = _count_rule(draft, f"{where} :replication-factor", tm["replication-factor"])
    # viooh copied no topic configs or ACLs
    out["sync_configs"] = False
    for k in tm:
        if k not in ("auto-create-topics", "partition-count", "replication-factor"):
            draft.unmapped(f"{where} :{k}", f"{_edn_short(tm[k])}: not a viooh-mirror setting mirrorflow maps", ())
    return out


def _strategies(draft: Draft, where: str, m: dict[str, Any], at: Path) -> None:
    for k in ("key-subject-name-strategy", "value-subject-name-strategy"):
        if k in m and m[k] != _TOPIC_NAME_STRATEGY:
            draft.unmapped(f"{where} :{k}", f"{m[k]!r}: mirrorflow maps subjects by topic name (TopicNameStrategy); "
                           "record-name subjects pass through unchanged", at)
    if "subject-naming-strategy" in m and m["subject-naming-strategy"] != "topic-name":
        draft.unmapped(f"{where} :subject-naming-strategy", f"{m['subject-naming-strategy']!r}: mirrorflow maps "
                       "subjects by topic name", at)


def _mirror_settings(draft: Draft, mw: str, m: dict[str, Any], shared: dict[str, Any], spec: dict[str, Any],
                     at: Path) -> None:
    """The settings a viooh mirror sets itself become mirror overrides."""
    if "mirror-mode" in m:
        spec["mirror_mode"] = _mode(draft, f"{mw} :mirror-mode", m["mirror-mode"])
    if "serdes" in m:
        spec["serdes"] = _serdes(draft, f"{mw} :serdes", m["serdes"])
    elif "serdes" not in shared:
        raise draft.error(f"{mw} :serdes", "missing: viooh-mirror needs [key-serde value-serde]")
    dst = m.get("destination") if isinstance(m.get("destination"), dict) else {}
    level = (dst or {}).get("force-subject-compatibility-level", shared.get("destination", {}).get(
        "force-subject-compatibility-level") if isinstance(shared.get("destination"), dict) else None)
    if level is not None:
        lv = str(level).upper()
        if lv not in _COMPAT:
            raise draft.error(f"{mw} :destination :force-subject-compatibility-level",
                              f"expected one of {', '.join(_COMPAT)}, got {level!r}")
        spec["force_subject_compatibility_level"] = lv
    if "topics-mirroring" in m:
        spec["topics_mirroring"] = _topics_mirroring(draft, f"{mw} :topics-mirroring",
                                                     _deep_merge(shared.get("topics-mirroring") or {}, m["topics-mirroring"]))
    if "poll-interval" in m:
        draft.unmapped(f"{mw} :poll-interval", f"{m['poll-interval']!r}: no equivalent (spark.trigger sets how often "
                       "a mirror reads)", at)
    _strategies(draft, mw, m, at)
    _side_extras(draft, mw, m, at)


def _side_extras(draft: Draft, where: str, holder: dict[str, Any], at: Path) -> None:
    """Keys of a group's or mirror's :source / :destination (and their :topic) that nothing reads."""
    for side in ("source", "destination"):
        raw = holder.get(side)
        extra: dict[str, Any] = raw if isinstance(raw, dict) else {}
        for k, v in extra.items():
            if k not in _SIDE_KEYS:
                draft.unmapped(f"{where} :{side} :{k}", f"{_edn_short(v)}: not a viooh-mirror setting mirrorflow maps", at)
        topic = extra.get("topic")
        for k, v in sorted(topic.items() if isinstance(topic, dict) else []):
            if k != "topic-name":
                draft.unmapped(f"{where} :{side} :topic :{k}", f"{_edn_short(v)}: not a viooh-mirror setting mirrorflow maps", at)
