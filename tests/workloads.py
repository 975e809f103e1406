"""A seeded random workload generator for a real PostgreSQL: many different histories from one test.

Each seed gives a different, reproducible mix of inserts, updates (plain, of a TOASTed column, of
other columns leaving the TOASTed one unchanged, key changes), deletes, savepoints rolled back,
whole transactions rolled back, truncates, and duplicate rows in a key-less FULL-identity table.
"""

from __future__ import annotations

import random

import psycopg

SCHEMA = """
CREATE TABLE rw_keyed (id int PRIMARY KEY, big text, n int, tags text[]);
CREATE TABLE rw_bag (a int, b text);
ALTER TABLE rw_bag REPLICA IDENTITY FULL;
CREATE PUBLICATION rw_pub FOR TABLE rw_keyed, rw_bag;
"""
TABLES = [("public", "rw_keyed"), ("public", "rw_bag")]


class _Rollback(Exception):
    pass


def random_workload(conn: psycopg.Connection, seed: int, transactions: int = 40, *, prepared: bool = False) -> None:
    """``prepared``: also run two-phase transactions (PREPARE, then COMMIT/ROLLBACK PREPARED, one left
    pending), which needs max_prepared_transactions and, to be decoded, a two-phase slot."""
    rng = random.Random(seed)
    keys: set[int] = set()
    next_key = 1

    def big() -> str:
        return rng.choice("abcdef") * rng.choice([10, 5000, 40000])  # large ones are TOASTed

    for _ in range(transactions):
        roll_back = rng.random() < 0.1
        try:
            with conn.transaction():
                for _ in range(rng.randint(1, 8)):
                    op = rng.random()
                    if op < 0.35 or not keys:
                        conn.execute("INSERT INTO rw_keyed VALUES (%s, %s, %s, %s)",
                                     (next_key, big(), rng.randint(0, 9), [f"t{rng.randint(0, 3)}", None]))
                        keys.add(next_key)
                        next_key += 1
                    elif op < 0.55:
                        conn.execute("UPDATE rw_keyed SET n = n + 1 WHERE id = %s", (rng.choice(sorted(keys)),))
                    elif op < 0.62:
                        conn.execute("UPDATE rw_keyed SET big = %s WHERE id = %s", (big(), rng.choice(sorted(keys))))
                    elif op < 0.70:
                        old = rng.choice(sorted(keys))
                        conn.execute("UPDATE rw_keyed SET id = %s WHERE id = %s", (next_key, old))
                        keys.discard(old)
                        keys.add(next_key)
                        next_key += 1
                    elif op < 0.78:
                        k = rng.choice(sorted(keys))
                        conn.execute("DELETE FROM rw_keyed WHERE id = %s", (k,))
                        keys.discard(k)
                    elif op < 0.86:
                        conn.execute("INSERT INTO rw_bag VALUES (%s, %s)", (rng.randint(0, 2), rng.choice(["x", None])))
                    elif op < 0.92:
                        conn.execute("DELETE FROM rw_bag WHERE ctid = (SELECT ctid FROM rw_bag WHERE a = %s LIMIT 1)",
                                     (rng.randint(0, 2),))
                    elif op < 0.97:
                        try:
                            with conn.transaction():  # a savepoint, rolled back
                                conn.execute("UPDATE rw_keyed SET n = -1")
                                conn.execute("INSERT INTO rw_bag VALUES (99, 'rolled back')")
                                raise _Rollback
                        except _Rollback:
                            pass
                    else:
                        conn.execute("TRUNCATE rw_bag")
                if roll_back:
                    raise _Rollback
        except _Rollback:
            pass
        if roll_back:  # keys of the rolled-back transaction are gone again: resync
            keys = {r[0] for r in conn.execute("SELECT id FROM rw_keyed")}
    if not prepared:
        return
    for n, finish in enumerate(["COMMIT", "ROLLBACK", "COMMIT", None]):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO rw_keyed SELECT g, repeat('p', 200), %s, NULL FROM generate_series(%s, %s) g",
                     (n, 100000 + n * 1000, 100000 + n * 1000 + rng.choice([5, 400])))  # some big enough to stream
        if keys:
            conn.execute("UPDATE rw_keyed SET n = n + 100 WHERE id = %s", (rng.choice(sorted(keys)),))
        conn.execute("INSERT INTO rw_bag VALUES (7, 'prepared')")
        conn.execute(f"PREPARE TRANSACTION 'rw-{seed}-{n}'")
        if finish:
            conn.execute(f"{finish} PREPARED 'rw-{seed}-{n}'")
