"""MirrorMaker 1 (``kafka-mirror-maker.sh``): consumer.properties + producer.properties + the include
regex -> one mirrorflow group with one regex flow.

MM1 kept topic names (identity policy), created no topics itself (the destination broker's
auto-creation did, with the broker's defaults), copied no configs, ACLs or consumer offsets, and
committed its progress under the consumer's ``group.id``, which the flow keeps.
"""

from __future__ import annotations

import re
from typing import Any

from mirror_core.importers import common, mm2
from mirror_core.importers.draft import Draft, Path
from mirror_core.importers.javaclient import translate


def mm1_include_regex(text: str) -> str:
    """The regex MirrorMaker 1 made of its include list (kafka.utils IncludeList): trimmed, every ',' made
    '|', every space removed, leading and trailing quotes stripped; it then full-matched topic names."""
    regex = text.strip().replace(",", "|").replace(" ", "")
    return re.sub(r"[\"']+$", "", re.sub(r"^[\"']+", "", regex))


def import_mm1(consumer_text: str, consumer_source: str, producer_text: str | None, producer_source: str,
               include: str | None) -> Draft:
    draft = Draft(consumer_source)
    if producer_text is None:
        raise draft.error("--producer", "missing: MirrorMaker 1 needs its producer.properties too")
    if include is None or not include.strip():
        raise draft.error("--include", "missing: the topic regex MirrorMaker 1 ran with (--include / --whitelist "
                          "or MIRROR_MAKER_TOPIC_WHITELIST)")
    consumer = {k: s.value for k, s in mm2.parse_properties(draft, consumer_text).items()}
    producer = {k: s.value for k, s in mm2.parse_properties(Draft(producer_source), producer_text).items()}
    pname = producer_source
    for side, props, src in (("consumer", consumer, consumer_source), ("producer", producer, producer_source)):
        if not props.get("bootstrap.servers", "").strip():
            raise Draft(src).error("bootstrap.servers", f"missing: the {side}'s brokers")

    regex = mm1_include_regex(include)
    topics_re = common.alternation(draft, "--include", [regex])
    if regex != include:
        draft.note(("groups", 0, "mirrors"), f"topics include: MirrorMaker 1 read --include {include!r} as the "
                   f"regex {regex!r} (',' -> '|', spaces and surrounding quotes removed)")

    src = common.host_alias(consumer["bootstrap.servers"], [], "source")
    dst = common.host_alias(producer["bootstrap.servers"], [src], "target")
    group_id = consumer.pop("group.id", None)

    cm = translate(consumer, src, "")
    common.put_cluster(draft, src, cm)
    common.report(draft, cm, ("clusters", src))
    pm = translate(producer, dst, "")
    common.put_cluster(draft, dst, pm)
    common.report(draft, pm, ("clusters", dst), file=pname)
    for k in sorted(pm.source_options):
        draft.unmapped(k.removeprefix("kafka."), "a consumer setting in the producer's file: no effect", ("clusters", dst), pname)

    at: Path = ("groups", 0)
    group: dict[str, Any] = {"name": "mm1", "source": src, "destination": dst, "enabled": True,
                             "replication_policy": "identity"}
    draft.note(at + ("replication_policy",), "MirrorMaker 1 kept topic names")
    group["topics_mirroring"] = {"auto_create_topics": True, "partition_count": {"type": "mirror_source"},
                                 "sync_configs": False, "sync_acls": False}
    draft.note(at + ("topics_mirroring",), "MirrorMaker 1 left topic creation to the destination broker "
               "(auto.create.topics.enable, broker defaults); mirrorflow creates them with the source's partition count")
    group["offsets"] = {"sync_group_offsets": False}
    draft.note(at + ("offsets",), "MirrorMaker 1 synced no consumer groups; checkpoints are written")
    group["heartbeats"] = {"enabled": False}
    if cm.source_options:
        group["spark"] = {"source_options": dict(sorted(cm.source_options.items()))}
        draft.note(at + ("spark",), f"consumer settings of {src} (Spark's Kafka source is the consumer)")
    mirror: dict[str, Any] = {"topics": {"include": topics_re}}
    if group_id:
        mirror["consumer_group"] = group_id
        draft.note(at + ("mirrors", 0), "consumer_group: MirrorMaker 1's group.id, so lag tools keep showing it")
    else:
        draft.unmapped("group.id", "not set: MirrorMaker 1 committed under no group; mirrorflow names one", at)
    group["mirrors"] = [mirror]
    draft.tree["groups"] = [group]
    draft.comments.setdefault(("groups",), [])[:0] = common.first_run("MirrorMaker 1", "group.id")
    return draft
