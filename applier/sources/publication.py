"""Which tables a publication sends, as pgoutput names them, and which of those a config mirrors."""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

from applier.config.source import publication_names
from applier.errors import ConfigError

if TYPE_CHECKING:
    from applier.config import TablesSettings


@dataclass(frozen=True, slots=True)
class PublishedTable:
    namespace: str
    name: str
    columns: tuple[str, ...] | None  # the publication's column list (None: all columns)
    row_filter: str | None  # the publication's WHERE clause, as SQL
    oid: int | None = None  # the relation's OID: what the mirror follows through renames

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def require_publication(conn: psycopg.Connection, publication: str) -> None:
    """ConfigError (exit 2: a name in the config or a flag, which a restart will not fix) when the
    server lacks one of the publications (``publication``: one name or a comma-separated list, see
    ``publication_names``). The commands call it right after the DSN check, before Spark starts; a
    publication dropped while a mirror runs ends the run the same way."""
    names = publication_names(publication)
    found = {r[0] for r in conn.execute("SELECT pubname::text FROM pg_publication WHERE pubname = ANY(%s)",
                                        (names,)).fetchall()}
    missing = [name for name in names if name not in found]
    if missing:
        existing = [r[0] for r in conn.execute("SELECT pubname::text FROM pg_publication ORDER BY 1").fetchall()]
        raise ConfigError(missing_publication_hint(missing[0], publication, existing))


def missing_publication_hint(name: str, written: str, existing: list[str]) -> str:
    """What to say when publication ``name`` (as pgoutput reads ``written``, the setting) is missing. An
    unquoted name folds to lower case, so ``MyPub`` means ``mypub``: when that folding is why (a
    ``"MyPub"`` exists, or the setting has capitals) the hint says so and gives the setting quoted; the
    SQL it prints quotes each name exactly (``quote_ident``), so it creates the publication named."""
    text = f"publication {name!r} does not exist in this database"
    meant = _as_written(name, written)
    if meant != name:
        text += (f" (source.publication {meant} is read as {name}: an unquoted name folds to lower case, as "
                 "pgoutput reads it)")
    same = [p for p in existing if p != name and p.lower() == name.lower()]
    if same:
        quoted = quote_ident(same[0])
        return (f"{text}; {quoted} does: to use it, write its name in double quotes, publication: '{quoted}' "
                f"(--publication '{quoted}')")
    text += f"; create it first, e.g. CREATE PUBLICATION {quote_ident(name)} FOR TABLE ... (or FOR ALL TABLES)"
    if meant != name:
        text += (f", or to keep the capitals CREATE PUBLICATION {quote_ident(meant)} ... and write publication: "
                 f"'{quote_ident(meant)}' (--publication '{quote_ident(meant)}')")
    close = difflib.get_close_matches(name, existing, n=3, cutoff=0.6)
    if close:
        text += f"; or name one that exists: {', '.join(quote_ident(p) for p in close)}"
    return text + "; or fix source.publication (--publication)"


def _as_written(name: str, written: str) -> str:
    """The unquoted word of ``written`` that folds to ``name`` (``MyPub`` for ``mypub``), else ``name``."""
    for word in written.split(","):
        word = word.strip()
        if not word.startswith('"') and word != name and word.lower() == name:
            return word
    return name


#: what a publication can publish (``publish = '...'``), in pg_publication's order
PUBLISHED_ACTIONS = ("insert", "update", "delete", "truncate")


def partial_publication_note(conn: psycopg.Connection, publication: str) -> str | None:
    """What a publication that does not publish every kind of change (``publish = 'insert'``, say) means
    for a mirror, or None when each of ``publication`` publishes all four: the changes it leaves out never
    reach the stream, so the Delta tables cannot stay equal to Postgres, and ``verify`` reports the rows
    that differ. Said at every mirror start, by ``status`` and by ``verify``: nothing else would."""
    rows = conn.execute("SELECT pubname::text, pubinsert, pubupdate, pubdelete, pubtruncate FROM pg_publication "
                        "WHERE pubname = ANY(%s) ORDER BY 1", (publication_names(publication),)).fetchall()
    parts = []
    for name, *flags in rows:
        left = [action for action, on in zip(PUBLISHED_ACTIONS, flags, strict=True) if not on]
        if left:
            parts.append(f"publication {quote_ident(name)} does not publish {', '.join(left)} (publish = "
                         f"'{', '.join(a for a, on in zip(PUBLISHED_ACTIONS, flags, strict=True) if on)}')")
    if not parts:
        return None
    return ("; ".join(parts) + ": those changes never reach the stream, so the Delta tables cannot stay equal to "
            "Postgres (applier verify reports the rows that differ). To mirror exactly: ALTER PUBLICATION ... SET "
            f"(publish = '{', '.join(PUBLISHED_ACTIONS)}'), then `applier resync --table` the tables that changed")


