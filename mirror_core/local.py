"""Embedded real clusters for the demo, the tests and the benchmarks.

Each side (``src``, ``dst``) is a real Apache Kafka cluster in KRaft mode (every
node a combined broker + controller) started from the Maven Central jars, and
optionally a real Apicurio Registry (Confluent-compatible API) with in-memory
storage. Everything this module starts is recorded in ``<state>/local.json``
with its pid, so ``down`` stops exactly those processes and nothing else.

Readiness is polled against real endpoints with a deadline; there are no
fixed sleeps.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mirror_core import artifacts, tls
from mirror_core.errors import LocalClusterError, PrerequisiteError

Progress = Callable[[str], None]

REGISTRY_API_PATH = "/apis/ccompat/v7"
STATE_FILE = "local.json"
_KAFKA_HEAP = os.environ.get("MIRRORFLOW_KAFKA_HEAP", "-Xms128m -Xmx512m")
_REGISTRY_HEAP = os.environ.get("MIRRORFLOW_REGISTRY_HEAP", "-Xms64m -Xmx384m")


@dataclass(frozen=True)
class SideSpec:
    """One side: ``brokers`` KRaft nodes on ``kafka_port`` + 2*i (controller on +1), and a registry."""

    name: str
    kafka_port: int
    brokers: int = 1
    registry_port: int | None = None
    registry_management_port: int | None = None
    #: SASL_SSL (SCRAM-SHA-512) listeners, StandardAuthorizer, the registry over HTTPS
    secure: bool = False

    def broker_ports(self) -> list[tuple[int, int]]:
        return [(self.kafka_port + 2 * i, self.kafka_port + 2 * i + 1) for i in range(self.brokers)]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p, _ in self.broker_ports())

    @property
    def registry_url(self) -> str | None:
        scheme = "https" if self.secure else "http"
        return f"{scheme}://127.0.0.1:{self.registry_port}{REGISTRY_API_PATH}" if self.registry_port else None

    def ports(self) -> list[tuple[int, str]]:
        out = []
        for i, (p, c) in enumerate(self.broker_ports()):
            out += [(p, f"{self.name} broker {i + 1}"), (c, f"{self.name} controller {i + 1}")]
        if self.registry_port:
            out.append((self.registry_port, f"{self.name} schema registry"))
        if self.registry_management_port:
            out.append((self.registry_management_port, f"{self.name} schema registry management"))
        return out


@dataclass(frozen=True)
class ClusterSpec:
    sides: tuple[SideSpec, ...]

    @property
    def secure(self) -> bool:
        return any(s.secure for s in self.sides)


def default_spec(src_brokers: int = 1, dst_brokers: int = 1, registries: bool = True,
                 secure: bool = False) -> ClusterSpec:
    """The documented fixed ports: src on 19092 / 18081, dst on 29092 / 28081."""
    return ClusterSpec((
        SideSpec("src", 19092, src_brokers, 18081 if registries else None, 18091 if registries else None, secure),
        SideSpec("dst", 29092, dst_brokers, 28081 if registries else None, 28091 if registries else None, secure),
    ))


def free_spec(src_brokers: int = 1, dst_brokers: int = 1, registries: bool = True,
              secure: bool = False) -> ClusterSpec:
    """Same shape on free ports (tests that must not collide with a running demo).

    The ports are taken from just below the system's ephemeral range: a port in that range can be given to
    any outgoing connection while its broker is down, and a broker restarted on the same ports then fails
    with "Address already in use" (it happened to a fault test's restarted source broker)."""
    taken: set[int] = set()

    def side(name: str, brokers: int) -> SideSpec:
        kp = server_ports(2 * brokers, taken)
        rp = server_ports(1, taken) if registries else None
        mp = server_ports(1, taken) if registries else None
        return SideSpec(name, kp, brokers, rp, mp, secure)

    return ClusterSpec((side("src", src_brokers), side("dst", dst_brokers)))


def server_ports(n: int, taken: set[int]) -> int:
    """The first of ``n`` consecutive free loopback ports for a local server, none of them in ``taken`` (they
    are added to it), from :data:`_SERVER_PORTS`: below the ephemeral range, so a server restarted on them gets
    them back."""
    for _ in range(500):
        base = secrets.choice(_SERVER_PORTS)
        ports = range(base, base + n)
        if ports[-1] in _SERVER_PORTS and not taken.intersection(ports) and all(_port_free(p) for p in ports):
            taken.update(ports)
            return base
    raise PrerequisiteError("could not find a block of free ports on 127.0.0.1 "
                            f"({_SERVER_PORTS.start}-{_SERVER_PORTS.stop - 1})")


def _server_ports(range_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> range:
    """Ports for local servers on free ports: from 30000 (above the documented fixed ports) up to the
    system's ephemeral range (Linux: 32768 and up by default). An ephemeral range that starts lower leaves
    30000-32767 all the same (a restart may then collide, as before)."""
    try:
        low = int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(30000, low if low >= 31000 else 32768)


_SERVER_PORTS = _server_ports()


@dataclass
class LocalEnv:
    """Where artifacts are cached and where a running set keeps data, logs and pids."""

    state_dir: Path
    cache: Path
    java: str = "java"

    @classmethod
    def from_environment(cls, state_dir: Path | None = None) -> LocalEnv:
        root = Path(__file__).resolve().parent.parent
        sd = state_dir or Path(os.environ.get("MIRRORFLOW_STATE", root / ".state")) / "local"
        return cls(state_dir=Path(sd).resolve(), cache=artifacts.cache_dir(root))

    @property
    def state_file(self) -> Path:
        return self.state_dir / STATE_FILE


@dataclass
class ProcessRecord:
    role: str
    pid: int
    address: str
    log: str
    node_id: int | None = None
    data_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- security (``--secure``)

#: the brokers' own SASL user (inter-broker traffic; a super user, like the brokers' certificate)
SUPER_USER = "admin"
#: SCRAM-SHA-512 users of every secured cluster: the super user and the two principals that
#: ``config/local-secure.yaml`` mirrors with (what they may do comes from ACLs, see mirror_core/acls.py)
SOURCE_USER = "mirror-source"
DESTINATION_USER = "mirror-destination"
LOCAL_USERS = (SUPER_USER, SOURCE_USER, DESTINATION_USER)
BROKER_CERT = "mirrorflow-broker"
SCRAM_MECHANISM = "SCRAM-SHA-512"
CREDENTIALS_FILE = "credentials.env"
#: credentials.env variable per user (config/local-secure.yaml reads these)
PASSWORD_VARS = {SUPER_USER: "MIRRORFLOW_ADMIN_PASSWORD", SOURCE_USER: "MIRRORFLOW_SRC_PASSWORD",
                 DESTINATION_USER: "MIRRORFLOW_DST_PASSWORD"}


@dataclass(frozen=True)
class Security:
    """What a secured set shares: the CA, the service certificates, the SCRAM users and their passwords.

    Everything lives in ``<state>/secrets`` (a 0700 directory of 0600 files); passwords are never put on
    a command line: brokers read them from their properties file, the storage format from an argument
    file that is deleted once it ran.
    """

    directory: Path
    ca_file: Path
    broker_bundle: Path
    registry_cert: Path
    registry_key: Path
    passwords: tuple[tuple[str, str], ...]

    def password(self, user: str) -> str:
        return dict(self.passwords)[user]

    def client_config(self, user: str = SUPER_USER) -> dict[str, str]:
        """librdkafka properties to connect as ``user`` (SASL_SSL, SCRAM-SHA-512, the local CA)."""
        return {"security.protocol": "SASL_SSL", "sasl.mechanism": SCRAM_MECHANISM, "sasl.username": user,
                "sasl.password": self.password(user), "ssl.ca.location": str(self.ca_file)}

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    @property
    def credentials_file(self) -> Path:
        return self.directory / CREDENTIALS_FILE


def _make_security(env: LocalEnv) -> Security:
    directory = env.state_dir / "secrets"
    _rmtree(directory)
    ca = tls.LocalCA(directory)
    broker = ca.issue(BROKER_CERT)
    registry = ca.issue("mirrorflow-registry")
    passwords = tuple((u, secrets.token_hex(16)) for u in LOCAL_USERS)
    sec = Security(directory, ca.ca_file, broker.bundle, registry.cert, registry.key, passwords)
    lines = [f"export {PASSWORD_VARS[u]}={pw}" for u, pw in passwords]
    lines.append(f"export MIRRORFLOW_LOCAL_CA={ca.ca_file}")
    tls.write_private(sec.credentials_file, ("\n".join(lines) + "\n").encode())
    return sec


def load_security(env: LocalEnv) -> Security | None:
    """The running secured set's material (None when what runs is not secured)."""
    if not env.state_file.exists():
        return None
    info = json.loads(env.state_file.read_text()).get("security")
    if not info:
        return None
    directory = Path(info["directory"])
    found = dict(re.findall(r"^export (\w+)=(\S+)$", (directory / CREDENTIALS_FILE).read_text(), re.M))
    passwords = tuple((u, found[var]) for u, var in PASSWORD_VARS.items())
    return Security(directory, Path(info["ca_file"]), Path(info["broker_bundle"]), Path(info["registry_cert"]),
                    Path(info["registry_key"]), passwords)


def _security_state(sec: Security) -> dict[str, Any]:
    """What the state file keeps (paths and user names; never a password)."""
    return {"directory": str(sec.directory), "ca_file": str(sec.ca_file), "broker_bundle": str(sec.broker_bundle),
            "registry_cert": str(sec.registry_cert), "registry_key": str(sec.registry_key),
            "users": list(LOCAL_USERS), "credentials": str(sec.credentials_file)}


def client_config(side: SideSpec, sec: Security | None, user: str = SUPER_USER) -> dict[str, str]:
    """librdkafka properties reaching ``side`` (as ``user`` when it is secured)."""
    conf = {"bootstrap.servers": side.bootstrap}
    if side.secure:
        assert sec is not None
        conf |= sec.client_config(user)
    return conf


def grant_example_acls(env: LocalEnv, spec: ClusterSpec, progress: Progress | None = None,
                       config: Path | None = None) -> int:
    """Grant the least-privilege ACLs of ``config/local-secure.yaml`` (as the super user) on a secured set."""
    from confluent_kafka.admin import AdminClient

    from mirror_core.acls import apply_acls, required_acls
    from mirror_core.config import load_config

    sec = load_security(env)
    if sec is None:
        raise LocalClusterError("the running local clusters are not secured")
    path = config or Path(__file__).resolve().parent.parent / "config" / "local-secure.yaml"
    sides = {s.name: s for s in spec.sides}
    env_vars = {"MIRRORFLOW_SRC_PASSWORD": "-", "MIRRORFLOW_DST_PASSWORD": "-", "MIRRORFLOW_LOCAL_CA": str(sec.ca_file)}
    cfg = load_config(path, env=env_vars)
    count = 0
    for g in cfg.groups:
        grants = required_acls(cfg, g)
        for cluster in {x.cluster for x in grants}:
            admin = AdminClient(client_config(sides[cluster], sec) | {"log_level": 0})
            count += apply_acls(admin, [x for x in grants if x.cluster == cluster])
    if progress:
        progress(f"  granted {count} ACLs for the groups of {path.name} (see `mirrorflow acls {path.name}`)")
    return count


# --------------------------------------------------------------------------- public API


def up(env: LocalEnv, spec: ClusterSpec, progress: Progress | None = None, timeout: float = 180.0) -> dict[str, Any]:
    """Start every side of ``spec``; return the status dict. Raises if anything fails to come up.

    On failure, whatever was started is stopped again.
    """
    say = progress or (lambda _m: None)
    t0 = time.monotonic()
    if env.state_file.exists() and any(_alive(p["pid"]) for p in _records(env)):
        raise PrerequisiteError(
            f"local clusters already running from {env.state_dir} (run `mirrorflow local down` first, or status)"
        )
    java = find_java(17)  # Kafka 4.x
    want_registry = any(s.registry_port for s in spec.sides)
    registry_java = find_java(21) if want_registry else java  # Apicurio 3.3 is built for Java 21
    taken = [f"{what} port {port}" for side in spec.sides for port, what in side.ports() if not _port_free(port)]
    if taken:
        raise PrerequisiteError("ports already in use: " + ", ".join(taken) + " (stop what holds them or pick others)")

    kafka_lib = artifacts.fetch_kafka(env.cache, say)
    apicurio_dir = artifacts.fetch_apicurio(env.cache, say) if want_registry else None

    env.state_dir.mkdir(parents=True, exist_ok=True)
    (env.state_dir / "logs").mkdir(exist_ok=True)
    state: dict[str, Any] = {"state_dir": str(env.state_dir), "started_at": time.time(), "sides": {}}
    records: list[ProcessRecord] = []
    sec: Security | None = None
    if spec.secure:
        say("generating a CA, service certificates and SCRAM users...")
        sec = _make_security(env)
        state["security"] = _security_state(sec)
    try:
        say("formatting KRaft storage...")
        _format_all(env, spec, java, kafka_lib, sec)
        for side in spec.sides:
            side_state: dict[str, Any] = {"bootstrap": side.bootstrap, "brokers": [], "registry": None,
                                          "secure": side.secure}
            for i in range(side.brokers):
                rec = _start_broker(env, side, i, java, kafka_lib, sec)
                records.append(rec)
                side_state["brokers"].append(asdict(rec))
            if side.registry_port and apicurio_dir:
                rec = _start_registry(env, side, registry_java, apicurio_dir, sec)
                records.append(rec)
                side_state["registry"] = asdict(rec) | {"url": side.registry_url}
            state["sides"][side.name] = side_state
            _write_state(env, state)
        say(f"started {len(records)} processes; waiting for readiness (deadline {timeout:.0f}s)...")
        deadline = time.monotonic() + timeout
        for side in spec.sides:
            _wait_kafka(side, deadline, records, sec)
            say(f"  {side.name}: kafka ready at {side.bootstrap} ({side.brokers} broker(s))")
            if side.registry_port:
                _wait_registry(side, deadline, records, sec)
                _set_global_compatibility(side, "BACKWARD", sec)
                say(f"  {side.name}: schema registry ready at {side.registry_url}")
    except BaseException:
        _stop_records([asdict(r) for r in records])
        if sec is not None:
            _rmtree(sec.directory)
        raise
    if sec is not None:
        say(f"  credentials (SCRAM users {', '.join(LOCAL_USERS)}) and the CA: {sec.credentials_file}")
    state["took_s"] = round(time.monotonic() - t0, 2)
    _write_state(env, state)
    return status(env)


def down(env: LocalEnv, keep_data: bool = False) -> list[str]:
    """Stop every process recorded in the state file; returns what was stopped."""
    recs = _records(env)
    stopped = _stop_records(recs)
    sec_dir = None
    if env.state_file.exists():
        sec_dir = (json.loads(env.state_file.read_text()).get("security") or {}).get("directory")
        env.state_file.unlink()
    if not keep_data:
        for rec in recs:
            if rec.get("data_dir"):
                _rmtree(Path(rec["data_dir"]))
        if sec_dir:
            _rmtree(Path(sec_dir))
    return stopped


def status(env: LocalEnv) -> dict[str, Any]:
    """What runs where, with a live check of each process and port."""
    if not env.state_file.exists():
        return {"state_dir": str(env.state_dir), "running": False, "sides": {}}
    state = json.loads(env.state_file.read_text())
    any_alive = False
    for side in state.get("sides", {}).values():
        for b in side.get("brokers", []):
            b["state"] = _proc_state(b)
            any_alive |= b["state"] != "stopped"
        reg = side.get("registry")
        if reg:
            reg["state"] = _proc_state(reg)
            any_alive |= reg["state"] != "stopped"
    state["running"] = any_alive
    return state


def running_endpoints(env: LocalEnv) -> dict[str, dict[str, str | None]]:
    """``{side: {"bootstrap": ..., "registry": ...}}`` for a running set."""
    st = status(env)
    return {
        name: {"bootstrap": s["bootstrap"], "registry": (s.get("registry") or {}).get("url")}
        for name, s in st.get("sides", {}).items()
    }


# --------------------------------------------------------------------------- faults (tests)


def _broker_record(state: dict[str, Any], side: str, node_id: int) -> dict[str, Any]:
    for b in state["sides"][side]["brokers"]:
        if b["node_id"] == node_id:
            return dict(b)
    raise LocalClusterError(f"{side}: no broker {node_id} in this set")


def stop_broker(env: LocalEnv, side: str, node_id: int, kill: bool = False, timeout: float = 60.0) -> float:
    """Stop one broker of the running set: SIGTERM (a controlled shutdown) or, with ``kill``, SIGKILL (a
    crash). Its data stays; :func:`start_broker` brings it back. Returns how long it took to go."""
    state = json.loads(env.state_file.read_text())
    rec = _broker_record(state, side, node_id)
    t0 = time.monotonic()
    if _alive(rec["pid"]) and _ours(rec["pid"]):
        os.killpg(rec["pid"], signal.SIGKILL if kill else signal.SIGTERM)
    while _alive(rec["pid"]):
        _reap(rec["pid"])
        if time.monotonic() - t0 > timeout:
            os.killpg(rec["pid"], signal.SIGKILL)
        time.sleep(0.1)
    _reap(rec["pid"])
    return time.monotonic() - t0


def start_broker(env: LocalEnv, side: str, node_id: int, timeout: float = 120.0) -> float:
    """Start a stopped broker again (same ports, data and configuration); returns when its client port
    accepts connections, with the seconds that took."""
    state = json.loads(env.state_file.read_text())
    rec = _broker_record(state, side, node_id)
    if _alive(rec["pid"]):
        raise LocalClusterError(f"{side} broker {node_id} is still running (pid {rec['pid']})")
    props = env.state_dir / "config" / f"{side}-{node_id}.properties"
    cmd = _java_kafka_cmd(find_java(17), artifacts.fetch_kafka(env.cache), "kafka.Kafka", str(props))
    t0 = time.monotonic()
    proc = _spawn(cmd, Path(rec["log"]))
    for b in state["sides"][side]["brokers"]:
        if b["node_id"] == node_id:
            b["pid"] = proc.pid
    _write_state(env, state)
    port = int(rec["address"].rpartition(":")[2])
    while _port_free(port):
        if not _alive(proc.pid):
            raise LocalClusterError(f"{side} broker {node_id} exited while restarting; see {rec['log']}")
        if time.monotonic() - t0 > timeout:
            raise LocalClusterError(f"{side} broker {node_id} did not listen on {port} within {timeout:.0f}s")
        time.sleep(0.2)
    return time.monotonic() - t0


def pause_registry(env: LocalEnv, side: str, paused: bool = True) -> None:
    """Freeze (SIGSTOP) or thaw (SIGCONT) a side's schema registry: an outage in which connections are
    accepted but never answered, like a hung server, and after which its in-memory schemas are intact."""
    state = json.loads(env.state_file.read_text())
    reg = state["sides"][side]["registry"]
    if reg and _alive(reg["pid"]) and _ours(reg["pid"]):
        os.killpg(reg["pid"], signal.SIGSTOP if paused else signal.SIGCONT)


# --------------------------------------------------------------------------- kafka


def _kraft_id() -> str:
    """A KRaft cluster id; like Kafka's Uuid.randomUuid, never starting with '-' (a CLI would read an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _broker_props(env: LocalEnv, side: SideSpec, i: int, sec: Security | None = None) -> tuple[Path, Path]:
    ports = side.broker_ports()
    port, cport = ports[i]
    data = env.state_dir / "data" / f"{side.name}-{i + 1}"
    voters = ",".join(f"{n + 1}@127.0.0.1:{c}" for n, (_, c) in enumerate(ports))
    rf = min(3, side.brokers)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(i + 1),
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data),
        "offsets.topic.replication.factor": str(rf),
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": str(rf),
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": str(rf),
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "log.cleaner.backoff.ms": "1000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "10000",
    }
    if side.secure:
        assert sec is not None
        props |= _secure_broker_props(port, cport, sec)
    cfg_dir = env.state_dir / "config"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    path = cfg_dir / f"{side.name}-{i + 1}.properties"
    # 0600: a secured broker's file holds its SASL password
    tls.write_private(path, "".join(f"{k}={v}\n" for k, v in props.items()).encode())
    return path, data


def _secure_broker_props(port: int, cport: int, sec: Security) -> dict[str, str]:
    """Clients and brokers on SASL_SSL (SCRAM-SHA-512); the controller listener on mutual TLS (the brokers'
    certificate is their principal); StandardAuthorizer denying whatever no ACL allows."""
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{SUPER_USER}" '
            f'password="{sec.password(SUPER_USER)}";')
    return {
        "listeners": f"SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        "advertised.listeners": f"SASL_SSL://127.0.0.1:{port}",
        "inter.broker.listener.name": "SASL_SSL",
        "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
        "sasl.enabled.mechanisms": SCRAM_MECHANISM,
        "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
        f"listener.name.sasl_ssl.{SCRAM_MECHANISM.lower()}.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(sec.broker_bundle),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(sec.ca_file),
        "listener.name.controller.ssl.client.auth": "required",
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{SUPER_USER};User:CN={BROKER_CERT}",
    }


def _java_kafka_cmd(java: str, lib: Path, main: str, *args: str, heap: str = _KAFKA_HEAP) -> list[str]:
    log4j = Path(__file__).resolve().parent / "resources" / "kafka-log4j2.yaml"
    return [
        java, *heap.split(), "-XX:+UseG1GC", "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{lib}/*", main, *args,
    ]


def kafka_tool_cmd(env: LocalEnv, main: str, *args: str) -> list[str]:
    """A command line for a Kafka Java tool class (e.g. consumer group command) from the cached jars."""
    lib = artifacts.fetch_kafka(env.cache)
    return _java_kafka_cmd(artifacts.require_tool(env.java, "run Kafka tools"), lib, main, *args, heap="-Xmx256m")


def _format_all(env: LocalEnv, spec: ClusterSpec, java: str, lib: Path, sec: Security | None = None) -> None:
    procs = []
    argfiles = []
    for side in spec.sides:
        cluster_id = _kraft_id()
        for i in range(side.brokers):
            props, data = _broker_props(env, side, i, sec)
            _rmtree(data)
            log = env.state_dir / "logs" / f"format-{side.name}-{i + 1}.log"
            args = ["format", f"--cluster-id={cluster_id}", "-c", str(props)]
            if side.secure:
                assert sec is not None
                for user in LOCAL_USERS:
                    args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={sec.password(user)}]"]
            cmd = _java_kafka_cmd(java, lib, "kafka.tools.StorageTool", *args, heap="-Xmx256m")
            if side.secure:
                # the SCRAM passwords go in a 0600 argument file the java launcher expands, not on the command line
                argfile = env.state_dir / "secrets" / f"format-{side.name}-{i + 1}.args"
                tls.write_private(argfile, "\n".join(_argfile_quote(a) for a in cmd[1:]).encode())
                argfiles.append(argfile)
                cmd = [cmd[0], f"@{argfile}"]
            with log.open("wb") as fh:
                procs.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT), log))
    try:
        for proc, log in procs:
            if proc.wait(timeout=120) != 0:
                raise LocalClusterError(f"formatting KRaft storage failed; see {log}")
    finally:
        for argfile in argfiles:
            argfile.unlink(missing_ok=True)


def _argfile_quote(arg: str) -> str:
    """One argument as a line of a java launcher argument file (double-quoted, backslashes escaped)."""
    return '"' + arg.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _start_broker(env: LocalEnv, side: SideSpec, i: int, java: str, lib: Path,
                  sec: Security | None = None) -> ProcessRecord:
    props, data = _broker_props(env, side, i, sec)
    log = env.state_dir / "logs" / f"kafka-{side.name}-{i + 1}.log"
    cmd = _java_kafka_cmd(java, lib, "kafka.Kafka", str(props))
    proc = _spawn(cmd, log)
    port = side.broker_ports()[i][0]
    return ProcessRecord(
        role="kafka", pid=proc.pid, address=f"127.0.0.1:{port}", log=str(log), node_id=i + 1, data_dir=str(data),
        extra={"controller": f"127.0.0.1:{side.broker_ports()[i][1]}"},
    )


def _wait_kafka(side: SideSpec, deadline: float, records: list[ProcessRecord], sec: Security | None = None) -> None:
    from confluent_kafka.admin import AdminClient

    first_port = side.broker_ports()[0][0]
    last = "no answer"
    while _port_free(first_port) and time.monotonic() < deadline:
        _check_alive(records)
        time.sleep(0.2)
    admin = AdminClient(client_config(side, sec) | {"socket.timeout.ms": 2000, "log_level": 0})
    while time.monotonic() < deadline:
        _check_alive(records)
        try:
            md = admin.list_topics(timeout=2)
            if len(md.brokers) >= side.brokers:
                return
            last = f"{len(md.brokers)} of {side.brokers} brokers registered"
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready yet"
            last = str(exc)
        time.sleep(0.3)
    raise LocalClusterError(f"{side.name}: kafka at {side.bootstrap} not ready before the deadline ({last})")


# --------------------------------------------------------------------------- registry


def _start_registry(env: LocalEnv, side: SideSpec, java: str, app_dir: Path,
                    sec: Security | None = None) -> ProcessRecord:
    assert side.registry_port and side.registry_management_port
    log = env.state_dir / "logs" / f"registry-{side.name}.log"
    if side.secure:
        assert sec is not None
        # HTTPS only: with insecure requests disabled Quarkus opens no plain HTTP port
        listen = [f"-Dquarkus.http.ssl-port={side.registry_port}", "-Dquarkus.http.insecure-requests=disabled",
                  f"-Dquarkus.http.port={side.registry_port}",
                  f"-Dquarkus.http.ssl.certificate.files={sec.registry_cert}",
                  f"-Dquarkus.http.ssl.certificate.key-files={sec.registry_key}"]
    else:
        listen = [f"-Dquarkus.http.port={side.registry_port}"]
    cmd = [
        java, *_REGISTRY_HEAP.split(), "-XX:MaxMetaspaceSize=192m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        "-Xss512k",
        "-Dquarkus.http.host=127.0.0.1",
        *listen,
        # the management interface cannot be switched off at run time: give each instance its own port
        "-Dquarkus.management.host=127.0.0.1",
        f"-Dquarkus.management.port={side.registry_management_port}",
        "-Dapicurio.storage.kind=sql",
        "-Dapicurio.storage.sql.kind=h2",
        f"-Dapicurio.datasource.url=jdbc:h2:mem:registry_{side.registry_port}",
        "-Dapicurio.datasource.jdbc.initial-size=2",
        "-Dapicurio.datasource.jdbc.min-size=2",
        "-Dapicurio.datasource.jdbc.max-size=20",
        # GET /subjects silently truncates at 1000 by default
        "-Dapicurio.ccompat.max-subjects=100000",
        '-Dquarkus.log.category."io.quarkus.http.access-log".level=WARN',
        '-Dquarkus.log.category."io.apicurio.registry.logging.audit".level=WARN',
        "-jar", str(app_dir / "quarkus-run.jar"),
    ]
    proc = _spawn(cmd, log, cwd=app_dir)
    return ProcessRecord(
        role="registry", pid=proc.pid, address=f"127.0.0.1:{side.registry_port}", log=str(log),
        extra={"management_port": side.registry_management_port, "java": java},
    )


def _wait_registry(side: SideSpec, deadline: float, records: list[ProcessRecord],
                   sec: Security | None = None) -> None:
    """Ready when the management health check says UP and the ccompat API answers."""
    urls = [f"http://127.0.0.1:{side.registry_management_port}/health/ready", f"{side.registry_url}/subjects"]
    last = "no answer"
    ctx = sec.ssl_context() if sec is not None and side.secure else None
    for url in urls:
        while True:
            if time.monotonic() > deadline:
                raise LocalClusterError(f"{side.name}: schema registry at {url} not ready before the deadline ({last})")
            _check_alive(records)
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx if url.startswith("https") else None) as resp:
                    if resp.status == 200:
                        break
                    last = f"HTTP {resp.status}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(exc)
            time.sleep(0.3)


def _set_global_compatibility(side: SideSpec, level: str, sec: Security | None = None) -> None:
    """Apicurio starts with global NONE and answers compatibility checks inconsistently until a global
    level is set; set Confluent's default so both registries behave like a fresh Confluent one."""
    req = urllib.request.Request(
        f"{side.registry_url}/config", data=json.dumps({"compatibility": level}).encode(), method="PUT",
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    ctx = sec.ssl_context() if sec is not None and side.secure else None
    # a registry that has just said it is ready sometimes closes the first HTTPS connection unanswered
    # (seen once in a full run): a few more tries before giving up
    for attempt in range(5):
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                if resp.status != 200:
                    raise LocalClusterError(
                        f"{side.name}: could not set the registry's global compatibility (HTTP {resp.status})")
                return
        except (urllib.error.HTTPError, LocalClusterError):
            raise
        except OSError as exc:
            if attempt == 4:
                raise LocalClusterError(f"{side.name}: could not set the registry's global compatibility: {exc}") from None
            time.sleep(1.0)


def find_java(min_version: int) -> str:
    """A ``java`` of at least ``min_version``: $MIRRORFLOW_JAVA<N>, PATH, $JAVA_HOME, then /usr/lib/jvm/*."""
    candidates = [os.environ.get(f"MIRRORFLOW_JAVA{min_version}", "")]
    candidates.append(shutil.which("java") or "")
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates += [str(p) for p in sorted(Path("/usr/lib/jvm").glob("*/bin/java"), reverse=True)]
    seen: list[str] = []
    for cand in filter(None, candidates):
        if cand in seen or not Path(cand).exists():
            continue
        seen.append(cand)
        if (_java_major(cand) or 0) >= min_version:
            return cand
    raise PrerequisiteError(
        f"no Java {min_version}+ found (tried: {', '.join(seen) or 'none'}); "
        f"install one or set MIRRORFLOW_JAVA{min_version}=/path/to/bin/java"
    )


def _java_major(java: str) -> int | None:
    try:
        text = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)', text)
    return int(m.group(1)) if m else None


# --------------------------------------------------------------------------- processes


def _spawn(cmd: list[str], log: Path, cwd: Path | None = None) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as fh:
        return subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True
        )


def _check_alive(records: list[ProcessRecord]) -> None:
    for r in records:
        if not _alive(r.pid):
            tail = Path(r.log).read_text(errors="replace").splitlines()[-10:] if Path(r.log).exists() else []
            raise LocalClusterError(f"{r.role} at {r.address} exited during startup; see {r.log}\n" + "\n".join(tail))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of this process counts as dead
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _proc_state(rec: dict[str, Any]) -> str:
    if not _alive(rec["pid"]):
        return "stopped"
    host, _, port = rec["address"].rpartition(":")
    return "running" if not _port_free(int(port), host) else "starting"


def _records(env: LocalEnv) -> list[dict[str, Any]]:
    if not env.state_file.exists():
        return []
    state = json.loads(env.state_file.read_text())
    out = []
    for side in state.get("sides", {}).values():
        out += side.get("brokers", [])
        if side.get("registry"):
            out.append(side["registry"])
    return out


def _ours(pid: int) -> bool:
    """Guard against a recycled pid: only signal java processes."""
    try:
        return b"java" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _stop_records(recs: list[dict[str, Any]], timeout: float = 30.0) -> list[str]:
    stopped = []
    live = [r for r in recs if _alive(r["pid"]) and _ours(r["pid"])]
    for r in live:
        try:
            os.killpg(r["pid"], signal.SIGTERM)
            os.killpg(r["pid"], signal.SIGCONT)  # a paused process (pause_registry) must run to exit
        except (ProcessLookupError, PermissionError):
            os.kill(r["pid"], signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for r in live:
        while _alive(r["pid"]) and time.monotonic() < deadline:
            _reap(r["pid"])
            time.sleep(0.1)
        if _alive(r["pid"]):
            try:
                os.killpg(r["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            _reap(r["pid"])
        stopped.append(f"{r['role']}@{r['address']} (pid {r['pid']})")
    return stopped


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _write_state(env: LocalEnv, state: dict[str, Any]) -> None:
    tmp = env.state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2))
    tmp.replace(env.state_file)


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True
