"""Confluent wire framing: find and rewrite schema ids without decoding payloads.

Payload framings:

* ``0x00`` + big-endian int32 schema id + body (Avro, JSON Schema; Protobuf adds message indexes
  after the id, which are left untouched);
* ``0x01`` + 16-byte schema GUID + body (newer clients). GUIDs are registry-global content ids;
  they pass through unchanged unless a GUID map is given.

Header framings: the ``__key_schema_id`` / ``__value_schema_id`` headers carry the id (``0x00`` + int32)
or the GUID (``0x01`` + 16 bytes) while the payload itself is unframed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

MAGIC_ID = 0
MAGIC_GUID = 1
KEY_HEADER = "__key_schema_id"
VALUE_HEADER = "__value_schema_id"

Lookup = Callable[[int], "int | None"]
Header = tuple[str, "bytes | None"]


@dataclass(frozen=True)
class SchemaRef:
    """Where a payload says its schema is: an int id, or a GUID."""

    schema_id: int | None
    guid: bytes | None = None


@dataclass(frozen=True)
class WireError:
    """Why a record cannot be translated; ``reason`` is a stable code for dead-letter headers."""

    reason: str  # bad_magic | too_short | unknown_schema_id
    detail: str


def parse_schema_ref(data: bytes) -> SchemaRef | WireError:
    if len(data) < 1:
        return WireError("too_short", "empty payload has no schema framing")
    magic = data[0]
    if magic == MAGIC_ID:
        if len(data) < 5:
            return WireError("too_short", f"{len(data)} bytes, framing needs 5")
        return SchemaRef(struct.unpack_from(">i", data, 1)[0])
    if magic == MAGIC_GUID:
        if len(data) < 17:
            return WireError("too_short", f"{len(data)} bytes, GUID framing needs 17")
        return SchemaRef(None, bytes(data[1:17]))
    return WireError("bad_magic", f"first byte 0x{magic:02x} is not a Confluent magic byte (0x00 / 0x01)")


def rewrite_id(data: bytes, new_id: int) -> bytes:
    """The same bytes with the 4 id bytes replaced (``0x00`` framing only)."""
    return data[:1] + struct.pack(">i", new_id) + data[5:]


def translate_payload(data: bytes, lookup: Lookup) -> bytes | WireError:
    """Rewrite the schema id of a framed payload via ``lookup`` (source id -> destination id)."""
    ref = parse_schema_ref(data)
    if isinstance(ref, WireError):
        return ref
    if ref.schema_id is None:
        return data  # GUID framing: content ids are the same on both registries
    new = lookup(ref.schema_id)
    if new is None:
        return WireError("unknown_schema_id", f"schema id {ref.schema_id} is unknown to the source registry")
    return data if new == ref.schema_id else rewrite_id(data, new)


def rewrite_header_ids(headers: tuple[Header, ...], lookup: Lookup, only: str | None = None
                       ) -> tuple[tuple[Header, ...], WireError | None]:
    """Rewrite ids carried in ``__key_schema_id`` / ``__value_schema_id`` headers."""
    out: list[Header] = []
    for name, value in headers:
        if name in (KEY_HEADER, VALUE_HEADER) and (only is None or name == only) and value is not None:
            new = translate_payload(value, lookup)
            if isinstance(new, WireError):
                return headers, WireError(new.reason, f"header {name}: {new.detail}")
            out.append((name, new))
        else:
            out.append((name, value))
    return tuple(out), None
