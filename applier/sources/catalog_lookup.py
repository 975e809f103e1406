"""The source catalog, asked when the stream alone cannot say which table or column is which.

The sink binds each source relation to its Delta table by OID (applier.sink.identity); when a new
relation takes a name another one had, or a column disappears while another appears, it asks here
what the older relation or column is now:

- ``LiveCatalog``: the live catalog (``mirror``). One connection, opened at the first question and kept
  (opened again after a failure): every Relation message of a run asks whether its columns are still
  the columns they were (``attnums``), and a run may read hundreds of them at its start.
- ``RecordedCatalog``: what ``applier capture`` read of the live catalog as it stored each Relation
  message (a ``CatalogNote`` in the log's ``catalog`` column), answered in log order (``replay``). It
  answers only what was recorded: any other question raises NotRecorded, which the sink treats as no
  catalog at all (a log without notes stops where it stopped before they existed).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from applier.errors import NotRecorded, SourceError, TransientSourceError
from applier.lsn import format_lsn, parse_lsn
from applier.sources.sql_slot import pin_session

#: the ``catalog`` column's format; a note of another version is not read (as if absent)
NOTE_VERSION = 1

Name = tuple[str, str]
T = TypeVar("T")


class LiveCatalog:
    """``applier.sink.identity.CatalogLookup`` over a DSN."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection | None = None
        self._lock = threading.Lock()  # the catch-up's survey may ask from a thread of its own

    def _ask(self, query: Callable[[psycopg.Connection], T]) -> T:
        with self._lock:
            for attempt in (1, 2):
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.dsn, autocommit=True)
                try:
                    return query(self._conn)
                except psycopg.OperationalError:  # a connection the server closed since: once more, anew
                    self._conn.close()
                    self._conn = None
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def relation(self, oid: int) -> tuple[str, str] | None:
        row = self._ask(lambda conn: conn.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.oid = %s", (oid,)).fetchone())
        return (str(row[0]), str(row[1])) if row is not None else None

    def attnums(self, oid: int) -> dict[str, int]:
        return self._ask(lambda conn: column_attnums(conn, oid))

    def rewrite_witness(self, oid: int, columns: Sequence[str]) -> RewriteWitness | None:
        return self._ask(lambda conn: rewrite_witness(conn, oid, columns))

    def rewritten_rows(self, oid: int, key: Sequence[str], columns: Sequence[str],
                       xid: str) -> Iterator[tuple[str | None, ...]]:
        """As text, ``key`` and ``columns`` of the rows of relation ``oid`` that transaction ``xid`` wrote
        with its first command that wrote any (the ALTER's rewrite) and nobody changed since (their xmin
        and cmin), in batches from a cursor of its own connection."""
        name = self.relation(oid)
        if name is None:
            return
        with psycopg.connect(self.dsn) as conn:
            pin_session(conn)
            # the ALTER's rewrite writes every row with one command id; a change later in the same transaction
            # (an UPDATE after the ALTER) has a higher one, and its row is in the stream
            # the type's output text, as pgoutput sends it: a ::text cast is not that (bool casts to 'true',
            # inet keeps its /32, char(n) loses its padding); format('%s') is NULL-safe only through num_nulls,
            # which counts a composite of NULLs as a value, as the stream does ('%%s': the query has parameters)
            text = [sql.SQL("CASE WHEN num_nulls({0}) = 0 THEN format('%%s', {0}) END").format(sql.Identifier(c))
                    for c in (*key, *columns)]
            query = sql.SQL("WITH w AS (SELECT {}, cmin::text::bigint AS applier_cid FROM ONLY {}.{} WHERE xmin = "
                            "%s::xid) SELECT * FROM w WHERE applier_cid = (SELECT min(applier_cid) FROM w)").format(
                sql.SQL(", ").join(text), sql.Identifier(name[0]), sql.Identifier(name[1]))
            with conn.cursor(name="applier_rewritten_rows") as cursor:
                cursor.itersize = 10_000
                cursor.execute(query, (xid,))
                for found in cursor:
                    yield found[:-1]

    def dropped_attnums(self, oid: int) -> set[int]:
        return self._ask(lambda conn: dropped_attnums(conn, oid))

    def existing(self, oids: Iterable[int]) -> set[int]:
        """Those of ``oids`` that are relations Postgres has now (``existing_relations``), asked on this
        catalog's connection: the mirror asks it after a stop, and needs no connection of its own for it."""
        wanted = list(oids)
        return self._ask(lambda conn: existing_relations(conn, wanted))


def existing_relations(conn: psycopg.Connection, oids: Iterable[int]) -> set[int]:
    """Those of ``oids`` that are relations in ``pg_class`` now: the one question that tells a relation
    dropped in Postgres from one that is only out of the publication, or behind the stream's name for it
    (the mirror asks it of a stop's relations, ``set_aside`` of those it sets aside)."""
    wanted = sorted(set(oids))
    if not wanted:
        return set()
    rows = conn.execute("SELECT oid::int8 FROM pg_class WHERE oid = ANY(%s::oid[])", (wanted,)).fetchall()
    return {int(r[0]) for r in rows}


@dataclass(frozen=True, slots=True)
class RewriteWitness:
    """What the catalog keeps of the last rewrite of a table: its file (``relfilenode``, new at every
    rewrite), the transaction that last updated its pg_class row (``class_xmin``: a rewrite does), and
    the transaction that last updated each of some columns' pg_attribute rows (``column_xmins``: an
    ALTER COLUMN ... TYPE does; a column missing from it is no longer there by that name)."""

    relfilenode: int
    class_xmin: str
    column_xmins: dict[str, str]


def rewrite_witness(conn: psycopg.Connection, oid: int, columns: Sequence[str]) -> RewriteWitness | None:
    """Relation ``oid``'s RewriteWitness for ``columns`` (None: no such relation)."""
    row = conn.execute("SELECT relfilenode, xmin::text FROM pg_class WHERE oid = %s", (oid,)).fetchone()
    if row is None:
        return None
    attrs = conn.execute("SELECT attname, xmin::text FROM pg_attribute WHERE attrelid = %s AND attname = ANY(%s) "
                         "AND attnum > 0 AND NOT attisdropped", (oid, list(columns))).fetchall()
    return RewriteWitness(int(row[0]), str(row[1]), {str(n): str(x) for n, x in attrs})


def dropped_attnums(conn: psycopg.Connection, oid: int) -> set[int]:
    """The attnums of relation ``oid``'s dropped columns (PostgreSQL keeps them in pg_attribute)."""
    rows = conn.execute("SELECT attnum FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND attisdropped",
                        (oid,)).fetchall()
    return {int(r[0]) for r in rows}


def column_attnums(conn: psycopg.Connection, oid: int) -> dict[str, int]:
    """Column name -> attnum of relation ``oid``'s live columns (as the connection's snapshot sees them)."""
    rows = conn.execute("SELECT attname, attnum FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                        "AND NOT attisdropped", (oid,)).fetchall()
    return {str(name): int(num) for name, num in rows}


# --- what capture records, and replay reads back -------------------------------------------------


@dataclass(frozen=True)
class CatalogNote:
    """What the live catalog said of one Relation message when ``applier capture`` stored it (after
    peeking it, so at or after the time the message was written):

    ``oid``, ``name`` and ``columns`` are the message's own; ``now`` the relation's (schema, name) then,
    None when it was dropped; ``attnums`` its columns' attnums, only when its live columns were exactly
    the message's (else None: they would not be the message's columns); ``others`` every other relation
    the capture had seen under this name (or the name ``now``) before, displaced since: its (schema,
    name) then, or None when dropped."""

    oid: int
    name: Name
    columns: tuple[str, ...]
    now: Name | None
    attnums: dict[str, int] | None
    others: dict[int, Name | None] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({"v": NOTE_VERSION, "oid": self.oid, "name": list(self.name), "columns": list(self.columns),
                           "now": list(self.now) if self.now is not None else None, "attnums": self.attnums,
                           "others": {str(k): list(v) if v is not None else None for k, v in self.others.items()}},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> CatalogNote | None:
        """The note, or None for a note of another format version (not read: as if absent)."""
        try:
            raw: dict[str, Any] = json.loads(text)
            if raw.get("v") != NOTE_VERSION:
                return None
            return cls(int(raw["oid"]), _name(raw["name"]), tuple(str(c) for c in raw["columns"]),
                       _name(raw["now"]) if raw["now"] is not None else None,
                       {str(k): int(v) for k, v in raw["attnums"].items()} if raw["attnums"] is not None else None,
                       {int(k): _name(v) if v is not None else None for k, v in (raw.get("others") or {}).items()})
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise SourceError(f"raw log row has a catalog note that cannot be read: {type(e).__name__}: {e}",
                              note=text[:200]) from None


def _name(value: Sequence[Any]) -> Name:
    schema, table = value
    return str(schema), str(table)


class RecordedCatalog:
    """``CatalogLookup`` over the notes of a stored log, each ``record``-ed as replay reaches its Relation
    (before the message is decoded): a relation's name and attnums are the latest notes' of it. Every note
    was taken at or after its message was written, so an answer is, as a live catalog's is, the catalog at
    some time after the change the sink asks about. A relation no note speaks of raises NotRecorded
    (never "dropped"); so do the attnums of one whose latest Relation had none recorded."""

    def __init__(self) -> None:
        self._names: dict[int, Name | None] = {}
        self._attnums: dict[int, dict[str, int] | None] = {}

    def record(self, note: CatalogNote) -> None:
        for oid, now in note.others.items():
            self._names[oid] = now
        self._names[note.oid] = note.now
        self._attnums[note.oid] = note.attnums

    def relation(self, oid: int) -> tuple[str, str] | None:
        if oid not in self._names:
            raise NotRecorded(oid)
        return self._names[oid]

    def attnums(self, oid: int) -> dict[str, int]:
        found = self._attnums.get(oid)
        if found is None:
            raise NotRecorded(oid)
        return dict(found)

    def dropped_attnums(self, oid: int) -> set[int]:
        raise NotRecorded(oid)  # a capture records no dropped columns

    def rewrite_witness(self, oid: int, columns: Sequence[str]) -> RewriteWitness | None:
        raise NotRecorded(oid)  # nor what rewrote the table

    def rewritten_rows(self, oid: int, key: Sequence[str], columns: Sequence[str],
                       xid: str) -> Iterator[tuple[str | None, ...]]:
        raise NotRecorded(oid)


class CatalogRecorder:
    """``applier capture``'s side: the notes of the Relation messages of one stored round, read from the
    live catalog in one statement (one snapshot) after the round was peeked. Remembers which relations it
    has seen under which names (its own notes, and the log's notes read back when a capture starts)."""

    def __init__(self) -> None:
        self._seen: dict[Name, set[int]] = {}

    def _see(self, oid: int, name: Name | None) -> None:
        if name is not None:
            self._seen.setdefault(name, set()).add(oid)

    def remember(self, notes: Iterable[str]) -> None:
        """The notes a log already holds (a capture that starts again goes on from them)."""
        for text in notes:
            note = CatalogNote.from_json(text)
            if note is None:
                continue
            self._see(note.oid, note.name)
            self._see(note.oid, note.now)
            for oid, now in note.others.items():
                self._see(oid, now)

    def notes(self, conn: psycopg.Connection, relations: Sequence[tuple[int, Name, tuple[str, ...]]]) -> list[str]:
        """A note (JSON) for each Relation ``(oid, (schema, name), columns)``, in order."""
        if not relations:
            return []
        oids = {oid for oid, _n, _c in relations} | {o for oids in self._seen.values() for o in oids}
        live = _catalog_now(conn, sorted(oids))
        out = []
        for oid, name, columns in relations:
            now, attnums = live.get(oid, (None, {}))
            displaced = self._seen.get(name, set()) | (self._seen.get(now, set()) if now is not None else set())
            others = {o: live[o][0] if o in live else None for o in sorted(displaced - {oid})}
            out.append(CatalogNote(oid, name, columns, now,
                                   attnums if now is not None and set(attnums) == set(columns) else None,
                                   others).to_json())
            self._see(oid, name)
            self._see(oid, now)
            for o, other in others.items():
                self._see(o, other)
        return out


def _catalog_now(conn: psycopg.Connection, oids: list[int]) -> dict[int, tuple[Name, dict[str, int]]]:
    """(schema, name) and column attnums of each of ``oids`` that exists, in one statement."""
    rows = conn.execute(
        "SELECT c.oid, n.nspname, c.relname, (SELECT coalesce(json_object_agg(a.attname, a.attnum), '{}') FROM "
        "pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped) FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = ANY(%s::oid[])", (oids,)).fetchall()
    out: dict[int, tuple[Name, dict[str, int]]] = {}
    for oid, schema, table, attnums in rows:
        parsed = attnums if isinstance(attnums, dict) else json.loads(attnums)
        out[int(oid)] = ((str(schema), str(table)), {str(k): int(v) for k, v in parsed.items()})
    return out


# --- what the mirror asks of tables the stream has said nothing of since (applier.drivers.unsentshapes) ----


def relations_now(conn: psycopg.Connection, oids: list[int]) -> dict[int, tuple[Name, dict[str, int]]]:
    """(schema, name) and live column attnums of each of ``oids`` that exists, in one statement (one
    snapshot): what ``CatalogRecorder`` reads for its notes."""
    return _catalog_now(conn, oids)


def shape_fingerprints(conn: psycopg.Connection, oids: list[int]) -> dict[int, str]:
    """For each of ``oids`` that exists: the transactions that last wrote its ``pg_class`` row, each of its
    ``pg_attribute`` rows (dropped ones too) and its ``pg_index`` rows, as one text. Every ALTER TABLE that
    changes a column, the replica identity or a key writes one of them, so two equal fingerprints read at
    two times mean no such change committed in between (a change of anything else, or a VACUUM FREEZE of
    the catalog, may change it too: a difference means "maybe", never "no")."""
    rows = conn.execute(
        "SELECT c.oid::int8, c.xmin::text || '/' || coalesce((SELECT string_agg(a.attnum::text || ':' || "
        "a.xmin::text, ',' ORDER BY a.attnum) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0), '') "
        "|| '/' || coalesce((SELECT string_agg(i.indexrelid::text || ':' || i.xmin::text, ',' ORDER BY "
        "i.indexrelid) FROM pg_index i WHERE i.indrelid = c.oid), '') FROM pg_class c WHERE c.oid = ANY(%s::oid[])",
        (oids,)).fetchall()
    return {int(oid): str(text) for oid, text in rows}


#: the sizes of a WAL page's header: on a segment's first page (XLogLongPageHeaderData) and on the others
LONG_PAGE_HEADER, SHORT_PAGE_HEADER = 40, 24


def written_position(conn: psycopg.Connection) -> int:
    """A WAL position at or past the end of every transaction the connection's last snapshot could see:
    on a primary the insert position (a commit record is inserted before its transaction becomes visible,
    and with ``synchronous_commit = off`` it is visible before it is flushed, so the flush position is not
    enough), on a standby the replay position (it sees what it has replayed). An insert position just past
    a page header (nothing has been written on that page yet) is taken as the page's start: every record
    ends at or before it, and a flush reaches it."""
    row = conn.execute(
        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_insert_lsn() "
        "END)::text, (SELECT setting::int8 FROM pg_settings WHERE name = 'wal_block_size'), "
        "(SELECT setting::int8 FROM pg_settings WHERE name = 'wal_segment_size')").fetchone()
    if row is None or row[0] is None:
        raise TransientSourceError("the server has no WAL position to give yet (a standby that is still starting)")
    position, page, segment = parse_lsn(row[0]), int(row[1]), int(row[2])
    if position % segment == LONG_PAGE_HEADER:
        return position - LONG_PAGE_HEADER
    if position % page == SHORT_PAGE_HEADER:
        return position - SHORT_PAGE_HEADER
    return position


# --- attnums of a Relation whose columns the live catalog no longer has (applier capture) ---------------


def forced_attnums(columns: Sequence[str], ever: Iterable[int], dropped_before: Iterable[int] = ()) \
        -> dict[str, int] | None:
    """The attnums of a Relation message's ``columns`` when only one assignment is possible, else None.

    Why this is a proof: pgoutput lists a relation's columns in attnum order, attnums are never reused, and
    every attnum a relation ever had stays in ``pg_attribute`` (a dropped column keeps its row). So the
    columns a Relation lists are as many distinct attnums out of those the relation has now (``ever``: live
    and dropped), less the ones known dropped before the Relation was written (``dropped_before``). When
    they are as many as those, the i-th column has the i-th attnum, whatever names the columns had or have
    been given since. (A column the Relation does not list, such as a generated one, leaves one more
    attnum than columns: no answer, never a wrong one.)"""
    possible = sorted(set(ever) - set(dropped_before))
    if len(possible) != len(columns) or len(set(columns)) != len(columns):
        return None
    return dict(zip(columns, possible, strict=True))


def attnums_ever(conn: psycopg.Connection, oids: list[int]) -> dict[int, tuple[set[int], set[int]]]:
    """Per relation of ``oids`` that exists: every attnum it has had (live and dropped), and the dropped ones."""
    rows = conn.execute("SELECT attrelid::int8, array_agg(attnum::int), coalesce(array_agg(attnum::int) FILTER "
                        "(WHERE attisdropped), '{}') FROM pg_attribute WHERE attrelid = ANY(%s::oid[]) AND attnum > 0 "
                        "GROUP BY attrelid", (oids,)).fetchall()
    return {int(oid): ({int(a) for a in ever}, {int(a) for a in dropped}) for oid, ever, dropped in rows}


class AttnumRecorder(CatalogRecorder):
    """A ``CatalogRecorder`` whose notes give a Relation its attnums also when the live catalog's columns are
    no longer exactly the message's (two renames of a table between two captures: the first Relation's
    columns are gone by the time the capture reads the catalog), where ``forced_attnums`` proves them. Each
    note also records the relation's dropped attnums and the position ``at`` the server had written up to
    when they were read (keys ``dropped`` and ``at``, which ``CatalogNote`` does not read): a column dropped
    then was dropped before any Relation written after ``at``, so a later round's Relations leave it out of
    the attnums they could have."""

    def __init__(self) -> None:
        super().__init__()
        self._dropped: dict[int, list[tuple[int, frozenset[int]]]] = {}  # oid -> [(at, dropped attnums)]

    def remember(self, notes: Iterable[str]) -> None:
        texts = list(notes)
        super().remember(texts)
        for text in texts:
            try:
                raw = json.loads(text)
                if raw.get("v") == NOTE_VERSION and raw.get("at") is not None and raw.get("dropped") is not None:
                    self._remember_dropped(int(raw["oid"]), parse_lsn(str(raw["at"])), raw["dropped"])
            except (ValueError, TypeError, KeyError, AttributeError):
                continue  # a note this recorder did not write: CatalogNote.from_json says what is wrong with it

    def _remember_dropped(self, oid: int, at: int, dropped: Iterable[int]) -> None:
        self._dropped.setdefault(oid, []).append((at, frozenset(int(a) for a in dropped)))

    def dropped_before(self, oid: int, lsn: int) -> set[int]:
        """The attnums of ``oid`` known dropped before a Relation written at ``lsn``."""
        return {a for at, dropped in self._dropped.get(oid, ()) if at <= lsn for a in dropped}

    def notes(self, conn: psycopg.Connection, relations: Sequence[tuple[int, Name, tuple[str, ...]]],
              lsns: Sequence[int] | None = None) -> list[str]:
        """As ``CatalogRecorder.notes``; ``lsns``: each Relation's position in the stream (without them, no
        dropped column is taken as dropped before a Relation)."""
        out = super().notes(conn, relations)
        if not relations:
            return out
        oids = sorted({oid for oid, _n, _c in relations})
        ever = attnums_ever(conn, oids)
        at = written_position(conn)  # after the read: every drop it saw committed before this
        noted: list[str] = []
        for i, (text, (oid, _name, columns)) in enumerate(zip(out, relations, strict=True)):
            raw: dict[str, Any] = json.loads(text)
            if oid in ever:
                if raw.get("attnums") is None:
                    before = self.dropped_before(oid, lsns[i]) if lsns is not None else set()
                    raw["attnums"] = forced_attnums(columns, ever[oid][0], before)
                raw["dropped"], raw["at"] = sorted(ever[oid][1]), format_lsn(at)
            noted.append(json.dumps(raw, separators=(",", ":")))
        for oid in oids:  # for the next rounds' Relations
            if oid in ever:
                self._remember_dropped(oid, at, ever[oid][1])
        return noted
