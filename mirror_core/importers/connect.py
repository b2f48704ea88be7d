"""MirrorMaker 2 run as Kafka Connect connectors -> mirrorflow groups (one per source -> target pair).

The input is one or more connector configs as posted to a Connect cluster's REST API: JSON, either
``{"name": ..., "config": {...}}`` or the bare config map, or a ``.properties`` file. Each names its
``connector.class`` (``MirrorSourceConnector``, ``MirrorCheckpointConnector`` or
``MirrorHeartbeatConnector``, short or fully qualified) and its pair (``source.cluster.alias`` /
``target.cluster.alias``, MM2's defaults ``source`` / ``target``). The connectors of one pair make one
group, mapped by :func:`.mm2.flow_group` as a dedicated-mode ``A->B`` flow is:

- ``source.cluster.*`` / ``target.cluster.*`` client settings -> ``clusters.<alias>.kafka`` (secrets become
  ``${ENV}`` placeholders); the consumer / producer / admin overrides (``consumer.*``, ``source.consumer.*``,
  ``producer.override.*``, ...) as dedicated mode's ``<alias>.consumer.*`` / ``.producer.*`` / ``.admin.*``;
- the MM2 settings of :data:`.mm2.CONNECTOR_KEYS`; every file of a pair that sets one must agree;
- delivery: Connect ran a connector exactly-once only when its worker had ``exactly.once.source.support =
  enabled`` (a worker setting, not in a connector config); ``exactly.once.support = required`` on the
  MirrorSourceConnector says it had (the connector fails to start otherwise), so it maps to
  ``exactly_once``; unset or ``requested`` depended on the worker, which the import reports;
- a connector class that is not among the inputs (or ``enabled = false``) ran nothing, so its part is
  imported off, as for Strimzi.

What concerns only one connector in Connect (``tasks.max``, converters, transforms, error handling, other
Connect settings) is reported for the file that sets it. Converters: MM2 hands Connect raw bytes, so a
``ByteArrayConverter`` copied them unchanged, as mirrorflow does; any other converter changed what was
written, which is reported.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, NamedTuple

from mirror_core.config import ALIAS_RE
from mirror_core.importers import common, mm2
from mirror_core.importers.draft import Draft, Path
from mirror_core.importers.javaclient import ClientMapping, holds_private_key, is_secret, safe_text, shown, translate

_PACKAGE = "org.apache.kafka.connect.mirror."
CLASSES = ("MirrorSourceConnector", "MirrorCheckpointConnector", "MirrorHeartbeatConnector")
_SIDES = {"source": "source.cluster.", "target": "target.cluster."}
_DEFAULT_ALIAS = {"source": "source", "target": "target"}

#: per-connector client overrides -> (side, role) as dedicated mode's ``<alias>.<role>.*``; longest first
_ROLE_PREFIXES = (
    ("source.cluster.consumer.", "source", "consumer"), ("source.cluster.producer.", "source", "producer"),
    ("source.cluster.admin.", "source", "admin"), ("target.cluster.consumer.", "target", "consumer"),
    ("target.cluster.producer.", "target", "producer"), ("target.cluster.admin.", "target", "admin"),
    ("producer.override.", "target", "producer"), ("admin.override.", "target", "admin"),
    ("source.consumer.", "source", "consumer"), ("source.producer.", "source", "producer"),
    ("source.admin.", "source", "admin"), ("target.producer.", "target", "producer"),
    ("target.admin.", "target", "admin"), ("target.consumer.", "target", "consumer"),
    ("consumer.", "source", "consumer"), ("producer.", "target", "producer"), ("admin.", "target", "admin"),
)
_BYTES = re.compile(r"(org\.apache\.kafka\.connect\.converters\.)?ByteArrayConverter")
_CONVERTER = re.compile(r"^(key|value|header)\.converter$")
#: Kafka Connect's own connector settings, which MM2's connectors ran with but mirrorflow has no use for
_CONNECT_KEYS = re.compile(r"^(key|value|header)\.converter\.|^(transforms|predicates)(\.|$)|^errors\.|"
                           r"^config\.action\.reload$|^topic\.creation\.|^offsets\.storage\.topic$|"
                           r"^transaction\.boundary\.interval\.ms$|^consumer\.override\.")
_SMT = "single message transforms changed records; mirrorflow copies them unchanged"


@dataclass(frozen=True)
class Connector:
    """One connector config: its class, its pair and its other settings (``where`` is the input key)."""

    file: str
    name: str | None
    cls: str  # one of CLASSES
    src: str
    dst: str
    settings: dict[str, mm2.Setting]


def is_connector_config(text: str) -> bool:
    """A Connect connector config (JSON, or properties with ``connector.class`` and no ``clusters``)
    rather than dedicated mode's mm2.properties."""
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except ValueError:
            return True  # dedicated mode is never JSON: let read_connector say what is wrong
        cfg = doc.get("config", doc) if isinstance(doc, dict) else None
        return not isinstance(cfg, dict) or "clusters" not in cfg
    keys = {m.group(1) for m in re.finditer(r"^[ \t\f]*([^\s:=#!]+)", text, re.M)}
    return "connector.class" in keys and "clusters" not in keys


