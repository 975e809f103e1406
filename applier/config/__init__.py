"""Job configuration: pydantic models, read from YAML by applier.config.files.

Every model forbids unknown keys (a typo must not silently fall back to a default), every field says
what it is for (docs/config.md is generated from these descriptions: ``python -m applier.config.docs``),
and the DSN is a secret that never prints. Fields marked ``config_path`` hold paths, which a config
file resolves from its own folder.
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from applier.config.files import load_config
from applier.errors import ConfigError
from applier.lsn import format_lsn, parse_lsn
from applier.storage.options import StorageOptions, put_in_force

__all__ = ["ApplySettings", "CaptureConfig", "DistributedSettings", "MaintenanceSettings", "MirrorConfig",
           "ReplayConfig", "SourceSettings", "SparkConfig", "MetadataNames", "TableRule", "TablesSettings",
           "TargetSettings", "load_config"]

#: libpq variables that say which server to use: with one of them set, an empty DSN is a complete one.
LIBPQ_SERVER_ENV = ("PGHOST", "PGHOSTADDR", "PGSERVICE", "PGDATABASE", "PGPORT")


def libpq_env_given() -> bool:
    return any(os.environ.get(v) for v in LIBPQ_SERVER_ENV)


#: Marks a field holding a path: relative values in a config file are resolved from the file's folder.
PATH: dict[str, Any] = {"config_path": True}


def _lsn(value: str) -> str:
    try:
        return format_lsn(parse_lsn(value))
    except Exception:  # noqa: BLE001 - pydantic reports it with the key (or the flag)
        raise ValueError(f"not an LSN like 0/16B3748 (two hex numbers separated by a slash): {value!r}") from None


#: A commit LSN as PostgreSQL prints it, normalised (``0/16b3748`` -> ``0/16B3748``).
Lsn = Annotated[str, AfterValidator(_lsn)]

#: PostgreSQL's rule for replication slot names (ReplicationSlotValidateName in slot.c).
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def _slot_name(value: str) -> str:
    """Checked here, not by the server: the server refuses a bad name only when the slot is created,
    after Spark has started (20 s), and as an error that looks like an outage (exit 3)."""
    if not _SLOT_NAME.fullmatch(value):
        hint = f" (e.g. {value.lower()!r})" if _SLOT_NAME.fullmatch(value.lower()) else ""
        raise ValueError(f"not a valid replication slot name: {value!r}; PostgreSQL allows only lower-case "
                         f"letters, digits and underscores, at most 63 characters{hint}")
    return value


#: A replication slot name PostgreSQL accepts.
SlotName = Annotated[str, AfterValidator(_slot_name)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSettings(_Model):
    """Where the changes come from: a PostgreSQL logical replication slot."""

    dsn: SecretStr | None = Field(
        None, description="libpq connection string (key=value pairs or a postgresql:// URI); prefer dsn_env or "
        "libpq's own PGHOST/PGSERVICE/PGPASSWORD and ~/.pgpass, which keep the password out of the file")
    dsn_env: str = Field("APPLIER_DSN", description="environment variable holding the DSN when dsn is unset")
    slot: SlotName = Field(
        "applier", description="logical replication slot (pgoutput); created when absent; lower-case letters, "
        "digits and underscores only (PostgreSQL's rule), at most 63 characters")
    publication: str = Field(
        "applier", description="publication whose tables are mirrored, or several as a comma-separated list, read "
        "as pgoutput reads publication_names (unquoted names fold to lower case, \"Quoted\" ones do not); a table "
        "in several is filtered as PostgreSQL filters it: their row filters OR-ed, none when one of them has none")
    proto_version: Literal[1, 2, 3, 4] = Field(1, description="pgoutput protocol version")
    streaming: Literal["off", "on", "parallel"] = Field(
        "off", description="stream in-progress transactions (on: proto >= 2, parallel: proto >= 4, PG 16+)")
    two_phase: bool = Field(False, description="decode prepared transactions (proto >= 3, PG 15+)")
    binary: bool = Field(False, description="binary column values (PG 14+)")
    messages: bool = Field(False, description="receive pg_logical_emit_message messages (PG 14+)")
    origin: Literal["any", "none"] | None = Field(
        None, description="pgoutput's origin option (PG 16+), a filter on the server: 'none' sends only changes "
        "made locally on the source (not those a subscription or other replication origin wrote there, "
        "which avoids loops in bidirectional setups); 'any' sends all; unset: the server's default (any)")
    read_mode: Literal["replication", "sql"] = Field(
        "replication", description="streaming replication protocol, or SQL peek/advance")
    failover: bool = Field(
        False, description="PostgreSQL 17+: create the slot with FAILOVER (an existing slot is altered), so that "
        "standbys with sync_replication_slots keep a copy and the mirror can follow the new primary after a "
        "failover (docs/operations.md)")
    wal_warning_bytes: int = Field(
        1 << 30, ge=0, description="mirror: warn (log, applier status) when the slot's safe_wal_size, the WAL the "
        "server may still write before the slot exceeds max_slot_wal_keep_size, falls under this; a slot whose "
        "wal_status is extended or unreserved is always warned about, and a lost slot stops the mirror (exit 2: a "
        "restart cannot mend it)")
    max_retries: int = Field(
        10, ge=0, description="mirror: reconnect attempts after the connection drops or the server restarts "
        "(backoff 1 s doubling to 30 s); counted per outage, then the mirror stops with the last error")

    @field_validator("publication")
    @classmethod
    def _publication_list(cls, value: str) -> str:
        from applier.errors import ConfigError
        from applier.sources.publication import publication_names

        try:
            publication_names(value)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return value

    @model_validator(mode="after")
    def _versions(self) -> SourceSettings:
        if self.streaming == "on" and self.proto_version < 2:
            raise ValueError("streaming: on needs proto_version >= 2")
        if self.streaming == "parallel" and self.proto_version < 4:
            raise ValueError("streaming: parallel needs proto_version 4")
        if self.two_phase and self.proto_version < 3:
            raise ValueError("two_phase needs proto_version >= 3")
        return self

    def resolved_dsn(self) -> str:
        """The DSN from the config or the environment; the error never shows the value.

        With neither, libpq's own variables (PGHOST, PGSERVICE, ...) are a DSN too, as for psql: the
        empty string, which libpq completes from them (and the password from ~/.pgpass)."""
        if self.dsn is not None:
            return self.dsn.get_secret_value()
        value = os.environ.get(self.dsn_env)
        if value:
            return value
        if libpq_env_given():
            return ""
        raise ConfigError(f"no DSN: pass --dsn, set source.dsn, the environment variable {self.dsn_env}, or "
                          "libpq's PGHOST / PGSERVICE variables")


class TableRule(_Model):
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


class MetadataNames(_Model):
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


class TablesSettings(_Model):
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

    def selected(self, qualified_name: str) -> bool:
        return any(fnmatch.fnmatchcase(qualified_name, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(qualified_name, p) for p in self.exclude)

    def rule_for(self, qualified_name: str) -> TableRule | None:
        return next((r for r in self.rules if fnmatch.fnmatchcase(qualified_name, r.match)), None)

    def extra_columns_for(self, qualified_name: str) -> tuple[bool, bool]:
        """(metadata columns, soft delete) for a table: its rule's choice, else the global one."""
        rule = self.rule_for(qualified_name)
        metadata = rule.metadata_columns if rule is not None and rule.metadata_columns is not None \
            else self.metadata_columns
        soft = rule.soft_delete if rule is not None and rule.soft_delete is not None else self.soft_delete
        return metadata, soft


