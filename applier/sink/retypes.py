"""Whether a column's type change kept its values: ``ALTER COLUMN ... TYPE ... USING <expression>``.

Why: ``ALTER TABLE u ALTER COLUMN v TYPE bigint USING v * 2`` rewrites every row in Postgres and sends
none of them; the stream's next Relation shows ``v`` as ``bigint``, exactly as a plain widening's does.
Widening the Delta column "values kept" (applier.sink.schema) left every row the stream did not carry
with its old value, exit 0 (issue 77, case 3). The same for ``varchar(n)`` to ``text USING upper(s)``,
which Delta does not even see as a change (both are strings).

What the catalog keeps, and what this proves from it (measured on PostgreSQL 15):

- A type change that rewrites nothing (``varchar(10)`` to ``varchar(40)`` or ``text``, a larger
  ``numeric``) keeps the table's relfilenode, and a ``USING`` that changes a value always rewrites. So a
  relfilenode equal to the one recorded when the table was copied (or at the last proven change) proves
  that every value was kept, at no cost.
- A rewrite (``int`` to ``bigint`` always is one, with or without ``USING``) gives the table a new
  relfilenode and stamps every row it writes with the ALTER's transaction id (``xmin``) and one command
  id (``cmin``), and the ALTER updates the table's pg_class row and the column's pg_attribute row in that
  transaction. While both rows still carry that xmin, nothing altered the table or the column since, and
  the rows with that xmin and the lowest cmin among them are exactly the rows the ALTER wrote and nobody
  changed since (a change later in the same transaction has a higher cmin; a row changed since is in
  the stream with its new value). Their
  values now are what the ALTER made of the values the Delta table holds (it is applied up to just
  before the change), so comparing them, key by key, proves or disproves "values kept". A difference
  copies the table again (``TypeRewriteError``). A row the ALTER's own transaction changed before the
  ALTER differs too: that table is copied needlessly, but exactly.
- What the catalog cannot decide (the table or the column altered again in a later transaction: an ADD
  COLUMN, a rename; a table with no key to match rows by; a stored log's catalog, which records none of
  this) keeps the values, with a warning naming the
  resync to run if a ``USING`` did change them: copying instead stopped most backlogs that widen a
  column and then alter the table again (the suite's catch-up workloads). That is the one way left
  for such a change to go unseen, and it is said each time.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from applier.catalog import SchemaVersion
from applier.errors import NotRecorded, ResyncNeededError
from applier.sink.identity import TableIdentities

log = logging.getLogger("applier.sink.schema")


class TypeRewriteError(ResyncNeededError):
    """A column's type changed and Postgres rewrote the table, and its values cannot be proven kept (a
    ``USING`` expression, or a rewrite the catalog cannot tell apart from one): the table is copied again
    (exit 4 with the resync remedy, or by itself under ``apply.schema_changes: resync``)."""


#: (column, its type OID and modifier) -> the text Postgres gives converted as the stream's values are
Convert = Callable[[str, bytes], Any]
#: the Delta table's rows: (key columns, value columns) -> {key tuple: value tuple}, by Postgres names
#: (None: the Delta table has no column of one of those names yet, renamed in the same change)
DeltaRows = Callable[[Sequence[str], Sequence[str]], dict[tuple[Any, ...], tuple[Any, ...]] | None]


def retyped_columns(version: SchemaVersion) -> tuple[str, ...]:
    """The columns whose Postgres type or modifier this version changed (the stream's names)."""
    change = version.change
    return tuple(name for name, *_types in change.retyped) if change is not None else ()


def unproven_retype(identities: TableIdentities, version: SchemaVersion, convert: Convert,
                    delta_rows: DeltaRows, touched: set[tuple[Any, ...]] | None = None) -> str | None:
    """Why the type change of ``version`` may not have kept the values of its retyped columns, or None when
    they are proven kept (see the module docstring). Records the relfilenode a proof leaves as the baseline.
    ``touched``: the keys the group being applied changes (the Delta table holds them as of before the
    group, not as of the change): left out of the comparison; None when not known (a fold of ranges), and
    then a difference is not taken as proof either (it may be the group's own change)."""
    columns = retyped_columns(version)
    oid, table = version.relation.oid, version.qualified_name
    bound = identities.bound(oid)
    lookup = identities.lookup
    if not columns or lookup is None or bound is None:
        return None  # nothing to ask: as before (a stored log; a table not bound yet is new: no old values)
    try:
        witness = lookup.rewrite_witness(oid, columns)
    except NotRecorded:
        return None
    if witness is None:
        return None  # dropped since: the stream's changes after this are its last ones
    if bound.relfilenode is not None and witness.relfilenode == bound.relfilenode:
        return None  # nothing rewrote the table since the copy or the last proof
    key = [c.name for c in version.relation.columns if c.is_key]
    if not key or version.relation.replica_identity == "f" or any(k in columns for k in key):
        return _unproven(table, columns, "without a key apart from them its rows cannot be matched")
    # each column's pg_attribute row was last updated by its ALTER ... TYPE (or by a later ALTER of it)
    groups: dict[str, list[str]] = {}
    for column in columns:
        xid = witness.column_xmins.get(column)
        if xid is None:
            return _unproven(table, columns, f"{column} is no longer there by that name")
        groups.setdefault(xid, []).append(column)
    for xid, group in groups.items():
        if xid != witness.class_xmin:
            # the table (its pg_class row) or the column was altered again since: which rows that later
            # transaction wrote, and which it left stamped by the ALTER, the catalog no longer says
            return _unproven(table, group, "the table or the column was altered again since, so the rows that ALTER "
                             "wrote cannot be told apart")
        changed, seen = _changed_rows(lookup.rewritten_rows(oid, key, group, xid), key, group, convert, delta_rows,
                                      touched or set())
        if changed is _OTHER_KIND:
            return None  # a type Delta cannot widen (int to text): the sink stops on it with its own remedy
        if changed and touched is None:
            return _unproven(table, group, f"the rows it wrote differ from the Delta table's ({changed}), which may "
                             "be changes of the range being folded")
        if changed:
            return (f"column(s) {', '.join(group)} of {table} changed type with new values (an ALTER ... TYPE ... "
                    f"USING, transaction {xid}): {changed}")
    identities.record_relfilenode(oid, witness.relfilenode)
    log.info("%s: column(s) %s changed type in a rewrite that kept every value (compared with Postgres)", table,
             ", ".join(columns))
    return None


def _unproven(table: str, columns: Sequence[str], why: str) -> str | None:
    """A type change the catalog can neither prove nor disprove to have kept the values: the values are kept
    (a copy for every such change would stop most backlogs that widen a column and alter the table again),
    with a warning that says how to mend it if an ``ALTER ... TYPE ... USING`` did change them."""
    log.warning("%s: column(s) %s changed type and the catalog cannot prove that their values were kept (%s); they "
                "are kept in Delta. If that ALTER had a USING expression that changed values, copy the table again: "
                "`applier resync --config FILE --table %s`", table, ", ".join(columns), why, table)
    return None


#: what _changed_rows says of values of another kind than the Delta column's (a number become text)
_OTHER_KIND = "values of another kind"


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, Decimal)):
        return "number"
    if isinstance(value, (date, datetime)):
        return "time"
    return type(value).__name__


