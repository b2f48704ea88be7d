"""Confluent framing: parse and rewrite schema ids / GUIDs without touching any other byte."""

from __future__ import annotations

import dataclasses
import random

import pytest
from confluent_kafka.schema_registry.common.serde import SchemaId

from mirror_core.errors import MirrorError
from mirror_core.wire import (
    KEY_HEADER,
    VALUE_HEADER,
    SchemaRef,
    WireError,
    WireFormatError,
    parse_schema_ref,
    rewrite_guid,
    rewrite_header_ids,
    rewrite_id,
    translate_payload,
    translate_value,
)

GUID_A = bytes.fromhex("00112233445566778899aabbccddeeff")
GUID_B = bytes.fromhex("ffeeddccbbaa99887766554433221100")
AVRO_42 = bytes.fromhex("0000 00002a") + b"\x02\x06abc"  # id 42, then an Avro body
PROTO_42 = bytes.fromhex("00 0000002a 04 02 00") + b"\x0a\x03abc"  # id 42, message indexes [1, 0], body


# --------------------------------------------------------------------------- parse


def test_parse_id_framing_golden() -> None:
    assert parse_schema_ref(bytes.fromhex("00 0000002a")) == SchemaRef(42)
    assert parse_schema_ref(AVRO_42) == SchemaRef(42)
    assert parse_schema_ref(bytes.fromhex("00 7fffffff")) == SchemaRef(2**31 - 1)
    assert parse_schema_ref(bytes.fromhex("00 00010000")) == SchemaRef(65536)


def test_parse_ignores_protobuf_message_indexes() -> None:
    assert parse_schema_ref(PROTO_42) == SchemaRef(42)


def test_parse_guid_framing() -> None:
    ref = parse_schema_ref(b"\x01" + GUID_A + b"body")
    assert ref == SchemaRef(None, GUID_A)
    assert isinstance(ref, SchemaRef) and ref.framing_len == 17
    assert SchemaRef(1).framing_len == 5


def test_parse_null_is_tombstone() -> None:
    assert parse_schema_ref(None) is None


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "too_short"),
        (b"\x00", "too_short"),
        (b"\x00\x00\x00\x01", "too_short"),
        (b"\x01" + GUID_A[:15], "too_short"),
        (b"\x02\x00\x00\x00\x01", "bad_magic"),
        (b"{\"json\": 1}", "bad_magic"),
        (b"\xff", "bad_magic"),
    ],
)
def test_parse_malformed_returns_error(data: bytes, reason: str) -> None:
    err = parse_schema_ref(data)
    assert isinstance(err, WireError) and err.reason == reason and err.detail


def test_wire_error_is_frozen_data() -> None:
    err = WireError("bad_magic")
    assert err.detail == ""
    with pytest.raises(dataclasses.FrozenInstanceError):
        err.reason = "x"  # type: ignore[misc]


# --------------------------------------------------------------------------- rewrite


def test_rewrite_id_changes_only_the_id_bytes() -> None:
    assert rewrite_id(AVRO_42, 7) == bytes.fromhex("00 00000007") + b"\x02\x06abc"
    assert rewrite_id(PROTO_42, 0x01020304) == bytes.fromhex("00 01020304 04 02 00") + b"\x0a\x03abc"
    assert rewrite_id(bytes.fromhex("00 0000002a"), 1) == bytes.fromhex("00 00000001")


def test_rewrite_id_random_bodies_are_byte_identical() -> None:
    rnd = random.Random(7)
    for _ in range(200):
        body = rnd.randbytes(rnd.randint(0, 64))
        old, new = rnd.randint(0, 2**31 - 1), rnd.randint(0, 2**31 - 1)
        data = b"\x00" + old.to_bytes(4, "big") + body
        out = rewrite_id(data, new)
        assert len(out) == len(data) and out[5:] == body and out[0] == 0
        assert parse_schema_ref(out) == SchemaRef(new)
        assert rewrite_id(out, old) == data


@pytest.mark.parametrize("data", [b"", b"\x00\x00", b"\x01" + GUID_A, b"\x05abcdef"])
def test_rewrite_id_refuses_non_id_framing(data: bytes) -> None:
    with pytest.raises(WireFormatError) as exc:
        rewrite_id(data, 1)
    assert isinstance(exc.value, MirrorError)
    assert exc.value.error.reason in ("too_short", "bad_magic")


def test_rewrite_id_refuses_ids_outside_int32() -> None:
    with pytest.raises(WireFormatError):
        rewrite_id(AVRO_42, 2**31)


def test_rewrite_guid_changes_only_the_guid_bytes() -> None:
    assert rewrite_guid(b"\x01" + GUID_A + b"\x02xyz", GUID_B) == b"\x01" + GUID_B + b"\x02xyz"
    with pytest.raises(WireFormatError):
        rewrite_guid(AVRO_42, GUID_B)
    with pytest.raises(WireFormatError):
        rewrite_guid(b"\x01" + GUID_A, b"short")


# --------------------------------------------------------------------------- translate


def test_translate_value_with_a_mapping_and_a_function() -> None:
    assert translate_value(AVRO_42, {42: 7}) == rewrite_id(AVRO_42, 7)
    assert translate_value(PROTO_42, lambda i: i + 1000) == bytes.fromhex("00 00000412 04 02 00") + b"\x0a\x03abc"


