"""The least-privilege ACLs a group's two principals need, as data (printed, applied, documented).

The source principal reads and describes the mirrored topics, commits the mirror's own consumer
groups and describes the consumer groups whose offsets are checkpointed. The destination principal
creates, writes, reads and configures the mirrored and internal topics (offset syncs, checkpoints,
dead letters, a failover's stops, the mirrored heartbeats), uses the group's transactional ids and writes the
mirrored consumer groups' offsets. Nothing at cluster level, unless ``sync_acls`` is on: then both principals
list ACLs (Describe on the cluster) and the destination's creates them (Alter on the cluster).

A regex flow is granted by the literal prefix of its ``include`` pattern (``payments\\..*`` ->
topics prefixed ``payments.``); a pattern without a usable prefix is reported, not widened to ``*``.
"""

from __future__ import annotations

from dataclasses import dataclass

from mirror_core.config import GroupConfig, MirrorsConfig, default_consumer_group, resolve_mirrors, transactional_id
from mirror_core.errors import PlanError
from mirror_core.policy import build_replication_policy

SOURCE_TOPIC_OPS = ("READ", "DESCRIBE", "DESCRIBE_CONFIGS")
DESTINATION_TOPIC_OPS = ("CREATE", "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS", "ALTER_CONFIGS", "ALTER")
TRANSACTIONAL_ID_OPS = ("WRITE", "DESCRIBE")
MIRROR_GROUP_OPS = ("READ",)
CHECKPOINTED_GROUP_OPS = ("DESCRIBE",)
DESTINATION_GROUP_OPS = ("READ", "DESCRIBE")
#: the source's heartbeats topic: the checkpoint round writes it (creating it if missing), the mirror reads it
SOURCE_HEARTBEATS_OPS = ("CREATE", "WRITE", "READ", "DESCRIBE", "DESCRIBE_CONFIGS")
#: the one resource name Kafka gives a cluster in ACLs
CLUSTER_NAME = "kafka-cluster"


@dataclass(frozen=True)
class Grant:
    """``principal`` may do ``operations`` on ``resource_type`` ``name`` (``pattern``: LITERAL / PREFIXED)."""

    side: str  # "source" | "destination"
    cluster: str
    principal: str
    resource_type: str  # TOPIC | GROUP | TRANSACTIONAL_ID | CLUSTER
    name: str
    pattern: str
    operations: tuple[str, ...]
    why: str

    def kafka_acls_command(self, bootstrap: str = "$BOOTSTRAP") -> str:
        """The equivalent ``kafka-acls.sh`` invocation (what an operator without mirrorflow would run)."""
        ops = " ".join(f"--operation {o.title().replace('_', '')}" for o in self.operations)
        if self.resource_type == "CLUSTER":
            resource = "--cluster"
        else:
            flag = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id"}[self.resource_type]
            pattern = " --resource-pattern-type prefixed" if self.pattern == "PREFIXED" else ""
            resource = f"{flag} '{self.name}'{pattern}"
        return (f"kafka-acls.sh --bootstrap-server {bootstrap} --command-config admin.properties --add "
                f"--allow-principal {self.principal} {ops} {resource}")


def principal_of(cfg: MirrorsConfig, cluster: str) -> str:
    """``User:<sasl.username>`` of a cluster's client settings (the principal its ACLs name)."""
    props = cfg.cluster(cluster).kafka_properties()
    user = props.get("sasl.username")
    if not user:
        raise PlanError(f"clusters.{cluster}.kafka: no sasl.username, so no principal to grant ACLs to "
                        "(principals from certificates or OAUTHBEARER: grant the ACLs printed for User:<name> "
                        "to that principal)")
    return f"User:{user}"


def literal_prefix(pattern: str) -> str:
    """The literal text every match of ``pattern`` starts with (``orders\\.eu\\..*`` -> ``orders.eu.``)."""
    out = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out.append(pattern[i + 1])
            i += 2
            continue
        if ch in ".^$*+?{}[]()|\\":
            break
        out.append(ch)
        i += 1
    text = "".join(out)
    # a quantifier applies to the last literal character: it is not guaranteed
    if i < len(pattern) and pattern[i] in "*?{" and text:
        text = text[:-1]
    return text


