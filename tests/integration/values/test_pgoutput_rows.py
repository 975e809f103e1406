"""Rows captured from a real pgoutput stream convert to the same Python tuples with binary=false and
binary=true, on every installed PostgreSQL major; enums and domains resolve through the Type cache."""

from __future__ import annotations

import struct
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from applier.catalog import RelationCache, SchemaVersion
from applier.errors import ValueConversionError
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import COL_BINARY, COL_TEXT, Insert, Relation, Type, Update
from applier.sources.sql_slot import peek, pgoutput_options
from applier.spark.types import spark_schema
from applier.values import UNCHANGED_TOAST, RowConverter, arrow_schema_for

pytestmark = pytest.mark.postgres

SCHEMA = """
CREATE TYPE mood AS ENUM ('happy', 'sad', 'a "quoted", spaced label');
CREATE DOMAIN posint AS integer CHECK (VALUE > 0);
CREATE DOMAIN amount AS numeric(10,2);
CREATE DOMAIN intlist AS integer[];
CREATE TYPE pair AS (a integer, b text);
CREATE TABLE many (
  id integer PRIMARY KEY, b boolean, i2 smallint, i8 bigint, o oid, f4 real, f8 double precision,
  n numeric(12,3), nu numeric, t text, vc varchar(10), c char(4), ch "char", nm name, by bytea, u uuid,
  j json, jb jsonb, d date, ts timestamp, tstz timestamptz, tm time, ttz timetz, iv interval,
  ai integer[], at text[], an numeric(5,2)[], ats timestamptz[], e mood, ae mood[], dp posint,
  dn amount, da intlist
);
CREATE TABLE composite (id integer PRIMARY KEY, p pair);
CREATE PUBLICATION pub FOR TABLE many, composite;
"""

INSERTS = """
INSERT INTO many VALUES (1, true, -32768, 9223372036854775807, 4294967295, 0.1, 0.1,
  123456789.123, '123456789012345678901234567890.000000000000000000001', 'héllo "x" \\ {y}', 'abc', 'ab',
  'z', 'pg_class', '\\x00ff', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{"b": 1,  "a": 2}',
  '{"b": 1,  "a": 2}', '2026-11-22', '2026-11-22 10:11:12.123456', '2026-11-22 10:11:12.5+02',
  '24:00:00', '10:11:12-05:30', '-1 days +02:03:00', '{1,NULL,3}', '{"a,b","c\\"d",NULL,"NULL",""}',
  '{1.5,-2.25}', '{"2026-01-01 00:00:00+00"}', 'a "quoted", spaced label',
  '{happy,NULL,"a \\"quoted\\", spaced label"}',
  7, 12.5, '{4,5}');
INSERT INTO many (id) VALUES (2);
INSERT INTO many (id, f4, f8, nu, d, ts, iv, ai, ae) VALUES (3, '-Infinity', 'NaN', 'NaN', '0001-01-01',
  '9999-12-31 23:59:59.999999', '1 year 2 months 3 days 04:05:06.789', '{}', '{}');
INSERT INTO composite VALUES (1, ROW(1, 'x'));
"""

ROW_1 = (1, True, -32768, 9223372036854775807, 4294967295, struct.unpack("!f", struct.pack("!f", 0.1))[0], 0.1,
         Decimal("123456789.123"), "123456789012345678901234567890.000000000000000000001", 'héllo "x" \\ {y}',
         "abc", "ab  ", "z", "pg_class", b"\x00\xff", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
         '{"b": 1,  "a": 2}', '{"a": 2, "b": 1}', date(2026, 11, 22), datetime(2026, 11, 22, 10, 11, 12, 123456),
         datetime(2026, 11, 22, 8, 11, 12, 500000, tzinfo=UTC), "24:00:00", "10:11:12-05:30", "-1 days +02:03:00",
         [1, None, 3], ["a,b", 'c"d', None, "NULL", ""], [Decimal("1.50"), Decimal("-2.25")],
         [datetime(2026, 1, 1, tzinfo=UTC)], 'a "quoted", spaced label',
         '{happy,NULL,"a \\"quoted\\", spaced label"}', 7, "12.50", [4, 5])


