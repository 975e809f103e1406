"""bool, integers, floats, text-like types, bytea, uuid, json/jsonb: text and binary parsers side by side.

Text parsers take the raw bytes of a 't' column (UTF-8: the decoding session is pinned to it);
binary parsers take the type's send-format bytes of a 'b' column.
"""

from __future__ import annotations

import struct
import uuid

_I2, _I4, _I8, _U4 = struct.Struct("!h"), struct.Struct("!i"), struct.Struct("!q"), struct.Struct("!I")
_F4, _F8 = struct.Struct("!f"), struct.Struct("!d")


def text_str(raw: bytes) -> str:
    return raw.decode("utf-8")


def bool_text(raw: bytes) -> bool:
    if raw == b"t":
        return True
    if raw == b"f":
        return False
    raise ValueError("boolean text is neither 't' nor 'f'")


def bool_binary(raw: bytes) -> bool:
    if len(raw) != 1:
        raise ValueError("boolean binary value is not 1 byte")
    return raw != b"\x00"


def int_text(raw: bytes) -> int:
    return int(raw)


def int2_binary(raw: bytes) -> int:
    return _I2.unpack(raw)[0]


def int4_binary(raw: bytes) -> int:
    return _I4.unpack(raw)[0]


def int8_binary(raw: bytes) -> int:
    return _I8.unpack(raw)[0]


def oid_binary(raw: bytes) -> int:
    return _U4.unpack(raw)[0]


def float_text(raw: bytes) -> float:
    # PostgreSQL prints NaN, Infinity, -Infinity; Python's float() accepts all three spellings.
    return float(raw)


def float4_binary(raw: bytes) -> float:
    return _F4.unpack(raw)[0]


def float8_binary(raw: bytes) -> float:
    return _F8.unpack(raw)[0]


def bytea_text(raw: bytes) -> bytes:
    if not raw.startswith(b"\\x"):
        raise ValueError("bytea text is not in hex format (bytea_output must be 'hex')")
    return bytes.fromhex(raw[2:].decode("ascii"))


def bytea_binary(raw: bytes) -> bytes:
    return bytes(raw)


def char_binary(raw: bytes) -> str:
    """The one-byte "char" type."""
    return raw.decode("utf-8") if raw else ""


def uuid_binary(raw: bytes) -> str:
    return str(uuid.UUID(bytes=bytes(raw)))


def jsonb_binary(raw: bytes) -> str:
    if not raw or raw[0] != 1:
        raise ValueError("unsupported jsonb binary version")
    return raw[1:].decode("utf-8")
