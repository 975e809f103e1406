"""Job configuration: YAML files validated by pydantic models.

Every model forbids unknown keys (a typo must not silently fall back to a default), every field says
what it is for, and the DSN is a secret that never prints. Errors name the file, the line and the
dotted key, and say why.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from applier.errors import ConfigError


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceSettings(_Model):
    """Where the changes come from: a PostgreSQL logical replication slot."""

    dsn: SecretStr | None = Field(None, description="libpq connection string; prefer dsn_env")
    dsn_env: str = Field("APPLIER_DSN", description="environment variable holding the DSN when dsn is unset")
    slot: str = Field("applier", description="logical replication slot (pgoutput); created when absent")
    publication: str = Field("applier", description="publication whose tables are mirrored")
    proto_version: Literal[1, 2, 3, 4] = Field(1, description="pgoutput protocol version")
    streaming: Literal["off", "on", "parallel"] = Field(
        "off", description="stream in-progress transactions (on: proto >= 2, parallel: proto >= 4, PG 16+)")
    two_phase: bool = Field(False, description="decode prepared transactions (proto >= 3, PG 15+)")
    binary: bool = Field(False, description="binary column values (PG 14+)")
    messages: bool = Field(False, description="receive pg_logical_emit_message messages (PG 14+)")
    origin: Literal["any", "none"] | None = Field(
        None, description="server-side origin filter (PG 16+): none = only changes without an origin")
    read_mode: Literal["replication", "sql"] = Field(
        "replication", description="streaming replication protocol, or SQL peek/advance")
    max_retries: int = Field(
        10, ge=0, description="mirror: reconnect attempts after the connection drops or the server restarts "
        "(backoff 1 s doubling to 30 s); counted per outage, then the mirror stops with the last error")

    @model_validator(mode="after")
    def _versions(self) -> SourceSettings:
        if self.streaming == "on" and self.proto_version < 2:
            raise ValueError("streaming: on needs proto_version >= 2")
        if self.streaming == "parallel" and self.proto_version < 4:
            raise ValueError("streaming: parallel needs proto_version 4")
        if self.two_phase and self.proto_version < 3:
            raise ValueError("two_phase needs proto_version >= 3")
        return self

    def with_overrides(self, **values: object) -> SourceSettings:
        """A copy with the given settings replaced (command-line flags; None means not given), validated."""
        given = {k: v for k, v in values.items() if v is not None}
        return SourceSettings.model_validate({**self.model_dump(), **given}) if given else self

    def resolved_dsn(self) -> str:
        """The DSN from the config or the environment; the error never shows the value."""
        if self.dsn is not None:
            return self.dsn.get_secret_value()
        value = os.environ.get(self.dsn_env)
        if not value:
            raise ConfigError(f"no DSN: set source.dsn or the environment variable {self.dsn_env}")
        return value


class TableRule(_Model):
    """Per-table settings for the tables a glob matches (``schema.table``, e.g. ``shop.*``)."""

    match: str = Field(description="glob over 'schema.table'")
    target: str | None = Field(None, description="Delta path for this table (default <target>/<schema>/<table>)")
    table: str | None = Field(
        None, description="catalog table name (e.g. 'lake.shop_orders'): an existing Delta table is written at its "
        "location; a new name is registered as an external table over the path")
    key_columns: list[str] | None = Field(
        None, description="key to merge on for tables without a primary key (else the replica identity)")
    exclude_columns: list[str] = Field(default_factory=list, description="columns not mirrored")
    # Delta table options: applied when the table is created and never to an existing table (a mismatch is
    # a warning and shows in `applier status`). Each may add a Delta table feature; see the README's
    # "Delta table features" for which of them readers outside Spark (delta-rs) can open.
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


class TablesSettings(_Model):
    """Which published tables are mirrored, and how."""

    include: list[str] = Field(default_factory=lambda: ["*"], description="globs over 'schema.table'")
    exclude: list[str] = Field(default_factory=list, description="globs over 'schema.table'")
    rules: list[TableRule] = Field(default_factory=list, description="first matching rule wins")

    def selected(self, qualified_name: str) -> bool:
        return any(fnmatch.fnmatchcase(qualified_name, p) for p in self.include) and not any(
            fnmatch.fnmatchcase(qualified_name, p) for p in self.exclude)

    def rule_for(self, qualified_name: str) -> TableRule | None:
        return next((r for r in self.rules if fnmatch.fnmatchcase(qualified_name, r.match)), None)


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
    max_group_seconds: float = Field(
        5.0, gt=0, description="mirror: the longest a committed transaction waits in a group before it is "
        "applied (a group is applied sooner, as soon as the stream has nothing more buffered)")
    unresolved_toast: Literal["error"] = Field(
        "error", description="an unchanged TOAST value with no row to take it from stops the apply")
    schema_changes: Literal["evolve", "stop"] = Field(
        "evolve", description="evolve: add columns, widen types, keep dropped ones; stop: error")
    truncate: Literal["apply", "error"] = Field("apply", description="apply TRUNCATE, or stop on one")
    special_values: Literal["error", "clamp", "null"] = Field(
        "error", description="values Spark cannot hold (infinity dates, BC years, numeric NaN)")
    skip_origins: list[str] = Field(default_factory=list,
                                    description="drop transactions from these replication origins")
    skip_any_origin: bool = Field(False, description="drop every transaction that has an origin")
    memory_budget_mb: int = Field(256, ge=1, description="buffered changes per transaction before spilling")
    skip_transactions: list[str] = Field(
        default_factory=list,
        description="commit LSNs (as in '0/16B3748') of transactions to leave out, like ALTER SUBSCRIPTION "
        "... SKIP: the way past a transaction the applier stopped on (bad bytes, a value that cannot be "
        "converted). A prepared transaction is skipped by its prepare LSN or its Commit Prepared LSN. "
        "Each skip is recorded in the audit table <state_dir>/skipped_transactions")

    @field_validator("skip_transactions")
    @classmethod
    def _lsns(cls, values: list[str]) -> list[str]:
        from applier.lsn import format_lsn, parse_lsn

        try:
            return [format_lsn(parse_lsn(v)) for v in values]
        except Exception as e:  # noqa: BLE001 - pydantic reports it with the key
            raise ValueError(f"not an LSN like 0/16B3748: {e}") from None
    messages_table: str | None = Field(
        None, description="record pg_logical_emit_message messages (messages: true) in this Delta table path")


class SparkConfig(_Model):
    """The SparkSession the job runs on (ignored when the job is given a session).

    ``master`` is a fallback: a master that spark-submit (``--master``), ``PYSPARK_SUBMIT_ARGS``, the
    ``MASTER`` environment variable or ``spark-defaults.conf`` already set wins, so
    ``spark-submit --master spark://host:7077 jobs/mirror.py ...`` runs on that cluster."""

    master: str | None = Field(
        None, description="Spark master used only when spark-submit, PYSPARK_SUBMIT_ARGS, $MASTER or "
        "spark-defaults.conf set none (then 'local[2]' when unset here too)")
    app_name: str = "applier"
    shuffle_partitions: int = Field(2, ge=1)
    driver_memory: str = "2g"
    conf: dict[str, str] = Field(default_factory=dict, description="extra Spark settings")