class ApplySettings(_Model):
    """How committed transactions are applied to Delta."""

    grouping: Literal["transaction", "grouped"] = Field(
        "grouped", description="fold many source transactions into one Delta commit per table (exact, "
        "fast), or 'transaction': one Delta commit per source transaction (strict, slow)")
    max_group_transactions: int = Field(
        250_000, ge=1, description="grouped: transactions per Delta commit (memory is bounded by the two "
        "limits below; this bounds the bookkeeping of many tiny transactions)")
    max_group_rows: int = Field(500_000, ge=1, description="grouped: row changes per Delta commit")
    max_group_bytes_mb: int = Field(
        256, ge=1, description="grouped: approximate size of the row images folded into one Delta commit")
    parallel_tables: int = Field(
        3, ge=1, description="grouped: how many tables of one group are committed at the same time, each "
        "in a Spark session of its own (1: one after the other)")
    optimize_every_commits: int = Field(
        0, ge=0, description="compact a table's small files (Delta OPTIMIZE) after this many applier commits "
        "to it; 0: never (run OPTIMIZE yourself)")
    merge_engine: Literal["auto", "spark"] = Field(
        "auto", description="auto: a table's commit is written by delta-rs from the fold's Arrow table when "
        "that is the same commit (a table delta-rs can write and read; a key-less table without "
        "floating-point or nested columns; no floating-point key), else by a Spark MERGE, and the initial "
        "copy creates and writes tables with delta-rs; spark: every write by Spark, the initial copy's too "
        "(e.g. on a cluster, or where delta-rs cannot reach the storage with its own credentials)")
    overlap_groups: bool = Field(
        False, description="decode and assemble the next group while the previous one is committed to Delta "
        "(one group in flight; memory up to two groups). Positions are still confirmed only after the "
        "commits exist, so exactly-once and crash safety are unchanged")
    max_group_seconds: float = Field(
        5.0, gt=0, description="mirror: the longest a committed transaction waits in a group before it is "
        "applied (a group is applied sooner, as soon as the stream has nothing more buffered)")
    unresolved_toast: Literal["error"] = Field(
        "error", description="an update that leaves a large (TOASTed) value unchanged sends no value for it; "
        "applier takes it from the old image, an earlier image in the batch or the target row. When none "
        "exists the apply stops with an error ('error', the only choice: never a NULL or a placeholder)")
    schema_changes: Literal["evolve", "stop", "resync"] = Field(
        "evolve", description="evolve: add columns, widen types, keep dropped ones, and stop (exit 4) on a type "
        "change Delta cannot widen (e.g. int to text), a column rename no catalog can prove, or a Delta table "
        "found diverged from Postgres, naming `applier resync`; resync (mirror only): the same, but such a table "
        "is copied again from Postgres at a new position, automatically, as `applier resync --table` does; stop: "
        "stop on any schema change")
    on_table_error: Literal["stop", "park"] = Field(
        "stop", description="mirror: what a table that cannot be applied past a point does to the others (a type "
        "change Delta cannot widen, a diverged Delta table, an unproven column rename, when schema_changes does "
        "not resync it): stop (exit 4: every table waits until `applier resync --table` mends it), or park (that "
        "table's changes are left out from then on, the other tables go on; applier status lists it as PARKED, "
        "the metrics count it, and `applier resync --table` copies it again and un-parks it)")
    truncate: Literal["apply", "error"] = Field("apply", description="apply TRUNCATE, or stop on one")
    special_values: Literal["error", "clamp", "null"] = Field(
        "error", description="values Spark cannot hold (infinity dates, BC years, numeric NaN)")
    skip_origins: list[str] = Field(default_factory=list,
                                    description="drop transactions from these replication origins (by name)")
    skip_any_origin: bool = Field(
        False, description="drop every transaction that carries a replication origin (an Origin message: it "
        "was replayed into the source by a subscription or another replication tool), on the applier side; "
        "skip_origins drops only the named ones")
    memory_budget_mb: int = Field(256, ge=1, description="buffered changes per transaction before spilling; "
                                  "a larger transaction is applied in pieces of about one row change per KB of it "
                                  "(docs/applying.md)")
    piece_rows: int | None = Field(None, ge=1, description="row changes per piece of a transaction applied in pieces "
                                   "(default: one per KB of memory_budget_mb, at least 1000)")
    skip_transactions: list[Lsn] = Field(
        default_factory=list,
        description="commit LSNs (as in '0/16B3748') of transactions to leave out, like ALTER SUBSCRIPTION "
        "... SKIP: the way past a transaction the applier stopped on (bad bytes, a value that cannot be "
        "converted). A prepared transaction is skipped by its prepare LSN or its Commit Prepared LSN. "
        "Each skip is recorded in the audit table <state_dir>/skipped_transactions")

    messages_table: str | None = Field(
        None, json_schema_extra=PATH,
        description="record pg_logical_emit_message messages (source option messages: true) in the Delta table "
        "at this path")


