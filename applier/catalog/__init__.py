"""Relation and Type cache by OID, with schema versions (what PostgreSQL's logicalrep relmap does)."""

from applier.catalog.per_version import PerSchemaVersion
from applier.catalog.relations import RelationCache, SchemaChange, SchemaVersion, TypeCache, TypeInfo

__all__ = ["PerSchemaVersion", "RelationCache", "SchemaChange", "SchemaVersion", "TypeCache", "TypeInfo"]
