"""Confluent wire framing: find and rewrite schema ids without decoding payloads.

Payload framings (the first bytes of a record key or value):

* ``0x00`` + big-endian int32 schema id + body (Avro, JSON Schema; Protobuf puts its message
  indexes after the id, as part of the body, so they are left untouched);
* ``0x01`` + 16-byte schema GUID + body (newer Confluent clients).

Header framings: the Confluent clients' ``header_schema_id_serializer`` leaves the payload unframed and
puts the schema reference in a ``__key_schema_id`` / ``__value_schema_id`` header: the GUID form
(``0x01`` + 16 bytes, what the client writes) or the id form (``0x00`` + int32), followed by Protobuf
message indexes when the schema is Protobuf. Both are handled exactly like payload framing.

Ids are registry-local: every rewrite goes through an id map (source id -> destination id). GUIDs
identify a schema's content within one registry; the destination's GUID for the same schema is found
through the registries (the partition writer's resolver registers the schema under the mapped subject
and asks the destination for its GUID). So a GUID is mapped through ``guid_map`` (an unmapped GUID is
then an ``unknown_schema_guid`` error, and the record is dead-lettered); only the low-level
:func:`translate_value` without a ``guid_map`` passes GUIDs through unchanged.

Only the 4 id bytes (or 16 GUID bytes) ever change; every other byte is kept as is. Nothing here
decodes a payload. A record that cannot be translated yields a :class:`WireError` value with a stable
``reason`` code, so the data path can route it to the dead-letter topic instead of stopping.
Null values (tombstones) pass through untouched.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from mirror_core.errors import MirrorError

MAGIC_ID = 0
MAGIC_GUID = 1
ID_FRAME_LEN = 5  # magic + int32
GUID_FRAME_LEN = 17  # magic + 16-byte GUID
KEY_HEADER = "__key_schema_id"
VALUE_HEADER = "__value_schema_id"
SCHEMA_ID_HEADERS = (KEY_HEADER, VALUE_HEADER)

# stable reason codes (they end up in dead-letter headers)
BAD_MAGIC = "bad_magic"
TOO_SHORT = "too_short"
UNKNOWN_SCHEMA_ID = "unknown_schema_id"
UNKNOWN_SCHEMA_GUID = "unknown_schema_guid"
#: the destination registry refused to register the record's schema (incompatible, invalid): the
#: resolver's answer instead of an id or GUID, passed on as it is
SCHEMA_REGISTRATION_REFUSED = "schema_registration_refused"

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_ID = struct.Struct(">i")

#: source schema id -> destination id; None when unknown, or a WireError saying why there is none
Lookup = Callable[[int], "int | WireError | None"]
GuidLookup = Callable[[bytes], "bytes | WireError | None"]
#: source schema id -> destination schema id: a mapping, or a :data:`Lookup`
IdMap = Mapping[int, int] | Lookup
#: source GUID (16 bytes) -> destination GUID (16 bytes): a mapping, or a :data:`GuidLookup`
GuidMap = Mapping[bytes, bytes] | GuidLookup
Header = tuple[str, "bytes | None"]


@dataclass(frozen=True, slots=True)
class SchemaRef:
    """Where a payload says its schema is: an int id (``0x00`` framing) or a GUID (``0x01`` framing)."""

    schema_id: int | None
    guid: bytes | None = None

    @property
    def framing_len(self) -> int:
        """How many leading bytes the framing occupies."""
        return ID_FRAME_LEN if self.guid is None else GUID_FRAME_LEN


@dataclass(frozen=True, slots=True)
class WireError:
    """Why a record cannot be translated.

    ``reason`` is a stable code for dead-letter headers: ``bad_magic``, ``too_short``,
    ``unknown_schema_id``, ``unknown_schema_guid`` or ``schema_registration_refused``; ``detail`` is for
    people.
    """

    reason: str
    detail: str = ""


class WireFormatError(MirrorError):
    """Raised by the functions that cannot return a :class:`WireError` (e.g. :func:`rewrite_id`)."""

    def __init__(self, error: WireError):
        self.error = error
        super().__init__(f"{error.reason}: {error.detail}" if error.detail else error.reason)


def parse_schema_ref(value: bytes | None) -> SchemaRef | None | WireError:
    """The schema reference framed at the start of ``value``.

    Returns None for a null value (tombstone), a :class:`SchemaRef`, or a :class:`WireError`
    (``too_short`` / ``bad_magic``). Never raises.
    """
    if value is None:
        return None
    n = len(value)
    if n < 1:
        return WireError(TOO_SHORT, "empty payload has no schema framing")
    magic = value[0]
    if magic == MAGIC_ID:
        if n < ID_FRAME_LEN:
            return WireError(TOO_SHORT, f"{n} bytes, id framing needs {ID_FRAME_LEN}")
        return SchemaRef(_ID.unpack_from(value, 1)[0])
    if magic == MAGIC_GUID:
        if n < GUID_FRAME_LEN:
            return WireError(TOO_SHORT, f"{n} bytes, GUID framing needs {GUID_FRAME_LEN}")
        return SchemaRef(None, bytes(value[1:GUID_FRAME_LEN]))
    return WireError(BAD_MAGIC, f"first byte 0x{magic:02x} is not a Confluent magic byte (0x00 / 0x01)")


def rewrite_id(value: bytes, new_id: int) -> bytes:
    """``value`` with its 4 id bytes replaced by ``new_id``; every other byte is identical.

    Raises :class:`WireFormatError` when ``value`` is not ``0x00``-framed or ``new_id`` is not an int32.
    """
    if len(value) < ID_FRAME_LEN or value[0] != MAGIC_ID:
        ref = parse_schema_ref(value)
        err = ref if isinstance(ref, WireError) else WireError(BAD_MAGIC, "not 0x00 (schema id) framing")
        raise WireFormatError(err)
    if not _INT32_MIN <= new_id <= _INT32_MAX:
        raise WireFormatError(WireError(UNKNOWN_SCHEMA_ID, f"schema id {new_id} does not fit in an int32"))
    return b"\x00" + _ID.pack(new_id) + value[ID_FRAME_LEN:]


def rewrite_guid(value: bytes, new_guid: bytes) -> bytes:
    """``value`` with its 16 GUID bytes replaced by ``new_guid``; every other byte is identical."""
    if len(value) < GUID_FRAME_LEN or value[0] != MAGIC_GUID:
        ref = parse_schema_ref(value)
        err = ref if isinstance(ref, WireError) else WireError(BAD_MAGIC, "not 0x01 (GUID) framing")
        raise WireFormatError(err)
    if len(new_guid) != 16:
        raise WireFormatError(WireError(UNKNOWN_SCHEMA_GUID, f"a GUID has 16 bytes, got {len(new_guid)}"))
    return b"\x01" + bytes(new_guid) + value[GUID_FRAME_LEN:]


def _ids(m: IdMap) -> Lookup:
    return m if callable(m) else m.get


def _guids(m: GuidMap | None) -> GuidLookup | None:
    if m is None or callable(m):
        return m
    return m.get


def translate_value(value: bytes | None, id_map: IdMap, guid_map: GuidMap | None = None) -> bytes | None | WireError:
    """``value`` with its schema id mapped through ``id_map`` (and GUID through ``guid_map``).

    Returns the (possibly identical) bytes, None for a tombstone, or a :class:`WireError`
    (``bad_magic``, ``too_short``, ``unknown_schema_id``, ``unknown_schema_guid``, or the one a lookup
    function answered). Never raises for bad input. ``id_map`` / ``guid_map`` are mappings or functions
    returning None when unknown (or a WireError saying why there is no mapping).
    A GUID passes through unchanged when no ``guid_map`` is given (see the module notes).
    """
    return _translate(value, _ids(id_map), _guids(guid_map))


def _translate(value: bytes | None, ids: Lookup, guids: GuidLookup | None) -> bytes | None | WireError:
    ref = parse_schema_ref(value)
    if ref is None or isinstance(ref, WireError):
        return ref
    assert value is not None
    if ref.schema_id is not None:
        new = ids(ref.schema_id)
        if isinstance(new, WireError):
            return new
        if new is None:
            return WireError(UNKNOWN_SCHEMA_ID, f"schema id {ref.schema_id} has no destination id")
        if new == ref.schema_id:
            return value
        if not _INT32_MIN <= new <= _INT32_MAX:
            return WireError(UNKNOWN_SCHEMA_ID, f"schema id {ref.schema_id} maps to {new}, not an int32")
        return b"\x00" + _ID.pack(new) + value[ID_FRAME_LEN:]
    assert ref.guid is not None
    if guids is None:
        return value
    new_guid = guids(ref.guid)
    if isinstance(new_guid, WireError):
        return new_guid
    if new_guid is None or len(new_guid) != 16:
        return WireError(UNKNOWN_SCHEMA_GUID, f"schema GUID {ref.guid.hex()} has no destination GUID")
    return value if new_guid == ref.guid else b"\x01" + bytes(new_guid) + value[GUID_FRAME_LEN:]


def translate_payload(data: bytes, lookup: Lookup, guid_lookup: GuidLookup | None = None) -> bytes | WireError:
    """Rewrite the schema id (via ``lookup``) or GUID (via ``guid_lookup``) of a framed (non-null) payload.

    The partition writer's form of ``translate_value(data, lookup, guid_lookup)`` for non-null data.
    """
    out = _translate(data, lookup, guid_lookup)
    if out is None:  # pragma: no cover - data is never None here
        return WireError(TOO_SHORT, "null payload")
    return out


def rewrite_header_ids(headers: Iterable[Header], id_map: IdMap, only: str | None = None,
                       guid_map: GuidMap | None = None) -> tuple[tuple[Header, ...], WireError | None]:
    """Rewrite the schema references carried in ``__key_schema_id`` / ``__value_schema_id`` headers.

    ``only`` restricts the rewrite to one of the two header names. Header order and every other header
    are kept. Returns ``(new_headers, None)``, or ``(headers unchanged, WireError)`` naming the header
    when a reference cannot be translated. A header whose value is null is left alone (the Confluent
    deserializers then fall back to payload framing).
    """
    ids, guids = _ids(id_map), _guids(guid_map)
    original = tuple(headers)
    out: list[Header] = []
    for name, value in original:
        if value is not None and name in SCHEMA_ID_HEADERS and (only is None or name == only):
            new = _translate(value, ids, guids)
            if isinstance(new, WireError):
                return original, WireError(new.reason, f"header {name}: {new.detail}")
            out.append((name, new))
        else:
            out.append((name, value))
    return tuple(out), None