def test_translate_value_same_id_returns_the_same_bytes() -> None:
    assert translate_value(AVRO_42, {42: 42}) is AVRO_42


def test_translate_value_tombstone_passes_through() -> None:
    assert translate_value(None, {}) is None


def test_translate_value_unknown_id_is_a_typed_error() -> None:
    err = translate_value(AVRO_42, {1: 2})
    assert isinstance(err, WireError) and err.reason == "unknown_schema_id" and "42" in err.detail
    err = translate_value(AVRO_42, lambda i: None)
    assert isinstance(err, WireError) and err.reason == "unknown_schema_id"


@pytest.mark.parametrize(("data", "reason"), [(b"", "too_short"), (b"\x00\x01", "too_short"), (b"plain", "bad_magic")])
def test_translate_value_malformed_is_returned_not_raised(data: bytes, reason: str) -> None:
    err = translate_value(data, {42: 7})
    assert isinstance(err, WireError) and err.reason == reason


def test_guid_passes_through_without_a_guid_map() -> None:
    data = b"\x01" + GUID_A + b"body"
    assert translate_value(data, {}) is data


def test_guid_is_mapped_with_a_guid_map() -> None:
    data = b"\x01" + GUID_A + b"body"
    assert translate_value(data, {}, {GUID_A: GUID_B}) == b"\x01" + GUID_B + b"body"
    err = translate_value(data, {}, {GUID_B: GUID_A})
    assert isinstance(err, WireError) and err.reason == "unknown_schema_guid" and GUID_A.hex() in err.detail


def test_translate_payload_keeps_the_writer_contract() -> None:
    assert translate_payload(AVRO_42, {42: 9}.get) == rewrite_id(AVRO_42, 9)
    err = translate_payload(b"x", {42: 9}.get)
    assert isinstance(err, WireError) and err.reason == "bad_magic"


# --------------------------------------------------------------------------- header-carried ids


def test_header_values_written_by_the_confluent_client_are_understood() -> None:
    guid = "00112233-4455-6677-8899-aabbccddeeff"
    by_guid = SchemaId("AVRO", guid=guid).guid_to_bytes()
    by_id = SchemaId("AVRO", schema_id=42).id_to_bytes()
    proto_by_id = SchemaId("PROTOBUF", schema_id=42, message_indexes=[1, 0]).id_to_bytes()
    assert by_guid == b"\x01" + GUID_A and by_id == bytes.fromhex("00 0000002a")
    assert parse_schema_ref(by_guid) == SchemaRef(None, GUID_A)
    assert parse_schema_ref(proto_by_id) == SchemaRef(42)
    out, err = rewrite_header_ids([(VALUE_HEADER, proto_by_id)], {42: 7})
    assert err is None
    assert out == ((VALUE_HEADER, SchemaId("PROTOBUF", schema_id=7, message_indexes=[1, 0]).id_to_bytes()),)


def test_rewrite_header_ids_rewrites_both_headers_and_keeps_the_rest() -> None:
    headers = [("trace", b"abc"), (KEY_HEADER, bytes.fromhex("00 00000001")), ("other", None),
               (VALUE_HEADER, bytes.fromhex("00 0000002a 02 00"))]
    out, err = rewrite_header_ids(headers, {1: 101, 42: 142})
    assert err is None
    assert out == (("trace", b"abc"), (KEY_HEADER, bytes.fromhex("00 00000065")), ("other", None),
                   (VALUE_HEADER, bytes.fromhex("00 0000008e 02 00")))


def test_rewrite_header_ids_only_one_side() -> None:
    headers = ((KEY_HEADER, bytes.fromhex("00 00000001")), (VALUE_HEADER, bytes.fromhex("00 00000002")))
    out, err = rewrite_header_ids(headers, {1: 11, 2: 12}, only=VALUE_HEADER)
    assert err is None
    assert out == ((KEY_HEADER, bytes.fromhex("00 00000001")), (VALUE_HEADER, bytes.fromhex("00 0000000c")))


def test_rewrite_header_guids() -> None:
    headers = ((VALUE_HEADER, b"\x01" + GUID_A),)
    assert rewrite_header_ids(headers, {}) == (headers, None)
    assert rewrite_header_ids(headers, {}, guid_map={GUID_A: GUID_B}) == (((VALUE_HEADER, b"\x01" + GUID_B),), None)


def test_rewrite_header_ids_error_names_the_header_and_keeps_headers() -> None:
    headers = ((KEY_HEADER, bytes.fromhex("00 00000001")), (VALUE_HEADER, bytes.fromhex("00 00000063")))
    out, err = rewrite_header_ids(headers, {1: 11})
    assert out == headers
    assert err is not None and err.reason == "unknown_schema_id" and VALUE_HEADER in err.detail
    _, err = rewrite_header_ids(((VALUE_HEADER, b"\x07"),), {1: 11})
    assert err is not None and err.reason == "bad_magic"
    _, err = rewrite_header_ids(((KEY_HEADER, b"\x00\x00"),), {1: 11})
    assert err is not None and err.reason == "too_short"


def test_null_schema_id_header_is_left_alone() -> None:
    headers = ((VALUE_HEADER, None),)
    assert rewrite_header_ids(headers, {}) == (headers, None)
