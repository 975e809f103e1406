"""``tables``: which published tables are mirrored, and per-table rules."""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from applier.config.base import PATH, SettingsModel


class TableRule(SettingsModel):
    """Per-table settings for the tables a glob matches (``schema.table``, e.g. ``shop.*``)."""

    match: str = Field(description="glob over 'schema.table'")
    target: str | None = Field(
        None, json_schema_extra=PATH, description="Delta path for this table (default <target>/<schema>/<table>)")
    table: str | None = Field(
        None, description="catalog table name (e.g. 'lake.shop_orders'): an existing Delta table is written at its "
        "location; a new name is registered as an external table over the path")
    key_columns: list[str] | None = Field(
        None, description="key to merge on for tables without a primary key (else the replica identity)")
    exclude_columns: list[str] = Field(default_factory=list, description="columns not mirrored")
    column_names: Literal["keep", "safe"] | None = Field(
        None, description="how this table's column names reach Delta (keep or safe, see tables.column_names); "
        "unset: tables.column_names")
    path_names: Literal["keep", "safe"] | None = Field(
        None, description="how this table's schema and table names become directory names (keep or safe, see "
        "tables.path_names); unset: tables.path_names")
    metadata_columns: bool | None = Field(
        None, description="add the columns naming the change that last wrote each row (tables.metadata_names); "
        "unset: tables.metadata_columns")
    soft_delete: bool | None = Field(
        None, description="keep deleted rows, flagged in the deleted column (tables.metadata_names.deleted); "
        "unset: tables.soft_delete")
    history: bool = Field(
        False, description="SCD type 2: also keep a history table with one row per version of each key "
        "(__start_lsn/__end_lsn, __start_at/__end_at; an open version ends NULL); keyed tables only")
    history_columns: list[str] | None = Field(
        None, description="history: the columns whose change starts a new version (unset: every column); a "
        "change to the others updates the open version in place")
    changes: bool = Field(
        False, description="also keep a change feed table: one row per change with every column (unchanged TOAST "
        "resolved), __op (I/U/D; R for the initial copy), __commit_lsn, __ordinal, __commit_time; a key change is "
        "D + U, a TRUNCATE a D per row; the source for create_auto_cdc_flow; keyed tables only")
    changes_target: str | None = Field(
        None, json_schema_extra=PATH, description="changes: Delta path of the feed table (default "
        "<target>/_changes/<schema>/<table>)")
    history_target: str | None = Field(
        None, json_schema_extra=PATH, description="history: Delta path of the history table (default "
        "<target>/_history/<schema>/<table>)")
    # Delta table options: applied when the table is created and never to an existing table (a mismatch is
    # a warning and shows in `applier status`). Each may add a Delta table feature; see docs/delta-tables.md,
    # "Delta table features", for which of them readers outside Spark (delta-rs) can open.
    type_widening: bool = Field(
        False, description="create the table with Delta type widening enabled (otherwise it is enabled only when "
        "a source column is actually widened); adds the 'typeWidening' reader feature, which delta-rs cannot read")
    change_data_feed: bool = Field(
        False, description="create the table with Delta's change data feed (delta.enableChangeDataFeed); "
        "adds the 'changeDataFeed' writer feature (delta-rs reads such tables)")
    partition_by: list[str] = Field(
        default_factory=list, description="partition columns of a new table (source column names)")
    cluster_by: list[str] = Field(
        default_factory=list, description="liquid clustering columns of a new table (CLUSTER BY); adds the "
        "'clustering' and 'domainMetadata' writer features; not together with partition_by")
    table_properties: dict[str, str] = Field(
        default_factory=dict, description="free Delta table properties of a new table (e.g. "
        "'delta.logRetentionDuration': 'interval 60 days'); 'applier.*' keys are reserved")

    @model_validator(mode="after")
    def _options_consistent(self) -> TableRule:
        if self.partition_by and self.cluster_by:
            raise ValueError("partition_by and cluster_by cannot be combined (Delta allows one or the other)")
        reserved = [k for k in self.table_properties if k.startswith("applier.")]
        if reserved:
            raise ValueError(f"table_properties may not set applier's own properties: {', '.join(reserved)}")
        return self


class MetadataNames(SettingsModel):
    """Names of the columns applier adds to a table with metadata columns or soft deletes."""

    commit_lsn: str = Field("_applier_commit_lsn", description="commit LSN (bigint: the pg_lsn as a number) of "
                            "the transaction that last wrote the row; the initial copy's position for copied rows")
    commit_time: str = Field("_applier_commit_time", description="commit timestamp (UTC) of that transaction; "
                             "NULL for rows the initial copy wrote (Postgres does not keep it)")
    op: str = Field("_applier_op", description="what last wrote the row: I insert, U update, D delete (soft "
                    "deletes), R read by the initial copy")
    deleted: str = Field("_applier_deleted", description="soft_delete: true on a row deleted in Postgres")

    @model_validator(mode="after")
    def _distinct(self) -> MetadataNames:
        names = [self.commit_lsn, self.commit_time, self.op, self.deleted]
        if len(set(names)) != len(names) or not all(names):
            raise ValueError(f"metadata column names must be distinct and not empty: {names}")
        return self