class SparkConfig(_Model):
    """The SparkSession the job runs on (ignored when the job is given a session). ``mirror`` and
    ``replay`` start it only when an operation needs Spark (a table delta-rs does not write, a schema
    change, executors...; docs/applying.md, "Spark only when needed").

    ``master`` is a fallback: a master that spark-submit (``--master``), ``PYSPARK_SUBMIT_ARGS``, the
    ``MASTER`` environment variable or ``spark-defaults.conf`` already set wins, so
    ``spark-submit --master spark://host:7077 jobs/mirror.py ...`` runs on that cluster."""

    master: str | None = Field(
        None, description="Spark master used only when spark-submit, PYSPARK_SUBMIT_ARGS, $MASTER or "
        "spark-defaults.conf set none (then 'local[2]' when unset here too), e.g. local[4] or yarn")
    app_name: str = Field("applier", description="application name shown in the Spark UI (spark.app.name)")
    shuffle_partitions: int = Field(
        2, ge=1, description="spark.sql.shuffle.partitions: small, because a MERGE source holds one row per key")
    driver_memory: str = Field(
        "2g", description="spark.driver.memory (only takes effect when applier starts the JVM itself)")
    jit: Literal["full", "quick"] = Field(
        "full", description="the driver JVM's compiler when applier starts the JVM: 'quick' compiles with C1 only "
        "(-XX:TieredStopAtLevel=1), which starts Spark and runs short jobs (a mirror --once of a few changes, a "
        "resync of a small table) up to twice as fast on few cores; 'full' (tiered, C1 then C2) for long runs "
        "and large catch-ups")
    conf: dict[str, str] = Field(
        default_factory=dict, description="any other Spark settings, as name: value strings (they win over the "
        "fields above)")


