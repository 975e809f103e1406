"""Relation and Type cache by OID, with schema versions (what PostgreSQL's logicalrep relmap does)."""

from applier.catalog.relations import RelationCache, SchemaChange, SchemaVersion, TypeCache, TypeInfo

__all__ = ["RelationCache", "SchemaChange", "SchemaVersion", "TypeCache", "TypeInfo"]