class TargetSettings(_Model):
    """Where the Delta tables go: ``<path>/<schema>/<table>`` unless a table rule says otherwise."""

    path: str = Field(description="root directory of the mirrored Delta tables")
    state_dir: str | None = Field(None, description="applier state (catalog, staged prepares); default <path>/_applier")


class ReplayConfig(_Model):
    """``applier replay``: apply a stored raw log (Parquet or Delta: lsn, xid, data) to Delta tables."""

    source_log: str = Field(description="path of the raw log")
    target: TargetSettings
    tables: TablesSettings = Field(default_factory=TablesSettings)
    apply: ApplySettings = Field(default_factory=ApplySettings)
    spark: SparkConfig = Field(default_factory=SparkConfig)


class MirrorConfig(_Model):
    """``applier mirror``: snapshot the published tables, then follow the slot."""

    source: SourceSettings = Field(default_factory=SourceSettings)
    target: TargetSettings
    tables: TablesSettings = Field(default_factory=TablesSettings)
    apply: ApplySettings = Field(default_factory=ApplySettings)
    spark: SparkConfig = Field(default_factory=SparkConfig)


class CaptureConfig(_Model):
    """``applier capture``: drain a slot into a stored raw log (a Delta table) for replay later."""

    source: SourceSettings = Field(default_factory=SourceSettings)
    log_path: str = Field(description="the Delta table of raw messages (lsn, xid, data, seq, session, captured_at)")
    batch_changes: int = Field(10_000, ge=1, description="changes per peek (whole transactions are kept together)")
    spark: SparkConfig = Field(default_factory=SparkConfig)


def load_config(path: str | Path, model: type[_Model]) -> Any:
    """Load and validate ``path`` as ``model``; ConfigError names file, line, key and reason."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file: {e.strerror}", file=str(path)) from e
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(f"not valid YAML: {getattr(e, 'problem', e)}", file=str(path),
                          line=mark.line + 1 if mark else None) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError("a config file must be a mapping of settings", file=str(path))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        loc = [p for p in first["loc"]]
        key = ".".join(str(p) for p in loc) or "(top level)"
        raise ConfigError(f"{key}: {first['msg']}", file=str(path), line=_line_of(node, loc),
                          problems=len(e.errors())) from None


def _line_of(node: yaml.Node | None, loc: list[Any]) -> int | None:
    """1-based line of the deepest YAML node along ``loc`` (for error messages)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line = match[0].start_mark.line + 1
            node = match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
