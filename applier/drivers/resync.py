"""Re-copy chosen tables of a running mirror at a new position (``applier resync --table``, and
``apply.schema_changes: resync`` after a type change Delta cannot widen).

Why this is exact: it is the table sync of ``applier.drivers.tablesync`` (a temporary slot's
exported snapshot gives a position P and a snapshot that sees exactly the transactions committed
before P; the copy's last Delta commit records P as the table's applied version). The mirror's slot
stays where it was confirmed (C <= P). When the mirror goes on from C, the stream's transactions on
the table that ended at or before P are already in the copy and are left out, because the table's
applied version is P, which is how the apply stage skips any transaction a table already has; those
after P are applied on top. Nothing between C and P is applied twice or lost: each transaction of
that range is either visible to the snapshot (ended before P) or ends after P. Prepared or
streamed transactions still open at P are not in the snapshot, and their commits come after P.

The Delta table is first replaced, empty, with the columns Postgres has now (one commit, ``CREATE OR
REPLACE``: its history and table id stay), because a retype Delta cannot widen cannot be evolved
into. Crash safety comes from the order: the table is removed from the mirror's list of copied
tables (state ``copied_tables``) before anything is written, and put back, with P, only when its
copy's last commit exists; a mirror that finds a published table missing from that list copies it
(the ordinary table sync), so a resync cut short by a crash is finished by the next mirror run.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import psycopg

from applier.catalog import RelationCache
from applier.drivers.tablesync import STATE_KEY, TableSync
from applier.errors import ApplierError, ConfigError, DivergenceError, InputError, TypeChangeError
from applier.sink.identity import UnprovenRenameError, known_names, retired_relations
from applier.sink.parking import ParkedTables
from applier.sources.catalog_lookup import existing_relations
from applier.sources.publication import PublishedTable, published_selection
from applier.sources.snapshot import describe_relation
from applier.sources.sql_slot import current_flush_lsn
from applier.state import StateDir

if TYPE_CHECKING:
    from applier.config import MirrorConfig

log = logging.getLogger(__name__)

#: resyncs one mirror run does by itself (apply.schema_changes: resync) before it stops as evolve would
MAX_AUTOMATIC_RESYNCS = 20


def choose_tables(conn: psycopg.Connection, config: MirrorConfig, names: list[str], *,
                  gone: dict[str, int] | None = None) -> list[PublishedTable]:
    """The published, selected tables named ``schema.table`` (as Postgres names it now), by relation OID,
    or by a name this mirror knew the relation by (a stop names the table as the stream had it; it may
    have been renamed since, or its schema): a table is its relation, not its name. ConfigError naming
    what is not one of them. A relation the mirror follows that Postgres no longer publishes (dropped, or
    taken out of the publication, since) goes in ``gone`` (name -> OID) when it is given (``set_aside``
    then resolves it), else its name says so in the error."""
    selection = published_selection(conn, config.source.publication, config.tables)
    published = {t.qualified_name: t for t in selection}
    by_oid = {t.oid: t for t in selection if t.oid is not None}
    known = _known_relations(config)
    retired = retired_relations(StateDir.for_target(config.target.path, config.target.state_dir))
    chosen: list[PublishedTable] = []
    unknown: list[str] = []
    for name in dict.fromkeys(names):
        table = published.get(name)
        dropped = {was: oid for oid, was in retired.items() if was == name and oid not in by_oid}
        if gone is not None:  # a name reused: relations dropped under it whose changes may still be in the stream
            gone.update(dropped)
        if table is None and name.isdigit():
            table = by_oid.get(int(name))
            if table is None and (int(name) in known.values() or int(name) in retired):
                _gone(retired.get(int(name), name), int(name), gone, unknown)
                continue
        if table is None and name in known:
            table = by_oid.get(known[name])
            if table is None:
                _gone(name, known[name], gone, unknown)
                continue
            log.info("resync: %s is %s now (relation OID %s)", name, table.qualified_name, table.oid)
        if table is None:
            if not dropped:
                unknown.append(name)
            elif gone is None:
                _gone(name, dropped[name], gone, unknown)
        elif table not in chosen:
            chosen.append(table)
    if unknown:
        some = ", ".join(sorted(published)[:10]) + (", ..." if len(published) > 10 else "")
        raise ConfigError(f"not a table this mirror follows: {', '.join(unknown)} (give schema.table as Postgres "
                          f"names it, a name the mirror knew it by, or its relation OID; publication "
                          f"{config.source.publication!r} with the config's tables.include/exclude has: "
                          f"{some or 'no tables'})")
    return chosen


def _gone(name: str, oid: int, gone: dict[str, int] | None, unknown: list[str]) -> None:
    if gone is not None:
        gone[name] = oid
    else:
        unknown.append(f"{name} (relation OID {oid}, which Postgres no longer publishes: dropped or taken out of "
                       "the publication since)")


def set_aside(tablesync: TableSync, gone: dict[str, int], why: str, parked: ParkedTables | None = None) -> None:
    """Relations the mirror follows that Postgres no longer publishes, named by a stop (``gone``: name ->
    OID): there is nothing to copy, and their changes still in the stream cannot be applied exactly
    (that is why the mirror stopped), so they are set aside for good: parked, so every later group
    leaves their changes out, and, when the relation was dropped, its Delta table retired under
    DIR/_retired (as when its name is taken). A table only taken out of the publication keeps its
    Delta table, which table sync marks as not published."""
    applier, state = tablesync.applier, tablesync.state
    parked = parked if parked is not None else ParkedTables(state)
    with psycopg.connect(tablesync.dsn, autocommit=True) as conn:
        exists = existing_relations(conn, gone.values())
        position = current_flush_lsn(conn)  # past every drop the catalog shows
    for name, oid in gone.items():
        until: int | None = None
        if oid in exists:
            what = "is no longer published (it still exists in Postgres): its Delta table stays as it is"
        else:
            until = position
            bound = applier.identities.bound(oid) if applier.identities is not None else None
            path = applier.identities.retire(oid) if applier.identities is not None else None
            what = "was dropped in Postgres: " + (f"its Delta table is retired to {path}" if path is not None
                                                  else f"its Delta table was retired to {bound.path}"
                                                  if bound is not None and bound.retired
                                                  else "it has no Delta table to keep")
        message = (f"{name} (relation OID {oid}) {what}, and its changes still in the stream are left out "
                   f"({why}); nothing is left to copy")
        parked.park(name, oid, message, until=until)
        log.warning("resync: %s", message)  # once: the progress line beside it printed it a second time


def _known_relations(config: MirrorConfig) -> dict[str, int]:
    """Names this mirror's target knows relations by: name -> relation OID (``known_names``)."""
    return known_names(StateDir.for_target(config.target.path, config.target.state_dir))