def read_connector(text: str, file: str) -> Connector:
    """One connector config; a malformed one is an error naming ``file`` and the key."""
    draft = Draft(file)
    props = _json_settings(draft, text) if text.lstrip().startswith("{") else mm2.parse_properties(draft, text)
    if "clusters" in props:
        raise draft.error("clusters", "a dedicated-mode mm2.properties among connector configs: import it on its own")
    name = props.pop("name").value if "name" in props else None
    cls_s = props.pop("connector.class", None)
    if cls_s is None:
        raise draft.error("connector.class", f"missing: name one of {', '.join(CLASSES)}")
    cls = cls_s.value.strip()
    short = cls.removeprefix(_PACKAGE)
    if short not in CLASSES:
        raise draft.error("connector.class", f"{cls!r} is not one of MirrorMaker 2's connectors "
                          f"({', '.join(CLASSES)}, short or under {_PACKAGE.rstrip('.')})")
    ends = []
    for side in ("source", "target"):
        key = f"{side}.cluster.alias"
        s = props.pop(key, None)
        alias = s.value.strip() if s is not None else _DEFAULT_ALIAS[side]
        if not re.match(ALIAS_RE, alias):
            raise draft.error(key, f"alias {alias!r} cannot be used: mirrorflow aliases are letters, digits, '_' and '-'")
        ends.append(alias)
    if ends[0] == ends[1]:
        raise draft.error("target.cluster.alias", f"the same alias as source.cluster.alias ({ends[0]!r})")
    return Connector(file, name, short, ends[0], ends[1], props)


def _json_settings(draft: Draft, text: str) -> dict[str, mm2.Setting]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise draft.error(f"line {exc.lineno}", f"invalid JSON: {exc.msg}") from None
    if not isinstance(doc, dict):
        raise draft.error("line 1", "expected a JSON object: a connector config or {\"name\": ..., \"config\": {...}}")
    cfg: Any = doc
    if "config" in doc:  # as POST /connectors takes it (GET /connectors/NAME adds tasks and type)
        cfg = doc["config"]
        if not isinstance(cfg, dict):
            raise draft.error("config", "expected a JSON object of connector settings")
        extra = sorted(set(doc) - {"name", "config", "tasks", "type"})
        if extra:
            raise draft.error(extra[0], "not part of a connector config ({\"name\": ..., \"config\": {...}})")
        if "name" in doc and "name" not in cfg:
            cfg = cfg | {"name": doc["name"]}
    out: dict[str, mm2.Setting] = {}
    for k, v in cfg.items():
        if isinstance(v, (dict, list)):
            raise draft.error(k, "expected a string, number or boolean (Connect takes every setting as text)")
        if v is not None:  # Connect reads null as unset
            out[k] = mm2.Setting(common.prop_text(v), k)
    return out


