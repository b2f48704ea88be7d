"""Free ports for local clusters: outside the system's ephemeral range, so a restarted broker gets its own
ports back (an outgoing connection may take any ephemeral port while the broker is down)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mirror_core import local
from mirror_core.errors import PrerequisiteError


def test_free_ports_are_below_the_ephemeral_range_and_clear_of_the_fixed_ones():
    fixed = {p for side in local.default_spec(src_brokers=3, dst_brokers=3).sides for p in _ports(side)}
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        spec = local.free_spec(src_brokers=3, dst_brokers=3, registries=True)
        ports = [p for side in spec.sides for p in _ports(side)]
        assert len(ports) == len(set(ports)) == 2 * (2 * 3 + 2), ports  # no port given twice
        assert all(30000 <= p < low for p in ports), ports
        assert not fixed.intersection(ports)


def test_a_port_in_use_is_not_given(monkeypatch):
    monkeypatch.setattr(local, "_SERVER_PORTS", range(30000, 30006))
    monkeypatch.setattr(local, "_port_free", lambda port, host="127.0.0.1": port != 30002)
    for _ in range(20):
        spec = local.free_spec(registries=False)
        ports = sorted(p for side in spec.sides for p in _ports(side))
        assert 30002 not in ports and len(set(ports)) == 4 and ports[-1] < 30006, ports


def test_the_range_ends_where_the_ephemeral_one_starts(tmp_path):
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert local._server_ports(f) == range(30000, 40000)
    f.write_text("1024 65535\n")  # an ephemeral range over everything: the default stretch all the same
    assert local._server_ports(f) == range(30000, 32768)
    assert local._server_ports(tmp_path / "missing") == range(30000, 32768)


def _ports(side: local.SideSpec) -> list[int]:
    out = [side.kafka_port + k for k in range(2 * side.brokers)]
    return out + [p for p in (side.registry_port, side.registry_management_port) if p is not None]



def test_server_ports_never_gives_a_port_twice(monkeypatch):
    """Single ports (the local Spark master's and its UI's) come from the same range, each once."""
    monkeypatch.setattr(local, "_SERVER_PORTS", range(30000, 30002))
    taken: set[int] = set()
    assert sorted([local.server_ports(1, taken), local.server_ports(1, taken)]) == [30000, 30001]
    with pytest.raises(PrerequisiteError, match="30000-30001"):
        local.server_ports(1, taken)
