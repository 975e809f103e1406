"""Which delta-rs tables read as Spark reads them, and their values as a Spark row holds them: what the
delta-rs store (applier.sink.store.deltars) and its commits that read the target first (``rsmerge``,
``readback``) ask. A module of its own so that those import it, not the store class that calls them.
"""

from __future__ import annotations

from typing import Any

#: reader features delta-rs reads and writes as Spark does (a table with any other is read through Spark)
READER_FEATURES = {"timestampNtz"}
#: reader features whose rows delta-rs's DataFusion scan gives as Spark does (``DeltaRsStore.scan``): it
#: applies deletion vectors, where a pyarrow dataset of the files (the commits that read the target first)
#: would read the rows they delete too
SCAN_FEATURES = READER_FEATURES | {"deletionVectors"}


def reads_rows(table: Any) -> bool:
    """Whether delta-rs reads the rows of this opened ``deltalake.DeltaTable`` as Spark reads them (see
    ``DeltaRsStore.can_scan``); a commit that must read the target first (applier.sink.store.rsmerge)
    asks it too."""
    return _reads_within(table, READER_FEATURES)


def scans_rows(table: Any) -> bool:
    """Whether ``DeltaRsStore.scan`` reads the rows of this opened ``deltalake.DeltaTable`` as Spark
    reads them: what ``reads_rows`` accepts, and deletion vectors (applied by DataFusion's scan)."""
    return _reads_within(table, SCAN_FEATURES)


def _reads_within(table: Any, features: set[str]) -> bool:
    """The table's reader protocol asks for nothing beyond ``features``."""
    protocol = table.protocol()
    version = int(protocol.min_reader_version)
    return version == 1 or (version == 3 and set(protocol.reader_features or ()) <= features)


def spark_like(column: Any) -> list[Any]:
    """A pyarrow column's values as a Spark row holds them: a struct as a tuple in field order (Spark's
    ``Row``), a map as a dict, lists of those likewise; everything else as pyarrow gives it (instants
    as aware UTC datetimes, as verify reads Spark's)."""
    import pyarrow as pa

    def nested(t: Any) -> bool:
        return bool(pa.types.is_struct(t) or pa.types.is_map(t) or
                    ((pa.types.is_list(t) or pa.types.is_large_list(t)) and nested(t.value_type)))

    def convert(value: Any, t: Any) -> Any:
        if value is None:
            return None
        if pa.types.is_struct(t):
            return tuple(convert(value[f.name], f.type) for f in t)
        if pa.types.is_map(t):
            return {convert(k, t.key_type): convert(v, t.item_type) for k, v in value}
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return [convert(v, t.value_type) for v in value]
        return value

    values = column.to_pylist()
    if not nested(column.type):
        return values  # type: ignore[no-any-return]
    return [convert(v, column.type) for v in values]
