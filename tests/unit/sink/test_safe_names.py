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
from applier.sink.spec import TableSpec, fresh_copy_properties, with_added_columns


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
    wanted, stale = fresh_copy_properties(spec)
    assert wanted["applier.columnNames"] == '{"a%3Db": "a=b", "the%20id": "the id"}'
    assert "applier.columnNames" in fresh_copy_properties(TableSpec("s.t", spec.schema, (), "f"))[1]


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
