"""Values computed once per schema version (a row converter, a column layout).

Keyed by the version object's identity, not its value: the catalog makes a new ``SchemaVersion``
for every Relation change and never mutates one, and hashing a version by value would hash its
whole column list on every row. The cache keeps the versions it has seen alive, so an id is never
reused while the cache lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from applier.catalog.relations import SchemaVersion

T = TypeVar("T")


class PerSchemaVersion(Generic[T]):
    def __init__(self, make: Callable[[SchemaVersion], T]) -> None:
        self._make = make
        self._values: dict[int, T] = {}
        self._keep: list[SchemaVersion] = []

    def __getitem__(self, schema: SchemaVersion) -> T:
        value = self._values.get(id(schema))
        if value is None:
            value = self._make(schema)
            self._values[id(schema)] = value
            self._keep.append(schema)
        return value
