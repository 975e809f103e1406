"""Where each mirrored table is written: a path, and optionally a name in Spark's catalog.

All writes go to a Delta path (idempotent writes, MERGE and schema evolution all work on paths).
A rule's ``table`` gives the table a catalog name as well: an existing catalog table is written at
its own location, and a name that does not exist yet is registered as an external Delta table over
the path once the table has been created, so that ``spark.table(name)`` reads the mirror.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from applier.errors import SinkError
from applier.sink.catalogclients import SparkSessionCatalog
from applier.sink.naming import quote_table_name, table_location
from applier.spark.session import SparkLike, SparkProvider

if TYPE_CHECKING:
    from applier.config import TablesSettings


class TableTargets:
    """Resolves ``schema.table`` to the Delta path it is mirrored at (and its catalog name, if any)."""

    def __init__(self, spark: SparkLike | None, target_dir: str, tables: TablesSettings) -> None:
        self.spark = SparkProvider.of(spark) if spark is not None else None  # only catalog names need it
        self.target_dir = target_dir
        self.tables = tables
        self._paths: dict[str, str] = {}
        self._unregistered: dict[str, str] = {}  # path -> catalog name still to register

    def catalog_name(self, namespace: str, name: str) -> str | None:
        rule = self.tables.rule_for(f"{namespace}.{name}")
        return rule.table if rule is not None else None

    def excluded_columns(self, namespace: str, name: str) -> set[str]:
        rule = self.tables.rule_for(f"{namespace}.{name}")
        return set(rule.exclude_columns) if rule is not None else set()

    def path_for(self, namespace: str, name: str) -> str:
        qualified = f"{namespace}.{name}"
        if qualified in self._paths:
            return self._paths[qualified]
        rule = self.tables.rule_for(qualified)
        path = rule.target if rule is not None and rule.target else str(table_location(
            self.target_dir, namespace, name, safe=self.tables.safe_path_names(qualified)))
        if rule is not None and rule.table:
            existing = self._catalog_location(rule.table, qualified)
            if existing is not None:
                path = existing
            else:
                self._unregistered[path] = rule.table
        self._paths[qualified] = path
        return path

    def _catalog_location(self, table: str, qualified: str) -> str | None:
        if self.spark is None:
            raise SinkError("a catalog table name needs a Spark session", table=qualified, catalog_table=table)
        spark = self.spark.get(f"the catalog table {table} (tables.rules)")
        if not spark.catalog.tableExists(table):
            return None
        detail = spark.sql(f"DESCRIBE DETAIL {quote_table_name(table)}").collect()[0]
        if (detail["format"] or "").lower() != "delta":
            raise SinkError("the catalog table is not a Delta table; name another table or drop it",
                            table=qualified, catalog_table=table, format=detail["format"])
        return str(detail["location"])

    def created(self, path: str) -> None:
        """The Delta table at ``path`` exists now: register its catalog name if it has one still unregistered."""
        name = self._unregistered.pop(path, None)
        if name is None or self.spark is None:
            return
        try:
            SparkSessionCatalog(self.spark.get(f"registering the catalog table {name}")).register(name, path)
        except Exception as e:  # noqa: BLE001 - the catalog's own error is the useful part
            self._unregistered[path] = name
            raise SinkError(f"could not register the catalog table: {e}", catalog_table=name, path=path,
                            hint="create its schema (CREATE SCHEMA ...) or fix the name in tables.rules") from e
