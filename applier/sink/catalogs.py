"""Catalog registrations (``catalog: {kind: hive}``): every mirrored table, and its history and change feed
tables, registered by name as an external Delta table over its path, and kept in step with the tables.

Why a reconciliation and not one call per event: a table's name and path change in several places (a
copy, a table sync, a rename or a move to another schema followed, a table dropped and its name taken,
a table taken out of the publication), and a run can be killed between a Delta commit and a catalog
call. After each group (and the initial copy) the registrations wanted now are compared with those this
target made, kept in the state directory; only a difference starts Spark and changes the catalog, one
registration at a time, each saved as it is made, so a run killed in between finishes the rest.

A name the catalog holds that this target did not register (another team's table) is never replaced:
the run stops and says so.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from applier.errors import ConfigError, SinkError
from applier.sink.naming import quote_identifier, sql_string_literal

if TYPE_CHECKING:
    from applier.config.catalog import CatalogSettings
    from applier.sink.engine import DeltaApplier
    from applier.spark.session import SparkProvider
    from applier.state import StateDir

log = logging.getLogger(__name__)

#: the state file of the registrations this target made: catalog name (database.table) -> Delta path
STATE_KEY = "catalog_registrations"
_NOT_IN_NAMES = re.compile(r"[^a-z0-9_]")


def catalog_part(name: str) -> str:
    """A Postgres name as a Hive database or table name: lower case, any character other than a-z, 0-9 and
    '_' written '_' (the metastore refuses others, and folds case)."""
    return _NOT_IN_NAMES.sub("_", name.lower()) or "_"


def catalog_name(settings: CatalogSettings, source_name: str, kind: str = "mirror") -> str:
    """``database.table`` of the table ``source_name`` (schema.table) of ``kind`` (mirror, history, changes)."""
    schema, _, table = source_name.partition(".")
    suffix = {"history": settings.history_suffix, "changes": settings.changes_suffix}.get(kind, "")
    return f"{catalog_part(settings.database.format(schema=schema))}.{catalog_part(table + suffix)}"


def _same_location(a: str, b: str) -> bool:
    def plain(p: str) -> str:
        p = p.removeprefix("file://").removeprefix("file:")
        return p.rstrip("/")
    return plain(a) == plain(b)


class CatalogRegistrations:
    """The registrations of one target's tables in the catalog ``settings`` names."""

    def __init__(self, spark: SparkProvider, settings: CatalogSettings, state: StateDir, *,
                 followed: Callable[[str], bool] | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.state = state
        self.followed = followed  # None: every live table (a replay); a mirror: the tables it follows now
        self._registered: dict[str, str] | None = None

    def registered(self) -> dict[str, str]:
        """catalog name -> path of each registration this target made (and has not dropped)."""
        if self._registered is None:
            self._registered = dict(self.state.load(STATE_KEY) or {})
        return self._registered

    def wanted(self, applier: DeltaApplier) -> dict[str, str]:
        """catalog name -> path of every table that should be registered now: each live relation's Delta
        table that exists (and is followed), and its history and change feed tables that exist."""
        ids = applier.identities
        out: dict[str, str] = {}
        owners: dict[str, str] = {}
        if ids is None:
            return out
        for bound in ids.live():
            if self.followed is not None and not self.followed(bound.name):
                continue
            if applier.applied_lsn(bound.path, bound.name) is None:
                continue  # no Delta table yet
            rule = applier.tables.rule_for(bound.name)
            tables = [("mirror", bound.path)] if rule is None or not rule.table else []  # (a rule's name: its own)
            tables += [(kind, path) for kind, path, done in applier.derived_tables(bound.name) if done is not None]
            for kind, path in tables:
                name = catalog_name(self.settings, bound.name, kind)
                if name in out and out[name] != path:
                    raise ConfigError(
                        f"{owners[name]} and {bound.name} would both be registered as {name} in the catalog "
                        "(names are lower-cased, and characters other than a-z, 0-9 and _ become _); nothing was "
                        "registered for either. Give one a catalog name of its own (tables.rules: table:) or set "
                        "catalog.database", catalog_name=name)
                out[name], owners[name] = path, bound.name
        return out

    def sync(self, applier: DeltaApplier) -> None:
        """Make the catalog hold exactly the registrations wanted now (a no-op, without Spark or a request,
        when it does). A catalog that does not answer is an outage (SinkError: run again; what was made is
        kept)."""
        wanted = self.wanted(applier)
        if wanted == self.registered():
            return
        try:
            self._sync(self._client(), wanted)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the catalog's own error is the useful part
            raise SinkError(f"the catalog refused or did not answer a registration: {str(e).splitlines()[0]}; "
                            "the Delta tables are written, and the next run makes the registrations still "
                            "missing", catalog=f"{self.settings.kind} {self.settings.uri or ''}".strip()) from e

    def _client(self) -> CatalogClient:
        if self.settings.kind == "glue":
            return GlueCatalog(self.settings.uri)
        return HiveCatalog(self.spark.get(f"registering tables in the catalog (catalog.kind: {self.settings.kind})"))

    def _sync(self, catalog: CatalogClient, wanted: dict[str, str]) -> None:
        registered = self.registered()
        for name in sorted(set(registered) - set(wanted)):  # renamed, moved, dropped or no longer published
            catalog.drop(name)  # (an external table: its files stay)
            log.info("catalog: %s dropped (no such table follows it now; its Delta table stays at %s)",
                     name, registered[name])
            del registered[name]
            self.state.save(STATE_KEY, registered)
        for name, path in sorted(wanted.items()):
            if registered.get(name) == path:
                continue
            catalog.create_database(name.partition(".")[0])
            there = catalog.location(name)
            if there is not None and not _same_location(there, path):
                if name not in registered:
                    raise ConfigError(
                        f"the catalog name {name} is taken by a table at {there}, which this mirror did not "
                        f"register; nothing was changed. Drop or rename that table in the catalog, or give the "
                        f"table at {path} another name (catalog.database, or tables.rules: table:)",
                        catalog_name=name, path=path, catalog_location=there)
                catalog.drop(name)
                there = None
            if there is None:
                catalog.register(name, path)
                log.info("catalog: %s registered over %s", name, path)
            registered[name] = path
            self.state.save(STATE_KEY, registered)


class CatalogClient(Protocol):
    """What a registration asks of a catalog: names are ``database.table``, each part a plain lower-case name."""

    def location(self, name: str) -> str | None:
        """Where the catalog's table ``name`` is (None: no such table)."""
        ...

    def create_database(self, database: str) -> None:
        """The database, made when missing."""
        ...

    def register(self, name: str, path: str) -> None:
        """``name`` registered as an external Delta table over ``path``."""
        ...

    def drop(self, name: str) -> None:
        """``name`` no longer registered (its files are not touched); none is fine."""
        ...


class HiveCatalog:
    """A Hive Metastore, through the Spark session's catalog (``spark.sql.catalogImplementation=hive``)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    @staticmethod
    def _quoted(name: str) -> str:
        database, _, table = name.partition(".")
        return f"{quote_identifier(database)}.{quote_identifier(table)}"

    def location(self, name: str) -> str | None:
        if not self.spark.catalog.tableExists(name):
            return None
        rows = self.spark.sql(f"DESCRIBE TABLE EXTENDED {self._quoted(name)}").collect()
        found = next((r["data_type"] for r in rows if r["col_name"] == "Location"), None)
        return str(found) if found is not None else ""

    def create_database(self, database: str) -> None:
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}")

    def register(self, name: str, path: str) -> None:
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {self._quoted(name)} USING DELTA LOCATION "
                       f"{sql_string_literal(path)}")

    def drop(self, name: str) -> None:
        self.spark.sql(f"DROP TABLE IF EXISTS {self._quoted(name)}")


class GlueCatalog:
    """AWS Glue's Data Catalog through boto3 (credentials and region as boto3 finds them; ``endpoint``: another
    endpoint than AWS's, e.g. a local one). A table is registered as Athena and Spark on AWS read Delta:
    ``table_type`` DELTA, ``spark.sql.sources.provider`` delta, its location (the schema is in its log)."""

    def __init__(self, endpoint: str | None) -> None:
        try:
            import boto3  # type: ignore[import-untyped]
        except ImportError as e:
            raise ConfigError("catalog.kind glue needs boto3: pip install 'applier[glue]'") from e
        # AWS_REGION as delta-rs reads it, where boto3 would ask for AWS_DEFAULT_REGION
        region = os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or None
        self.glue = boto3.client("glue", endpoint_url=endpoint or None, region_name=region)

    def location(self, name: str) -> str | None:
        database, _, table = name.partition(".")
        try:
            found = self.glue.get_table(DatabaseName=database, Name=table)["Table"]
        except self.glue.exceptions.EntityNotFoundException:
            return None
        return str(found.get("StorageDescriptor", {}).get("Location") or "")

    def create_database(self, database: str) -> None:
        try:
            self.glue.create_database(DatabaseInput={"Name": database})
        except self.glue.exceptions.AlreadyExistsException:
            pass

    def register(self, name: str, path: str) -> None:
        database, _, table = name.partition(".")
        self.glue.create_table(DatabaseName=database, TableInput={
            "Name": table, "TableType": "EXTERNAL_TABLE",
            "Parameters": {"table_type": "DELTA", "spark.sql.sources.provider": "delta", "EXTERNAL": "TRUE"},
            "StorageDescriptor": {"Location": path, "SerdeInfo": {"Parameters": {"path": path}}}})

    def drop(self, name: str) -> None:
        database, _, table = name.partition(".")
        try:
            self.glue.delete_table(DatabaseName=database, Name=table)
        except self.glue.exceptions.EntityNotFoundException:
            pass