def capture(conn, binary: bool) -> list[object]:
    """Every message of the slot, decoded; the slot is only peeked so both formats see the same changes."""
    decoder = MessageDecoder()
    options = pgoutput_options("pub", proto_version=1, binary=binary)
    return [decoder.decode(m.data, m.lsn) for m in peek(conn, "s", options)]


def rows_of(messages: list[object]) -> tuple[RelationCache, dict[str, list[tuple[object, ...] | ValueConversionError]],
                                              dict[str, bytes]]:
    """Converted rows per table (errors kept in place), and the column kinds seen per table."""
    cache = RelationCache()
    converters: dict[int, RowConverter] = {}
    rows: dict[str, list[tuple[object, ...] | ValueConversionError]] = {}
    kinds: dict[str, bytes] = {}
    for msg in messages:
        if isinstance(msg, Type):
            cache.update_type(msg)
        elif isinstance(msg, Relation):
            schema: SchemaVersion = cache.update(msg)
            converters[msg.oid] = RowConverter(schema, cache.types)
        elif isinstance(msg, Insert):
            name = cache.get(msg.relation_oid).relation.name
            kinds[name] = kinds.get(name, b"") + msg.new.kinds
            try:
                rows.setdefault(name, []).append(converters[msg.relation_oid].convert(msg.new))
            except ValueConversionError as e:
                rows.setdefault(name, []).append(e)
    return cache, rows, kinds


def create_and_fill(conn) -> None:
    conn.execute(SCHEMA)
    conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    conn.execute(INSERTS)


@pytest.fixture
def captured(pg_any):
    with pg_any.connect() as conn:
        create_and_fill(conn)
        yield rows_of(capture(conn, binary=False)), rows_of(capture(conn, binary=True))


