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
