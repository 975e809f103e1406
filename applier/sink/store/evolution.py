"""The common schema changes, columns added and columns dropped, made without Spark by a store that
writes the table's metadata itself (delta-rs, the in-memory store); anything else (a rename, a
retype, a column name that needs column mapping) is declined and left to Spark's DDL
(applier.sink.store.sparkddl).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from applier.sink.naming import needs_column_mapping
from applier.sink.spec import PROP_COLUMN_NAMES, PROP_DROPPED, PROP_KEYS, Renames, SchemaEvolution, TableSpec
from applier.sink.store.deltatypes import delta_fields, delta_type
from applier.sink.zerocol import ROW_COLUMN

#: the schema changes' one logger, whichever engine makes them (what a log filter names)
log = logging.getLogger("applier.sink.schema")


class EvolvingStore(Protocol):
    """A store that reads and writes a table's schema and properties itself."""

    def schema_fields(self, path: str) -> list[dict[str, Any]]: ...

    def configuration(self, path: str) -> dict[str, str]: ...

    def add_columns(self, path: str, fields: list[dict[str, Any]]) -> None: ...

    def set_properties(self, path: str, properties: Mapping[str, str], *,
                       carry: tuple[str, int] | None = None) -> None: ...


def rename_suspects(have: list[str], spec: TableSpec,
                     earlier: set[str]) -> tuple[list[str], tuple[str, ...], tuple[str, ...]]:
    """The Delta columns that may have been renamed (in table order), those gone from the source, and
    the source columns new to Delta. Columns an earlier drop left in Delta (``earlier``), applier's own
    added columns and zerocol's ``_applier_row`` are no candidates."""
    source = spec.source_column_names
    own = set(spec.column_names) - set(source)
    old_order = [n for n in have if n not in own and n not in earlier and n != ROW_COLUMN]
    gone = tuple(n for n in old_order if n not in source)
    new = tuple(n for n in source if n not in have)
    return old_order, gone, new


def evolve_without_spark(store: EvolvingStore, path: str, spec: TableSpec,
                         renames: Renames | None) -> SchemaEvolution | None:
    """``evolve_table`` for the common changes, columns added and columns dropped, in a store that makes
    them without Spark (delta-rs, on a table it writes), None for anything else, left to
    ``evolve_table``: a rename, a retype, a column name that needs column mapping, a type that needs a
    table feature. Starting Spark for an ADD COLUMN costs a fresh process most of its run; the Delta log
    gets the same metaData either way."""
    have = {f["name"]: f["type"] for f in store.schema_fields(path)}
    configuration = store.configuration(path)
    earlier = set(json.loads(configuration.get(PROP_DROPPED) or "[]"))
    old_order, gone, new = rename_suspects(list(have), spec, earlier)
    if gone and new and renames is not None:
        from applier.catalog.relations import rename_candidates

        if renames(gone, new, rename_candidates(old_order, spec.source_column_names)):
            return None  # a rename: column mapping, through Spark
    added = [f for f in spec.schema if f.name not in have]
    if any(have[f.name] != delta_type(f.type) for f in spec.schema if f.name in have):
        return None  # a retype: widened, or the error, by evolve_table
    if needs_column_mapping([f.name for f in added]) or "timestamp_ntz" in json.dumps(delta_fields(added)):
        return None
    if added:
        # as ALTER TABLE ADD COLUMNS adds them
        store.add_columns(path, [dict(f, nullable=True) for f in delta_fields(added)])
    source_names = set(spec.column_names)
    dropped = tuple(n for n in have if n not in source_names and n != ROW_COLUMN)
    properties = recorded_changes(spec, configuration, dropped, {}, announce=bool(set(dropped) - earlier))
    if properties:
        store.set_properties(path, properties)
    return SchemaEvolution(tuple(f.name for f in added), (), dropped)


def recorded_changes(spec: TableSpec, configuration: Mapping[str, str], dropped: tuple[str, ...],
                     properties: dict[str, str], *, announce: bool) -> dict[str, str]:
    """``properties`` plus what records the source's dropped columns and its key, less what the table's
    ``configuration`` holds already: the properties an evolution sets. ``announce``: warn of the
    dropped columns (once, when they go)."""
    if dropped:
        if announce:
            log.warning("%s: columns %s were dropped in the source; kept in Delta, NULL from now on",
                        spec.source_name, ", ".join(dropped))
        properties[PROP_DROPPED] = json.dumps(sorted(dropped))
    keys = configuration.get(PROP_KEYS)
    if keys is not None and json.loads(keys) != list(spec.key_columns):
        properties[PROP_KEYS] = json.dumps(list(spec.key_columns))
    if spec.safe_names:  # the columns' names, those the source dropped (still in Delta) included
        earlier = json.loads(configuration.get(PROP_COLUMN_NAMES) or "{}")
        names = {d: p for d, p in earlier.items() if d in dropped} | spec.renamed_columns()
        properties[PROP_COLUMN_NAMES] = json.dumps(names, sort_keys=True)
    return {k: v for k, v in properties.items() if configuration.get(k) != v}
