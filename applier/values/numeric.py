"""numeric: to Decimal for numeric(p, s) with p <= 38 (Spark's DecimalType limit), else to PostgreSQL's
own canonical text (lossless: unconstrained numeric can hold 131072 digits, NaN and ±Infinity).

The binary form is base-10000 digits with a weight, a sign word and a display scale; it is turned
into exactly the text PostgreSQL would print, so text and binary replication give equal values.
"""

from __future__ import annotations

import struct
from decimal import Decimal

from applier.values.special import Unrepresentable

_HEAD = struct.Struct("!hhHh")
_POS, _NEG, _NAN, _PINF, _NINF = 0x0000, 0x4000, 0xC000, 0xD000, 0xF000
_SPECIAL_TEXT = {_NAN: "NaN", _PINF: "Infinity", _NINF: "-Infinity"}


def typmod_precision_scale(typmod: int) -> tuple[int, int] | None:
    """(precision, scale) of numeric(p, s), or None when unconstrained (PG 15+ allows scale < 0 or > p)."""
    if typmod < 4:
        return None
    t = typmod - 4
    precision = (t >> 16) & 0xFFFF
    scale = ((t & 0x7FF) ^ 1024) - 1024
    return precision, scale


def fits_decimal(typmod: int) -> tuple[int, int] | None:
    ps = typmod_precision_scale(typmod)
    if ps is None:
        return None
    p, s = ps
    return (p, s) if 0 < p <= 38 and 0 <= s <= p else None


def numeric_binary_text(raw: bytes) -> str:
    """The canonical text of a binary numeric (what numeric_out prints)."""
    if len(raw) < 8:
        raise ValueError("numeric binary value shorter than its header")
    ndigits, weight, sign, dscale = _HEAD.unpack_from(raw, 0)
    if sign in _SPECIAL_TEXT:
        return _SPECIAL_TEXT[sign]
    if sign not in (_POS, _NEG) or ndigits < 0 or dscale < 0 or len(raw) != 8 + 2 * ndigits:
        raise ValueError("malformed numeric binary value")
    digits = struct.unpack_from(f"!{ndigits}H", raw, 8)
    if any(d > 9999 for d in digits):
        raise ValueError("numeric digit out of range")
    # Integer part: groups with weight >= 0; fraction: groups after.
    int_groups = [digits[i] if i < ndigits else 0 for i in range(weight + 1)] if weight >= 0 else []
    int_part = "".join(f"{g:04d}" for g in int_groups).lstrip("0") or "0"
    frac = ""
    if dscale > 0:
        frac_groups = []
        for i in range(weight + 1, weight + 1 + (dscale + 3) // 4):
            frac_groups.append(digits[i] if 0 <= i < ndigits else 0)
        frac = "".join(f"{g:04d}" for g in frac_groups)[:dscale]
    text = int_part + ("." + frac if dscale > 0 else "")
    if sign == _NEG and any(ch not in "0." for ch in text):
        text = "-" + text
    return text


def numeric_text_to_decimal(raw: bytes) -> Decimal:
    text = raw.decode("ascii")
    if text in ("NaN", "Infinity", "-Infinity"):
        raise Unrepresentable(f"numeric {text} in a DECIMAL column")
    return Decimal(text)


def numeric_binary_to_decimal(raw: bytes) -> Decimal:
    return numeric_text_to_decimal(numeric_binary_text(raw).encode("ascii"))


def numeric_text_to_str(raw: bytes) -> str:
    return raw.decode("ascii")


def numeric_binary_to_str(raw: bytes) -> str:
    return numeric_binary_text(raw)
