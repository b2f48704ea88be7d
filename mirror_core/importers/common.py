"""Pieces every importer shares: clusters from Java client settings, regex lists, booleans, durations."""

from __future__ import annotations

import re
import warnings
from typing import Any

from mirror_core.importers.draft import Draft, safe_alias
from mirror_core.importers.javaclient import ClientMapping

#: MM2's defaults (MirrorSourceConfig / MirrorCheckpointConfig), written out so the import keeps them.
MM2_TOPICS_EXCLUDE = [r".*[\-\.]internal", r".*\.replica", r"__.*"]
MM2_GROUPS_EXCLUDE = [r"console-consumer-.*", r"connect-.*", r"__.*"]
#: a regex no name matches: what MM2's blank ``topics =`` / ``groups =`` list meant
MATCH_NOTHING = "(?!)"
#: mirrorflow's own consumer groups are never checkpointed (added to any groups exclude).
OWN_GROUPS = r".*\.mirrorflow\..*"

#: Kafka Connect worker settings: MM2 runs on a Connect worker, mirrorflow runs none.
CONNECT_WORKER_RE = re.compile(
    r"^(config\.storage\.|offset\.storage\.|status\.storage\.|key\.converter|value\.converter|"
    r"header\.converter|offset\.flush\.|group\.id$|plugin\.path$|rest\.|listeners$|"
    r"dedicated\.mode\.|scheduled\.rebalance|connector\.client\.config\.override\.policy$|"
    r"task\.shutdown\.graceful\.timeout\.ms$|worker\.)"
)


def put_cluster(draft: Draft, alias: str, m: ClientMapping, registry: dict[str, Any] | None = None) -> None:
    """``clusters.<alias>``: the mapped librdkafka settings, secrets as placeholders, notes beside them."""
    kafka: dict[str, str] = {}
    if "bootstrap.servers" in m.cluster:
        kafka["bootstrap.servers"] = m.cluster["bootstrap.servers"]
    for k in sorted(m.cluster):
        kafka.setdefault(k, m.cluster[k])
    base = ("clusters", alias, "kafka")
    for rd_key, (var, what) in sorted(m.secrets.items()):
        kafka[rd_key] = draft.secret(var, f"{what}, cluster {alias}")
        draft.note(base + (rd_key,), f"set {var} before running: {what}")
    for key, text in m.notes:
        draft.note(base + (key,) if key in kafka else base, text)
    entry: dict[str, Any] = {"kafka": kafka}
    if registry:
        entry["schema_registry"] = registry
    if m.java:
        java: dict[str, str] = dict(sorted(m.java.items()))
        for key, (var, what) in sorted(m.java_secrets.items()):
            java[key] = draft.secret(var, f"{what}, cluster {alias}")
            draft.note(("clusters", alias, "java_kafka", key), f"set {var} before running: {what}")
        entry["java_kafka"] = java
        draft.note(("clusters", alias, "java_kafka"), "Java-only settings for Spark's Kafka source")
    draft.tree.setdefault("clusters", {})[alias] = entry


def report(draft: Draft, m: ClientMapping, anchor: tuple[str | int, ...], file: str | None = None) -> None:
    """The client settings that did not map, as findings beside ``anchor``."""
    for where, message in m.findings:
        draft.unmapped(where, message, anchor, file)


def host_alias(bootstrap: str, taken: set[str] | list[str], fallback: str) -> str:
    """A readable cluster alias from the first broker's host name (``kafka-1.dc1:9092`` -> ``kafka-1``)."""
    host = bootstrap.split(",")[0].strip().rsplit(":", 1)[0].split(".")[0]
    alias = base = safe_alias(host) if host else fallback
    n = 2
    while alias in taken:
        alias, n = f"{base}-{n}", n + 1
    return alias


def first_run(tool: str, where: str) -> list[str]:
    """What the first run of an imported mirror does, for tools that kept no offset syncs (viooh, MM1)."""
    return [
        f"First run: {tool} committed its progress under the consumer group(s) kept below ({where}), on the",
        "source cluster, but wrote no offset syncs: without them a mirror starts at each source partition's",
        f"earliest offset and copies again what {tool} already wrote. To start where {tool} stopped: stop it,",
        "then `mirrorflow provision` this file and, before the first `mirrorflow run`, seed each partition's",
        "position from those groups: python -m mirror_core.handover FILE --group GROUP [--dry-run].",
        f"{tool} did not preserve partitions (its producer chose them again from the key); mirrorflow does, so",
        "a key may now land in another partition than before: per-key order holds within each side of the",
        "switch, destination consumers should finish what is there before reading on, and offsets from before",
        "the switch cannot be translated (checkpoints start at the seeded positions).",
    ]


