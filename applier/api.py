"""The Python API: the CLI's jobs for notebooks and jobs that already have a SparkSession.

Each function takes the session and a config given as a model (``applier.config.ReplayConfig``,
``MirrorConfig``), a path to a YAML file (read exactly as ``--config`` reads it: relative paths from
the file's folder, ``APPLIER_*`` variables override), or a plain dict of the same settings. They raise
``applier.errors.ApplierError`` subclasses (``ConfigError``, ``SourceError``, ``DataError``) instead of
exiting, and report progress on the ``applier.<job>`` logger.

    import applier
    summary = applier.replay(spark, {"source_log": "/lake/raw-log", "target": {"path": "/lake/mirror"}})
    print("\\n".join(summary.lines()))
    applier.mirror(spark, "configs/mirror.yaml", once=True)   # DSN from source.dsn or $APPLIER_DSN
    bad = [r for r in applier.verify(spark, "configs/mirror.yaml") if not r.equal]
    frames = applier.read_consistent(spark, "/lake/mirror", ["public.orders", "public.order_lines"])
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel

from applier.commands.logsetup import progress as log_progress
from applier.config import MirrorConfig, ReplayConfig, TablesSettings, libpq_env_given
from applier.config.files import load_config, validate_mapping
from applier.errors import ConfigError
from applier.infra.progress import Progress

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from applier.checks.cuts import At
    from applier.checks.verify import TableComparison
    from applier.drivers.mirror import MirrorSummary
    from applier.drivers.replay import ReplaySummary
    from applier.sink.cuts import Cut
    from applier.spark.session import SparkLike
    from applier.values.special import SpecialValuePolicy

M = TypeVar("M", bound=BaseModel)
ConfigLike = BaseModel | str | Path | Mapping[str, Any]


def as_config(config: ConfigLike, model: type[M]) -> M:
    """``config`` as ``model``: the model itself, a YAML file's path, or a mapping of settings."""
    if isinstance(config, model):
        return config
    if isinstance(config, str | Path):
        return load_config(config, model)
    if isinstance(config, Mapping):
        return validate_mapping(config, model)
    raise ConfigError(f"expected a {model.__name__}, a path to a YAML file or a dict, not {type(config).__name__}")


def replay(spark: SparkSession, config: ReplayConfig | str | Path | Mapping[str, Any], *,
           progress: Progress | None = None,
           dry_run: Callable[[str], None] | None = None) -> ReplaySummary:
    """Apply a stored raw log to Delta tables, exactly once and in commit order (``applier replay``).

    Returns the summary (transactions applied or already applied, row changes per table, LSN reached).
    With ``dry_run``, each commit that would be made is described to it and nothing is written.
    A transaction that cannot be applied raises ``DataError`` after every earlier one is applied."""
    import logging

    from applier.checks.position import check_log_continues_target
    from applier.drivers.replay import replay_log
    from applier.drivers.writer import target_writer

    cfg = as_config(config, ReplayConfig)
    # the CLI's guards (one writer, stale spill, the target registry, the log's position), here too
    with target_writer(cfg.target.path, cfg.target.state_dir, command="replay", dry_run=dry_run is not None):
        for warning in check_log_continues_target(cfg.target.path, cfg.source_log):
            logging.getLogger("applier.replay").warning("%s", warning)
        return replay_log(spark, cfg, progress=progress or log_progress("replay"), dry_run=dry_run)


def mirror(spark: SparkSession, config: MirrorConfig | str | Path | Mapping[str, Any], *, once: bool = True,
           progress: Progress | None = None, stop: threading.Event | None = None) -> MirrorSummary:
    """Copy a publication's tables into Delta under the slot's snapshot, then follow the slot (``applier mirror``).

    ``once=True`` (the default here, unlike the CLI) drains what is committed when it starts and returns;
    ``once=False`` runs until ``stop`` is set. The DSN is parsed and one connection made first, so a
    wrong DSN raises ``ConfigError`` or ``SourceError`` at once, without retries."""
    from applier.drivers.mirror import mirror as run_mirror
    from applier.sources.dsn import check_connection

    cfg = as_config(config, MirrorConfig)
    from applier.drivers.writer import target_writer

    with target_writer(cfg.target.path, cfg.target.state_dir, command="mirror",  # as the CLI: one writer etc.
                       config_file=str(config) if isinstance(config, str | Path) else None):
        check_connection(cfg.source.resolved_dsn())
        return run_mirror(spark, cfg, once=once, progress=progress or log_progress("mirror"), stop=stop)


@dataclass(frozen=True, slots=True)
class VerifyPlan:
    """What ``verify`` compares, settled (and the DSN checked) before Spark is needed."""

    dsn: str = field(repr=False)
    target: str  # a local directory or an object-store URI (never a Path: it would fold s3:// to s3:/)
    settings: TablesSettings | None = None
    publication: str | None = None
    only: tuple[str, ...] = ()
    policy: SpecialValuePolicy = "error"  # the mirror's apply.special_values: Postgres values are read under it