class TargetSettings(_Model):
    """Where the Delta tables go: ``<path>/<schema>/<table>`` unless a table rule says otherwise."""

    path: str = Field(json_schema_extra=PATH, description="root directory of the mirrored Delta tables: a local "
                      "directory or an s3://, gs:// or abfss:// URI (docs/object-storage.md)")
    state_dir: str | None = Field(
        None, json_schema_extra=PATH,
        description="applier state (catalog as last seen, staged prepared transactions, spill files, skip "
        "audit); default <path>/_applier, for an s3://, gs:// or abfss:// target a local directory of its own "
        "($XDG_STATE_HOME/applier/targets/..., docs/object-storage.md)")
    storage_options: dict[str, SecretStr] = Field(
        default_factory=dict,
        description="an object-store target's settings when not (only) the cloud's environment: e.g. "
        "aws_access_key_id, aws_secret_access_key, aws_session_token, aws_region, aws_endpoint_url, aws_allow_http "
        "(abfss://: azure_storage_account_name, azure_storage_account_key; gs://: google_service_account). delta-rs, "
        "the lock and Spark's Hadoop settings (fs.s3a.bucket.<bucket>.*) all get them, for every location in the "
        "target's bucket; secrets are never printed (docs/object-storage.md)")

    @model_validator(mode="after")
    def _storage_options_in_force(self) -> TargetSettings:
        """Checked here (an unknown key is an error, not an option one engine ignores) and put in force for
        the process: every module that opens the bucket finds them there (applier.storage.options)."""
        if self.storage_options:
            raw = {key: value.get_secret_value() for key, value in self.storage_options.items()}
            try:
                options = StorageOptions.of(self.path, raw)
            except ConfigError as e:
                raise ValueError(str(e)) from None
            put_in_force(options)
        return self