def required_acls(cfg: MirrorsConfig, group: GroupConfig) -> list[Grant]:
    """Every ACL the group's mirror needs (provision, run in either delivery mode, checkpoint, lag, verify)."""
    src_p, dst_p = principal_of(cfg, group.source), principal_of(cfg, group.destination)
    policy = build_replication_policy(group)
    grants: list[Grant] = []

    def add(side: str, rtype: str, name: str, pattern: str, ops: tuple[str, ...], why: str) -> None:
        cluster, principal = (group.source, src_p) if side == "source" else (group.destination, dst_p)
        grants.append(Grant(side, cluster, principal, rtype, name, pattern, ops, why))

    for m in resolve_mirrors(group):
        if m.is_flow:
            assert m.topics is not None
            prefix = literal_prefix(m.topics.include)
            if not prefix:
                raise PlanError(f"groups[{group.name}].{m.path}.topics.include: {m.topics.include!r} has no literal "
                                "prefix to grant by; grant its topics one by one")
            add("source", "TOPIC", prefix, "PREFIXED", SOURCE_TOPIC_OPS, f"{m.name}: read the source topics")
            add("destination", "TOPIC", policy.format_remote_topic(group.source, prefix), "PREFIXED",
                DESTINATION_TOPIC_OPS, f"{m.name}: create and write the mirrored topics")
        else:
            assert m.source_topic is not None and m.destination_topic is not None
            add("source", "TOPIC", m.source_topic, "LITERAL", SOURCE_TOPIC_OPS, f"{m.name}: read the source topic")
            add("destination", "TOPIC", m.destination_topic, "LITERAL", DESTINATION_TOPIC_OPS,
                f"{m.name}: create and write the mirrored topic")
        add("source", "GROUP", m.consumer_group, "LITERAL", MIRROR_GROUP_OPS,
            f"{m.name}: commit the mirror's source offsets (lag tools see it)")
    for topic, why in ((group.offset_syncs, "offset syncs (exactly-once positions, translation)"),
                       (group.checkpoints_topic, "checkpoints"), (group.dlq_topic, "dead letters"),
                       (group.stops, "a failover's stop of the stream (the job reads it; finalize writes it)")):
        add("destination", "TOPIC", topic, "LITERAL", DESTINATION_TOPIC_OPS, why)
    # the stem config.transactional_id gives every mirror of the group (names joined with ':')
    txn_prefix = transactional_id(group.name, "", "", "").split(":", 1)[0] + ":"
    add("destination", "TRANSACTIONAL_ID", txn_prefix, "PREFIXED", TRANSACTIONAL_ID_OPS,
        "the writers' transactional ids")
    if group.offsets.emit_checkpoints or group.offsets.sync_group_offsets:
        prefix = literal_prefix(group.offsets.groups.include)
        pattern = "PREFIXED" if prefix else "LITERAL"
        name = prefix or "*"
        add("source", "GROUP", name, pattern, CHECKPOINTED_GROUP_OPS, "read the checkpointed groups' offsets")
        if group.offsets.sync_group_offsets:
            add("destination", "GROUP", name, pattern, DESTINATION_GROUP_OPS,
                "write the translated offsets of idle groups")
    if group.heartbeats.enabled:
        hb = group.heartbeats.topic
        remote = policy.format_remote_topic(group.source, hb)
        add("source", "TOPIC", hb, "LITERAL", SOURCE_HEARTBEATS_OPS,
            "heartbeats: written on the source (as MM2 does), then mirrored like a topic")
        add("source", "GROUP", default_consumer_group(group.name, hb, remote), "LITERAL", MIRROR_GROUP_OPS,
            "heartbeats: commit their mirror's source offsets")
        add("destination", "TOPIC", remote, "LITERAL", DESTINATION_TOPIC_OPS,
            "heartbeats: create and write their mirror (lag reads the newest)")
    if any(m.settings.topics_mirroring.sync_acls for m in resolve_mirrors(group)):
        add("source", "CLUSTER", CLUSTER_NAME, "LITERAL", ("DESCRIBE",), "sync_acls: list the source topics' ACLs")
        add("destination", "CLUSTER", CLUSTER_NAME, "LITERAL", ("DESCRIBE", "ALTER"),
            "sync_acls: list and create the mirrored topics' ACLs (Alter on the cluster lets it create any ACL)")
    return grants


def apply_acls(admin: object, grants: list[Grant], timeout: float = 30.0) -> int:
    """Create the ACL bindings of ``grants`` with ``admin`` (a confluent-kafka AdminClient on the grants'
    cluster, connected as a principal allowed to alter ACLs). Returns how many bindings were created."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    # the cluster resource is BROKER in librdkafka's names
    bindings = [
        AclBinding(ResourceType.BROKER if g.resource_type == "CLUSTER" else ResourceType[g.resource_type], g.name,
                   ResourcePatternType[g.pattern], g.principal, "*",
                   AclOperation[op], AclPermissionType.ALLOW)
        for g in grants for op in g.operations
    ]
    for fut in admin.create_acls(bindings, request_timeout=timeout).values():  # type: ignore[attr-defined]
        fut.result(timeout)
    return len(bindings)
