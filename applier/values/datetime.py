"""date, timestamp, timestamptz (to Spark DateType / TimestampNTZType / TimestampType) and time,
timetz, interval (Delta has no TIME or INTERVAL type: kept as PostgreSQL's canonical text, lossless,
including 24:00:00 and '-1 days +02:03:00').

Text arrives with DateStyle=ISO, IntervalStyle=postgres, TimeZone=UTC (the decoding session is
pinned). Binary values are microseconds/days since 2000-01-01; the time-like ones are formatted into
exactly the text PostgreSQL would print, so text and binary replication give equal values.
"""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime, timedelta

from applier.values.special import Unrepresentable

_I4, _I8 = struct.Struct("!i"), struct.Struct("!q")
_TIMETZ, _INTERVAL = struct.Struct("!qi"), struct.Struct("!qii")
PG_EPOCH_DATE = date(2000, 1, 1)
PG_EPOCH = datetime(2000, 1, 1)
PG_EPOCH_UTC = datetime(2000, 1, 1, tzinfo=UTC)
DATE_MIN, DATE_MAX = date(1, 1, 1), date(9999, 12, 31)
TS_MIN, TS_MAX = datetime(1, 1, 1), datetime(9999, 12, 31, 23, 59, 59, 999999)
I32_MAX, I32_MIN, I64_MAX, I64_MIN = 2**31 - 1, -(2**31), 2**63 - 1, -(2**63)


# --- date ----------------------------------------------------------------------------------------

def date_text(raw: bytes) -> date:
    if raw == b"infinity":
        raise Unrepresentable("date 'infinity'", DATE_MAX)
    if raw == b"-infinity":
        raise Unrepresentable("date '-infinity'", DATE_MIN)
    if raw.endswith(b" BC"):
        raise Unrepresentable("date outside years 1..9999", DATE_MIN)
    y, m, d = raw.split(b"-")
    if len(y) > 4:
        raise Unrepresentable("date outside years 1..9999", DATE_MAX)
    return date(int(y), int(m), int(d))


def date_binary(raw: bytes) -> date:
    (days,) = _I4.unpack(raw)
    if days == I32_MAX:
        raise Unrepresentable("date 'infinity'", DATE_MAX)
    if days == I32_MIN:
        raise Unrepresentable("date '-infinity'", DATE_MIN)
    try:
        return PG_EPOCH_DATE + timedelta(days=days)
    except OverflowError:
        raise Unrepresentable("date outside years 1..9999", DATE_MIN if days < 0 else DATE_MAX) from None


# --- timestamp / timestamptz ------------------------------------------------------------------------

def _split_ts(raw: bytes, what: str, clamp_min: datetime, clamp_max: datetime) -> str:
    if raw == b"infinity":
        raise Unrepresentable(f"{what} 'infinity'", clamp_max)
    if raw == b"-infinity":
        raise Unrepresentable(f"{what} '-infinity'", clamp_min)
    if raw.endswith(b" BC"):
        raise Unrepresentable(f"{what} outside years 1..9999", clamp_min)
    text = raw.decode("ascii")
    if text.index("-") > 4:
        raise Unrepresentable(f"{what} outside years 1..9999", clamp_max)
    return text


def timestamp_text(raw: bytes) -> datetime:
    return datetime.fromisoformat(_split_ts(raw, "timestamp", TS_MIN, TS_MAX))


def timestamptz_text(raw: bytes) -> datetime:
    text = _split_ts(raw, "timestamptz", TS_MIN.replace(tzinfo=UTC), TS_MAX.replace(tzinfo=UTC))
    value = datetime.fromisoformat(text)
    if value.tzinfo is None:
        raise ValueError("timestamptz text without a UTC offset")
    return value.astimezone(UTC)


