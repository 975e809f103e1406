"""The ``catalog`` section: registering the mirrored tables by name where other engines look them up."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from applier.config.base import SettingsModel


class CatalogSettings(SettingsModel):
    """Where each mirrored table (and its history and change feed tables) is registered as an external Delta
    table, and kept in step with Postgres: registered when its Delta table is made, moved with a rename or
    a move to another schema, dropped from the catalog when the table is dropped or leaves the publication
    (docs/delta-tables.md, "Catalog registrations")."""

    kind: Literal["none", "hive", "glue"] = Field(
        "none", description="none: tables are found by path only (a rule's `table` still names one in Spark's "
        "catalog). hive: every table is registered in a Hive Metastore through Spark (the run starts Spark when "
        "a registration changes). glue: in AWS Glue's Data Catalog through boto3 (pip install 'applier[glue]'; "
        "credentials and region as boto3 finds them), as Athena and Spark on AWS read Delta tables")
    uri: str | None = Field(
        None, description="hive: the metastore's Thrift URI (thrift://host:9083), given to Spark as "
        "hive.metastore.uris; unset: the Spark session's own Hive settings (hive-site.xml, spark.conf). glue: "
        "an endpoint other than AWS's (unset: AWS's, or AWS_ENDPOINT_URL_GLUE)")
    database: str = Field(
        "{schema}", description="the database each table is registered in; {schema} is its Postgres schema. Names "
        "are lower-cased and every character other than a-z, 0-9 and _ becomes _ ('Sales Ü' -> sales__)")
    history_suffix: str = Field("__history", description="a history table's name: its table's name and this")
    changes_suffix: str = Field("__changes", description="a change feed table's name: its table's name and this")

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings this catalog needs (a session applier starts; a session given to it is as it is)."""
        if self.kind != "hive":
            return {}
        conf = {"spark.sql.catalogImplementation": "hive"}
        if self.uri:
            conf["spark.hadoop.hive.metastore.uris"] = self.uri
        return conf