def check_publication(dsn: str, publication: str) -> None:
    """``require_publication`` on a connection of its own (after ``check_connection`` made one)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        require_publication(conn, publication)


def published_tables(conn: psycopg.Connection, publication: str) -> list[PublishedTable]:
    """The tables the publications send changes for (as pgoutput names them), with column lists and
    row filters on servers that have them (PG 15+). The column list is exactly the columns pgoutput
    sends: stored generated columns only on PostgreSQL 18+ where the publication publishes them
    (``publish_generated_columns = stored`` or a column list naming them); PostgreSQL 15 to 17 list
    generated columns in ``pg_publication_tables.attnames`` but never send them.

    ``publication`` is one name or a comma-separated list, as pgoutput's ``publication_names``. A table
    in several of them is sent once, with the row filters combined as PostgreSQL's table sync and
    pgoutput combine them: OR-ed, and no filter at all when any of those publications has none for it
    (a FOR ALL TABLES or TABLES IN SCHEMA publication never has one). Different column lists for one
    table are refused, as pgoutput refuses them."""
    require_publication(conn, publication)
    names = publication_names(publication)
    version = conn.info.server_version
    if version >= 180000:  # attnames is what pgoutput sends, stored generated columns included when published
        extra = ", attnames, rowfilter"
    elif version >= 150000:  # attnames lists generated columns, which pgoutput before 18 never sends
        extra = (", ARRAY(SELECT n FROM unnest(attnames) n WHERE NOT EXISTS (SELECT 1 FROM pg_attribute a "
                 "WHERE a.attrelid = format('%%I.%%I', schemaname, tablename)::regclass AND a.attname = n "
                 "AND a.attgenerated <> '')), rowfilter")
    else:
        extra = ", NULL::name[], NULL::text"
    rows = conn.execute(f"SELECT schemaname, tablename{extra}, pubname, (quote_ident(schemaname) || '.' || "
                        "quote_ident(tablename))::regclass::oid::int8 FROM pg_publication_tables "
                        "WHERE pubname = ANY(%s) ORDER BY 1, 2, 5", (names,)).fetchall()
    merged: dict[tuple[str, str], PublishedTable] = {}
    unfiltered: set[tuple[str, str]] = set()
    filters: dict[tuple[str, str], list[str]] = {}
    for ns, name, cols, rf, pubname, oid in rows:
        key, columns = (ns, name), tuple(cols) if cols is not None else None
        first = merged.setdefault(key, PublishedTable(ns, name, columns, None, int(oid)))
        if first.columns != columns:
            # exit 2, not a source outage: the publications must change, a restart will not help
            raise ConfigError(f"table {ns}.{name} has different column lists in the publications {publication!r}; "
                              "PostgreSQL cannot send it (pgoutput refuses different column lists): give it one "
                              "column list in all of them, or leave it in one", publication=pubname,
                              table=f"{ns}.{name}")
        if rf is None:
            unfiltered.add(key)
        elif rf not in filters.setdefault(key, []):
            filters[key].append(rf)
    return [PublishedTable(t.namespace, t.name, t.columns,
                           None if key in unfiltered or not filters.get(key) else
                           filters[key][0] if len(filters[key]) == 1 else
                           "(" + " OR ".join(f"({f})" for f in filters[key]) + ")", t.oid)
            for key, t in merged.items()]


def published_selection(conn: psycopg.Connection, publication: str, tables: TablesSettings) -> list[PublishedTable]:
    """The publication's tables that ``tables`` selects: what a config mirrors, wherever its rules put
    the Delta tables."""
    return [t for t in published_tables(conn, publication) if tables.selected(t.qualified_name)]


def warn_unmatched_includes(published: list[PublishedTable], publication: str, tables: TablesSettings,
                            warn: Callable[[str], None]) -> None:
    """Say which ``tables.include`` globs match no published table (a typo there silently mirrors
    nothing), with the tables each could have meant, or some the publication has. No query of its own:
    ``published`` is what the caller read anyway."""
    names = [t.qualified_name for t in published]
    if not names:
        return
    for pattern, could_mean in tables.unmatched_includes(names):
        hint = (f"did you mean {', '.join(could_mean)}?" if could_mean else
                f"it publishes {', '.join(names[:5])}" + (f" and {len(names) - 5} more" if len(names) > 5 else ""))
        warn(f"tables.include pattern {pattern!r} matches no table of publication {publication} (globs over "
             f"'schema.table', case-sensitive): {hint} Fix the pattern, or add the table to the publication")


def check_readable(conn: psycopg.Connection, tables: list[PublishedTable]) -> None:
    """ConfigError (exit 2) naming the published tables this role cannot read, with the GRANT that fixes
    it: the mirror calls it before it creates its slot. Found by the copy instead, the run stopped with
    exit 3 (a restart meets it again) and its new slot kept WAL on the server while nobody read it. A
    column-level grant of every published column is enough, as it is for the copy's SELECT."""
    oids = [t.oid for t in tables if t.oid is not None]
    if not oids:
        return
    rows = conn.execute(
        "SELECT c.oid::int8, format('%%I.%%I', n.nspname, c.relname), current_user::text, coalesce(("
        "SELECT bool_and(has_column_privilege(c.oid, a.attnum, 'SELECT')) FROM pg_attribute a WHERE a.attrelid = "
        "c.oid AND a.attnum > 0 AND NOT a.attisdropped AND (%(cols)s::jsonb -> c.oid::text IS NULL OR "
        "%(cols)s::jsonb -> c.oid::text ? a.attname)), true) FROM pg_class c JOIN pg_namespace n ON n.oid = "
        "c.relnamespace WHERE c.oid = ANY(%(oids)s)",
        {"oids": oids, "cols": json.dumps({str(t.oid): list(t.columns) for t in tables
                                           if t.oid is not None and t.columns is not None})}).fetchall()
    denied = [(str(name), str(role)) for _oid, name, role, readable in rows if not readable]
    if denied:
        role = denied[0][1]
        names = ", ".join(name for name, _role in denied)
        raise ConfigError(
            f"role {role} cannot read published table(s) {names}, which the mirror copies with SELECT; nothing was "
            f"created (no slot). Grant it as the tables' owner: GRANT SELECT ON {names} TO {quote_ident(role)}; "
            "or leave the tables out (tables.exclude), then run again", tables=names, role=role)