def _from_micros(micros: int, what: str, epoch: datetime, lo: datetime, hi: datetime) -> datetime:
    if micros == I64_MAX:
        raise Unrepresentable(f"{what} 'infinity'", hi)
    if micros == I64_MIN:
        raise Unrepresentable(f"{what} '-infinity'", lo)
    try:
        return epoch + timedelta(microseconds=micros)
    except OverflowError:
        raise Unrepresentable(f"{what} outside years 1..9999", lo if micros < 0 else hi) from None


def timestamp_binary(raw: bytes) -> datetime:
    return _from_micros(_I8.unpack(raw)[0], "timestamp", PG_EPOCH, TS_MIN, TS_MAX)


def timestamptz_binary(raw: bytes) -> datetime:
    return _from_micros(_I8.unpack(raw)[0], "timestamptz", PG_EPOCH_UTC, TS_MIN.replace(tzinfo=UTC),
                        TS_MAX.replace(tzinfo=UTC))


# --- time, timetz, interval: PostgreSQL's own text ---------------------------------------------------

def _seconds_text(sec: int, fsec: int) -> str:
    """AppendSeconds: two-digit seconds, then the fraction without trailing zeros."""
    text = f"{abs(sec):02d}"
    if fsec:
        text += "." + f"{abs(fsec):06d}".rstrip("0")
    return text


def _clock(micros: int) -> str:
    hour, rem = divmod(micros, 3_600_000_000)
    minute, rem = divmod(rem, 60_000_000)
    sec, fsec = divmod(rem, 1_000_000)
    return f"{hour:02d}:{minute:02d}:{_seconds_text(sec, fsec)}"


def time_binary(raw: bytes) -> str:
    return _clock(_I8.unpack(raw)[0])


def _zone(tz_west: int) -> str:
    """EncodeTimezone: the zone is stored in seconds WEST of Greenwich."""
    sign = "+" if tz_west <= 0 else "-"
    sec = abs(tz_west)
    minute, sec = divmod(sec, 60)
    hour, minute = divmod(minute, 60)
    if sec:
        return f"{sign}{hour:02d}:{minute:02d}:{sec:02d}"
    if minute:
        return f"{sign}{hour:02d}:{minute:02d}"
    return f"{sign}{hour:02d}"


def timetz_binary(raw: bytes) -> str:
    micros, zone = _TIMETZ.unpack(raw)
    return _clock(micros) + _zone(zone)


def _ctrunc_div(a: int, b: int) -> tuple[int, int]:
    """C division (truncates toward zero) with its remainder."""
    q = abs(a) // b
    q = q if a >= 0 else -q
    return q, a - q * b


def interval_binary(raw: bytes) -> str:
    """EncodeInterval with IntervalStyle=postgres."""
    micros, days, months = _INTERVAL.unpack(raw)
    if months == I32_MAX and days == I32_MAX and micros == I64_MAX:
        return "infinity"
    if months == I32_MIN and days == I32_MIN and micros == I64_MIN:
        return "-infinity"
    year, mon = _ctrunc_div(months, 12)
    hour, rem = _ctrunc_div(micros, 3_600_000_000)
    minute, rem = _ctrunc_div(rem, 60_000_000)
    sec, fsec = _ctrunc_div(rem, 1_000_000)
    parts: list[str] = []
    is_zero, is_before = True, False
    for value, unit in ((year, "year"), (mon, "mon"), (days, "day")):
        if value == 0:
            continue
        parts.append(f"{'' if is_zero else ' '}{'+' if is_before and value > 0 else ''}{value} {unit}"
                     f"{'' if value == 1 else 's'}")
        is_before, is_zero = value < 0, False
    if is_zero or hour or minute or sec or fsec:
        minus = hour < 0 or minute < 0 or sec < 0 or fsec < 0
        parts.append(f"{'' if is_zero else ' '}{'-' if minus else ('+' if is_before else '')}"
                     f"{abs(hour):02d}:{abs(minute):02d}:{_seconds_text(sec, fsec)}")
    return "".join(parts)
