"""One error root for the whole engine.

Every error carries the context a user needs to act (LSN, xid, message kind, relation, column,
byte offset) as structured attributes, and never row values or connection strings. ``transient``
tells callers whether retrying the same operation can succeed.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ApplierError(Exception):
    """Root of all applier errors.

    Context is structured: the fields below are what callers and tests read (None when unknown);
    any other detail (gid, slot, path, ...) is kept in ``context`` and printed with the message.
    Inner layers raise with what they know; outer layers add what they know through
    ``add_context`` (the one way context is added), which never overwrites an inner value.
    Whether retrying can succeed is decided by the class (``transient``), never by the caller.
    """

    transient: ClassVar[bool] = False

    def __init__(self, message: str, **context: Any) -> None:
        self.message = message
        self.context: dict[str, Any] = {k: v for k, v in context.items() if v is not None}
        super().__init__(self._render())

    def _render(self) -> str:
        if not self.context:
            return self.message
        details = ", ".join(f"{k}={_fmt(k, v)}" for k, v in self.context.items())
        return f"{self.message} ({details})"

    def add_context(self, **context: Any) -> None:
        """Fill in what an outer layer knows (the LSN, the transaction) and the inner one did not."""
        for k, v in context.items():
            if v is not None:
                self.context.setdefault(k, v)
        self.args = (self._render(),)

    @property
    def lsn(self) -> int | None:
        """LSN of the message the error is about."""
        return self.context.get("lsn")

    @property
    def xid(self) -> int | None:
        return self.context.get("xid")

    @property
    def commit_lsn(self) -> int | None:
        """Commit LSN of the transaction the error is about: what ``--skip-transaction`` takes."""
        return self.context.get("commit_lsn")

    @property
    def kind(self) -> str | None:
        """Message kind (``Insert``, ``Stream Abort``, ...)."""
        return self.context.get("kind")

    @property
    def offset(self) -> int | None:
        """Byte offset inside the message where decoding failed."""
        return self.context.get("offset")

    @property
    def relation(self) -> str | None:
        return self.context.get("relation")

    @property
    def column(self) -> str | None:
        return self.context.get("column")

    @property
    def sqlstate(self) -> str | None:
        """The server's SQLSTATE, for errors that came from PostgreSQL."""
        return self.context.get("sqlstate")


def _fmt(key: str, value: Any) -> str:
    """LSN-valued fields (named ``lsn`` or ``*_lsn``) print the way PostgreSQL prints them."""
    if (key == "lsn" or key.endswith("_lsn")) and isinstance(value, int) and value >= 0:
        return f"{value >> 32:X}/{value & 0xFFFFFFFF:X}"
    return str(value)


class ConfigError(ApplierError):
    """A configuration file, flag or DSN is invalid. ``problems`` lists every one found in a config
    (``file:line: key: reason``), one per line after the message."""

    def __init__(self, message: str, *, problems: list[str] | None = None, **context: Any) -> None:
        self.problems = list(problems or [])
        super().__init__(message, **context)

    def _render(self) -> str:
        return super()._render() + "".join(f"\n  {p}" for p in self.problems)

    @property
    def file(self) -> str | None:
        """The config file the (first) problem is in."""
        return self.context.get("file")

    @property
    def line(self) -> int | None:
        """Line of the first problem in ``file``."""
        return self.context.get("line")


class InputError(ApplierError):
    """What the command was given does not fit, and a person must act (a restart will not help): a
    file that is not a raw log, a target whose tables are not the ones applier wrote, or a target
    that is ahead of the log replayed into it."""


class TableBehindError(InputError):
    """A table's Delta history went backwards: its log ends before the version, or holds transactions only
    up to before the applied LSN, that this target recorded for it (its newest commit files deleted, its
    directory restored from an older copy). The transactions in between are gone from it and the runs went
    on past them (the slot confirmed, a log replayed), so no run brings them back by itself: a person
    re-copies the table (``applier resync --table``) or accepts the loss (exit 2). ``table`` is the source's
    ``schema.table``."""


class EnvironmentSetupError(ApplierError):
    """Something the engine needs on this machine (Java, Delta jars, PostgreSQL binaries) is missing."""


class DataError(ApplierError):
    """Caused by the data of one transaction, not by the machine, the server or the config: the run
    stops before that transaction, and ``--skip-transaction`` is a way past it."""


class DecodeError(DataError):
    """Bytes that are not a valid pgoutput (or replication-protocol) message."""


class CatalogError(DataError):
    """A change refers to a relation or type the catalog does not know, or a schema change is unsupported."""


