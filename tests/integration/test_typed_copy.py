"""The initial copy's typed fast path (applier.sources.typedcopy) against the per-value path, the
reference: a table holding every mapped type, with NULLs and edge values, read both ways from a real
PostgreSQL gives the same Arrow values, bit for bit (floats by their bits: NaN, -0.0); chunks with
values Spark's types cannot hold fall back alone to the per-value path; and a whole mirror of such a
table equals Postgres under each ``apply.special_values`` policy, its copied rows equal to the same
rows streamed through pgoutput afterwards."""

from __future__ import annotations

import math
import struct
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pytest

from applier.catalog import RelationCache
from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, MirrorConfig, SnapshotSettings, SourceSettings, TargetSettings
from applier.drivers.mirror import Mirror
from applier.errors import ValueConversionError
from applier.sink.store.arrow import arrow_table
from applier.sources.copy import CopyPlan, arrow_types, read_arrow_chunk, select_sql
from applier.sources.publication import PublishedTable
from applier.sources.snapshot import copy_rows, describe_relation
from applier.sources.sql_slot import pin_session
from applier.values import RowConverter, arrow_schema_for

pytestmark = [pytest.mark.postgres]

COLUMNS = """id int PRIMARY KEY, i2 smallint, i8 bigint, b bool, t text, vc varchar(5), c char(3),
  d date, ts timestamp, tstz timestamptz, n numeric(12,2), n38 numeric(38,10), nu numeric, f4 real, f8 float8,
  u uuid, j json, jb jsonb, by bytea, m mood, pi posint, dd day, dn money2, ia int[], ta text[], tsa timestamptz[],
  tm time, iv interval"""

TYPES = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy ü');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE DOMAIN day AS date;
CREATE DOMAIN money2 AS numeric(12,2);
"""

#: Values every mapped type's fast reader must give exactly as the stream does (no special values).
EDGE_ROWS = r"""
INSERT INTO every_type (id) VALUES (1);
INSERT INTO every_type VALUES (2, 0, 0, false, '', '', '', '2000-01-01', '2000-01-01 00:00:00',
  '2000-01-01 00:00:00+00', 0, 0, 'NaN', 'NaN', 'NaN', '00000000-0000-0000-0000-000000000000', '""', '{}',
  '\x', 'sad', 1, '1999-12-31', 0, '{}', '{}', '{}', '00:00', '0');
INSERT INTO every_type VALUES (3, -32768, -9223372036854775808, true, E'a,b\n"c"\\', 'ü€𝄞', 'x',
  '0001-01-01', '0001-01-01 00:00:00', '0001-01-01 00:00:00+00', '-0.01',
  '-1234567890123456789012345678.0123456789', '-0.000000000000000000000000000000000000000001', '-0', '-0',
  'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '{"k": "\u00fc\n\"q\"", "e": "\\u0000x"}',
  '{"k": "\u00fc\n\"q\"", "n": 1.50, "a": [null, true]}', '\x00ff00', 'happy ü', 2147483647, '0001-01-01',
  '-9999999999.99', '{1,NULL,-3}', '{"",NULL,"NULL","a,b","q\"x"}',
  '{"2021-03-04 05:06:07.123456+00",NULL}', '24:00:00', '-1 days +02:03:00');
INSERT INTO every_type VALUES (4, 32767, 9223372036854775807, NULL, 'NULL', NULL, NULL,
  '9999-12-31', '9999-12-31 23:59:59.999999', '9999-12-31 23:59:59.999999+00', '9999999999.99',
  '9999999999999999999999999999.9999999999', '123456789012345678901234567890123456789012345678901234567890.5',
  'Infinity', '-Infinity', NULL, 'null', 'null', '\x000000', 'ok', NULL, '9999-12-31', NULL,
  '{2147483647}', NULL, NULL, '23:59:59.999999', '1 year 2 mons 3 days 04:05:06.789');
INSERT INTO every_type VALUES (5, 1, 1, true, ' ', 'a', 'abc', '1970-01-01', '2021-03-04 05:06:07.5',
  '2021-03-04 05:06:07.123456+05:30', '0.10', '0.0000000001', 'Infinity', '3.4028235e38', '1.7976931348623157e308',
  NULL, '[1, 2.50, "\u263a"]', '"\u263a"', decode('deadbeef', 'hex'), NULL, 7, NULL, '0.00',
  NULL, '{"\\\\"}', NULL, NULL, NULL);