class TablesSettings(SettingsModel):
    """Which published tables are mirrored, and how."""

    include: list[str] = Field(default_factory=lambda: ["*"], description="globs over 'schema.table'")
    exclude: list[str] = Field(default_factory=list, description="globs over 'schema.table'")
    rules: list[TableRule] = Field(default_factory=list, description="first matching rule wins")
    metadata_columns: bool = Field(
        False, description="add to every keyed table the commit LSN, commit time and operation of the change "
        "that last wrote each row (names: metadata_names); exact under grouping; a table without a key "
        "cannot have them (set key_columns in a rule, or turn them off for it)")
    soft_delete: bool = Field(
        False, description="keep rows deleted in Postgres, with the deleted column true, instead of removing "
        "them (a later insert of the key revives the row); a TRUNCATE still empties the table; keyed tables "
        "only")
    metadata_names: MetadataNames = Field(default_factory=MetadataNames, description="names of the added columns")
    column_names: Literal["keep", "safe"] = Field(
        "keep", description="keep: Delta columns have the Postgres names exactly; a name Delta cannot hold without "
        "column mapping (a space or one of ,;{}()= tab newline) turns Delta column mapping on for its table "
        "(Spark and delta-rs's QueryBuilder read it; to_pyarrow_table, pandas and Polars do not). safe: such a "
        "character, and '%', is written as '%' and two hex digits ('Weird col' -> 'Weird%20col'), so the table "
        "needs no column mapping and every reader opens it; the table property applier.columnNames lists the "
        "mapped names. Applies to new tables: a table written under the other choice stops the run "
        "(docs/schema-changes.md, 'Column names Delta cannot hold')")
    path_names: Literal["keep", "safe"] = Field(
        "keep", description="keep: a table's directory is <schema>/<table>, the Postgres names exactly but for "
        "'%u' escapes of '/', backslash, control characters, '%', '.', '..' and reserved names; Polars cannot "
        "open a table whose path holds a space, '%' or non-ASCII, and on an object store a name that needs an "
        "escape is refused. safe: only ASCII letters, digits, '_', '-' and '.' are kept; any other character is "
        "written '~' and two hex digits per UTF-8 byte ('Mixed Case' -> 'Mixed~20Case'), so every reader opens "
        "every table, on object stores too; the table property applier.source holds the Postgres name. A table "
        "already written under keep stays where it is (docs/delta-tables.md, 'Directory names')")

    def selected(self, qualified_name: str) -> bool:
        return any(fnmatch.fnmatchcase(qualified_name, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(qualified_name, p) for p in self.exclude)

    def unmatched_includes(self, published: Sequence[str]) -> list[tuple[str, list[str]]]:
        """Each ``include`` glob that matches none of the ``published`` tables (``schema.table``), with up
        to three it could have meant: a typo there mirrors nothing, and says nothing otherwise."""
        return [(p, _could_mean(p, published)) for p in self.include
                if not any(fnmatch.fnmatchcase(name, p) for name in published)]

    def rule_for(self, qualified_name: str) -> TableRule | None:
        return next((r for r in self.rules if fnmatch.fnmatchcase(qualified_name, r.match)), None)

    def safe_column_names(self, qualified_name: str) -> bool:
        """Whether a table's columns take safe names (``column_names``: its rule's choice, else the global one)."""
        rule = self.rule_for(qualified_name)
        choice = rule.column_names if rule is not None and rule.column_names is not None else self.column_names
        return choice == "safe"

    def safe_path_names(self, qualified_name: str) -> bool:
        """Whether a table's directory takes a safe name (``path_names``: its rule's choice, else the global one)."""
        rule = self.rule_for(qualified_name)
        choice = rule.path_names if rule is not None and rule.path_names is not None else self.path_names
        return choice == "safe"

    def extra_columns_for(self, qualified_name: str) -> tuple[bool, bool]:
        """(metadata columns, soft delete) for a table: its rule's choice, else the global one."""
        rule = self.rule_for(qualified_name)
        metadata = rule.metadata_columns if rule is not None and rule.metadata_columns is not None \
            else self.metadata_columns
        soft = rule.soft_delete if rule is not None and rule.soft_delete is not None else self.soft_delete
        return metadata, soft



def _could_mean(pattern: str, names: Sequence[str]) -> list[str]:
    """Published names a glob that matches none of them was likely meant for: the same glob without
    regard to case (globs are case-sensitive), a glob without a schema taken for the table name, or
    names close to it as text."""
    folded = [n for n in names if fnmatch.fnmatchcase(n.lower(), pattern.lower())]
    if folded:
        return folded[:3]
    if "." not in pattern:
        bare = [n for n in names if fnmatch.fnmatchcase(n.partition(".")[2], pattern)]
        if bare:
            return bare[:3]
    return difflib.get_close_matches(pattern, list(names), n=3, cutoff=0.6)