def regex_list(value: str) -> list[str]:
    """MM2's comma-separated list of regexes (``topics = a.*, b``); empty items dropped."""
    return [x.strip() for x in value.split(",") if x.strip()]


#: a Java inline-flag group at the start of a list item: ``(?i)``, ``(?is-x)``
_LEADING_FLAGS = re.compile(r"^\(\?(?=[a-zA-Z-]*[a-zA-Z])([a-zA-Z]*)(?:-([a-zA-Z]*))?\)")
#: Java flags Python can scope (``(?i:...)``); ``u`` / ``U`` (Unicode case / classes) are Python's default for str
_SCOPED_FLAGS = frozenset("imsx")
_UNICODE_FLAGS = frozenset("uU")


def check_regex(draft: Draft, where: str, pattern: str) -> str:
    """``pattern`` if Python reads it as Java did; errors name the input key ``where``. Python only warns
    (FutureWarning) about Java-only class syntax such as the intersection ``[a-z&&[^x]]``, and would then
    read it with another meaning, so such a warning is an error here."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        re.purge()  # a cached pattern is not parsed again, and would not warn again
        try:
            re.compile(pattern)
        except re.error as exc:
            hint = ""
            if "global flags" in str(exc):
                hint = (" (Java applies an inline flag to the rest of the pattern, Python only at the start: put it "
                        "at the start of the list item or use a scoped group such as (?i:...))")
            elif "bad escape \\Q" in str(exc) or "bad escape \\E" in str(exc):
                hint = " (\\Q...\\E quoting is Java-only: escape each character instead)"
            raise draft.error(where, f"invalid regex {pattern!r}: {exc}{hint}") from None
    java_only = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    if java_only:
        raise draft.error(where, f"regex {pattern!r}: {java_only[0]}: a Java-only construct (character class "
                          "intersection '&&' or a nested class) that Python reads otherwise; rewrite it without")
    return pattern


def _leading_flags(draft: Draft, where: str, item: str, on: set[str], off: set[str]) -> str:
    """``item`` without its leading Java flag group, whose flags update ``on`` / ``off`` in place: in
    Java they apply to the rest of the joined pattern, so to this item and every later one."""
    m = _LEADING_FLAGS.match(item)
    if not m:
        return item
    add, remove = set(m.group(1)), set(m.group(2) or "")
    unknown = (add | remove) - _SCOPED_FLAGS - _UNICODE_FLAGS
    if unknown:
        raise draft.error(where, f"inline flag(s) {''.join(sorted(unknown))} in {item!r}: no Python equivalent "
                          f"(Python can scope only {''.join(sorted(_SCOPED_FLAGS))})")
    add -= _UNICODE_FLAGS
    remove -= _UNICODE_FLAGS
    on |= add
    on -= remove
    off |= remove
    off -= add
    return item[m.end():]


def alternation(draft: Draft, where: str, patterns: list[str]) -> str:
    """One full-match regex for a list, as MM2 joined it (``|``): each item checked on its own, so the
    error names the bad one, then the whole. A leading inline flag group such as ``(?i)`` applies, as in
    Java, to its item and all later ones; Python cannot have it mid-pattern, so it becomes scoped groups."""
    on: set[str] = set()
    off: set[str] = set()
    parts: list[tuple[str, str]] = []
    for p in patterns:
        body = _leading_flags(draft, where, p, on, off)
        check_regex(draft, where, body)
        flags = "".join(sorted(on)) + ("-" + "".join(sorted(off)) if off else "")
        parts.append((body, flags))
    if len(parts) == 1 and not parts[0][1]:
        return check_regex(draft, where, parts[0][0])
    return check_regex(draft, where, "|".join(f"(?{flags}:{body})" for body, flags in parts))


def prop_text(v: Any) -> str:
    """A YAML / JSON scalar as the Java property text it stands for (``true``, ``3``)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def parse_bool(draft: Draft, where: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "false"):
        return v == "true"
    raise draft.error(where, f"expected true or false, got {value!r}")


def parse_int(draft: Draft, where: str, value: str, minimum: int | None = None) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise draft.error(where, f"expected a whole number, got {value!r}") from None
    if minimum is not None and n < minimum:
        raise draft.error(where, f"expected a number >= {minimum}, got {n}")
    return n


def seconds(n: int | float) -> str:
    """A duration as the YAML writes it (``60s``, ``500ms``)."""
    return f"{int(n * 1000)}ms" if n < 1 else f"{n:g}s"