def _changed_rows(rows: Iterable[tuple[str | None, ...]], key: Sequence[str], columns: Sequence[str],
                  convert: Convert, delta_rows: DeltaRows, touched: set[tuple[Any, ...]]) -> tuple[str | None, int]:
    """A description of the first rows whose new values differ from the Delta table's, ``_OTHER_KIND`` when a
    new value is of another kind than its old one (no widening keeps it), or None; and the rows compared."""
    have = delta_rows(key, columns)
    if have is None:
        return "the Delta table has no column of that name yet (renamed in the same change) to compare", 0
    names = [*key, *columns]
    seen = 0
    for row in rows:
        values = tuple(None if text is None else convert(name, text.encode("utf-8"))
                       for name, text in zip(names, row, strict=True))
        k, new = values[:len(key)], values[len(key):]
        if k in touched or k not in have:  # changed by the group being applied: its rows come with it
            continue
        seen += 1
        old = have[k]
        if any(a is not None and b is not None and _kind(a) != _kind(b) for a, b in zip(old, new, strict=True)):
            return _OTHER_KIND, seen
        if any(not _same(a, b) for a, b in zip(old, new, strict=True)):
            return f"key {k!r} holds {old!r} in Delta and {new!r} in Postgres", seen
    return None, seen


def _same(old: Any, new: Any) -> bool:
    """The Delta table's old value equals Postgres's new one (an int equals its bigint or numeric)."""
    if old is None or new is None:
        return old is None and new is None
    try:
        return bool(old == new)
    except TypeError:
        return False
