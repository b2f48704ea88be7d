"""The documented least-privilege grants on secured clusters (ACLs enforced, nothing allowed without one), with
heartbeats on (the default) and ``sync_acls``: plan, provision and the checkpoint round run as the mirror's two
principals with exactly what ``mirrorflow acls`` prints, and the source topic's ACLs, DENY included, reach its
mirror once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from mirror_core import local
from mirror_core.acls import apply_acls, required_acls
from mirror_core.config import parse_config
from mirror_core.topics import create_topics, read_state

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[2]


def config_text(sc, name: str, prefix: str) -> str:
    return "clusters:" + sc.cluster_yaml("src", registry=False) + sc.cluster_yaml("dst", registry=False) + f"""
groups:
  - name: {name}
    source: src
    destination: dst
    replication_policy: prefix
    offset_syncs_topic: "{name}.syncs.internal"
    stops_topic: "{name}.stops.internal"
    dead_letter_topic: "{name}.dlq"
    topics_mirroring:
      replication_factor: {{type: fix, value: 1}}
      sync_acls: true
    offsets: {{groups: {{include: "{name}-app.*"}}}}
    mirrors:
      - {{topics: {{include: "{prefix}\\\\..*"}}}}
"""


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mirror_core.cli", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def topic_acls(admin: AdminClient, topic: str) -> set[tuple[str, str, str]]:
    flt = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, None, None,  # type: ignore[arg-type]
                           AclOperation.ANY, AclPermissionType.ANY)
    return {(b.principal, b.operation.name, b.permission_type.name)
            for b in admin.describe_acls(flt, request_timeout=30).result(30)}


def test_documented_grants_cover_heartbeats_and_sync_acls(secure_clusters, unique, tmp_path):
    sc = secure_clusters
    sec = sc.security
    name, prefix = unique("acl").replace("-", "_"), unique("acls")
    topic = f"{prefix}.orders"
    src_admin = AdminClient(sc.admin_config(sc.src_bootstrap) | {"log_level": 3})
    dst_admin = AdminClient(sc.admin_config(sc.dst_bootstrap) | {"log_level": 3})
    create_topics(src_admin, [NewTopic(topic, 1, 1)])
    source_acls = {("User:*", "READ", "ALLOW"), ("User:bob", "READ", "DENY")}
    bindings = [AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, p, "*", AclOperation[o],
                           AclPermissionType[perm]) for p, o, perm in sorted(source_acls)]
    for fut in src_admin.create_acls(bindings, request_timeout=30).values():
        fut.result(30)

    cfg_path = tmp_path / "acls.yaml"
    cfg_path.write_text(config_text(sc, name, prefix))
    env = sc.principal_env(ROOT)
    cfg = parse_config(yaml.safe_load(cfg_path.read_text()), env=env)
    grants = required_acls(cfg, cfg.groups[0])
    admins = {"src": src_admin, "dst": dst_admin}

    # everything but the cluster-level grants: listing ACLs is refused on both sides, and the plan says so
    for cluster, admin in admins.items():
        apply_acls(admin, [g for g in grants if g.cluster == cluster and g.resource_type != "CLUSTER"])
    res = cli("plan", str(cfg_path), "--group", name, "--json", env=env)
    assert res.returncode == 2, res.stdout[-3000:] + res.stderr[-3000:]
    (plan,) = json.loads(res.stdout)
    src_err, dst_err = [a["reason"] for a in plan["topics"] if a["kind"] == "error"]
    assert "source cluster 'src' (CLUSTER_AUTHORIZATION_FAILED)" in src_err and "Describe on the cluster" in src_err
    assert "destination cluster 'dst' (CLUSTER_AUTHORIZATION_FAILED)" in dst_err and "Alter (to create)" in dst_err
    # provision fails on it too, but only the ACL copy waits for the grants: the mirror topic is made (as the stream
    # goes on mirroring, logging the error; MirrorMaker 2 goes on too)
    res = cli("provision", str(cfg_path), "--group", name, env=env)
    assert res.returncode == 1 and "Describe on the cluster" in res.stderr, res.stdout[-3000:] + res.stderr[-3000:]
    assert f"src.{topic}" in dst_admin.list_topics(timeout=30).topics
    assert topic_acls(dst_admin, f"src.{topic}") == set()

    # all of them: provision copies the source topic's ACLs, the DENY too
    for cluster, admin in admins.items():
        apply_acls(admin, [g for g in grants if g.cluster == cluster and g.resource_type == "CLUSTER"])
    res = cli("provision", str(cfg_path), "--group", name, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert topic_acls(dst_admin, f"src.{topic}") == source_acls

    # a checkpoint round writes a heartbeat, creating the source's heartbeats topic as the source principal
    res = cli("checkpoint", str(cfg_path), "--group", name, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "heartbeat: sent" in res.stdout
    # which the principal now sees, and planning reads its configs: the plan still works, and has nothing to do
    res = cli("plan", str(cfg_path), "--group", name, "--json", env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (plan,) = json.loads(res.stdout)
    assert {a["kind"] for a in plan["topics"]} == {"unchanged"}, plan["topics"]
    # the destination principal may create and read the heartbeats' mirror (the stream does, when it starts)
    dst_principal = AdminClient({"bootstrap.servers": sc.dst_bootstrap, "log_level": 3,
                                 **sec.client_config(local.DESTINATION_USER)})
    create_topics(dst_principal, [NewTopic("src.heartbeats", 1, 1, config={"cleanup.policy": "compact"})],
                  exist_ok=True)
    assert "src.heartbeats" in read_state(dst_principal).topics
