"""The column-by-column fold against the reference on a random workload captured from a real server.

tests/unit/sink/test_columnar_fold.py compares the two folds on the fixed captured streams; this one
makes a new stream with a fixed seed: many types (every kind of reader the copy has: native, cast,
date and time, bytea, per value), text, composite and moved keys, NULLs, special values (infinity,
NaN), TOAST values left unchanged, REPLICA IDENTITY FULL, a keyless table, truncates, and a column
added part-way. Its ranges, cut at random commits, must fold to the same RangeFold both ways, and the
fast way must have folded many of them (it refuses ranges with a FULL table, a keyless one, ...), among
them ranges with a TRUNCATE of a keyed table amid its rows.
"""

from __future__ import annotations

import itertools
import random

import pytest
from foldcompare import catalogs, cuts, fold, same

from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres]

SCHEMA = """
CREATE TABLE typed (id bigint PRIMARY KEY, b bool, d date, ts timestamp, tstz timestamptz, n numeric(12, 3),
                    nu numeric, f4 real, f8 double precision, u uuid, j jsonb, by bytea, tx text, i2 smallint);
CREATE TABLE texts (k text PRIMARY KEY, v int, big text);
CREATE TABLE pairs (a int, b text, v numeric(8, 2), PRIMARY KEY (a, b));
CREATE TABLE arrays (id int PRIMARY KEY, xs int[]);
CREATE TABLE fulls (id int PRIMARY KEY, v text);
ALTER TABLE fulls REPLICA IDENTITY FULL;
CREATE TABLE keyless (v int, w text);
ALTER TABLE keyless REPLICA IDENTITY FULL;
CREATE PUBLICATION cols FOR ALL TABLES;
"""


def _typed_values(rng: random.Random, i: int, plain: bool) -> tuple:
    special = not plain and rng.random() < 0.1
    return (rng.random() < 0.5 if rng.random() > 0.1 else None,
            f"20{rng.randint(10, 40)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
            "infinity" if special else rng.choice([  # past 2262 and before 1677 too (nanoseconds cannot hold them)
                f"2026-0{rng.randint(1, 9)}-0{rng.randint(1, 9)} 12:3{rng.randint(0, 9)}:00.25",
                "2500-01-01 00:00:00", "1500-06-01 12:00:00.000001"]),
            f"2026-11-2{rng.randint(0, 8)} 0{rng.randint(0, 9)}:00:00+0{rng.randint(0, 9)}",
            None if rng.random() < 0.1 else round(rng.uniform(-1e6, 1e6), 3),
            rng.choice(["1.5", "-0.000001", "123456789012345678901234567890", "NaN"]),
            rng.choice([1.25, -0.0, float("nan"), float("inf"), 3.4e38]),
            rng.choice([0.1, -2.5e-300, float("nan"), float("-inf"), 1e308]),
            f"00000000-0000-0000-0000-{i:012d}",
            '{"k": ' + str(i) + ', "s": "a\\\\b \\u00e9"}',
            bytes([i % 256, 0, 255, 10]),
            rng.choice(["plain", "tab\there", "new\nline", "back\\slash", "", "ünï", None]),
            rng.randint(-32768, 32767))