_SOURCE = "the slot, publication, DSN and pgoutput options"
_TARGET = "where the Delta tables and the applier's state go"
_TABLES = "which published tables are mirrored, and per-table rules"
_APPLY = "how transactions are grouped and applied, and what stops the run"
_SPARK = ("the SparkSession applier starts when it is not given one (mirror and replay: only when an "
          "operation needs Spark)")


class MetricsSettings(_Model):
    """Prometheus metrics and a health check while the mirror runs (docs/operations.md, "Metrics")."""

    port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics (Prometheus text format) and /healthz on this port while "
        "mirror or capture runs (--metrics-port); unset: no server; 0: a free port, logged")
    host: str = Field("0.0.0.0", description="the address the metrics server listens on")
    stall_seconds: float = Field(
        300.0, gt=0, description="/healthz answers 503 when the loop has not moved (read, applied a group, or "
        "found the stream idle and caught up) for this long; 200 otherwise")


class MaintenanceSettings(_Model):
    """``applier maintain`` (and ``every_minutes`` inside ``mirror``): compaction, VACUUM and checkpoints of the
    mirrored tables, safe beside a running mirror (docs/operations.md, "Table maintenance")."""

    min_small_files: int = Field(
        16, ge=1, description="compact (OPTIMIZE) a table once it has at least this many small data files")
    small_file_bytes: int = Field(32 << 20, ge=1, description="a data file under this size counts as small")
    target_file_bytes: int | None = Field(
        None, ge=1, description="size of the files compaction writes (unset: the table's delta.targetFileSize, "
        "else 100 MiB)")
    z_order: dict[str, list[str]] = Field(
        default_factory=dict, description="glob over 'schema.table' -> columns: compaction of a matching table "
        "Z-orders by them (rewrites every file of the table each time it runs); liquid-clustered tables (the "
        "rule's cluster_by) are clustered by OPTIMIZE instead")
    vacuum: bool = Field(True, description="VACUUM: delete data files no version within the retention references")
    retention_hours: int | None = Field(
        None, ge=0, description="VACUUM keeps files a version of the last N hours references (unset: the table's "
        "delta.deletedFileRetentionDuration, 7 days by default)")
    enforce_retention: bool = Field(
        True, description="refuse a retention_hours under the table's delta.deletedFileRetentionDuration; false "
        "only with no mirror running and no reader of older versions (their files may be deleted)")
    checkpoint: bool = Field(True, description="write a Delta checkpoint (delta-rs tables; Spark writes its own "
                             "every delta.checkpointInterval commits) and remove log files past "
                             "delta.logRetentionDuration")
    every_minutes: float | None = Field(
        None, gt=0, description="mirror: maintain each table at most this often, between groups while the stream "
                                "is idle (unset: only `applier maintain` does it)")


class DistributedSettings(_Model):
    """Decoding and folding on Spark's executors (applier.drivers.executors): for ``replay``, the driver
    surveys the log; for ``mirror``, a large backlog of the slot is read by the driver (applier.drivers.backlog).
    Executors decode and fold ranges of it, the driver combines and commits."""

    mode: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on executors when the log has at least min_messages messages (mirror: the "
        "backlog at least min_backlog_mb) and Spark has more than one core (spark.default.parallelism); on: "
        "whenever the log allows it; off: the driver path. A log that needs the driver path (history or "
        "change-feed tables, grouping 'transaction', prepared transactions staged by an earlier run, files not in "
        "log order; a mirror reading with read_mode 'sql') takes it, with a log line")
    min_messages: int = Field(2_000_000, ge=1, description="replay, auto: the smallest log replayed on executors")
    min_backlog_mb: int = Field(
        64, ge=0, description="mirror, auto: the smallest backlog (WAL between the slot's confirmed position and "
        "the server's flush position, in MiB) caught up on executors; the mirror then follows the stream on the "
        "driver")
    partition_messages: int = Field(
        250_000, ge=1, description="messages per range given to one executor task (cut where no transaction "
        "is open, so a range may be longer)")


