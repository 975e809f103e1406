"""PostgreSQL LSNs: 64-bit WAL positions printed as two hex halves (``0/16B3748``)."""

from __future__ import annotations

from applier.errors import ApplierError


def format_lsn(lsn: int) -> str:
    """Format like PostgreSQL's ``LSN_FORMAT_ARGS``: upper and lower 32 bits in uppercase hex."""
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_lsn(text: str | int) -> int:
    """Parse ``'0/16B3748'`` (or an int, passed through) into an int."""
    if isinstance(text, int):
        return text
    hi, sep, lo = text.strip().partition("/")
    if not sep:
        raise ApplierError("not an LSN, expected 'X/Y' in hex", value=text[:40])
    try:
        high, low = int(hi, 16), int(lo, 16)
    except ValueError as e:
        raise ApplierError("not an LSN, expected 'X/Y' in hex", value=text[:40]) from e
    if not (0 <= high <= 0xFFFFFFFF and 0 <= low <= 0xFFFFFFFF):
        raise ApplierError("LSN half out of range", value=text[:40])
    return (high << 32) | low