def _workload(conn, rng: random.Random, transactions: int) -> None:
    ids: list[int] = []
    keys: list[str] = []
    pairs: list[tuple[int, str]] = []
    fresh = itertools.count()
    for t in range(transactions):
        # phases of 40 transactions: plain ones (what the fast path folds), then anything
        plain = (t // 40) % 2 == 0
        with conn.transaction():
            for _ in range(rng.randint(1, 6)):
                if plain and rng.random() < 0.01:  # a keyed table emptied amid plain changes, rows after it
                    statement = rng.choice(["TRUNCATE pairs", "TRUNCATE pairs RESTART IDENTITY",
                                            "TRUNCATE pairs, texts CASCADE"])
                    conn.execute(statement)
                    pairs.clear()
                    if "texts" in statement:
                        keys.clear()
                    continue
                what = rng.random() * (0.8 if plain else 1.0)
                if what < 0.3 or not ids:
                    i = next(fresh)
                    ids.append(i)
                    conn.execute("INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                                 (i, *_typed_values(rng, i, plain)))
                elif what < 0.45:
                    i = rng.choice(ids)
                    conn.execute("UPDATE typed SET b = %s, d = %s, ts = %s, tstz = %s, n = %s, nu = %s, f4 = %s, "
                                 "f8 = %s, u = %s, j = %s, by = %s, tx = %s, i2 = %s WHERE id = %s",
                                 (*_typed_values(rng, i, plain), i))
                elif what < 0.5:
                    i = ids.pop(rng.randrange(len(ids)))
                    conn.execute("DELETE FROM typed WHERE id = %s", (i,))
                elif what < 0.53:
                    i = rng.choice(ids)
                    new = 1_000_000 + next(fresh)
                    conn.execute("UPDATE typed SET id = %s WHERE id = %s", (new, i))
                    ids[ids.index(i)] = new
                elif what < 0.65:
                    k = f"key {rng.randint(0, 60)}"
                    if k in keys and rng.random() < 0.5 and plain:
                        conn.execute("UPDATE texts SET v = v + 1, big = big || 'y' WHERE k = %s", (k,))
                    elif k in keys and rng.random() < 0.5:
                        conn.execute("UPDATE texts SET v = v + 1 WHERE k = %s", (k,))  # big left unchanged
                    elif k in keys:
                        conn.execute("DELETE FROM texts WHERE k = %s", (k,))
                        keys.remove(k)
                    else:
                        big = "x" * rng.choice([10, 9000]) if rng.random() < 0.7 else None
                        conn.execute("INSERT INTO texts VALUES (%s, %s, repeat(md5(%s), %s))",
                                     (k, t, k, 400 if big else 0))
                        keys.append(k)
                elif what < 0.8:
                    a, b = rng.randint(0, 9), rng.choice(["x", "y", "z z"])
                    if (a, b) in pairs and rng.random() < 0.4:
                        c = rng.randint(10, 99)
                        if (c, b) not in pairs:
                            conn.execute("UPDATE pairs SET a = %s WHERE a = %s AND b = %s", (c, a, b))
                            pairs[pairs.index((a, b))] = (c, b)
                    elif (a, b) in pairs:
                        conn.execute("UPDATE pairs SET v = v + 0.5 WHERE a = %s AND b = %s", (a, b))
                    else:
                        conn.execute("INSERT INTO pairs VALUES (%s, %s, %s)", (a, b, rng.randint(0, 999) / 4))
                        pairs.append((a, b))
                elif what < 0.84:
                    i = rng.randint(0, 30)
                    conn.execute("INSERT INTO arrays VALUES (%s, %s) ON CONFLICT (id) DO UPDATE SET xs = excluded.xs",
                                 (i, [i, None, -i]))
                elif what < 0.9:
                    i = rng.randint(0, 30)
                    conn.execute("INSERT INTO fulls VALUES (%s, 'v') ON CONFLICT (id) DO UPDATE SET v = fulls.v || '+'",
                                 (i,))
                elif what < 0.97:
                    conn.execute("INSERT INTO keyless VALUES (%s, 'w')", (rng.randint(0, 5),))
                elif what < 0.98:
                    conn.execute("TRUNCATE keyless")
                elif what < 0.985 and t > transactions // 2:
                    conn.execute("ALTER TABLE pairs ADD COLUMN IF NOT EXISTS added int DEFAULT 7")


def test_random_ranges_of_a_random_workload_fold_alike(pg):
    with pg.connect() as conn:
        conn.execute(SCHEMA)
        create_slot(conn, "cols")
        _workload(conn, random.Random(49), 400)
        messages = list(peek(conn, "cols", pgoutput_options("cols")))
    lsns, datas = [m.lsn for m in messages], [m.data for m in messages]
    before, tables = catalogs(lsns, datas)
    paths = {t: f"/delta/{t[0]}.{t[1]}" for t in tables}
    rng = random.Random("columnar workload")
    taken, compared, truncated, tables_taken = 0, 0, 0, set()
    for _attempt in range(8):
        for a, b in cuts(datas, rng, most=60):
            fast = fold(lsns[a:b], datas[a:b], before[a], paths, columnar=True, special_values="clamp")
            same(fast, fold(lsns[a:b], datas[a:b], before[a], paths, columnar=False, special_values="clamp"))
            compared += 1
            taken += fast.columnar and bool(fast.folded)
            tables_taken |= {f.path.rsplit(".", 1)[1] for f in fast.folded if fast.columnar}
            truncated += sum(f.plan.truncated for f in fast.folded if fast.columnar)
    assert taken >= compared // 5, (taken, compared)  # the fast path folded many, each compared
    assert {"typed", "texts", "pairs"} <= tables_taken  # every type, text keys, composite and moved keys
    assert truncated >= 5, truncated  # TRUNCATEs amid the rows, folded the fast way too
