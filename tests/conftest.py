"""Session fixtures: real local clusters (or external ones given by environment variables).

Set MIRRORFLOW_SRC_BOOTSTRAP / MIRRORFLOW_DST_BOOTSTRAP (and optionally
MIRRORFLOW_SRC_REGISTRY / MIRRORFLOW_DST_REGISTRY) to run the integration
tests against clusters you started yourself; otherwise the session starts its
own with ``mirror_core.local`` on free ports and stops them at the end.
"""

from __future__ import annotations

import gc
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mirror_core.logs import quiet_library_warnings

ROOT = Path(__file__).resolve().parent.parent
# authlib's httpx2 notice, as mirrorflow's commands leave it out (authlib's own "always" filter goes in once,
# here; pytest's filterwarnings below then wins over it in every test and collection)
quiet_library_warnings()


@dataclass(frozen=True)
class Endpoints:
    src_bootstrap: str
    dst_bootstrap: str
    src_registry: str | None
    dst_registry: str | None
    external: bool = False

    def config_yaml(self, groups_yaml: str) -> str:
        """A mirrors YAML whose clusters are these endpoints, with the given ``groups:`` block."""
        def reg(url: str | None) -> str:
            return f"\n    schema_registry: {{url: \"{url}\"}}" if url else ""

        return (
            "clusters:\n"
            f"  src:\n    kafka: {{bootstrap.servers: \"{self.src_bootstrap}\"}}{reg(self.src_registry)}\n"
            f"  dst:\n    kafka: {{bootstrap.servers: \"{self.dst_bootstrap}\"}}{reg(self.dst_registry)}\n"
            + groups_yaml
        )


def _from_environment() -> Endpoints | None:
    src = os.environ.get("MIRRORFLOW_SRC_BOOTSTRAP")
    dst = os.environ.get("MIRRORFLOW_DST_BOOTSTRAP")
    if not (src and dst):
        return None
    return Endpoints(src, dst, os.environ.get("MIRRORFLOW_SRC_REGISTRY"), os.environ.get("MIRRORFLOW_DST_REGISTRY"),
                     external=True)


@pytest.fixture(scope="session")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    """Two real Kafka clusters with a schema registry each, for the whole session."""
    external = _from_environment()
    if external:
        yield external
        return
    from mirror_core import local

    env = local.LocalEnv.from_environment(tmp_path_factory.mktemp("local-clusters"))
    spec = local.free_spec()
    local.up(env, spec, progress=lambda m: print(f"[clusters] {m}", flush=True))
    try:
        src, dst = spec.sides
        yield Endpoints(src.bootstrap, dst.bootstrap, src.registry_url, dst.registry_url)
    finally:
        # writers the tests ran in this process keep producers; let them go while the brokers still answer
        from mirror_core import replicate

        replicate.release_producers()
        gc.collect()
        local.down(env)


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Unique topic / group / subject names per test: ``unique("orders")`` -> ``orders-1a2b3c4d``."""
    def make(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"

    return make


@dataclass(frozen=True)
class SecureClusters:
    """A secured pair started by ``local up --secure`` semantics: endpoints and the local security material."""

    src_bootstrap: str
    dst_bootstrap: str
    src_registry: str
    dst_registry: str
    security: object  # mirror_core.local.Security
    env: object  # mirror_core.local.LocalEnv
    spec: object  # mirror_core.local.ClusterSpec

    def admin_config(self, bootstrap: str) -> dict[str, str]:
        """librdkafka settings for the super user (test set-up and the independent reader)."""
        return {"bootstrap.servers": bootstrap, **self.security.client_config()}  # type: ignore[attr-defined]

    def passwords(self) -> list[str]:
        return [pw for _, pw in self.security.passwords]  # type: ignore[attr-defined]

    def cluster_yaml(self, side: str, registry: bool = True) -> str:
        """The ``clusters.<side>`` block of a mirrors YAML reaching ``src`` / ``dst`` as the mirror's principal
        (user, password and CA only by ``${ENV}``: see :meth:`principal_env`)."""
        bootstrap, url = (self.src_bootstrap, self.src_registry) if side == "src" else (self.dst_bootstrap,
                                                                                        self.dst_registry)
        text = f"""
  {side}:
    kafka:
      bootstrap.servers: "{bootstrap}"
      security.protocol: SASL_SSL
      sasl.mechanism: SCRAM-SHA-512
      sasl.username: "${{MIRRORFLOW_{side.upper()}_USERNAME}}"
      sasl.password: "${{MIRRORFLOW_{side.upper()}_PASSWORD}}"
      ssl.ca.location: "${{MIRRORFLOW_LOCAL_CA}}\""""
        if registry:
            text += f"""
    schema_registry: {{url: "{url}", ssl.ca.location: "${{MIRRORFLOW_LOCAL_CA}}"}}"""
        return text

    def principal_env(self, root: Path) -> dict[str, str]:
        """The environment a CLI or job subprocess of the repository at ``root`` runs with as the two
        mirror principals."""
        from mirror_core import local

        sec = self.security
        return {**os.environ, "PYTHONPATH": f"{root}:{root / 'plugins'}",
                "MIRRORFLOW_SRC_USERNAME": local.SOURCE_USER,
                "MIRRORFLOW_SRC_PASSWORD": sec.password(local.SOURCE_USER),  # type: ignore[attr-defined]
                "MIRRORFLOW_DST_USERNAME": local.DESTINATION_USER,
                "MIRRORFLOW_DST_PASSWORD": sec.password(local.DESTINATION_USER),  # type: ignore[attr-defined]
                "MIRRORFLOW_LOCAL_CA": str(sec.ca_file)}  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def secure_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureClusters]:
    """Two secured clusters (SASL_SSL SCRAM-SHA-512, ACLs enforced, HTTPS registries) for one test module;
    stopped at its end, also when it fails."""
    from mirror_core import local

    env = local.LocalEnv.from_environment(tmp_path_factory.mktemp("secure-clusters"))
    spec = local.free_spec(secure=True)
    try:
        local.up(env, spec, progress=lambda m: print(f"[secure] {m}", flush=True))
        sec = local.load_security(env)
        src, dst = spec.sides
        assert sec is not None and src.registry_url and dst.registry_url
        yield SecureClusters(src.bootstrap, dst.bootstrap, src.registry_url, dst.registry_url, sec, env, spec)
    finally:
        from mirror_core import replicate

        replicate.release_producers()
        gc.collect()
        local.down(env, keep_data=False)
