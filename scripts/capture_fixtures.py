"""Capture real pgoutput bytes from real PostgreSQL servers into tests/fixtures/pgoutput/.

Why: decoder tests must run on bytes a server really sent, not on layouts someone typed from the
docs. This script starts a throw-away cluster per installed major (15 from Debian, 16 and 18 from
the pgserver wheels; see applier.devtools.pgcluster), runs one small workload per scenario in a fresh
database, and peeks the slot (``pg_logical_slot_peek_binary_changes``, nothing is consumed) once per
pgoutput option set. Each (major, scenario, option set) becomes one JSON-lines file, one object per
message: ``{"lsn": "0/16B3748", "xid": 740, "data": "<hex>"}``, in the order the server sent them.
``manifest.json`` records server version, options, slot flags and the workload of every file.

Run it again whenever a scenario changes (LSNs and xids differ between runs; tests never depend
on their exact values)::

    .venv/bin/python scripts/capture_fixtures.py              # every installed major
    .venv/bin/python scripts/capture_fixtures.py --majors 15  # cache: $APPLIER_CACHE_DIR or .cache

Scenarios (every pgoutput message kind appears in at least one file; tests/protocol checks it):

* ``basic``: enum and domain columns (Type 'Y'; the domain's Y carries its base type int4 in
  pg_catalog, sent as namespace ""), NULLs, plain update, delete by key, a key change on a row
  whose toasted column did not change ('K' old key + 'u' in the new tuple), REPLICA IDENTITY FULL
  ('O' tuples), TRUNCATE ... RESTART IDENTITY CASCADE, a transaction from a session with a
  replication origin ('O'), transactional and non-transactional logical messages ('M').
  Peeked as protocol 1 text, protocol 1 binary, protocol 1 with messages.
* ``streaming``: a transaction larger than logical_decoding_work_mem (64kB) that streams, with a
  savepoint rolled back after its changes were streamed (subtransaction Stream Abort), an
  update, a delete, a truncate and a message inside the stream; then a streamed transaction that
  rolls back (top-level Stream Abort). The wide column is left out of the publication's column
  list so the transaction counts 64kB in the server's memory but stays small on the wire.
  Peeked as protocol 2 streaming=on, and on 16+ as protocol 4 streaming=parallel (on 18 this gives
  the 25-byte Stream Abort with abort LSN and time).
* ``twophase`` (slot created with two_phase = true): PREPARE + COMMIT PREPARED, PREPARE + ROLLBACK
  PREPARED, and a prepared transaction large enough to stream (Stream Prepare 'p'). Peeked as
  protocol 3 with two_phase and streaming.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# Absolute: the server binaries run with cwd "/", so a relative cache path would not resolve.
os.environ["APPLIER_CACHE_DIR"] = str(Path(os.environ.get("APPLIER_CACHE_DIR", REPO / ".cache")).resolve())

from applier.devtools.pgcluster import PgCluster, find_installation, find_installations  # noqa: E402
from applier.lsn import format_lsn  # noqa: E402
from applier.sources.sql_slot import PeekedMessage, peek  # noqa: E402

DEFAULT_OUT = REPO / "tests" / "fixtures" / "pgoutput"

#: Cluster settings for capture: small enough that a ~90kB transaction streams.
CAPTURE_SETTINGS = {"logical_decoding_work_mem": "64kB"}

PUBLICATION = "pub"

#: Peek only decodes WAL up to the flush position, and neither a rollback nor a non-transactional
#: message flushes: every workload ends with a committed transaction so that they are captured.
FLUSH_COMMIT = "INSERT INTO {table} VALUES {values}"


@dataclass(frozen=True, slots=True)
class OptionSet:
    """One way of peeking the slot: a name for the file and the pgoutput options."""

    name: str
    options: Mapping[str, str]
    min_major: int = 15


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    setup: tuple[str, ...]
    workload: Callable[[psycopg.Connection, str], None]
    option_sets: tuple[OptionSet, ...]
    two_phase_slot: bool = False


@dataclass(frozen=True, slots=True)
class Capture:
    """The messages of one peek, with what produced them."""

    major: int
    server_version: str
    scenario: Scenario
    option_set: OptionSet
    messages: list[PeekedMessage] = field(default_factory=list)

    @property
    def file_name(self) -> str:
        return f"pg{self.major}_{self.scenario.name}_{self.option_set.name}.jsonl"


def _run(conn: psycopg.Connection, *statements: str) -> None:
    for sql in statements:
        conn.execute(sql)  # type: ignore[arg-type]


# --- scenario: basic -----------------------------------------------------------------------------

BASIC_SETUP = (
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2), note text, "
    "mood mood, qty posint, created timestamptz)",
    "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
    # EXTERNAL: stored out of line without compression, so a 2100-byte body is really TOASTed.
    "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
    "CREATE TABLE full_rows (a int, b text)",
    "ALTER TABLE full_rows REPLICA IDENTITY FULL",
    "CREATE TABLE parent (id serial PRIMARY KEY, name text)",
    "CREATE TABLE child (id serial PRIMARY KEY, parent_id int REFERENCES parent (id))",
    f"CREATE PUBLICATION {PUBLICATION} FOR TABLE items, docs, full_rows, parent, child",
)


def basic_workload(conn: psycopg.Connection, dbname: str) -> None:
    _run(
        conn,
        "INSERT INTO items VALUES (1, 'pen', 1.50, 'blue ink', 'happy', 3, '2024-02-29 12:34:56.789+00'), "
        "(2, 'cap', NULL, NULL, NULL, NULL, NULL)",
        "UPDATE items SET price = 1.75, mood = 'ok' WHERE id = 1",
        "DELETE FROM items WHERE id = 2",
        "INSERT INTO docs VALUES (1, 'first', repeat('x', 2100))",
        "UPDATE docs SET id = 11, title = 'moved' WHERE id = 1",  # key change, body unchanged: K + 'u'
        "UPDATE docs SET title = 'renamed' WHERE id = 11",  # 'u' without K
        "INSERT INTO full_rows VALUES (1, 'one'), (1, 'one'), (2, NULL)",
        "UPDATE full_rows SET b = 'uno' WHERE a = 1",
        "DELETE FROM full_rows WHERE a = 2",
        "INSERT INTO parent (name) VALUES ('p1'), ('p2')",
        "INSERT INTO child (parent_id) VALUES (1), (2)",
        "TRUNCATE parent RESTART IDENTITY CASCADE",
    )
    origin = f"capture_{dbname}"
    _run(conn, f"SELECT pg_replication_origin_create('{origin}')",
         f"SELECT pg_replication_origin_session_setup('{origin}')",
         "BEGIN",
         "SELECT pg_replication_origin_xact_setup('0/ABCDEF', '2024-01-01 00:00:00+00')",
         "INSERT INTO items (id, name) VALUES (3, 'from origin')",
         "COMMIT",
         "SELECT pg_replication_origin_session_reset()",
         f"SELECT pg_replication_origin_drop('{origin}')")
    _run(conn, "BEGIN",
         "INSERT INTO items (id, name, note) VALUES (4, 'with message', 'ünïcode ✓')",
         "SELECT pg_logical_emit_message(true, 'applier', 'transactional payload')",
         "COMMIT",
         "SELECT pg_logical_emit_message(false, 'applier', 'non-transactional payload')",
         "BEGIN",
         "SELECT pg_logical_emit_message(false, 'applier', 'sent although rolled back')",
         "ROLLBACK")
    _run(conn, FLUSH_COMMIT.format(table="items", values="(5, 'last')"))


# --- scenario: streaming -------------------------------------------------------------------------

STREAMING_SETUP = (
    "CREATE TYPE phase AS ENUM ('new', 'done')",
    "CREATE TABLE bulk (id int PRIMARY KEY, phase phase, pad text)",
    "CREATE TABLE side (id int PRIMARY KEY, v text)",
    # pad is not published: 1.5kB per row counts in the reorder buffer, not on the wire.
    f"CREATE PUBLICATION {PUBLICATION} FOR TABLE bulk (id, phase), side",
)


def streaming_workload(conn: psycopg.Connection, dbname: str) -> None:
    _run(conn,
         "BEGIN",
         "INSERT INTO side VALUES (1, 'a')",
         "INSERT INTO bulk SELECT g, 'new', repeat('p', 1500) FROM generate_series(1, 60) g",
         "UPDATE bulk SET phase = 'done' WHERE id <= 2",
         "DELETE FROM bulk WHERE id = 3",
         "SELECT pg_logical_emit_message(true, 'applier', 'inside a streamed transaction')",
         "SAVEPOINT s1",
         "INSERT INTO bulk SELECT g, 'new', repeat('q', 1500) FROM generate_series(101, 160) g",
         "ROLLBACK TO SAVEPOINT s1",
         "INSERT INTO bulk VALUES (200, 'new', 'after rollback to savepoint')",
         "TRUNCATE side",
         "COMMIT")
    _run(conn, "INSERT INTO side VALUES (2, 'small, not streamed')")
    _run(conn,
         "BEGIN",
         "INSERT INTO bulk SELECT g, 'new', repeat('r', 1500) FROM generate_series(300, 360) g",
         "ROLLBACK")
    _run(conn, FLUSH_COMMIT.format(table="side", values="(3, 'last')"))


# --- scenario: two-phase -------------------------------------------------------------------------

TWOPHASE_SETUP = (
    "CREATE TABLE tp (id int PRIMARY KEY, v text)",
    "CREATE TABLE tpbulk (id int PRIMARY KEY, pad text)",
    f"CREATE PUBLICATION {PUBLICATION} FOR TABLE tp, tpbulk (id)",
)


def twophase_workload(conn: psycopg.Connection, dbname: str) -> None:
    _run(conn, "BEGIN", "INSERT INTO tp VALUES (1, 'committed')", "PREPARE TRANSACTION 'g_commit'",
         "COMMIT PREPARED 'g_commit'")
    _run(conn, "BEGIN", "INSERT INTO tp VALUES (2, 'rolled back')", "PREPARE TRANSACTION 'g_rollback'",
         "ROLLBACK PREPARED 'g_rollback'")
    _run(conn, "BEGIN",
         "INSERT INTO tpbulk SELECT g, repeat('s', 1500) FROM generate_series(1, 60) g",
         "PREPARE TRANSACTION 'g_stream'",
         "COMMIT PREPARED 'g_stream'")
    _run(conn, "INSERT INTO tp VALUES (3, 'plain commit')")


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "basic",
        "enum + domain columns (Y), NULLs, update, delete, key change with unchanged TOAST (K + u), "
        "REPLICA IDENTITY FULL (O), TRUNCATE RESTART IDENTITY CASCADE, replication origin (O), "
        "transactional and non-transactional messages",
        BASIC_SETUP, basic_workload,
        (OptionSet("proto1_text", {"proto_version": "1"}),
         OptionSet("proto1_binary", {"proto_version": "1", "binary": "true"}),
         OptionSet("proto1_messages", {"proto_version": "1", "messages": "true"})),
    ),
    Scenario(
        "streaming",
        "streamed transaction (>64kB in the reorder buffer) with enum column, update, delete, "
        "message, truncate and a savepoint rolled back after streaming (subxact Stream Abort); "
        "a small plain transaction; a streamed transaction rolled back (top-level Stream Abort)",
        STREAMING_SETUP, streaming_workload,
        (OptionSet("proto2_streaming", {"proto_version": "2", "streaming": "on", "messages": "true"}),
         OptionSet("proto4_parallel", {"proto_version": "4", "streaming": "parallel", "messages": "true"},
                   min_major=16)),
    ),
    Scenario(
        "twophase",
        "PREPARE + COMMIT PREPARED, PREPARE + ROLLBACK PREPARED, a streamed prepared transaction "
        "(Stream Prepare) committed later, a plain commit; slot created with two_phase = true",
        TWOPHASE_SETUP, twophase_workload,
        (OptionSet("proto3_twophase", {"proto_version": "3", "two_phase": "on", "streaming": "on"}),),
        two_phase_slot=True,
    ),
)


def capture_scenario(dsn: str, major: int, scenario: Scenario, *, slot: str = "capture") -> Iterator[Capture]:
    """Run ``scenario`` in the (fresh, empty) database of ``dsn`` and peek it once per option set."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        _run(conn, *scenario.setup)
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)",
                     (slot, scenario.two_phase_slot))
        dbname = conn.info.dbname
        scenario.workload(conn, dbname)
        (version,) = conn.execute("SHOW server_version").fetchone()  # type: ignore[misc]
        try:
            for option_set in scenario.option_sets:
                if major < option_set.min_major:
                    continue
                options = {**option_set.options, "publication_names": PUBLICATION}
                yield Capture(major, str(version), scenario, option_set, list(peek(conn, slot, options)))
        finally:
            conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def write_capture(capture: Capture, out_dir: Path) -> Path:
    path = out_dir / capture.file_name
    with open(path, "w", encoding="utf-8") as f:
        for m in capture.messages:
            f.write(json.dumps({"lsn": format_lsn(m.lsn), "xid": m.xid, "data": m.data.hex()}) + "\n")
    return path


