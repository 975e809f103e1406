"""A seeded random walk over a schema's life on a real PostgreSQL (issue 46): what a user's database
does over months, in a few hundred steps.

Each step is one transaction of 1-5 random row changes (inserts, updates with key changes, deletes,
duplicate rows in key-less tables) and, in about a sixth of the steps, one schema change (sometimes two)
between them, among: rename a column; add a column (no default, a constant default, or
``clock_timestamp()``); drop a column; widen a type; rename a table and often create a new one under the
old name; move a table to another schema; rename a schema and create a new one under its old name; drop
a table and often re-create its name; give a key-less table a primary key; switch REPLICA IDENTITY
between FULL and DEFAULT; move the primary key to a new column; truncate. A few are changes no catalog
can map onto the rows Delta holds, which a mirror mends by copying the table again (issue 73): a type
changed with ``USING`` (a rewrite Delta cannot widen), a column dropped and another added under its
name, two columns' names swapped. Some steps are large (streamed with ``logical_decoding_work_mem`` at
64kB), some end in PREPARE TRANSACTION and COMMIT/ROLLBACK PREPARED, some roll back. A statement
PostgreSQL refuses (a primary key over duplicates, an update of a table without a replica identity)
rolls its step back, as an application's error would.

The walk only reads the catalog to choose; it keeps no model of the rows: the oracle is PostgreSQL
itself (``applier.checks.verify``).
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg


class Executes(Protocol):
    """What the walk needs of its connection: a psycopg connection, or a wrapper that also records the
    statements (the soak's, from which reproductions are cut)."""

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor[Any]: ...


#: column types the walk creates: (type, SQL of a random value)
_TYPES = ("int", "bigint", "text", "bool", "date", "numeric(10,2)")


@dataclass
class SchemaWalk:
    """One walk: ``step()`` runs the next step on ``conn`` (autocommit) and returns what it did."""

    conn: Executes
    rng: random.Random
    dsn: str
    publication: str = "walk"
    steps: int = 0
    done: list[str] = field(default_factory=list)
    #: the schema changes of the steps that committed, as they read in ``done``
    changes: list[str] = field(default_factory=list)
    _names: int = 0

    # --- set-up -----------------------------------------------------------------------------------

    def create(self) -> None:
        """Four tables: keyed and key-less (FULL), two with out-of-line TOAST columns; some rows each."""
        c = self.conn
        c.execute("CREATE SCHEMA app")
        self._create('"public"."orders"', keyed=True, toast=True)
        self._create('"public"."bag"', keyed=False, toast=False)
        self._create('"app"."items"', keyed=True, toast=False)
        self._create('"app"."notes"', keyed=False, toast=True)
        c.execute(f"CREATE PUBLICATION {self.publication} FOR ALL TABLES")
        for schema, table in self.tables():
            for _ in range(12):
                self._insert(schema, table)

    def _name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}{self._names}"

    def _create(self, q: str, *, keyed: bool, toast: bool) -> None:
        cols = [f'"{self._name("c")}" {self.rng.choice(_TYPES)}' for _ in range(self.rng.randint(1, 2))]
        pk = ', PRIMARY KEY ("id")' if keyed else ""
        self.conn.execute(f'CREATE TABLE {q} ("id" int, {", ".join(cols)}{pk})')
        if not keyed:
            self.conn.execute(f"ALTER TABLE {q} REPLICA IDENTITY FULL")
        if toast:
            doc = self._name("doc")
            self.conn.execute(f'ALTER TABLE {q} ADD COLUMN "{doc}" text')
            self.conn.execute(f'ALTER TABLE {q} ALTER COLUMN "{doc}" SET STORAGE EXTERNAL')

    # --- the catalog ------------------------------------------------------------------------------

    def tables(self) -> list[tuple[str, str]]:
        return [(str(s), str(t)) for s, t in self.conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s ORDER BY 1, 2",
            (self.publication,))]

    def columns(self, schema: str, table: str) -> list[tuple[str, str]]:
        return [(str(n), str(t)) for n, t in self.conn.execute(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
            "format('%%I.%%I', %s::text, %s::text)::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (schema, table))]

    def key(self, schema: str, table: str) -> list[str]:
        return [str(r[0]) for r in self.conn.execute(
            "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = format('%%I.%%I', %s::text, %s::text)::regclass "
            "AND i.indisprimary",
            (schema, table))]

    def identity(self, schema: str, table: str) -> str:
        row = self.conn.execute("SELECT relreplident FROM pg_class WHERE oid = format('%%I.%%I', %s::text, "
                                "%s::text)::regclass", (schema, table)).fetchone()
        assert row is not None
        return str(row[0])

    # --- values -----------------------------------------------------------------------------------

    def _value(self, type_: str) -> str:
        r = self.rng
        if r.random() < 0.1:
            return "NULL"
        if type_ in ("integer", "int"):
            return str(r.randint(-1000, 1000))
        if type_ == "bigint":
            return str(r.randint(-10**12, 10**12))
        if type_ == "boolean" or type_ == "bool":
            return r.choice(["true", "false"])
        if type_ == "date":
            return f"'2023-{r.randint(10, 12)}-{r.randint(1, 9):02d}'"
        if type_.startswith("numeric"):
            return f"{r.randint(-5000, 5000)}.{r.randint(0, 99):02d}"
        if type_.startswith("timestamp"):
            return "clock_timestamp()"
        # text: small, or large enough to go out of line (a TOAST value an update may leave unchanged)
        return r.choice(["'small'", "'b c'", "'ünï'", f"'{'z' * r.choice([200, 3000])}'",
                         f"repeat('t', {r.choice([9000, 30000])})"])

    # --- row changes ------------------------------------------------------------------------------

    def _insert(self, schema: str, table: str) -> None:
        cols = self.columns(schema, table)
        q = f'"{schema}"."{table}"'
        names = ", ".join(f'"{n}"' for n, _t in cols)
        key = self.key(schema, table)
        values = []
        for n, t in cols:
            if n in key or n == "id":
                values.append(str(self.rng.randint(1, 60)))
            else:
                values.append(self._value(t))
        conflict = f' ON CONFLICT ({", ".join(chr(34) + k + chr(34) for k in key)}) DO NOTHING' if key else ""
        self.conn.execute(f"INSERT INTO {q} ({names}) VALUES ({', '.join(values)}){conflict}")

    def _one_row(self, schema: str, table: str) -> str | None:
        """A predicate that matches one row (by ctid: a key-less table's duplicates are one row each), chosen
        among the rows in the order of their values: where a row lies in the table (its ctid) depends on when
        a vacuum or a page's pruning made room, and so on what else runs on the server (a mirror's snapshot,
        a standby's feedback), and a seed must give the same walk wherever it runs."""
        rows = self.conn.execute(f'SELECT ctid::text FROM "{schema}"."{table}" AS r ORDER BY r::text, ctid').fetchall()
        return f"ctid = '{self.rng.choice(rows)[0]}'" if rows else None

    def _dml(self, schema: str, table: str) -> None:
        q = f'"{schema}"."{table}"'
        op = self.rng.random()
        if op < 0.35:
            self._insert(schema, table)
            return
        where = self._one_row(schema, table)
        if where is None:
            self._insert(schema, table)
            return
        cols = self.columns(schema, table)
        key = self.key(schema, table)
        if op < 0.5 and key:  # a key change
            k = key[0]
            self.conn.execute(f'UPDATE {q} SET "{k}" = {self.rng.randint(1, 90)} WHERE {where} AND NOT EXISTS '
                              f'(SELECT 1 FROM {q} WHERE "{k}" = {self.rng.randint(1, 90)})')
        elif op < 0.8:
            others = [(n, t) for n, t in cols if n not in key] or cols
            n, t = self.rng.choice(others)
            value = str(self.rng.randint(1, 60)) if n == "id" else self._value(t)
            self.conn.execute(f'UPDATE {q} SET "{n}" = {value} WHERE {where}')
        else:
            self.conn.execute(f"DELETE FROM {q} WHERE {where}")

    # --- schema changes ---------------------------------------------------------------------------

    def _ddl(self) -> str:
        r = self.rng
        tables = self.tables()
        if not tables:
            self._create(f'"public"."{self._name("t")}"', keyed=r.random() < 0.5, toast=r.random() < 0.5)
            return "create a table"
        schema, table = r.choice(tables)
        q = f'"{schema}"."{table}"'
        cols = self.columns(schema, table)
        key = self.key(schema, table)
        plain = [n for n, _t in cols if n not in key and n != "id"]
        if r.random() < 0.15:
            unmappable = self._unmappable(q, cols, plain)
            if unmappable is not None:
                return unmappable
        c = r.random()
        if c < 0.14 and plain:
            old, new = r.choice(plain), self._name("r")
            self.conn.execute(f'ALTER TABLE {q} RENAME COLUMN "{old}" TO "{new}"')
            return f"{q}: rename column {old} -> {new}"
        if c < 0.28:
            name, kind = self._name("a"), r.choice(["none", "const", "const", "volatile"])
            if kind == "none":
                self.conn.execute(f'ALTER TABLE {q} ADD COLUMN "{name}" {r.choice(_TYPES)}')
            elif kind == "const":
                self.conn.execute(f'ALTER TABLE {q} ADD COLUMN "{name}" int DEFAULT {r.randint(1, 9)}')
            else:
                self.conn.execute(f'ALTER TABLE {q} ADD COLUMN "{name}" timestamptz DEFAULT clock_timestamp()')
            return f"{q}: add column {name} ({kind} default)"
        if c < 0.36 and len(plain) > 1:
            old = r.choice(plain)
            self.conn.execute(f'ALTER TABLE {q} DROP COLUMN "{old}"')
            return f"{q}: drop column {old}"
        if c < 0.42 and any(t == "integer" and n not in key for n, t in cols):
            name = r.choice([n for n, t in cols if t == "integer" and n not in key])
            self.conn.execute(f'ALTER TABLE {q} ALTER COLUMN "{name}" TYPE bigint')
            return f"{q}: widen {name}"
        if c < 0.52:
            new = self._name("t")
            self.conn.execute(f'ALTER TABLE {q} RENAME TO "{new}"')
            if r.random() < 0.6:
                self._create(q, keyed=r.random() < 0.5, toast=r.random() < 0.5)
                return f"{q}: renamed to {new}, name reused"
            return f"{q}: renamed to {new}"
        if c < 0.58:
            other = "app" if schema == "public" else "public"
            exists = self.conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (other,)).fetchone()
            if exists is None or (other, table) in tables:
                self.conn.execute(f'TRUNCATE {q}')
                return f"{q}: truncate"
            self.conn.execute(f'ALTER TABLE {q} SET SCHEMA "{other}"')
            return f"{q}: moved to schema {other}"
        if c < 0.63 and schema != "public":
            new = f"{schema}_{self._name('s')}"
            self.conn.execute(f'ALTER SCHEMA "{schema}" RENAME TO "{new}"')
            self.conn.execute(f'CREATE SCHEMA "{schema}"')
            if r.random() < 0.6:
                self._create(q, keyed=r.random() < 0.5, toast=False)
            return f"schema {schema} renamed to {new}, name reused"
        if c < 0.70:
            self.conn.execute(f"DROP TABLE {q}")
            if r.random() < 0.7:
                self._create(q, keyed=r.random() < 0.5, toast=r.random() < 0.5)
                return f"{q}: dropped and re-created"
            return f"{q}: dropped"
        if c < 0.76 and not key:
            self.conn.execute(f'ALTER TABLE {q} ADD PRIMARY KEY ("id")')  # refused over duplicates or NULLs
            return f"{q}: primary key added"
        if c < 0.84:
            ident = self.identity(schema, table)
            to = "DEFAULT" if ident == "f" else "FULL"
            self.conn.execute(f"ALTER TABLE {q} REPLICA IDENTITY {to}")
            return f"{q}: replica identity {to}"
        if c < 0.92 and key:
            new = self._name("k")
            self.conn.execute(f'ALTER TABLE {q} ADD COLUMN "{new}" int')
            self.conn.execute(f'UPDATE {q} SET "{new}" = "{key[0]}" + 1000')
            constraint = self.conn.execute(
                "SELECT conname FROM pg_constraint WHERE conrelid = format('%%I.%%I', %s::text, %s::text)::regclass "
                "AND contype = 'p'", (schema, table)).fetchone()
            assert constraint is not None
            self.conn.execute(f'ALTER TABLE {q} DROP CONSTRAINT "{constraint[0]}"')
            self.conn.execute(f'ALTER TABLE {q} ADD PRIMARY KEY ("{new}")')
            return f"{q}: primary key moved to {new}"
        self.conn.execute(f"TRUNCATE {q}")
        return f"{q}: truncate"

    def _unmappable(self, q: str, cols: list[tuple[str, str]], plain: list[str]) -> str | None:
        """A change whose rows no catalog maps onto the old ones (None: the table has no column for it)."""
        r = self.rng
        c = r.random()
        retypable = [n for n, t in cols if n in plain and t != "text"]
        if c < 0.4 and retypable:
            name = r.choice(retypable)
            self.conn.execute(f'ALTER TABLE {q} ALTER COLUMN "{name}" TYPE text USING "{name}"::text')
            return f"{q}: retype {name} to text"
        if c < 0.75 and plain:
            name = r.choice(plain)
            self.conn.execute(f'ALTER TABLE {q} DROP COLUMN "{name}"')
            self.conn.execute(f'ALTER TABLE {q} ADD COLUMN "{name}" {r.choice(_TYPES)}')
            return f"{q}: drop column {name}, add it again"
        if len(plain) > 1:
            a, b = r.sample(plain, 2)
            self.conn.execute(f'ALTER TABLE {q} RENAME COLUMN "{a}" TO "swap"')
            self.conn.execute(f'ALTER TABLE {q} RENAME COLUMN "{b}" TO "{a}"')
            self.conn.execute(f'ALTER TABLE {q} RENAME COLUMN "swap" TO "{b}"')
            return f"{q}: swap names {a} <-> {b}"
        return None

    def trace(self) -> str:
        """What the walk did, a step a line (for a failure's message)."""
        return "\n".join(self.done)

    def kinds(self) -> Counter[str]:
        """How many schema changes of each kind committed (names left out: "rename column N -> N")."""
        return Counter(re.sub(r"\b[a-z]+(_[a-z]+)?\d+\b", "N", re.sub(r'^("[^"]+"\."[^"]+"|schema \w+): ', "", c))
                       for c in self.changes)

    # --- a step -----------------------------------------------------------------------------------

    def step(self) -> str:
        """One transaction: its row changes and maybe one schema change; how it ends is drawn too."""
        r = self.rng
        self.steps += 1
        end = r.choices(["commit", "rollback", "prepare-commit", "prepare-rollback"], [80, 7, 9, 4])[0]
        big = r.random() < 0.05
        what: list[str] = []
        ddls: list[str] = []
        gid = f"w{self.steps}"
        try:
            self.conn.execute("BEGIN")
            ddl_at = {r.randint(0, 5)} if r.random() < 0.33 else set()
            if ddl_at and r.random() < 0.2:  # two schema changes in one transaction, row changes around them
                ddl_at.add(r.randint(0, 5))
            for i in range(r.randint(1, 5)):
                if i in ddl_at:
                    what.append(self._ddl())
                    ddls.append(what[-1])
                tables = self.tables()
                if tables:
                    self._dml(*r.choice(tables))
            if big:
                tables = self.tables()
                if tables:
                    schema, table = r.choice(tables)
                    for _ in range(40):
                        self._insert(schema, table)
                    what.append(f"big transaction on {schema}.{table}")
            if end == "rollback":
                self.conn.execute("ROLLBACK")
            elif end.startswith("prepare"):
                self.conn.execute(f"PREPARE TRANSACTION '{gid}'")
                with psycopg.connect(self.dsn, autocommit=True) as other:
                    other.execute(f"{'COMMIT' if end == 'prepare-commit' else 'ROLLBACK'} PREPARED '{gid}'")
            else:
                self.conn.execute("COMMIT")
        except psycopg.Error as e:
            self.conn.execute("ROLLBACK")
            what.append(f"refused ({str(e).splitlines()[0][:80]}): rolled back")
            end = "rollback"
        if end in ("commit", "prepare-commit"):
            self.changes.extend(ddls)
        line = f"step {self.steps} ({end}): {'; '.join(what) or 'rows'}"
        self.done.append(line)
        return line