def import_connectors(inputs: list[tuple[str, str]]) -> Draft:
    """``inputs``: (text, file) of each connector config. One group per source -> target pair."""
    conns = [read_connector(text, file) for text, file in inputs]
    draft = Draft(conns[0].file)
    multi = len(inputs) > 1
    pairs: dict[tuple[str, str], dict[str, Connector]] = {}
    for c in conns:
        same = pairs.setdefault((c.src, c.dst), {})
        if c.cls in same:
            raise Draft(c.file).error("connector.class", f"a second {c.cls} for {c.src}->{c.dst} (also "
                                      f"{PurePath(same[c.cls].file).name}): give one connector of each class per pair")
        same[c.cls] = c

    # what each pair says about its clusters, checked to agree wherever an alias is used
    shared = {pair: _merge(cs) for pair, cs in pairs.items()}
    clusters: dict[str, _Described] = {}
    for (src, dst), (merged, files) in sorted(shared.items()):
        home = next(c.file for c in pairs[(src, dst)].values())
        for side, alias in (("source", src), ("target", dst)):
            prefix = _SIDES[side]
            props = {k.removeprefix(prefix): s for k, s in merged.items() if _kind(k).what == "client" and k.startswith(prefix)}
            desc = _Described(props, prefix, files, home)
            seen = clusters.get(alias)
            if seen is None or not seen.props:
                clusters[alias] = desc
            elif props:
                _same_cluster(alias, seen, desc)
    mappings: dict[str, ClientMapping] = {}
    for alias, desc in clusters.items():
        draft.files = desc.files if multi else {}
        mappings[alias] = _cluster(draft, alias, desc)
    consumer_opts: dict[str, dict[str, str]] = {a: dict(m.source_options) for a, m in mappings.items()}
    for (src, dst), (merged, files) in sorted(shared.items()):
        draft.files = files if multi else {}
        for k, s in sorted(merged.items()):
            kind = _kind(k)
            if kind.what == "role":
                alias = src if kind.side == "source" else dst
                consumer_opts[alias].update(
                    mm2.role_setting(draft, alias, kind.role, k.removeprefix(kind.prefix), s, mappings[alias]))

    groups: list[dict[str, Any]] = []
    draft.tree["groups"] = groups
    for (src, dst), (merged, files) in sorted(shared.items()):
        draft.files = files if multi else {}
        groups.append(_group(draft, len(groups), pairs[(src, dst)], merged, consumer_opts[src], multi))
    draft.files = {}
    return draft


class _Kind(NamedTuple):
    """How a connector setting is read (:func:`_kind`)."""

    what: str  # flow: an MM2 setting the pair shares; client: a cluster's; role: a client override; own: the connector's
    side: str = ""  # client / role: source or target
    role: str = ""  # role: consumer, producer or admin
    prefix: str = ""  # role: the prefix before the client setting's name


def _kind(key: str) -> _Kind:
    if key in mm2.CONNECTOR_KEYS and key not in (mm2.EOS, "enabled"):
        return _Kind("flow")
    if key in mm2.NO_EQUIVALENT or _CONNECT_KEYS.match(key):
        return _Kind("own")
    for prefix, side, role in _ROLE_PREFIXES:
        if key.startswith(prefix):
            return _Kind("role", side, role, prefix)
    for side, prefix in _SIDES.items():
        if key.startswith(prefix):
            return _Kind("client", side)
    return _Kind("own")


def _merge(conns: dict[str, Connector]) -> tuple[dict[str, mm2.Setting], dict[str, str]]:
    """The settings a pair's connectors share, and the file each came from; two files that set one
    differently are an error (mirrorflow runs the pair as one group with one value)."""
    merged: dict[str, mm2.Setting] = {}
    files: dict[str, str] = {}
    for cls in CLASSES:
        c = conns.get(cls)
        if c is None:
            continue
        for k, s in c.settings.items():
            if _kind(k).what == "own":
                continue
            if k in merged and merged[k].value.strip() != s.value.strip():
                raise Draft(c.file).error(k, f"{_differs(k, s.value, merged[k].value, files[k])}: the connectors of "
                                          f"{c.src}->{c.dst} must agree (mirrorflow runs them as one group)")
            merged.setdefault(k, s)
            files.setdefault(k, c.file)
    return merged, files


