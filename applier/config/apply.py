"""``apply``: how committed transactions are applied to Delta, in four kinds of settings.

The YAML keeps one flat ``apply:`` section (``settings.apply.max_group_rows``), but its fields are of four
kinds, each a model of its own, so code that needs one kind can say so in its type hints:
``GroupingSettings`` (how transactions are grouped into commits), ``EngineSettings`` (what writes them
and with how much memory), ``PolicySettings`` (what happens on schema changes, TRUNCATE, odd values,
messages) and ``FilterSettings`` (which transactions are left out). ``ApplySettings`` is all four.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from applier.config.base import PATH, Lsn, SettingsModel


class GroupingSettings(SettingsModel):
    """How committed transactions are gathered into groups, each applied as one Delta commit per table."""

    grouping: Literal["transaction", "grouped"] = Field(
        "grouped", description="fold many source transactions into one Delta commit per table (exact, "
        "fast), or 'transaction': one Delta commit per source transaction (strict, slow)")
    max_group_transactions: int = Field(
        250_000, ge=1, description="grouped: the most transactions one group holds, i.e. one Delta commit per "
        "table and one consistent cut (memory is bounded by the two limits below; this bounds the bookkeeping "
        "of many tiny transactions). Every group keeps it: on the driver path, and where a backlog is caught up "
        "in ranges (a mirror's start, a following mirror's rounds) or a stored log is replayed on executors, "
        "whose ranges end after this many. The one exception: a range can only be cut where nothing is open, so "
        "while a streamed (source.streaming) or prepared (source.two_phase) transaction stays open across "
        "others, the transactions committed meanwhile share its range and group")
    max_group_rows: int = Field(
        500_000, ge=1, description="grouped: the most row changes one group holds; a group is applied before a "
        "transaction (a range, in ranges) that would take it past, so a larger group is a transaction larger "
        "alone, of its own (applied in pieces past apply.memory_budget_mb), or in ranges what shares a range "
        "with a streamed or prepared transaction (see max_group_transactions). Driver path: the transactions' "
        "row changes; in ranges: the rows the group's commits write or delete, a range counted before it joins "
        "as its own, and ranges hold at most this many messages (a range that reaches them inside a transaction "
        "ends before it when it can)")
    max_group_bytes_mb: int = Field(
        256, ge=1, description="grouped: the approximate size of the row images one group holds, kept as "
        "max_group_rows is. Driver path: the lengths of string and binary values, 8 bytes any other; in "
        "ranges: the bytes of the messages that carry them (a range ends once it holds this many, with the "
        "Commit that reached them, or before the transaction that did when it can)")
    max_group_seconds: float = Field(
        5.0, gt=0, description="mirror: the longest a group stays open. Driver path: the longest a committed "
        "transaction waits in a group before it is applied (a group is applied sooner, as soon as the stream "
        "has nothing more buffered); in ranges (a catch-up, a following mirror's rounds, each of which reads "
        "the stream for this long): a group whose first range joined it this long ago is applied before the "
        "next range joins it, or when the reading ends. A replay of a stored log has no time limit")
    overlap_groups: bool = Field(
        False, description="decode and assemble the next group while the previous one is committed to Delta "
        "(one group in flight; memory up to two groups). Positions are still confirmed only after the "
        "commits exist, so exactly-once and crash safety are unchanged")

    def reached(self, transactions: int, rows: int, size: int) -> bool:
        """A group of ``transactions``, ``rows`` row changes and ``size`` bytes has reached a count limit (it
        is applied now). The one rule the driver path's groups and the executors' groups of folds keep."""
        return (transactions >= self.max_group_transactions or rows >= self.max_group_rows
                or size >= self.max_group_bytes_mb << 20)

    def passed(self, transactions: int, rows: int, size: int) -> bool:
        """A group that would hold this much is past a count limit (what would take it there joins the next)."""
        return (transactions > self.max_group_transactions or rows > self.max_group_rows
                or size > self.max_group_bytes_mb << 20)


class EngineSettings(SettingsModel):
    """What writes a group to Delta and with how much memory: the MERGE engine, commits in parallel,
    compaction, and when a large transaction spills and is applied in pieces."""

    merge_engine: Literal["auto", "spark"] = Field(
        "auto", description="auto: a table's commit is written by delta-rs from the fold's Arrow table when "
        "that is the same commit (a table delta-rs can write and read; a key-less table without "
        "floating-point or nested columns; no floating-point key), else by a Spark MERGE, and the initial "
        "copy creates and writes tables with delta-rs; spark: every write by Spark, the initial copy's too "
        "(e.g. on a cluster, or where delta-rs cannot reach the storage with its own credentials)")
    parallel_tables: int = Field(
        3, ge=1, description="grouped: how many tables of one group are committed at the same time, each "
        "in a Spark session of its own (1: one after the other)")
    optimize_every_commits: int = Field(
        0, ge=0, description="compact a table's small files (Delta OPTIMIZE) after this many applier commits "
        "to it; 0: never (run OPTIMIZE yourself)")
    memory_budget_mb: int = Field(256, ge=1, description="buffered changes per transaction before spilling; "
                                  "a larger transaction is applied in pieces of about one row change per KB of it "
                                  "(docs/applying.md)")
    columnar_fold: bool = Field(
        True, description="fold a range of a backlog on Spark's executors column by column (numpy and Arrow over "
        "the messages' bytes, several times faster) when it is only plain transactions of tables merged on their "
        "replica identity key, with text values the initial copy reads in bulk; any other range, and false here, "
        "folds message by message, the reference way. Both give the same plans (tested)")
    piece_rows: int | None = Field(None, ge=1, description="row changes per piece of a transaction applied in pieces "
                                   "(default: one per KB of memory_budget_mb, at least 1000)")


class PolicySettings(SettingsModel):
    """What the apply does with what is more than a plain row change: an unresolved TOAST value, a
    schema change, a table that cannot be applied, a TRUNCATE, a value Spark cannot hold, a logical
    decoding message."""

    unresolved_toast: Literal["error"] = Field(
        "error", description="an update that leaves a large (TOASTed) value unchanged sends no value for it; "
        "applier takes it from the old image, an earlier image in the batch or the target row. When none "
        "exists the apply stops with an error ('error', the only choice: never a NULL or a placeholder)")
    schema_changes: Literal["evolve", "stop", "resync"] = Field(
        "resync", description="resync, the default: add columns, widen types, keep dropped ones, follow proven "
        "renames; a table that cannot follow the stream past a point (a type change Delta cannot widen, e.g. int "
        "to text; a rewrite such as ALTER COLUMN ... TYPE ... USING; a column rename or drop-and-add no catalog "
        "can prove; a Delta table found diverged from Postgres; two relations claiming one path) is copied again "
        "from Postgres at a new position by the mirror itself, as `applier resync --table` does, while the other "
        "tables go on, with a warning, a count in the metrics (applier_errors, kind resync) and a line in "
        "`applier status`; a relation Postgres has dropped since is set aside (its Delta table retired, its "
        "changes still in the stream left out). evolve: the same, but such a table stops the run (exit 4) naming "
        "`applier resync` (a replay of a stored log always behaves so: it has nothing to copy from); stop: stop "
        "on any schema change")
    column_renames: Literal["auto", "rewrite", "map"] = Field(
        "auto", description="how a proven column rename reaches a Delta table that is not column-mapped: rewrite "
        "(the table is rewritten under the new names in one overwrite commit; every reader opens it: Spark, "
        "delta-rs's to_pyarrow_table/to_pandas, Polars), map (Delta column mapping turned on and the column renamed "
        "in place: no data rewritten, but the table gains the 'columnMapping' reader feature, which delta-rs's "
        "pyarrow path, pandas and Polars refuse), or auto, the default (rewrite up to rename_rewrite_max_mb of data "
        "files, map above; see docs/schema-changes.md for the measured cost)")
    rename_rewrite_max_mb: int = Field(
        1024, ge=0, description="column_renames auto: the largest table (data files, MB) a rename rewrites; a "
        "larger one is column-mapped")
    type_widening: Literal["auto", "rewrite", "feature"] = Field(
        "auto", description="how a type Postgres widened (int to bigint, real to double precision, numeric to a "
        "larger numeric, date to timestamp) reaches a Delta table that does not have type widening yet: rewrite "
        "(the table is rewritten with the wider type in one overwrite commit; every reader opens it and delta-rs "
        "keeps writing it), feature (Delta's type widening turned on and the column altered in place: no data "
        "rewritten, but the table gains the 'typeWidening' reader feature, which delta-rs and its readers cannot "
        "read, and every later commit to it goes through Spark), or auto, the default (rewrite up to "
        "widen_rewrite_max_mb of data files, feature above)")
    widen_rewrite_max_mb: int = Field(
        1024, ge=0, description="type_widening auto: the largest table (data files, MB) a widening rewrites; a "
        "larger one gets Delta's type widening")
    on_table_error: Literal["stop", "park"] = Field(
        "stop", description="mirror: what a table that cannot be applied past a point does to the others (a type "
        "change Delta cannot widen, a diverged Delta table, an unproven column rename, when schema_changes does "
        "not resync it): stop (exit 4: every table waits until `applier resync --table` mends it), or park (that "
        "table's changes are left out from then on, the other tables go on; applier status lists it as PARKED, "
        "the metrics count it, and `applier resync --table` copies it again and un-parks it)")
    truncate: Literal["apply", "error"] = Field("apply", description="apply TRUNCATE, or stop on one")
    special_values: Literal["error", "clamp", "null"] = Field(
        "error", description="values Spark cannot hold (infinity dates, BC years, numeric NaN)")
    messages_table: str | None = Field(
        None, json_schema_extra=PATH,
        description="record pg_logical_emit_message messages (source option messages: true) in the Delta table "
        "at this path")


class FilterSettings(SettingsModel):
    """Which committed transactions are left out before they are applied (by origin, or by the
    user's word)."""

    skip_origins: list[str] = Field(default_factory=list,
                                    description="drop transactions from these replication origins (by name)")
    skip_any_origin: bool = Field(
        False, description="drop every transaction that carries a replication origin (an Origin message: it "
        "was replayed into the source by a subscription or another replication tool), on the applier side; "
        "skip_origins drops only the named ones")
    skip_transactions: list[Lsn] = Field(
        default_factory=list,
        description="commit LSNs (as in '0/16B3748') of transactions to leave out, like ALTER SUBSCRIPTION "
        "... SKIP: the way past a transaction the applier stopped on (bad bytes, a value that cannot be "
        "converted). A prepared transaction is skipped by its prepare LSN or its Commit Prepared LSN. "
        "Each skip is recorded in the audit table <state_dir>/skipped_transactions")


# The bases are listed last kind first: pydantic orders inherited fields from the last base to the first,
# so the ``apply`` reference (docs/config.md) lists them as the kinds above: grouping, engine, policies, filters.
class ApplySettings(FilterSettings, PolicySettings, EngineSettings, GroupingSettings):
    """How committed transactions are applied to Delta."""