def check_rule_columns(conn: psycopg.Connection, tables: list[PublishedTable], settings: TablesSettings) -> None:
    """ConfigError (exit 2) when a table rule's ``partition_by`` or ``cluster_by`` names a column the
    table's Delta table will not have (not in the table, not sent by the publication, or excluded).
    The mirror calls it before it creates its slot, and table sync before it copies a table that joined
    the publication: found when the Delta table is created, the same mistake stopped the run after the
    slot was made, with exit 3 (a restart meets it again), and the slot kept WAL for a run that never began."""
    rules = {t.qualified_name: rule for t in tables
             if (rule := settings.rule_for(t.qualified_name)) is not None and (rule.partition_by or rule.cluster_by)}
    if not rules:
        return
    sent = _sent_columns(conn, [t for t in tables if t.qualified_name in rules])
    problems: list[str] = []
    for name, rule in rules.items():
        have = [c for c in sent.get(name, ()) if c not in rule.exclude_columns]
        metadata, soft = settings.extra_columns_for(name)
        extra = settings.metadata_names
        allowed = {*have, *((extra.commit_lsn, extra.commit_time, extra.op) if metadata else ()),
                   *((extra.deleted,) if soft else ())}
        where = f"tables.rules.{settings.rules.index(rule)} (match {rule.match!r})"
        for setting in ("partition_by", "cluster_by"):
            for column in getattr(rule, setting):
                if column in allowed:
                    continue
                why = ("is in its exclude_columns" if column in sent.get(name, ()) else
                       f"is not a column {name} has or its publication sends (it has: {', '.join(have) or 'none'})")
                problems.append(f"{where}: {setting} names {column!r}, which {why}")
    if problems:
        raise ConfigError("a table rule's partition or clustering column is not a column of its table; fix the "
                          "rule (source column names, as Postgres spells them) and run again", problems=problems)