class ReplayConfig(_Model):
    """``applier replay``: apply a stored raw log (Parquet or Delta: lsn, xid, data) to Delta tables."""

    source_log: str = Field(
        json_schema_extra=PATH, description="path of the raw log: a Parquet file, a directory of Parquet parts or "
        "a Delta table with columns lsn, xid, data (what `applier capture` writes)")
    target: TargetSettings = Field(description=_TARGET)
    tables: TablesSettings = Field(default_factory=TablesSettings, description=_TABLES)
    apply: ApplySettings = Field(default_factory=ApplySettings, description=_APPLY)
    spark: SparkConfig = Field(default_factory=SparkConfig, description=_SPARK)
    distributed: DistributedSettings = Field(
        default_factory=DistributedSettings, description="decoding and folding on Spark's executors")

    @model_validator(mode="after")
    def _no_resync(self) -> ReplayConfig:
        if self.apply.schema_changes == "resync":
            raise ValueError("apply.schema_changes: resync needs a live source to copy from (applier mirror); "
                             "a replay of a stored log cannot re-copy a table: use evolve or stop")
        return self


class SnapshotSettings(_Model):
    """The initial copy: chunks of each table read on several connections under the slot's snapshot."""

    parallelism: int | None = Field(
        None, ge=1, description="connections copying chunks at the same time (default: the number of cores)")
    chunk_mb: int = Field(
        32, ge=1, description="heap pages per chunk, in MB (ctid ranges on PostgreSQL 14+; one chunk before)")
    commit_mb: int = Field(
        128, ge=1, description="rows gathered (Arrow size) per Delta commit of a table's copy")

    def workers(self) -> int:
        return self.parallelism or os.cpu_count() or 1


class MirrorConfig(_Model):
    """``applier mirror``: snapshot the published tables, then follow the slot."""

    source: SourceSettings = Field(default_factory=SourceSettings, description=_SOURCE)
    target: TargetSettings = Field(description=_TARGET)
    tables: TablesSettings = Field(default_factory=TablesSettings, description=_TABLES)
    snapshot: SnapshotSettings = Field(default_factory=SnapshotSettings, description="the initial copy of the "
                                       "published tables (how many connections, chunk and commit sizes)")
    apply: ApplySettings = Field(default_factory=ApplySettings, description=_APPLY)
    spark: SparkConfig = Field(default_factory=SparkConfig, description=_SPARK)
    distributed: DistributedSettings = Field(
        default_factory=DistributedSettings, description="catching up a large backlog on Spark's executors")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings,
                                     description="Prometheus metrics and /healthz while the mirror runs")
    maintenance: MaintenanceSettings = Field(
        default_factory=MaintenanceSettings, description="compaction, VACUUM and checkpoints of the mirrored tables")


class CaptureConfig(_Model):
    """``applier capture``: drain a slot into a stored raw log (a Delta table) for replay later."""

    source: SourceSettings = Field(default_factory=SourceSettings, description=_SOURCE)
    log_path: str = Field(json_schema_extra=PATH,
                          description="the Delta table of raw messages (lsn, xid, data, seq, session, captured_at, "
                                      "catalog)")
    batch_changes: int = Field(10_000, ge=1, description="changes per peek (whole transactions are kept together)")
    spark: SparkConfig = Field(default_factory=SparkConfig, description=_SPARK)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings,
                                     description="Prometheus metrics and /healthz while capture runs")