def _differs(key: str, value: str, other: str, other_file: str) -> str:
    name = PurePath(other_file).name
    if is_secret(key) or holds_private_key(value) or holds_private_key(other):
        return f"differs from {name}'s (a secret: values not shown)"
    return f"{safe_text(value)!r} here but {safe_text(other)!r} in {name}"


@dataclass(frozen=True)
class _Described:
    """A cluster as one pair's connectors describe it: its client settings (keys without ``prefix``),
    the file each came from, and the file to name when a setting is missing."""

    props: dict[str, mm2.Setting]
    prefix: str  # source.cluster. or target.cluster.
    files: dict[str, str]
    home: str

    def file(self, key: str) -> str:
        return self.files.get(self.prefix + key, self.home)


def _same_cluster(alias: str, a: _Described, b: _Described) -> None:
    """Cluster ``alias`` as two pairs describe it (e.g. as one's source and the other's target):
    mirrorflow has one client config per cluster, so both must give the same settings."""
    for k in sorted(set(a.props) | set(b.props)):
        va, vb = a.props.get(k), b.props.get(k)
        if va is not None and vb is not None:
            if va.value.strip() != vb.value.strip():
                raise Draft(b.file(k)).error(b.prefix + k, f"{_differs(k, vb.value, va.value, a.file(k))} for cluster "
                                             f"{alias!r}: mirrorflow has one client config per cluster")
            continue
        has, lacks = (a, b) if va is not None else (b, a)
        raise Draft(has.file(k)).error(has.prefix + k, f"not set for cluster {alias!r} in "
                                       f"{PurePath(lacks.home).name} ({lacks.prefix}*): mirrorflow has one client "
                                       "config per cluster, so the connectors using the alias must describe it alike")


def _cluster(draft: Draft, alias: str, desc: _Described) -> ClientMapping:
    props, prefix = desc.props, desc.prefix
    bs = props.get("bootstrap.servers")
    if bs is None or not bs.value.strip():
        raise Draft(desc.file("bootstrap.servers")).error(
            f"{prefix}bootstrap.servers", f"{'missing' if bs is None else 'empty'}: cluster {alias!r} has no bootstrap servers")
    plain = {k: s.value for k, s in props.items() if not common.CONNECT_WORKER_RE.match(k)}
    cm = translate(plain, alias, prefix)
    common.put_cluster(draft, alias, cm)
    common.report(draft, cm, ("clusters", alias))
    for k in sorted(props):
        if common.CONNECT_WORKER_RE.match(k):
            draft.unmapped(prefix + k, "Kafka Connect worker setting: mirrorflow runs no Connect worker", ("clusters", alias))
    return cm


