"""Catalog names of mirrored tables (applier.sink.catalogs): what a Hive Metastore holds (lower case,
a-z, 0-9 and _), the database template and the derived tables' suffixes."""

from __future__ import annotations

from applier.config import CatalogSettings
from applier.sink.catalogs import catalog_name, catalog_part


def test_catalog_names_are_what_hive_holds() -> None:
    settings = CatalogSettings(kind="hive")
    assert catalog_name(settings, "Sales Ü.Mixed Case") == "sales__.mixed_case"
    assert catalog_name(settings, "shop.orders", "history") == "shop.orders__history"
    prefixed = CatalogSettings(kind="hive", database="pg_{schema}")
    assert catalog_name(prefixed, "shop.x", "changes") == "pg_shop.x__changes"
    assert catalog_part("") == "_"
