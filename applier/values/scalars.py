"""bool, integers, floats, text-like types, bytea, uuid, json/jsonb: text and binary parsers side by side.

Text parsers take the raw bytes of a 't' column (UTF-8: the decoding session is pinned to it);
binary parsers take the type's send-format bytes of a 'b' column.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable

from applier.values.arrays import binary_array_as_text

_I2, _I4, _I8, _U4 = struct.Struct("!h"), struct.Struct("!i"), struct.Struct("!q"), struct.Struct("!I")
_F4, _F8 = struct.Struct("!f"), struct.Struct("!d")


#: The C builtins themselves, not wrappers: the text path of int/text columns is one C call per value.
#: (bytes.decode defaults to UTF-8, the pinned client_encoding; int() of PostgreSQL's integer output
#: is exact.)
text_str: Callable[[bytes], str] = bytes.decode
int_text: Callable[[bytes], int] = int


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


def int2_binary(raw: bytes) -> int:
    value: int = _I2.unpack(raw)[0]
    return value


def int4_binary(raw: bytes) -> int:
    value: int = _I4.unpack(raw)[0]
    return value


def int8_binary(raw: bytes) -> int:
    value: int = _I8.unpack(raw)[0]
    return value


def oid_binary(raw: bytes) -> int:
    value: int = _U4.unpack(raw)[0]
    return value


def float_text(raw: bytes) -> float:
    # PostgreSQL prints NaN, Infinity, -Infinity; Python's float() accepts all three spellings.
    return float(raw)


def float4_text(raw: bytes) -> float:
    """Rounded to float32: real prints the shortest text that reads back as the same float32, but as a
    Python float '0.1' is not that float32, and the binary path (the exact float32) must agree."""
    value: float = _F4.unpack(_F4.pack(float(raw)))[0]
    return value


def float4_binary(raw: bytes) -> float:
    value: float = _F4.unpack(raw)[0]
    return value


def float8_binary(raw: bytes) -> float:
    value: float = _F8.unpack(raw)[0]
    return value


def bytea_text(raw: bytes) -> bytes:
    if not raw.startswith(b"\\x"):
        raise ValueError("bytea text is not in hex format (bytea_output must be 'hex')")
    return bytes.fromhex(raw[2:].decode("ascii"))


def bytea_binary(raw: bytes) -> bytes:
    return bytes(raw)


def char_binary(raw: bytes) -> str:
    """The one-byte "char" type, spelled as charout spells it: a byte >= 0x80 is printed as \\ooo."""
    if not raw or raw == b"\x00":  # charout prints the NUL "char" as ''
        return ""
    if len(raw) != 1:
        raise ValueError('"char" binary value is not 1 byte')
    return raw.decode("ascii") if raw[0] < 0x80 else f"\\{raw[0]:03o}"


class NotText(Exception):
    """The binary value of a user type is not text, so applier cannot know how to read it."""


def _label_binary(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise NotText() from None
    if not text.isprintable() and any(ch < " " and ch not in "\t\n\r" for ch in text):
        raise NotText()
    return text


def uuid_binary(raw: bytes) -> str:
    return str(uuid.UUID(bytes=bytes(raw)))


def jsonb_binary(raw: bytes) -> str:
    if not raw or raw[0] != 1:
        raise ValueError("unsupported jsonb binary version")
    return raw[1:].decode("utf-8")


def user_type_binary(raw: bytes) -> str:
    """Binary value of a user type that is not a domain of a built-in one (enum, composite, range,
    array of a user type, extension type): the stream does not say which kind it is.

    enum_send (and text-like extension types such as citext) send the label/text itself, which is
    accepted. An array of such labels (array_send's header is self-describing) is re-spelled as
    array_out prints it. Anything else is refused, never guessed: composites, ranges and most
    extension formats start with int32 counts (NUL bytes) that neither parse as text nor as an array
    (a composite's second word is a type OID, never an array's 0/1 flags word); ltree starts with a
    version byte 0x01."""
    try:
        return _label_binary(raw)
    except NotText:
        pass
    try:
        return binary_array_as_text(raw, _label_binary)
    except (ValueError, struct.error):
        raise NotText() from None
