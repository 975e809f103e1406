"""``column_names: safe``: the name rule is reversible and injective (no two Postgres names give one Delta
name, whatever they hold), its result never needs Delta column mapping, and a table's spec maps its
columns and keys while the stream's rows still match by Postgres names."""

from __future__ import annotations

import random
import string

import pyarrow as pa
import pytest

from applier.config import TableRule, TablesSettings
from applier.sink.fold import safe_named
from applier.sink.naming import needs_column_mapping, postgres_column_name, safe_column_name
from applier.sink.spec import TableSpec, column_properties, with_added_columns
from applier.sink.store import InMemoryStore


@pytest.mark.parametrize(("name", "safe"), [
    ("Weird col", "Weird%20col"), ("a=b", "a%3Db"), ("100%", "100%25"), ("n (units)", "n%20%28units%29"),
    ("x,y;z", "x%2Cy%3Bz"), ("{t}\tn\n", "%7Bt%7D%09n%0A"), ("plain", "plain"), ("ünï.cødé", "ünï.cødé"),
    ("%20", "%2520"), ("", "")])
def test_the_rule_on_names_people_use(name: str, safe: str) -> None:
    assert safe_column_name(name) == safe
    assert postgres_column_name(safe) == name
    assert not needs_column_mapping([safe])


def test_random_names_round_trip_and_never_collide() -> None:
    rng = random.Random(50)
    alphabet = string.ascii_letters + " ,;{}()\n\t=%_.0123456789ÄéЖ"
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(20_000)}
    safe = {safe_column_name(n) for n in names}
    assert len(safe) == len(names)  # injective
    for name in names:
        assert postgres_column_name(safe_column_name(name)) == name
        assert not needs_column_mapping([safe_column_name(name)])


def test_a_spec_maps_columns_and_keys_and_says_which() -> None:
    spec = safe_named(TableSpec("s.t", pa.schema([("the id", pa.int32()), ("v", pa.string()), ("a=b", pa.int64())]),
                                ("the id",), "d"))
    assert spec.column_names == ("the%20id", "v", "a%3Db") and spec.key_columns == ("the%20id",)
    assert spec.postgres_column_names == ("the id", "v", "a=b")
    assert spec.renamed_columns() == {"the%20id": "the id", "a%3Db": "a=b"}
    assert spec.delta_name("x y") == "x%20y" and spec.postgres_name("x%20y") == "x y"
    wider = with_added_columns(spec, [pa.field("__op", pa.string())], "change feed")
    assert wider.safe_names and wider.postgres_column_names == ("the id", "v", "a=b")
    assert wider.renamed_columns() == spec.renamed_columns()  # applier's own columns are not mapped
    wanted, stale = column_properties(spec)
    assert wanted["applier.columnNames"] == '{"a%3Db": "a=b", "the%20id": "the id"}'
    assert "applier.columnNames" in column_properties(TableSpec("s.t", spec.schema, (), "f"))[1]


def test_a_kept_spec_is_the_identity() -> None:
    spec = TableSpec("s.t", pa.schema([("a b", pa.int32())]), (), "f")
    assert spec.postgres_column_names == ("a b",) and spec.renamed_columns() == {}
    assert spec.delta_name("a%20b") == "a%20b" and spec.postgres_name("a%20b") == "a%20b"


def test_a_rule_overrides_the_global_choice() -> None:
    tables = TablesSettings(column_names="safe", rules=[TableRule(match="s.raw", column_names="keep"),
                                                        TableRule(match="s.other", history=True)])
    assert tables.safe_column_names("s.t") and tables.safe_column_names("s.other")
    assert not tables.safe_column_names("s.raw")
    assert not TablesSettings().safe_column_names("s.t")
    assert TablesSettings(rules=[TableRule(match="s.*", column_names="safe")]).safe_column_names("s.t")


def _table(store: InMemoryStore, path: str, spec: TableSpec) -> None:
    from applier.sink.schema import _creation_properties
    from applier.sink.spec import TableOptions

    store.create(path, spec, TableOptions(), _creation_properties(spec, TableOptions()))


def _spec(*names: str, safe: bool) -> TableSpec:
    spec = TableSpec("s.t", pa.schema([(n, pa.int32()) for n in names]), (), "f")
    return safe_named(spec) if safe else spec


@pytest.mark.parametrize(("written", "now"), [
    (("id", "a b"), ("id", "a b")),  # one column to map
    (("a b", "a%20b"), ("a b", "a%20b")),  # a Postgres column literally named like the other's safe name
    (("100%",), ("100%",)),  # no character Delta refuses, only '%'
])
def test_a_table_written_under_one_choice_stops_under_the_other(written: tuple[str, ...], now: tuple[str, ...]) -> None:
    from applier.errors import ColumnNamesError
    from applier.sink.schema import _check_column_names

    for first in (False, True):
        store = InMemoryStore()
        _table(store, "t", _spec(*written, safe=first))
        _check_column_names(store, "t", _spec(*now, safe=first))  # the same choice: nothing to say
        with pytest.raises(ColumnNamesError, match="nothing was written"):
            _check_column_names(store, "t", _spec(*now, safe=not first))


def test_no_stop_where_nothing_is_written_differently() -> None:
    from applier.sink.schema import _check_column_names

    store = InMemoryStore()
    _table(store, "t", _spec("id", "v", safe=False))  # plain names: the same under both choices
    _check_column_names(store, "t", _spec("id", "v", "a b", safe=True))  # a new mapped column
    store = InMemoryStore()
    _table(store, "t", _spec("id", safe=True))  # under safe, nothing mapped then ({} listed)
    _check_column_names(store, "t", _spec("id", "a b", safe=False))  # keep adds "a b" as it is
    store = InMemoryStore()
    _table(store, "t", _spec("id", "gone col", safe=True))
    _check_column_names(store, "t", _spec("id", safe=False))  # the mapped column was dropped in the source


def test_back_to_safe_after_keep_added_a_column_to_a_safe_table_stops() -> None:
    """A table created under safe (nothing mapped), then given "a b" under keep, then safe again: its
    property says safe, but it holds "a b" under its Postgres name."""
    from applier.errors import ColumnNamesError
    from applier.sink.schema import _check_column_names

    store = InMemoryStore()
    _table(store, "t", _spec("id", "a b", safe=False))
    store.set_properties("t", {"applier.columnNames": "{}"})
    with pytest.raises(ColumnNamesError, match="'a b' as 'a b' \\(safe writes 'a%20b'\\)"):
        _check_column_names(store, "t", _spec("id", "a b", safe=True))