def test_text_and_binary_streams_give_identical_expected_rows(captured):
    (cache, text_rows, text_kinds), (_, binary_rows, binary_kinds) = captured
    assert set(text_kinds["many"]) == {COL_TEXT, ord("n")}
    assert COL_BINARY in set(binary_kinds["many"])  # the binary stream really carried send formats
    assert _nan_as_marker(text_rows["many"]) == _nan_as_marker(binary_rows["many"])
    first, nulls, specials = text_rows["many"]
    assert first == ROW_1
    assert [type(v) for v in first] == [type(v) for v in ROW_1]
    assert nulls == (2,) + (None,) * (len(ROW_1) - 1)
    columns = cache.get(next(oid for oid in _oids(cache) if cache.get(oid).relation.name == "many")).column_names
    by_name = dict(zip(columns, specials, strict=True))
    assert by_name["f4"] == float("-inf") and by_name["f8"] != by_name["f8"]  # NaN
    assert by_name["nu"] == "NaN" and by_name["d"] == date(1, 1, 1)
    assert by_name["ts"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert by_name["iv"] == "1 year 2 mons 3 days 04:05:06.789"
    assert by_name["ai"] == [] and by_name["ae"] == "{}"
    assert UNCHANGED_TOAST not in first


def test_types_resolve_through_the_type_cache(captured):
    (cache, _rows, _kinds), _ = captured
    many = next(cache.get(oid) for oid in _oids(cache) if cache.get(oid).relation.name == "many")
    col = {c.name: c for c in many.relation.columns}
    # 'Y' carries the base type's name for a domain (logicalrep_write_typ uses getBaseType).
    assert cache.types.get(col["dp"].type_oid).name == "int4"
    assert cache.types.get(col["da"].type_oid).name == "_int4"
    assert (cache.types.get(col["e"].type_oid).namespace, cache.types.get(col["e"].type_oid).name) == ("public", "mood")
    # A domain column's typmod is -1 (the base type's modifier is not sent), so numeric(10,2) under a
    # domain maps like unconstrained numeric: text, lossless.
    assert col["dn"].type_modifier == -1
    fields = {f.name: f.dataType.simpleString() for f in spark_schema(arrow_schema_for(many, cache.types)).fields}
    assert fields == {
        "id": "int", "b": "boolean", "i2": "smallint", "i8": "bigint", "o": "bigint", "f4": "float",
        "f8": "double", "n": "decimal(12,3)", "nu": "string", "t": "string", "vc": "string", "c": "string",
        "ch": "string", "nm": "string", "by": "binary", "u": "string", "j": "string", "jb": "string",
        "d": "date", "ts": "timestamp_ntz", "tstz": "timestamp", "tm": "string", "ttz": "string",
        "iv": "string", "ai": "array<int>", "at": "array<string>", "an": "array<decimal(5,2)>",
        "ats": "array<timestamp>", "e": "string", "ae": "string", "dp": "int", "dn": "string",
        "da": "array<int>",
    }


def test_composite_is_text_and_its_binary_form_is_refused(captured):
    (_c, text_rows, _k), (_c2, binary_rows, _k2) = captured
    assert text_rows["composite"] == [(1, "(1,x)")]
    (err,) = binary_rows["composite"]
    assert isinstance(err, ValueConversionError)
    assert "binary=false" in str(err) and err.column == "p" and err.relation == "public.composite"


def _oids(cache: RelationCache) -> list[int]:
    return [r["oid"] for r in cache.to_json()["relations"]]


_NAN = object()


def _nan_as_marker(rows: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """NaN != NaN; compare NaN columns as one marker so the equality means 'same values'."""
    return [tuple(_NAN if isinstance(v, float) and v != v else v for v in row) for row in rows]


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_row_converter_unchanged_toast_and_special_values_with_context(pg, binary):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE toasty (id integer PRIMARY KEY, big text, n integer, d date);"
                     "CREATE PUBLICATION pub FOR TABLE toasty")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("INSERT INTO toasty SELECT 1, string_agg(md5(i::text), ''), 1, '2026-01-02' "
                     "FROM generate_series(1, 500) i")
        conn.execute("UPDATE toasty SET n = 2, d = 'infinity'")
        messages = capture(conn, binary)
    cache = RelationCache()
    schema = next(cache.update(m) for m in messages if isinstance(m, Relation))
    inserted, updated = [m for m in messages if isinstance(m, Insert | Update)]
    strict = RowConverter(schema, cache.types)
    row = strict.convert(inserted.new)
    assert row[0] == 1 and isinstance(row[1], str) and len(row[1]) == 16000 and row[2:] == (1, date(2026, 1, 2))
    assert updated.new.kinds[1] == ord("u")  # the big value was not sent again
    with pytest.raises(ValueConversionError, match="cannot hold") as e:
        strict.convert(updated.new)
    assert (e.value.column, e.value.relation, e.value.context["pg_type"]) == ("d", "public.toasty", "date")
    assert RowConverter(schema, cache.types, "null").convert(updated.new) == (1, UNCHANGED_TOAST, 2, None)
    assert RowConverter(schema, cache.types, "clamp").convert(updated.new) == (1, UNCHANGED_TOAST, 2,
                                                                             date(9999, 12, 31))


@pytest.mark.spark
def test_converted_rows_go_to_spark_and_delta_unchanged(pg, spark, tmp_path):
    """The Python values are what Spark accepts for the mapped types: createDataFrame with schema
    verification, a Delta write and read back give the same values."""
    with pg.connect() as conn:
        create_and_fill(conn)
        cache, rows, _kinds = rows_of(capture(conn, binary=True))
    many = next(cache.get(oid) for oid in _oids(cache) if cache.get(oid).relation.name == "many")
    schema = spark_schema(arrow_schema_for(many, cache.types))
    spark.createDataFrame(rows["many"], schema, verifySchema=True).write.format("delta").save(str(tmp_path / "t"))
    back = [tuple(r) for r in spark.read.format("delta").load(str(tmp_path / "t")).orderBy("id").collect()]
    converted = [r for r in rows["many"] if isinstance(r, tuple)]
    assert len(converted) == len(rows["many"])  # every row of "many" converts
    assert _nan_as_marker([_as_spark_returns(r) for r in converted]) == _nan_as_marker(back)


def _as_spark_returns(row: tuple[object, ...]) -> tuple[object, ...]:
    """PySpark returns TimestampType values as naive datetimes in the local time zone."""
    def one(v: object) -> object:
        if isinstance(v, datetime) and v.tzinfo is not None:
            return v.astimezone().replace(tzinfo=None)
        if isinstance(v, list):
            return [one(x) for x in v]
        if isinstance(v, bytes):
            return bytearray(v)
        return v
    return tuple(one(v) for v in row)