def plan_verify(config: MirrorConfig | str | Path | Mapping[str, Any] | None = None, *, dsn: str | None = None,
                target: str | Path | None = None, tables: Sequence[str] = (),
                special_values: SpecialValuePolicy | None = None) -> VerifyPlan:
    """The DSN, target, table selection and value policy from a mirror config and/or explicit values
    (``special_values`` over the config's ``apply.special_values``), the DSN checked."""
    from applier.sources.dsn import check_connection

    if config is not None:
        cfg = as_config(config, MirrorConfig)
        dsn = cfg.source.resolved_dsn() if dsn is None else dsn
        plan = VerifyPlan(dsn, str(target or cfg.target.path), cfg.tables, cfg.source.publication, tuple(tables),
                          special_values or cfg.apply.special_values)
    else:
        if dsn is None:
            dsn = os.environ.get("APPLIER_DSN") or ("" if libpq_env_given() else None)
        if dsn is None:
            raise ConfigError("no DSN: pass --dsn, set APPLIER_DSN or libpq's PGHOST / PGSERVICE variables, or "
                              "give --config")
        if not target:
            raise ConfigError("no target: pass --target or --config")
        plan = VerifyPlan(dsn, str(target), only=tuple(tables), policy=special_values or "error")
    check_connection(plan.dsn)
    return plan


def verify_plan(spark: SparkLike | None, plan: VerifyPlan) -> list[TableComparison]:
    """Run a settled plan (the CLI's second half; ``spark`` a session or a provider that starts one for
    a table delta-rs cannot read)."""
    import psycopg

    from applier.checks.verify import verify_against_postgres
    from applier.sink.naming import mirrored_table_dirs, source_name_of

    with psycopg.connect(plan.dsn, autocommit=True) as conn:
        if plan.publication is not None:  # the config's tables, wherever its rules put them
            from applier.sources.publication import published_selection

            names = [(t.namespace, t.name) for t in published_selection(conn, plan.publication,
                                                                 plan.settings or TablesSettings())]
        else:
            names = [source_name_of(d) for d in mirrored_table_dirs(plan.target)]  # path escapes decoded
        if plan.only:
            names = [t for t in names if f"{t[0]}.{t[1]}" in set(plan.only)]
        if not names:
            raise ConfigError("no mirrored Delta tables found", target=str(plan.target))
        return verify_against_postgres(spark, conn, str(plan.target), names, plan.settings, plan.publication,
                                       policy=plan.policy)


def verify(spark: SparkSession, config: MirrorConfig | str | Path | Mapping[str, Any] | None = None, *,
           dsn: str | None = None, target: str | Path | None = None,
           tables: Sequence[str] = (), special_values: SpecialValuePolicy | None = None) -> list[TableComparison]:
    """Compare mirrored Delta tables with Postgres, row by row (``applier verify``).

    Give a mirror config (its DSN, target, table selection and rules), or ``dsn`` and ``target`` (every
    Delta table under ``target/<schema>/<table>``); ``tables`` limits it to these ``schema.table`` names.
    ``special_values`` is the policy the mirror was written with (default: the config's).
    Returns one comparison per table: ``.equal``, row counts, and the rows found on one side only."""
    return verify_plan(spark, plan_verify(config, dsn=dsn, target=target, tables=tables,
                                          special_values=special_values))


def cut(target: str | Path, at: At = None) -> Cut:
    """The newest consistent cut of the mirror at ``target`` (``applier cut``): the end LSN of a group, its
    source commit time and, per table (mirrored, history, change feed), the Delta version holding exactly
    the source transactions up to that LSN. ``at``: the newest cut at or before an LSN (an int or
    PostgreSQL's ``'0/16B3748'``) or a time (a ``datetime``, or ISO 8601 text; naive means UTC), compared
    with the source commit time. Raises ``NoCutError`` when there is none. Reads the cuts table with
    delta-rs: no Spark."""
    from applier.checks.cuts import find_cut

    return find_cut(target, at)


def read_consistent(spark: SparkSession, target: str | Path, tables: Sequence[str], at: At = None) -> dict[
        str, DataFrame]:
    """One DataFrame per table, all at one consistent cut (``cut(target, at)``): read together, they are
    exactly what Postgres had when the cut's transaction committed, however the mirror's groups land
    meanwhile. ``tables``: mirrored tables' ``schema.table``, or any table's path relative to the target
    (``_history/public/orders``). Each is read with ``versionAsOf``; a table the cut lacks raises
    ``ConfigError``."""
    from applier.checks.cuts import find_cut, table_at

    chosen = find_cut(target, at)
    frames: dict[str, DataFrame] = {}
    for table in tables:
        entry, path = table_at(chosen, target, table, spark)
        frames[table] = spark.read.format("delta").option("versionAsOf", entry.version).load(path)
    return frames