INSERT INTO every_type VALUES (6, NULL, NULL, NULL, NULL, NULL, NULL, '1900-02-28', '1969-12-31 23:59:59.999999',
  '1847-12-01 00:00:00-00:01:15', '-0.00', NULL, '-Infinity', '1e-45', '5e-324', NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO every_type VALUES (7, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  '0.1', '0.1', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
INSERT INTO every_type SELECT i, i % 32000, i::bigint * 1000003, i % 2 = 0, repeat('t', i % 9), 'v' || (i % 999),
  'c', date '1800-01-01' + i * 17, timestamp '1950-01-01' + i * interval '1 day 1 hour 1.000001 second',
  timestamptz '2021-03-04 05:06:07.123456+02' + i * interval '37 minutes 0.1 second', i / 7.0, i / 3.0, i / 11.0,
  i / 3.0, i / 7.0, md5(i::text)::uuid, json_build_object('i', i), jsonb_build_object('i', i, 's', 'a,b'),
  decode(md5(i::text), 'hex'), (ARRAY['sad', 'ok', 'happy ü'])[i % 3 + 1]::mood, i, date '2000-01-01' - i,
  i / 100.0, ARRAY[i, -i], ARRAY['x' || i], ARRAY[timestamptz '2000-01-01' + i * interval '1 second'],
  time '00:00' + i * interval '1.5 second', i * interval '1 day 3 seconds'
FROM generate_series(10, 3000) i;
"""

#: Rows whose values Spark's types cannot hold (each chunk holding one must take the per-value path).
SPECIAL_ROWS = [
    ("d", "'infinity'"), ("d", "'-infinity'"), ("d", "'0044-03-15 BC'"), ("d", "'10000-01-01'"),
    ("dd", "'infinity'"), ("ts", "'infinity'"), ("ts", "'-infinity'"), ("ts", "'0001-01-01 00:00:00 BC'"),
    ("ts", "'12345-06-07 08:09:10'"), ("tstz", "'infinity'"), ("tstz", "'-infinity'"),
    ("tstz", "'0100-01-01 00:00:00+00 BC'"), ("tstz", "'99999-01-01 00:00:00+00'"), ("n", "'NaN'"),
    ("n38", "'NaN'"), ("ia", "'[0:1]={1,2}'"), ("ia", "'{{1,2},{3,4}}'"), ("tsa", "'{infinity}'"),
]
#: Not in the 'clamp' run: numeric NaN in a DECIMAL column has no nearest value ('clamp' stops on it, as
#: the stream does). (An array of timestamptz holding 'infinity' clamps element by element.)
NO_CLAMP = {("n", "'NaN'"), ("n38", "'NaN'")}


def _setup(conn: Any) -> None:
    conn.execute(TYPES)
    conn.execute(f"CREATE TABLE every_type ({COLUMNS})")
    conn.execute(EDGE_ROWS)


def _read_both_ways(conn: Any, where: str = "", policy: str = "error") -> tuple[Any, Any, list[str]]:
    """(fast path's Arrow table or None, the per-value path's Arrow table, the readers' kinds)."""
    table = PublishedTable("public", "every_type", None, None)
    relation, types = describe_relation(conn, table)
    catalog = RelationCache()
    for typ in types:
        catalog.update_type(typ)
    schema = catalog.update(relation)
    arrow_schema = arrow_schema_for(schema, catalog.types)
    readers = arrow_types(relation, catalog.types, arrow_schema)
    assert readers is not None
    names = [c.name for c in relation.columns]
    sql = select_sql(CopyPlan("ONLY public.every_type", None, ("",), -1), names, where)
    fast = read_arrow_chunk(conn, sql, names, readers, table)
    converter = RowConverter(schema, catalog.types, policy)  # type: ignore[arg-type]
    rows = [converter.convert(t) for batch in copy_rows(conn, table, relation, select=sql) for t in batch]
    reference = arrow_table(rows, arrow_schema)
    assert reference is not None
    return fast, reference, [r.kind for r in readers]


def _bits(value: object) -> object:
    """A value as something == compares exactly: floats by their bits (NaN, -0.0), lists element-wise."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, list):
        return [_bits(v) for v in value]
    return (type(value).__name__, value)


def _assert_same(fast: Any, reference: Any) -> None:
    assert fast.schema == reference.schema
    assert fast.num_rows == reference.num_rows
    for name in reference.column_names:
        got, want = fast.column(name).to_pylist(), reference.column(name).to_pylist()
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert _bits(g) == _bits(w), (name, i, g, w)


@pytest.fixture
def conn(pg):
    with pg.connect() as c:
        pin_session(c)  # the copy's session settings (open_snapshot pins the same)
        c.execute("BEGIN")  # copy_rows reads through a cursor
        yield c
        c.execute("ROLLBACK")


def test_every_mapped_type_reads_the_same_on_the_fast_path_and_the_per_value_path(conn):
    _setup(conn)
    fast, reference, kinds = _read_both_ways(conn)
    assert fast is not None, "no special value in the table: the fast path must read every chunk"
    # the typed readers are the ones in use (not the stream's parser per value) where they exist
    assert kinds.count("python") == 3, kinds  # the three array columns
    assert {"date", "timestamp", "cast", "bytea", "native"} <= set(kinds), kinds
    _assert_same(fast, reference)
    # and both are Postgres' values (checked here by hand for a few, not by the values layer)
    by_id = {r["id"]: r for r in fast.to_pylist()}
    assert by_id[1]["t"] is None and by_id[2]["t"] == "" and by_id[4]["t"] == "NULL"
    assert by_id[2]["by"] == b"" and by_id[3]["by"] == b"\x00\xff\x00" and by_id[5]["by"] == b"\xde\xad\xbe\xef"
    assert math.isnan(by_id[2]["f8"]) and math.copysign(1.0, by_id[3]["f8"]) == -1.0 and by_id[3]["f8"] == 0.0
    assert by_id[4]["f4"] == math.inf and by_id[4]["f8"] == -math.inf and by_id[7]["f8"] == 0.1
    assert by_id[7]["f4"] == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert by_id[3]["d"] == date(1, 1, 1) and by_id[4]["d"] == date(9999, 12, 31)
    assert by_id[4]["ts"] == datetime(9999, 12, 31, 23, 59, 59, 999999)
    assert by_id[5]["tstz"] == datetime(2021, 3, 3, 23, 36, 7, 123456, tzinfo=UTC)
    assert by_id[6]["tstz"] == datetime(1847, 12, 1, 0, 1, 15, tzinfo=UTC)  # LMT offset with seconds
    assert by_id[3]["n38"] == Decimal("-1234567890123456789012345678.0123456789")
    assert by_id[3]["n"] == Decimal("-0.01") and by_id[6]["n"] == Decimal("0.00")
    assert by_id[3]["dn"] == "-9999999999.99"  # a domain's typmod is not sent: unconstrained numeric, text
    assert by_id[2]["nu"] == "NaN"
    assert by_id[4]["nu"] == "123456789012345678901234567890123456789012345678901234567890.5"
    assert by_id[3]["j"] == r'{"k": "\u00fc\n\"q\"", "e": "\\u0000x"}'  # json: the text as given
    assert by_id[3]["jb"] == '{"a": [null, true], "k": "\u00fc\\n\\"q\\"", "n": 1.50}'  # jsonb: normalised
    assert by_id[3]["u"] == "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11" and by_id[3]["m"] == "happy ü"
    assert by_id[3]["ta"] == ["", None, "NULL", "a,b", 'q"x'] and by_id[2]["ia"] == []


@pytest.mark.parametrize(("column", "value"), SPECIAL_ROWS, ids=[f"{c}={v}" for c, v in SPECIAL_ROWS])
def test_a_chunk_with_a_value_spark_cannot_hold_falls_back_to_the_per_value_path(conn, column, value):
    _setup(conn)
    conn.execute(f"INSERT INTO every_type (id, {column}) VALUES (100000, {value})")
    fast, _, _ = _read_both_ways(conn, "id < 20", "null")
    assert fast is not None  # the other chunk is fast
    fast, reference, _ = _read_both_ways(conn, "id < 20 OR id = 100000", "null")
    assert fast is None, "a special value must send its chunk to the per-value path"
    assert reference.num_rows == 7 + 10 + 1
    special = [r for r in reference.to_pylist() if r["id"] == 100000]
    assert special[0][column] is None  # the policy ('null') applied by the per-value path


def _mirror(pg: Any, spark: Any, tmp_path: Any, policy: str, lines: list[str], *,
            on_executors: bool = False) -> MirrorConfig:
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=f"tc_{policy}", publication="tc"),
                       target=TargetSettings(path=str(tmp_path / policy)),
                       apply=ApplySettings(special_values=policy),
                       snapshot=SnapshotSettings(parallelism=2, chunk_mb=1, commit_mb=1, on_executors=on_executors))
    Mirror(spark, cfg, progress=lines.append, progress_every=0.0).run(once=True)
    return cfg


@pytest.mark.spark
@pytest.mark.parametrize("on_executors", [False, True], ids=["driver", "executors"])
def test_mirror_of_every_type_with_special_values_equals_postgres_under_each_policy(pg, spark, tmp_path,
                                                                                    on_executors):
    with pg.connect() as conn:
        _setup(conn)
        conn.execute("INSERT INTO every_type (id, t) SELECT i, repeat('filler', 80) FROM generate_series(4000, 9000) i")
        conn.execute("ANALYZE every_type")
        (pages,) = conn.execute("SELECT relpages FROM pg_class WHERE relname = 'every_type'").fetchone()
        assert pages > 2 * 128  # 3 chunks of 1 MB
        # the special values land in the table's last pages: one chunk of several
        for i, (column, value) in enumerate(SPECIAL_ROWS):
            if (column, value) not in NO_CLAMP:
                conn.execute(f"INSERT INTO every_type (id, {column}) VALUES ({100000 + i}, {value})")
        conn.execute("ANALYZE every_type; CREATE PUBLICATION tc FOR TABLE every_type")
        for policy in ("clamp", "null"):
            if policy == "null":  # numeric NaN has no nearest DECIMAL: 'clamp' stops on it (as the stream does)
                for i, (column, value) in enumerate(SPECIAL_ROWS):
                    if (column, value) in NO_CLAMP:
                        conn.execute(f"INSERT INTO every_type (id, {column}) VALUES ({100000 + i}, {value})")
            lines: list[str] = []
            cfg = _mirror(pg, spark, tmp_path, policy, lines, on_executors=on_executors)
            done = [m for m in lines if m.startswith("snapshot: public.every_type: ") and " rows in " in m]
            assert len(done) == 1 and " chunks per value (special values)" in done[0], done
            slow, _, chunks = done[0].split(", ")[-1].split()[:3]
            # only the chunks with them (all in the last one at first; in the second run the NaN rows
            # inserted later went to pages after the ones the copy's plan knew, its open-ended last chunk)
            assert 1 <= int(slow) < int(chunks) and int(chunks) >= 3, done
            [result] = verify_against_postgres(spark, conn, cfg.target.path, [("public", "every_type")],
                                               policy=policy)
            pairs = zip(result.only_in_source, result.only_in_target, strict=False)
            assert result.equal, str([(i, a, b) for src, tgt in pairs
                                      for i, (a, b) in enumerate(zip(src.split("\x1f"), tgt.split("\x1f"), strict=True))
                                      if a != b])
            # the copied rows equal the same rows sent by the stream (pgoutput text, RowConverter)
            conn.execute("INSERT INTO every_type SELECT id + 1000000, i2, i8, b, t, vc, c, d, ts, tstz, n, n38, nu, "
                         "f4, f8, u, j, jb, by, m, pi, dd, dn, ia, ta, tsa, tm, iv FROM every_type WHERE id < 1000000")
            Mirror(spark, cfg, progress=lines.append).run(once=True)
            frame = spark.read.format("delta").load(f"{cfg.target.path}/public/every_type")
            rows = {r["id"]: r for r in frame.toArrow().to_pylist()}  # (collect fails on year 1 in UTC-x)
            (count,) = conn.execute("SELECT count(*) FROM every_type").fetchone()
            specials = len([r for r in SPECIAL_ROWS if policy == "null" or r not in NO_CLAMP])
            assert len(rows) == count and count == 2 * (7 + 2991 + 5001 + specials)
            for key, copied in rows.items():
                if key >= 1000000:
                    continue
                streamed = rows[key + 1000000]
                assert {k: _bits(v) for k, v in copied.items() if k != "id"} == \
                       {k: _bits(v) for k, v in streamed.items() if k != "id"}, key
            conn.execute("DELETE FROM every_type WHERE id >= 1000000")
    with pg.connect() as conn:  # the default policy stops the copy, naming the column, as the stream does
        with pytest.raises(ValueConversionError, match="apply.special_values") as caught:
            _mirror(pg, spark, tmp_path, "error", [], on_executors=on_executors)
        assert caught.value.context.get("column") in {c for c, _ in SPECIAL_ROWS}
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_bytea_hex_decoder_handles_nulls_empty_values_slices_and_refuses_what_is_not_hex():
    import pyarrow as pa

    from applier.sources.typedcopy import NotFast, _bytea

    raw = pa.array([b"\\x00ff", None, b"\\x", b"\\xDEADbeef", None, b"\\x0a"], type=pa.binary())
    want = [b"\x00\xff", None, b"", b"\xde\xad\xbe\xef", None, b"\n"]
    assert _bytea(pa.chunked_array([raw])).to_pylist() == want
    assert _bytea(pa.chunked_array([raw.slice(2), raw.slice(0, 2)])).to_pylist() == want[2:] + want[:2]
    for bad in (b"\\x0", b"\\xzz", b"00ff", b"\\", b"x00ff"):
        with pytest.raises(NotFast):
            _bytea(pa.chunked_array([pa.array([b"\\x00", bad], type=pa.binary())]))