def resync_tables(tablesync: TableSync, tables: list[PublishedTable], *, reason: str) -> dict[str, int]:
    """Replace each table's Delta table with a fresh copy at a new position (see the module
    docstring); returns the rows copied per table."""
    applier, state = tablesync.applier, tablesync.state
    for table in tables:
        if applier.derived.kinds(table.qualified_name):
            raise InputError(
                "the table has a history or change feed table, which cannot take a fresh copy without losing "
                "what it holds; delete those derived tables (the mirror starts them anew at the copy) or turn "
                "history/changes off for it, then resync", table=table.qualified_name)
    with psycopg.connect(tablesync.dsn, autocommit=True) as conn:
        published = published_selection(conn, tablesync.config.source.publication, tablesync.config.tables)
        described = [describe_relation(conn, table) for table in tables]
    known = tablesync.known(published)  # (a state older than table sync gets its list made here)
    for table in tables:  # first: a crash from here on leaves the table to the next mirror's table sync
        known.pop(table.qualified_name, None)
    state.save(STATE_KEY, known)
    for table, (relation, types) in zip(tables, described, strict=True):
        for typ in types:
            tablesync.catalog.update_type(typ)
        schema = RelationCache(tablesync.catalog.types).update(relation)
        if applier.identities is not None and table.oid is not None:
            applier.identities.copied_anew(table.oid)
        if ParkedTables(state).release(table.qualified_name, table.oid):
            tablesync.progress(f"resync: {table.qualified_name} was parked; the copy brings it back")
        if applier.replace_table(schema):
            tablesync.progress(f"resync: {table.qualified_name}: Delta table emptied with the columns Postgres has "
                               "now; copying it")
        tablesync._columns.pop(table.oid or 0, None)  # what its Delta table had before
    tablesync.sync(tables, reason=reason)
    return {t.qualified_name: tablesync.synced[t.qualified_name] for t in tables}


def resync_after_schema_change(tablesync: TableSync, error: ApplierError) -> None:
    """``apply.schema_changes: resync``: the table of ``error`` copied again; the caller then starts a new
    decoding session from the slot, whose transactions up to the copy's position the table leaves out."""
    c = error.context
    oid = c.get("relation_oid")  # the relation, whatever its name is now (the stream may be behind a rename)
    name = str(c["table"]) if c.get("table") else f"relation OID {oid}"  # (never "None" in a progress line)
    if isinstance(error, TypeChangeError):
        why = (f"column {c.get('column')!r} changed type from {c.get('old_type')} to {c.get('new_type')}, which "
               "Delta cannot widen")
        reason = "changed a column's type in a way Delta cannot widen"
    elif isinstance(error, UnprovenRenameError):
        why = f"a column rename could not be proven ({c.get('columns')})"
        reason = "had a column change no catalog could prove a rename or a drop"
    elif isinstance(error, DivergenceError):
        why = "its Delta table has diverged from Postgres (" + str(error).split(":", 1)[0] + ")"
        reason = "diverged from Postgres"
    else:  # a column's identity or a rewrite (ColumnIdentityError, TypeRewriteError): its message says which
        why = str(error).splitlines()[0].split("; ")[0][:300] if str(error) else type(error).__name__
        reason = "changed in a way its stream cannot carry"
    tablesync.progress(f"resync: {name}: {why}; copying the table again (apply.schema_changes: resync)")
    gone: dict[str, int] = {}
    with psycopg.connect(tablesync.dsn, autocommit=True) as conn:
        tables = choose_tables(conn, tablesync.config, [str(oid) if oid is not None else name], gone=gone)
    if gone:
        set_aside(tablesync, gone, f"{why}; set aside by apply.schema_changes: resync")
    if tables:
        resync_tables(tablesync, tables, reason=reason)


def require_mirror(config: MirrorConfig) -> None:
    """InputError unless the target holds a mirror of ``config``'s slot that has finished its first
    copy: resync follows a mirror, it does not start one. Read from the state alone (before Spark)."""
    saved = StateDir.for_target(config.target.path, config.target.state_dir).load("mirror") or {}
    if saved.get("phase") != "streaming" or saved.get("slot") != config.source.slot:
        raise InputError(f"this target has no mirror with slot {config.source.slot!r} that finished its first copy; "
                         "run `applier mirror` first (it copies every table)", target=config.target.path)
