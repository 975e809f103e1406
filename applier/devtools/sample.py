"""A small sample schema and workload for ``applier demo`` (and tests): a shop with customers,
products and orders.

It is chosen to exercise what breaks naive appliers: a toasted column that stays unchanged across
updates (pgoutput sends 'u'), a primary-key change, deletes, NULLs, numerics with full precision,
timestamps, arrays, jsonb, and a TRUNCATE in the middle of a transaction.
"""

from __future__ import annotations

import random

import psycopg

SCHEMA_SQL = """
CREATE SCHEMA IF NOT EXISTS shop;
CREATE TABLE shop.customers (
    id        bigint PRIMARY KEY,
    name      text NOT NULL,
    email     text,
    notes     text,              -- large: TOASTed, arrives as 'u' when unchanged
    tags      text[],
    created   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE shop.products (
    sku       text PRIMARY KEY,
    title     text NOT NULL,
    price     numeric(12, 2) NOT NULL,
    attrs     jsonb
);
CREATE TABLE shop.orders (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL,
    sku         text NOT NULL,
    qty         integer NOT NULL,
    amount      numeric(14, 2),
    placed_on   date NOT NULL,
    status      text NOT NULL DEFAULT 'new'
);
CREATE TABLE shop.events (          -- truncated mid-transaction by the workload
    id    bigint PRIMARY KEY,
    kind  text
);
"""


def create_schema(conn: psycopg.Connection, publication: str) -> None:
    conn.execute(SCHEMA_SQL)
    conn.execute(f'CREATE PUBLICATION "{publication}" FOR TABLES IN SCHEMA shop')


def run_workload(conn: psycopg.Connection, *, seed: int = 7, transactions: int = 200) -> None:
    """Committed transactions of inserts, updates (incl. key changes and unchanged TOAST), deletes and a truncate."""
    rng = random.Random(seed)
    big = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(20000))
    with conn.transaction():
        conn.execute(
            "INSERT INTO shop.customers (id, name, email, notes, tags) "
            "SELECT g, 'customer ' || g, 'c' || g || '@example.com', %s || g, ARRAY['t' || (g %% 3), 'x,y']"
            " FROM generate_series(1, 50) g", (big,))
        conn.execute(
            "INSERT INTO shop.products SELECT 'sku-' || g, 'product ' || g, (g * 1.25)::numeric(12,2), "
            "jsonb_build_object('color', CASE WHEN g % 2 = 0 THEN 'red' ELSE 'blue' END, 'n', g) "
            "FROM generate_series(1, 20) g")
    next_order = 1
    for _ in range(transactions):
        with conn.transaction():
            for _ in range(rng.randint(1, 5)):
                op = rng.random()
                if op < 0.5:
                    cid, sku, qty = rng.randint(1, 50), f"sku-{rng.randint(1, 20)}", rng.randint(1, 9)
                    conn.execute(
                        "INSERT INTO shop.orders (id, customer_id, sku, qty, amount, placed_on) "
                        "SELECT %s, %s, %s, %s, price * %s, DATE '2026-01-01' + %s FROM shop.products WHERE sku = %s",
                        (next_order, cid, sku, qty, qty, rng.randint(0, 300), sku))
                    next_order += 1
                elif op < 0.75:
                    conn.execute("UPDATE shop.orders SET status = %s WHERE id = %s",
                                 (rng.choice(["paid", "shipped", "returned"]), rng.randint(1, next_order)))
                elif op < 0.85:
                    conn.execute("UPDATE shop.customers SET email = NULL WHERE id = %s", (rng.randint(1, 50),))
                elif op < 0.95:
                    conn.execute("UPDATE shop.products SET price = price * 1.10 WHERE sku = %s",
                                 (f"sku-{rng.randint(1, 20)}",))
                else:
                    conn.execute("DELETE FROM shop.orders WHERE id = %s", (rng.randint(1, next_order),))
    with conn.transaction():
        # Key change of rows whose toasted 'notes' did not change: the new row needs the old row's value.
        conn.execute("UPDATE shop.customers SET id = id + 1000 WHERE id IN (3, 4)")
        conn.execute("INSERT INTO shop.events VALUES (1, 'before truncate')")
        conn.execute("TRUNCATE shop.events")
        conn.execute("INSERT INTO shop.events VALUES (2, 'after truncate')")