def _sent_columns(conn: psycopg.Connection, tables: list[PublishedTable]) -> dict[str, tuple[str, ...]]:
    """The columns pgoutput sends of each table: the publication's list (PostgreSQL 15+ always gives it),
    else the table's columns that are not generated (what servers before 15 send)."""
    out = {t.qualified_name: t.columns for t in tables if t.columns is not None}
    rest = [t.oid for t in tables if t.columns is None and t.oid is not None]
    if rest:
        rows = conn.execute("SELECT format('%%s.%%s', n.nspname, c.relname), array_agg(a.attname::text ORDER BY "
                            "a.attnum) FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n "
                            "ON n.oid = c.relnamespace WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT "
                            "a.attisdropped AND a.attgenerated = '' GROUP BY 1", (rest,)).fetchall()
        out |= {name: tuple(cols) for name, cols in rows}
    return out


@dataclass(frozen=True, slots=True)
class PublishedShape:
    """What decides which rows and columns of a published table the publication sends, beyond the row
    filter (``PublishedTable.row_filter``): the explicit column list, as (attnum, name) pairs, None when
    the publication sends every column (attnums, not names: a rename does not change the list); and,
    for a partitioned table published through its root (``publish_via_partition_root``), its leaf
    partitions as (relation OID, name) pairs, None otherwise. An attached partition's rows and a
    detached one's reach no stream: only a copy brings them in, or takes them out. ``enum_labels``: the
    labels of the enum types its columns use (directly, as arrays or through a domain), as (pg_enum
    OID, label) pairs: ``ALTER TYPE ... RENAME VALUE`` keeps the OID and sends nothing, and the rows
    that hold the label keep the old one in Delta until each is changed."""
    columns: tuple[tuple[int, str], ...] | None
    leaves: tuple[tuple[int, str], ...] | None
    enum_labels: tuple[tuple[int, str], ...] = ()


def published_shapes(conn: psycopg.Connection, publication: str, oids: list[int]) -> dict[int, PublishedShape]:
    """The ``PublishedShape`` of each relation in ``oids``, in one query. Column lists exist on PostgreSQL
    15+ (``pg_publication_rel.prattrs``); earlier servers send every column."""
    listed = ("SELECT unnest(pr.prattrs::int2[]) FROM pg_publication_rel pr JOIN pg_publication p ON "
              "p.oid = pr.prpubid WHERE pr.prrelid = c.oid AND p.pubname = ANY(%(pubs)s)"
              if conn.info.server_version >= 150000 else "SELECT NULL::int2 WHERE false")
    rows = conn.execute(
        "SELECT c.oid::int8, cl.nums, cl.names, CASE WHEN c.relkind = 'p' THEN coalesce(lv.oids, '{}') END, "
        "coalesce(lv.names, '{}'), coalesce(en.oids, '{}'), coalesce(en.labels, '{}') FROM pg_class c "
        "LEFT JOIN LATERAL (SELECT array_agg(a.attnum::int ORDER BY a.attnum) AS nums, "
        "array_agg(a.attname::text ORDER BY a.attnum) AS names FROM pg_attribute a "
        f"WHERE a.attrelid = c.oid AND a.attnum IN ({listed})) cl ON true "
        "LEFT JOIN LATERAL (SELECT array_agg(t.relid::oid::int8 ORDER BY t.relid::oid) AS oids, "
        "array_agg(format('%%I.%%I', n.nspname, r.relname) ORDER BY t.relid::oid) AS names "
        "FROM pg_partition_tree(c.oid) t JOIN pg_class r ON r.oid = t.relid "
        "JOIN pg_namespace n ON n.oid = r.relnamespace WHERE t.isleaf AND c.relkind = 'p') lv ON true "
        "LEFT JOIN LATERAL (SELECT array_agg(e.oid::int8 ORDER BY e.oid) AS oids, "
        "array_agg(e.enumlabel::text ORDER BY e.oid) AS labels FROM pg_enum e WHERE e.enumtypid IN ("
        "SELECT x.oid FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid "
        "CROSS JOIN LATERAL (VALUES (t.oid), (t.typelem), (t.typbasetype)) x(oid) "
        "WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped)) en ON true "
        "WHERE c.oid = ANY(%(oids)s)", {"pubs": publication_names(publication), "oids": oids}).fetchall()
    return {int(oid): PublishedShape(None if nums is None else tuple(zip(nums, cnames, strict=True)),
                                     None if leaves is None else tuple(zip(leaves, lnames, strict=True)),
                                     tuple(zip(eoids, labels, strict=True)))
            for oid, nums, cnames, leaves, lnames, eoids, labels in rows}
