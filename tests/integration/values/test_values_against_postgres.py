"""Text and binary forms of real PostgreSQL values convert to the same, expected Python values."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from applier.errors import ValueConversionError
from applier.protocol.messages import COL_BINARY, COL_TEXT
from applier.sources.sql_slot import pin_session
from applier.spark.types import spark_type
from applier.values import arrow_type_for, convert_value

pytestmark = pytest.mark.postgres
UTC = UTC

CASES = [
    ("boolean", "true", True),
    ("smallint", "-32768", -32768),
    ("integer", "2147483647", 2147483647),
    ("bigint", "-9223372036854775808", -9223372036854775808),
    ("oid", "4294967295", 4294967295),
    ("real", "1.5", 1.5),
    ("real", "0.1", 0.10000000149011612),  # the float32 nearest 0.1, from text as from binary
    ("real", "-Infinity", float("-inf")),
    ("double precision", "0.1", 0.1),
    ("double precision", "Infinity", float("inf")),
    ("numeric(12,2)", "-1234567890.12", Decimal("-1234567890.12")),
    ("numeric(38,10)", "1234567890123456789012345678.0123456789", Decimal("1234567890123456789012345678.0123456789")),
    ("numeric", "123456789012345678901234567890123456789012.000000000000000000001",
     "123456789012345678901234567890123456789012.000000000000000000001"),
    ("numeric", "NaN", "NaN"),
    ("numeric", "-Infinity", "-Infinity"),
    ("text", "héllo \"wörld\" \\ {x}", "héllo \"wörld\" \\ {x}"),
    ("varchar(5)", "abc", "abc"),
    ("char(5)", "ab", "ab   "),
    ("name", "pg_class", "pg_class"),
    ('"char"', "x", "x"),
    ('"char"', "\\351", "\\351"),  # charout spells a high-bit byte in octal
    ('"char"', "", ""),
    ("bytea", "\\x00ff10", b"\x00\xff\x10"),
    ("uuid", "A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ("json", '{"b": 1,  "a": [1, 2]}', '{"b": 1,  "a": [1, 2]}'),
    ("jsonb", '{"b": 1,  "a": [1, 2]}', '{"a": [1, 2], "b": 1}'),
    ("date", "2026-11-22", date(2026, 11, 22)),
    ("date", "0001-01-01", date(1, 1, 1)),
    ("timestamp", "2026-11-22 10:11:12.123456", datetime(2026, 11, 22, 10, 11, 12, 123456)),
    ("timestamptz", "2026-11-22 10:11:12.5+02", datetime(2026, 11, 22, 8, 11, 12, 500000, tzinfo=UTC)),
    ("time", "24:00:00", "24:00:00"),
    ("time", "10:11:12.25", "10:11:12.25"),
    ("timetz", "10:11:12-05:30", "10:11:12-05:30"),
    ("interval", "-1 days +02:03:00", "-1 days +02:03:00"),
    ("interval", "1 year 2 months 3 days 04:05:06.789", "1 year 2 mons 3 days 04:05:06.789"),
    ("integer[]", "{1,NULL,3}", [1, None, 3]),
    ("text[]", '{"a,b","c\\"d",NULL,"NULL",""}', ["a,b", 'c"d', None, "NULL", ""]),
    ("numeric(5,2)[]", "{1.5,-2.25}", [Decimal("1.50"), Decimal("-2.25")]),
    ("bytea[]", '{"\\\\x0102"}', [b"\x01\x02"]),
    ("timestamptz[]", '{"2026-01-01 00:00:00+00"}', [datetime(2026, 1, 1, tzinfo=UTC)]),
    ("int[]", "{}", []),
]


def fetch(conn, pg_type: str, literal: str) -> tuple[int, int, bytes, bytes]:
    """(type oid, typmod, text output, binary send output) of one value, as pgoutput would carry them."""
    forms = []
    for binary in (False, True):
        with conn.cursor(binary=binary) as cur:
            cur.execute(f"SELECT %s::{pg_type}", (literal,))
            forms.append(bytes(cur.pgresult.get_value(0, 0)))
            oid, typmod = cur.pgresult.ftype(0), cur.pgresult.fmod(0)
    return oid, typmod, forms[0], forms[1]


@pytest.mark.parametrize(("pg_type", "literal", "expected"), CASES, ids=[f"{c[0]}:{c[1][:20]}" for c in CASES])
def test_text_and_binary_give_the_expected_value(pg, pg_type, literal, expected):
    with pg.connect() as conn:
        pin_session(conn)
        oid, typmod, text, binary = fetch(conn, pg_type, literal)
    from_text = convert_value(COL_TEXT, text, oid, typmod, None)
    from_binary = convert_value(COL_BINARY, binary, oid, typmod, None)
    assert from_text == expected
    assert from_binary == expected
    assert type(from_text) is type(expected) and type(from_binary) is type(expected)
    spark_type(arrow_type_for(oid, typmod, None))  # every mapped type has an Arrow type and a Spark type


@pytest.mark.parametrize(("pg_type", "literal"), [
    ("date", "infinity"), ("date", "0044-03-15 BC"), ("timestamp", "-infinity"), ("timestamptz", "infinity"),
    ("date", "10000-01-01"), ("numeric(10,2)", "NaN"), ("integer[]", "[0:1]={1,2}"), ("integer[]", "{{1},{2}}"),
])
def test_values_spark_cannot_hold_stop_by_default_and_follow_the_policy(pg, pg_type, literal):
    with pg.connect() as conn:
        pin_session(conn)
        oid, typmod, text, binary = fetch(conn, pg_type, literal)
    for kind, raw in ((COL_TEXT, text), (COL_BINARY, binary)):
        with pytest.raises(ValueConversionError, match="cannot hold"):
            convert_value(kind, raw, oid, typmod, None, column="c")
        assert convert_value(kind, raw, oid, typmod, None, "null") is None
    if pg_type != "numeric(10,2)":
        assert convert_value(COL_TEXT, text, oid, typmod, None, "clamp") == \
            convert_value(COL_BINARY, binary, oid, typmod, None, "clamp")


def test_unknown_type_falls_back_to_text_and_refuses_binary(pg):
    with pg.connect() as conn:
        pin_session(conn)
        oid, typmod, text, binary = fetch(conn, "point", "(1,2)")
    assert convert_value(COL_TEXT, text, oid, typmod, None) == "(1,2)"
    with pytest.raises(ValueConversionError, match="binary=false"):
        convert_value(COL_BINARY, binary, oid, typmod, None)