def _group(draft: Draft, gi: int, conns: dict[str, Connector], merged: dict[str, mm2.Setting],
           source_options: dict[str, str], multi: bool) -> dict[str, Any]:
    first = next(c for c in (conns.get(cls) for cls in CLASSES) if c is not None)
    src, dst = first.src, first.dst
    at: Path = ("groups", gi)
    settings = {k: s for k, s in merged.items() if _kind(k).what == "flow"}
    off: dict[str, str] = {}
    for cls in CLASSES:
        c = conns.get(cls)
        if c is None:
            off[cls] = f"no {cls} config for {src}->{dst} among the inputs: it ran nothing"
            continue
        enabled = c.settings.get("enabled")
        if enabled is not None and not common.parse_bool(Draft(c.file), "enabled", enabled.value):
            off[cls] = f"{PurePath(c.file).name}: enabled = false: the connector ran nothing"
    source = conns.get("MirrorSourceConnector")
    eos = source.settings.get("exactly.once.support") if source else None
    if eos is not None and eos.value.strip().lower() == "required":
        settings[mm2.EOS] = mm2.Setting("enabled", "exactly.once.support = required, so the worker's "
                                        "exactly.once.source.support")
    group = mm2.flow_group(draft, gi, src, dst, settings, source_options)
    group["enabled"] = True
    mm2.connectors_off(draft, at, group, off)
    names = ", ".join(f"{c.name or '(unnamed)'} ({PurePath(c.file).name})" for c in conns.values())
    draft.note(at, f"from the connectors {names}")
    if source is not None and (eos is None or eos.value.strip().lower() != "required"):
        _delivery_unknown(draft, at, source, eos, multi)
    for c in conns.values():
        for k, s in sorted(c.settings.items()):
            if _kind(k).what == "own":
                _own(draft, at, c, k, s, multi)
    return mm2.order_group(group)


def _delivery_unknown(draft: Draft, at: Path, source: Connector, eos: mm2.Setting | None, multi: bool) -> None:
    value = eos.value.strip().lower() if eos is not None else "requested"
    if value not in ("requested", "required"):
        raise Draft(source.file).error("exactly.once.support", f"expected required or requested, got {eos.value if eos else ''!r}")
    said = "unset (Connect's default requested)" if eos is None else "requested"
    draft.unmapped("exactly.once.support", f"{said}: MM2 ran exactly-once only if the Connect worker had "
                   "exactly.once.source.support = enabled, a worker setting not in a connector config; imported "
                   "at_least_once: set delivery: exactly_once if it had", at + ("delivery",), source.file if multi else None)


def _own(draft: Draft, at: Path, c: Connector, k: str, s: mm2.Setting, multi: bool) -> None:
    """A setting that concerns its connector alone: a note when it changed nothing mirrorflow does
    differently, else a finding for its file."""
    file = c.file if multi else None
    conv = _CONVERTER.match(k)
    if conv:
        if _BYTES.fullmatch(s.value.strip()):
            draft.note(at, "converters: ByteArrayConverter, so MM2 wrote the source's bytes unchanged, as mirrorflow does")
        else:
            draft.unmapped(k, f"{shown(k, s.value)}: MM2 wrote what this converter made of each record's bytes; "
                           "mirrorflow copies the source's bytes unchanged (what ByteArrayConverter does), so the "
                           "mirrored topics' consumers will read the source's format", at, file)
        return
    if k == "exactly.once.support" and c.cls == "MirrorSourceConnector":
        return  # decided delivery (_group)
    if k == "transaction.boundary" and c.cls == "MirrorSourceConnector" and s.value.strip() == "poll":
        draft.note(at + ("delivery",), "transaction.boundary = poll: under exactly_once mirrorflow commits a "
                   "transaction per source partition per batch")
        return
    if k == "enabled":
        return  # decided what ran (_group)
    if k in mm2.NO_EQUIVALENT:
        why = mm2.NO_EQUIVALENT[k]
    elif k.startswith(("transforms", "predicates")):
        why = _SMT
    elif k == "transaction.boundary" and c.cls == "MirrorSourceConnector":
        why = "under exactly_once mirrorflow commits a transaction per source partition per batch"
    elif k in ("exactly.once.support", "transaction.boundary"):
        why = f"it concerns the {c.cls}'s own records; mirrorflow's delivery covers the mirrored ones"
    elif k == mm2.EOS:
        why = "a Connect worker setting, which a connector config does not set; see exactly.once.support"
    elif _CONNECT_KEYS.match(k) or common.CONNECT_WORKER_RE.match(k):
        why = "a Kafka Connect setting: mirrorflow runs no Connect worker"
    else:
        draft.unmapped(k, f"{shown(k, s.value)}: not a MirrorMaker 2 setting mirrorflow maps", at, file)
        return
    draft.unmapped(k, f"{shown(k, s.value)}: no equivalent ({why})", at, file)