class ValueConversionError(DataError):
    """A column value cannot be converted from its PostgreSQL representation."""


class AssemblyError(DataError):
    """The message sequence breaks transaction framing (e.g. Commit without Begin)."""


class SpillError(ApplierError):
    """The spill directory cannot take a large transaction's changes (disk full, no permission)."""


class SinkError(ApplierError):
    """Applying a transaction to Delta failed."""


class SchemaDecisionError(SinkError):
    """A source schema change the mirror does not follow by itself (``apply.schema_changes: stop``, or a
    retype Delta cannot widen): a person decides, so exit 4, never 3 (a restart meets it again, and a
    service manager would restart the mirror forever)."""


class ColumnNamesError(SchemaDecisionError):
    """A table's Delta columns are named under the other ``column_names`` choice than the config's now (keep
    and safe): writing on would leave the columns it holds NULL and add their other names beside them. A
    person chooses: the config back for that table, or a fresh copy under the new names (exit 4)."""


class ResyncNeededError(SchemaDecisionError):
    """The table cannot follow the stream past this point, but a fresh copy of it at a new position
    can (``applier resync --table``, or ``apply.schema_changes: resync``, which the mirror does by
    itself): exit 4 otherwise. ``table`` is the source's ``schema.table``."""


class TypeChangeError(ResyncNeededError):
    """A column's new type is not one Delta can widen the old one to (``ALTER COLUMN ... TYPE text``, or
    a column dropped and added again with another type). Not an outage (a restart meets it again) and
    not one transaction's data (``--skip-transaction`` does not help): the table needs a decision, so
    exit 4, and the way forward is a fresh copy of that one table (``applier resync --table``, or
    ``apply.schema_changes: resync``). ``table`` is the source's ``schema.table``."""


class DivergenceError(ResyncNeededError):
    """The Delta table does not hold what the stream's change needs (a key-less row to delete that is not
    there, a row to take unchanged TOAST values from that is missing): it has diverged from Postgres.
    A restart meets the same table again (never exit 3); a fresh copy of that one table mends it
    (``applier resync --table``, or ``apply.schema_changes: resync``). ``table`` is the source's
    ``schema.table``."""


class DroppedTypeChangeError(SchemaDecisionError):
    """A retype Delta cannot widen, of a table that has been dropped in Postgres since (the stream is
    behind the catalog): no fresh copy of it can be taken, and ``applier resync --table`` by its name
    would copy nothing, or another table that took the name. Not a ``TypeChangeError``, so
    ``apply.schema_changes: resync`` does not try. ``path`` is its Delta table, which nothing was
    written to."""


class SourceError(ApplierError):
    """Reading from a slot or a stored raw log failed."""


class SlotUnusableError(SourceError):
    """The slot cannot serve this mirror, and no restart will change that: it was lost (invalidated by
    ``max_slot_wal_keep_size``, or dropped under a running mirror), it is a physical slot, or it decodes
    with another plugin than pgoutput. Exit 2: a person decides (drop it, or name another slot)."""


class HeldBackError(SourceError):
    """The server holds the slot's changes back for a standby: the slot is a failover slot and a physical slot
    named in ``synchronized_standby_slots`` is missing, has no standby connected, or is behind
    (applier.sources.heldback). Nothing is wrong with the mirror or its data, and nothing reaches it until
    that standby confirms the WAL or the setting drops its slot: a drain (``mirror --once``, ``capture``)
    stops after ``source.standby_wait_seconds`` with exit 6 rather than wait for ever or say "caught up"."""


class TransientSourceError(SourceError):
    """A source failure that a retry may fix (connection dropped, server restarting)."""

    transient = True


class NoCutError(ApplierError):
    """The target has no consistent cut (applier.sink.cuts) at or before the position asked for: none
    recorded yet (a mirror that has applied no group since cuts came), or all of them pruned or newer."""


class CutTableReplacedError(ApplierError):
    """A table a consistent cut lists is no longer the Delta table the cut recorded (its ``metaData.id``
    differs): written anew at the same path since (a copy after its directory was deleted, a new table
    that took the name of a retired one). Its version there is not the cut's rows."""


class TargetLockedError(ApplierError):
    """Another applier run holds the target (or raw log) this run would write: its ``flock``
    (applier.infra.lock) or its lease object on an object store (applier.storage.lease)."""


class NotRecorded(LookupError):  # noqa: N818  # an answer missing, not a failure: never shown to a user
    """A catalog that answers from records (a stored log's, ``applier.sources.catalog_lookup.RecordedCatalog``)
    has none for this question: the sink treats it as no catalog at all (never as a dropped relation)."""
