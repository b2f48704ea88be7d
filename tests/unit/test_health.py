"""Parity digests (item 13 of issue 11): registry-local references neutralised, nothing else."""

from __future__ import annotations

import struct

from mirror_core.health import record_digest


def framed(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">i", schema_id) + body


def guid_framed(guid: bytes, body: bytes) -> bytes:
    return b"\x01" + guid + body


def test_item13_key_and_header_references_neutralised():
    src = record_digest(framed(7, b"key"), b"body", [("__value_schema_id", framed(3, b"\x02")), ("h", b"1")], 5,
                        key_framed=True, value_framed=True)
    dst = record_digest(framed(91, b"key"), b"body", [("__value_schema_id", framed(44, b"\x02")), ("h", b"1")], 5,
                        key_framed=True, value_framed=True)
    assert src == dst
    g1, g2 = bytes(range(16)), bytes(range(16, 32))
    assert record_digest(None, guid_framed(g1, b"v"), [("__key_schema_id", guid_framed(g1, b""))], 1) == \
        record_digest(None, guid_framed(g2, b"v"), [("__key_schema_id", guid_framed(g2, b""))], 1)


def test_item13_real_differences_still_count():
    base = record_digest(framed(7, b"key"), framed(1, b"body"), [("__value_schema_id", framed(3, b"\x02"))], 5,
                         key_framed=True)
    assert base != record_digest(framed(7, b"kez"), framed(1, b"body"), [("__value_schema_id", framed(3, b"\x02"))],
                                 5, key_framed=True)
    # protobuf message indexes after the header's id are content
    assert base != record_digest(framed(7, b"key"), framed(1, b"body"), [("__value_schema_id", framed(3, b"\x04"))],
                                 5, key_framed=True)
    # a key whose serde carries no schema is compared byte for byte, even when it starts with 0x00
    assert record_digest(framed(7, b"k"), None, [], 5) != record_digest(framed(8, b"k"), None, [], 5)


# --------------------------------------------------------------------------- parity: what is left out


class _Msg:
    def __init__(self, offset: int, value: bytes, prov: str | None = None) -> None:
        self._offset, self._value = offset, value
        self._headers = [("mirrorflow.provenance", prov.encode())] if prov else None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return None

    def value(self) -> bytes:
        return self._value

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 1000)


def _parity(monkeypatch, source: list[_Msg], destination: list[_Msg], loop_guard: bool = True,  # noqa: ANN001
            dead: frozenset[int] = frozenset()):  # noqa: ANN202
    from mirror_core import clients, health
    from mirror_core.checkpoint import TopicMapping

    logs = {"src": source, "dst": destination}
    monkeypatch.setattr(clients, "read_partition", lambda cluster, topic, p, start, end: iter(
        [r for r in logs[cluster] if start <= r.offset() < end]))
    skip = health._Unmirrored("src", "dst" if loop_guard else None, dead)
    m = TopicMapping("t", "t", "g__t", "cg")
    return health._compare("src", "dst", m, 0, (0, 100), (0, 100), (False, False), skip)


def test_parity_leaves_out_copies_dead_letters_and_the_destinations_own_records(monkeypatch) -> None:  # noqa: ANN001
    """Source: a record, a copy of the destination's (loop guard), a dead letter, a record. Destination: the two
    mirrored records (provenance ending with the source) around one of its own."""
    source = [_Msg(0, b"a"), _Msg(1, b"own", prov="dst"), _Msg(2, b"bad"), _Msg(3, b"b")]
    destination = [_Msg(0, b"a", prov="src"), _Msg(1, b"own"), _Msg(2, b"b", prov="src")]
    res = _parity(monkeypatch, source, destination, dead=frozenset({2}))
    assert res.ok and (res.source_count, res.destination_count) == (2, 2)
    assert res.note == ("1 copies skipped by the loop guard left out, 1 dead letters left out, "
                        "1 destination records the flow did not write left out")


def test_parity_still_finds_a_missing_or_changed_record(monkeypatch) -> None:  # noqa: ANN001
    source = [_Msg(0, b"a"), _Msg(1, b"own", prov="dst"), _Msg(2, b"b"), _Msg(3, b"c")]
    res = _parity(monkeypatch, source, [_Msg(0, b"a", prov="src"), _Msg(1, b"c", prov="src")])
    assert not res.ok and res.first_mismatch_offset == 2  # b lost: not a dead letter, not a copy
    res = _parity(monkeypatch, source[:3], [_Msg(0, b"a", prov="src"), _Msg(1, b"B", prov="src")])
    assert not res.ok and res.first_mismatch_offset == 2
    # without the loop guard nothing is left out: a record written on the destination by someone else counts
    res = _parity(monkeypatch, [_Msg(0, b"a")], [_Msg(0, b"a"), _Msg(1, b"x")], loop_guard=False)
    assert not res.ok and res.destination_count == 2
