"""What a catalog registration asks of a catalog, and the catalogs that answer: the Spark session's (a Hive
Metastore under ``catalog.kind: hive``, and where a rule's ``table:`` is registered) and AWS Glue's. Below
the registrations (applier.sink.catalogs) and the table targets (applier.sink.targets), which both use them."""

from __future__ import annotations

import os
from typing import Any, Protocol

from applier.errors import ConfigError
from applier.sink.naming import quote_identifier, quote_table_name, sql_string_literal


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


class SparkSessionCatalog:
    """The Spark session's catalog: a Hive Metastore under ``catalog.kind: hive``
    (``spark.sql.catalogImplementation=hive``), and where a rule's ``table:`` is registered
    (applier.sink.targets)."""

    def __init__(self, spark: Any) -> None:
        self.spark = spark

    def location(self, name: str) -> str | None:
        if not self.spark.catalog.tableExists(name):
            return None
        rows = self.spark.sql(f"DESCRIBE TABLE EXTENDED {quote_table_name(name)}").collect()
        found = next((r["data_type"] for r in rows if r["col_name"] == "Location"), None)
        return str(found) if found is not None else ""

    def create_database(self, database: str) -> None:
        self.spark.sql(f"CREATE DATABASE IF NOT EXISTS {quote_identifier(database)}")

    def register(self, name: str, path: str) -> None:
        self.spark.sql(f"CREATE TABLE IF NOT EXISTS {quote_table_name(name)} USING DELTA LOCATION "
                       f"{sql_string_literal(path)}")

    def drop(self, name: str) -> None:
        self.spark.sql(f"DROP TABLE IF EXISTS {quote_table_name(name)}")


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