def manifest_entry(capture: Capture) -> dict[str, object]:
    kinds: dict[str, int] = {}
    for m in capture.messages:
        kind = chr(m.data[0])
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "file": capture.file_name,
        "major": capture.major,
        "server_version": capture.server_version,
        "scenario": capture.scenario.name,
        "workload": capture.scenario.description,
        "slot_two_phase": capture.scenario.two_phase_slot,
        "options": {**capture.option_set.options, "publication_names": PUBLICATION},
        "session": "DateStyle=ISO, IntervalStyle=postgres, extra_float_digits=3, bytea_output=hex, "
                   "TimeZone=UTC, client_encoding=UTF8",
        "cluster_settings": CAPTURE_SETTINGS,
        "messages": len(capture.messages),
        "kinds": dict(sorted(kinds.items())),
    }


def capture_major(major: int, out_dir: Path) -> list[dict[str, object]]:
    cluster = PgCluster(find_installation(major), dict(CAPTURE_SETTINGS)).start()
    entries = []
    try:
        for scenario in SCENARIOS:
            dbname = f"capture_{scenario.name}"
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{dbname}"')  # type: ignore[arg-type]
            for capture in capture_scenario(cluster.dsn(dbname), major, scenario):
                path = write_capture(capture, out_dir)
                entries.append(manifest_entry(capture))
                print(f"pg{major} {scenario.name} {capture.option_set.name}: {len(capture.messages)} messages "
                      f"-> {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", file=sys.stderr)
    finally:
        cluster.stop()
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--majors", type=int, nargs="*", help="PostgreSQL majors (default: every installed one)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    majors = args.majors or sorted({inst.major for inst in find_installations()})
    args.out.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    entries: list[dict[str, object]] = []
    if manifest_path.exists():  # keep entries of majors not captured this time
        entries = [e for e in json.loads(manifest_path.read_text())["files"] if e["major"] not in majors]
    for major in majors:
        entries += capture_major(major, args.out)
    entries.sort(key=lambda e: (e["major"], e["scenario"], e["file"]))  # type: ignore[arg-type, return-value]
    manifest = {
        "generated_by": "scripts/capture_fixtures.py",
        "format": "JSON lines, one object per message: lsn (text), xid (int), data (hex of the pgoutput bytes)",
        "files": entries,
    }
    manifest_path.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
