"""A Strimzi ``KafkaMirrorMaker2`` custom resource (YAML) -> mirrorflow groups (one per ``spec.mirrors[]``).

``spec.clusters[]`` become clusters (in the newer shape: ``spec.target`` and each mirror's ``source``,
converted into the older shape first, so both map the same way): ``tls`` and ``authentication`` map to librdkafka's security
settings, and what Strimzi reads from Kubernetes secrets (passwords, CA and client certificates)
becomes ``${ENV}`` placeholders whose comments name the secret and its key. Each mirror's
``topicsPattern`` / ``groupsPattern`` (+ exclude) and its connectors' ``config`` are MM2 settings and
map as in :mod:`.mm2`; a connector block that is absent or paused/stopped ran nothing, so its
part is imported off (no source connector: the group is disabled). The deployment settings (replicas, resources, logging, ...) have no equivalent.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from mirror_core.config import ALIAS_RE
from mirror_core.importers import common, mm2
from mirror_core.importers.draft import Draft, Path, env_name
from mirror_core.importers.javaclient import safe_text, translate

_PATTERNS = {
    "topicsPattern": "topics", "topicsExcludePattern": "topics.exclude", "topicsBlacklistPattern": "topics.exclude",
    "groupsPattern": "groups", "groupsExcludePattern": "groups.exclude", "groupsBlacklistPattern": "groups.exclude",
}
_CONNECTORS = ("sourceConnector", "checkpointConnector", "heartbeatConnector")
_CONNECTOR_CLASS = {"sourceConnector": "MirrorSourceConnector", "checkpointConnector": "MirrorCheckpointConnector",
                    "heartbeatConnector": "MirrorHeartbeatConnector"}
_SASL = {"scram-sha-512": "SCRAM-SHA-512", "scram-sha-256": "SCRAM-SHA-256", "plain": "PLAIN"}


def _load(draft: Draft, text: str) -> dict[str, Any]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        raise draft.error(where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    found = [d for d in docs if isinstance(d, dict) and d.get("kind") == "KafkaMirrorMaker2"]
    if not found and any(isinstance(d, dict) and d.get("kind") == "KafkaMirrorMaker" for d in docs):
        raise draft.error("kind", "KafkaMirrorMaker is a MirrorMaker 1 resource, which this format does not read: "
                          "write spec.consumer (bootstrapServers as bootstrap.servers, groupId as group.id, config) as "
                          "consumer.properties and spec.producer (bootstrapServers, config) as producer.properties, then "
                          "run `mirrorflow import mm1 consumer.properties --producer producer.properties --include "
                          "'<spec.include or spec.whitelist>'`")
    if not found:
        kinds = ", ".join(sorted({str(d.get("kind")) for d in docs if isinstance(d, dict)})) or "none"
        raise draft.error("kind", f"no KafkaMirrorMaker2 resource in the file (kinds found: {kinds})")
    if len(found) > 1:
        raise draft.error("kind", f"{len(found)} KafkaMirrorMaker2 resources: import them one file at a time")
    res = found[0]
    api = str(res.get("apiVersion", ""))
    if not api.startswith("kafka.strimzi.io/"):
        raise draft.error("apiVersion", f"expected kafka.strimzi.io/..., got {api!r}")
    spec = res.get("spec")
    if not isinstance(spec, dict):
        raise draft.error("spec", "missing or not a mapping")
    return spec


def import_strimzi(text: str, source: str) -> Draft:
    draft = Draft(source)
    spec = _load(draft, text)
    if "target" in spec:
        clusters, mirrors, worker = _target_shape(draft, spec)
    else:
        clusters, mirrors, worker = _clusters_shape(draft, spec)
    aliases: list[str] = []
    consumer_opts: dict[str, dict[str, str]] = {}
    eos: dict[str, mm2.Setting] = {}
    for w, c in clusters:
        alias, opts = _cluster(draft, w, c, aliases, eos, worker if w == "spec.target" else ())
        aliases.append(alias)
        consumer_opts[alias] = opts
    groups: list[dict[str, Any]] = []
    draft.tree["groups"] = groups
    for mi, m in enumerate(mirrors):
        groups.append(_mirror(draft, mi, m, consumer_opts, groups, eos, target_shape="target" in spec))
    for key in spec:
        if key not in ("clusters", "mirrors", "target"):
            what = ("the Connect cluster MM2 ran in; mirrorflow runs none" if key == "connectCluster"
                    else "Kubernetes deployment setting; mirrorflow runs as Spark jobs orchestrated by Airflow")
            draft.unmapped(f"spec.{key}", f"{_short(spec[key])}: no equivalent ({what})", ("groups",))
    return draft


#: ``spec.target`` keys that configure the Connect worker MM2 runs in (its group and internal topics)
_TARGET_WORKER_KEYS = ("groupId", "configStorageTopic", "statusStorageTopic", "offsetStorageTopic")

Clusters = list[tuple[str, dict[str, Any]]]  # (where, the cluster's mapping)


def _mirror_list(draft: Draft, spec: dict[str, Any]) -> list[Any]:
    mirrors = spec.get("mirrors")
    if not isinstance(mirrors, list) or not mirrors:
        raise draft.error("spec.mirrors", "expected a non-empty list of mirrors")
    return mirrors


def _clusters_shape(draft: Draft, spec: dict[str, Any]) -> tuple[Clusters, list[Any], tuple[str, ...]]:
    """``spec.clusters[]`` with ``spec.mirrors[].sourceCluster`` / ``targetCluster`` naming them by alias."""
    clusters = spec.get("clusters")
    if not isinstance(clusters, list) or not clusters:
        raise draft.error("spec.clusters", "expected a non-empty list of clusters")
    return [(f"spec.clusters[{ci}]", c) for ci, c in enumerate(clusters)], _mirror_list(draft, spec), ()


def _target_shape(draft: Draft, spec: dict[str, Any]) -> tuple[Clusters, list[Any], tuple[str, ...]]:
    """The newer shape: one ``spec.target`` (the target and Connect cluster) and each mirror's own
    ``source``. It becomes the older one: the target and each distinct source are clusters, and each
    mirror names them by alias, so both shapes map the same way."""
    for old in ("clusters", "connectCluster"):
        if old in spec:
            raise draft.error(f"spec.{old}", "set together with spec.target: use one shape, spec.target with "
                              "spec.mirrors[].source, or spec.clusters with sourceCluster / targetCluster")
    target = spec["target"]
    if not isinstance(target, dict):
        raise draft.error("spec.target", "expected a mapping")
    t_alias = target.get("alias")
    if not isinstance(t_alias, str) or not t_alias:
        raise draft.error("spec.target.alias", "missing")
    clusters: Clusters = [("spec.target", target)]
    seen: dict[str, tuple[str, Any]] = {t_alias: ("spec.target", target)}
    mirrors = []
    for mi, m in enumerate(_mirror_list(draft, spec)):
        w = f"spec.mirrors[{mi}]"
        if not isinstance(m, dict):
            raise draft.error(w, "expected a mapping")
        for old in ("sourceCluster", "targetCluster"):
            if old in m:
                raise draft.error(f"{w}.{old}", "with spec.target, a mirror gives its source cluster in source "
                                  "(alias, bootstrapServers, tls, authentication, config), and the target is spec.target")
        src = m.get("source")
        if not isinstance(src, dict):
            raise draft.error(f"{w}.source", "missing or not a mapping: the source cluster of this mirror")
        alias = src.get("alias")
        if not isinstance(alias, str) or not alias:
            raise draft.error(f"{w}.source.alias", "missing")
        if alias in seen and seen[alias][1] != src:
            what = "the target's alias" if seen[alias][0] == "spec.target" else f"defined otherwise in {seen[alias][0]}"
            raise draft.error(f"{w}.source.alias", f"{alias!r} is {what}: a cluster needs one alias of its own")
        if alias not in seen:
            seen[alias] = (f"{w}.source", src)
            clusters.append((f"{w}.source", src))
        mirrors.append({k: v for k, v in m.items() if k != "source"} | {"sourceCluster": alias, "targetCluster": t_alias})
    return clusters, mirrors, _TARGET_WORKER_KEYS


def _short(value: Any) -> str:
    text = safe_text(yaml.safe_dump(value, default_flow_style=True, width=10_000).strip())
    text = text[:-4].strip() if text.endswith("...") else text
    return text if len(text) <= 80 else text[:77] + "..."


def _cluster(draft: Draft, w: str, c: Any, seen: list[str], eos: dict[str, mm2.Setting],
             worker_keys: tuple[str, ...] = ()) -> tuple[str, dict[str, str]]:
    """One cluster at ``w`` (``spec.clusters[i]``, ``spec.target``, ``spec.mirrors[i].source``); returns its
    alias and its consumer settings (Spark source options). Its ``config.exactly.once.source.support`` (a
    Connect worker setting, which decides the delivery of the mirrors that target this cluster) goes to
    ``eos``; ``worker_keys`` are its fields that configure the Connect worker."""
    if not isinstance(c, dict):
        raise draft.error(w, "expected a mapping")
    alias = c.get("alias")
    if not isinstance(alias, str) or not alias:
        raise draft.error(f"{w}.alias", "missing")
    if not re.match(ALIAS_RE, alias):
        raise draft.error(f"{w}.alias", f"{alias!r} cannot be used: mirrorflow aliases are letters, digits, '_' and '-'")
    if alias in seen:
        raise draft.error(f"{w}.alias", f"duplicate alias {alias!r}")
    bs = c.get("bootstrapServers")
    if not isinstance(bs, str) or not bs.strip():
        raise draft.error(f"{w}.bootstrapServers", f"missing: cluster {alias!r} has no bootstrap servers")
    config = c.get("config") or {}
    if not isinstance(config, dict):
        raise draft.error(f"{w}.config", "expected a mapping")
    java = {str(k): common.prop_text(v) for k, v in config.items()
            if not common.CONNECT_WORKER_RE.match(str(k)) and str(k) != mm2.EOS}
    if mm2.EOS in config:
        eos[alias] = mm2.Setting(common.prop_text(config[mm2.EOS]), f"{w}.config.{mm2.EOS}")
    m = translate({"bootstrap.servers": bs} | java, alias, f"{w}.config.")
    at: Path = ("clusters", alias)
    for k in sorted(config):
        if common.CONNECT_WORKER_RE.match(str(k)):
            draft.unmapped(f"{w}.config.{k}", "Kafka Connect worker setting: mirrorflow runs no Connect worker", at)
    tls = c.get("tls")
    if tls is not None and not isinstance(tls, dict):
        raise draft.error(f"{w}.tls", "expected a mapping")
    auth = c.get("authentication")
    if auth is not None and not isinstance(auth, dict):
        raise draft.error(f"{w}.authentication", "expected a mapping")
    sasl = False
    secrets: dict[str, tuple[str, str]] = {}
    if auth:
        kind = str(auth.get("type", ""))
        if kind in _SASL:
            sasl = True
            m.cluster["sasl.mechanism"] = _SASL[kind]
            user = auth.get("username")
            if not isinstance(user, str) or not user:
                raise draft.error(f"{w}.authentication.username", f"missing for type {kind}")
            m.cluster["sasl.username"] = user
            ps = auth.get("passwordSecret")
            if not isinstance(ps, dict) or not ps.get("secretName") or not ps.get("password"):
                raise draft.error(f"{w}.authentication.passwordSecret", "expected {secretName, password}")
            secrets["sasl.password"] = (env_name(alias, "sasl.password"),
                                        f"key {ps['password']} of Kubernetes secret {ps['secretName']}")
        elif kind == "tls":
            ck = auth.get("certificateAndKey")
            if not isinstance(ck, dict) or not all(ck.get(k) for k in ("secretName", "certificate", "key")):
                raise draft.error(f"{w}.authentication.certificateAndKey", "expected {secretName, certificate, key}")
            secrets["ssl.certificate.location"] = (env_name(alias, "ssl.certificate.location"),
                                                   f"a file holding {ck['certificate']} of Kubernetes secret {ck['secretName']}")
            secrets["ssl.key.location"] = (env_name(alias, "ssl.key.location"),
                                           f"a file holding {ck['key']} of Kubernetes secret {ck['secretName']}")
        elif kind.startswith("oauth"):
            sasl = True
            m.cluster["sasl.mechanism"] = "OAUTHBEARER"
            draft.unmapped(f"{w}.authentication", "type oauth: set librdkafka's sasl.oauthbearer.* settings "
                           "(method oidc, client id, token endpoint) by hand; secrets not copied", at)
        else:
            raise draft.error(f"{w}.authentication.type", f"unknown type {kind!r} (tls, scram-sha-256, scram-sha-512, plain, oauth)")
        for k in auth:
            if k not in ("type", "username", "passwordSecret", "certificateAndKey") and not kind.startswith("oauth"):
                draft.unmapped(f"{w}.authentication.{k}", f"{_short(auth[k])}: no equivalent", at)
    if tls is not None:
        certs = tls.get("trustedCertificates") or []
        if not isinstance(certs, list):
            raise draft.error(f"{w}.tls.trustedCertificates", "expected a list")
        if certs:
            names = ", ".join(f"{x.get('certificate') or x.get('pattern')} of secret {x.get('secretName')}"
                              for x in certs if isinstance(x, dict))
            secrets["ssl.ca.location"] = (env_name(alias, "ssl.ca.location"), f"a PEM file holding {names}")
    if tls is not None or "security.protocol" not in m.cluster:
        proto = ("SASL_SSL" if sasl else "SSL") if tls is not None else ("SASL_PLAINTEXT" if sasl else None)
        if proto:
            m.cluster["security.protocol"] = proto
    for key, (var, what) in secrets.items():
        m.secrets[key] = (var, what)
    common.put_cluster(draft, alias, m)
    common.report(draft, m, at)
    for k in c:
        if k in worker_keys:
            draft.unmapped(f"{w}.{k}", f"{_short(c[k])}: Kafka Connect worker setting: mirrorflow runs no Connect worker", at)
        elif k not in ("alias", "bootstrapServers", "config", "tls", "authentication"):
            draft.unmapped(f"{w}.{k}", f"{_short(c[k])}: no equivalent", at)
    return alias, m.source_options


def _mirror(draft: Draft, mi: int, m: Any, consumer_opts: dict[str, dict[str, str]],
            groups: list[dict[str, Any]], eos: dict[str, mm2.Setting], target_shape: bool = False) -> dict[str, Any]:
    """One mirror, in the older shape's keys (:func:`_target_shape` rewrote a newer one's); ``target_shape``:
    it was read from ``spec.target`` and the mirror's ``source``, which its errors name."""
    aliases = list(consumer_opts)
    w = f"spec.mirrors[{mi}]"
    if not isinstance(m, dict):
        raise draft.error(w, "expected a mapping")
    ends = []
    for side in ("sourceCluster", "targetCluster"):
        alias = m.get(side)
        if not isinstance(alias, str) or not alias:
            raise draft.error(f"{w}.{side}", "missing")
        if alias not in aliases:
            raise draft.error(f"{w}.{side}", f"undefined cluster {alias!r} (spec.clusters: {', '.join(aliases)})")
        ends.append(alias)
    src, dst = ends
    if src == dst:
        if target_shape:
            raise draft.error(f"{w}.source", f"the mirror's source and spec.target are the same cluster ({src!r})")
        raise draft.error(w, "sourceCluster and targetCluster are the same cluster")
    settings: dict[str, mm2.Setting] = {mm2.EOS: eos[dst]} if dst in eos else {}
    for key, mm2_key in _PATTERNS.items():
        if key in m:
            if not isinstance(m[key], str):
                raise draft.error(f"{w}.{key}", "expected a string of regexes")
            settings[mm2_key] = mm2.Setting(m[key], f"{w}.{key}")
    gi = len(groups)
    off: dict[str, str] = {}  # connector -> why Strimzi ran it not (absent, paused, stopped)
    for conn in _CONNECTORS:
        block = m.get(conn)
        if block is None:
            off[_CONNECTOR_CLASS[conn]] = f"{w}.{conn} is not set: Strimzi creates no {_CONNECTOR_CLASS[conn]} without it"
            continue
        if not isinstance(block, dict):
            raise draft.error(f"{w}.{conn}", "expected a mapping")
        state = _connector_state(draft, f"{w}.{conn}", block)
        if state is not None:
            off[_CONNECTOR_CLASS[conn]] = state
        cfg = block.get("config") or {}
        if not isinstance(cfg, dict):
            raise draft.error(f"{w}.{conn}.config", "expected a mapping")
        for k, v in cfg.items():
            settings[str(k)] = mm2.Setting(common.prop_text(v), f"{w}.{conn}.config.{k}")
        for k, v in block.items():
            if k in ("config", "state", "pause"):
                continue
            if k == "tasksMax":
                draft.unmapped(f"{w}.{conn}.tasksMax", f"{v}: no equivalent (parallelism follows the host: spark.direct_processes writer processes, one per core by default, on the direct read path; a Spark task per source partition on Spark's)",
                               ("groups", gi))
            else:
                draft.unmapped(f"{w}.{conn}.{k}", f"{_short(v)}: no equivalent (a Kafka Connect connector setting)",
                               ("groups", gi))
    group = mm2.flow_group(draft, gi, src, dst, settings, consumer_opts[src])
    taken = {g["name"] for g in groups}
    name, n = group["name"], 2
    while name in taken:
        name, n = f"{group['name']}-{n}", n + 1
    group["name"] = name
    group["enabled"] = True
    mm2.connectors_off(draft, ("groups", gi), group, off)
    for k in m:
        if k not in ("sourceCluster", "targetCluster", *_PATTERNS, *_CONNECTORS):
            draft.unmapped(f"{w}.{k}", f"{_short(m[k])}: no equivalent", ("groups", gi))
    return mm2.order_group(group)


def _connector_state(draft: Draft, where: str, block: dict[str, Any]) -> str | None:
    """Why a connector block Strimzi deploys does not run (``state: paused|stopped``, or the older
    ``pause: true``), or None when it runs."""
    state = block.get("state")
    if state is not None:
        if state not in ("running", "paused", "stopped"):
            raise draft.error(f"{where}.state", f"expected running, paused or stopped, got {state!r}")
        if state != "running":
            return f"{where}.state is {state}: the connector copied nothing"
    pause = block.get("pause")
    if pause is not None and not isinstance(pause, bool):
        raise draft.error(f"{where}.pause", f"expected true or false, got {pause!r}")
    if pause and state is None:
        return f"{where}.pause is true: the connector copied nothing"
    return None
