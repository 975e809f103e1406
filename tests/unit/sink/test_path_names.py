"""Schema and table names as directory names (applier.sink.naming): every name round-trips, no two names
share a directory, and no directory name means anything else to a reader that percent-decodes paths
(delta-rs and Polars decode ``%XX`` in a local path once before they read the table's log:
docs/delta-tables.md, "Directory names"). Under ``path_names: safe`` no directory name holds anything a
URL escapes. A directory an earlier release wrote with URL escapes still decodes to its name, and a table
there is still found."""

from __future__ import annotations

import random
import re
import string
from pathlib import Path
from urllib.parse import quote, unquote

import pytest

from applier.errors import ConfigError
from applier.sink.naming import (
    RESERVED_SCHEMA_DIRS,
    RESERVED_TABLE_DIRS,
    _legacy_path_component,
    _path_component,
    decode_path_component,
    mirrored_table_dirs,
    source_name_of,
    table_location,
)

CONTROL = "".join(map(chr, range(0x20))) + "\x7f"
NAMES = [".", "..", "...", "a.b", "_applier", "_delta_log", "_history", "_changes", "_retired", "_x", "a/b", "/",
         "../..", "a\\b", "\\", "100%", "%", "%25", "%2E", "%2E.", "%2E%2E", "%5Fapplier", "%u2E", "%u2E.",
         "%u25", "%uZZ", "x\n2026-12-07T00:00:00.000Z ERROR applier.fake: forged", "\n", "\r\n", "\t", "\x00",
         "\x1b[31mred", "\x7f", "a b", "ünï.cødé", "tab le.\"q\"`ü", "plain", "%%", "%u", "u2E", "~", "~41",
         "a~7E", "~2E.", "~5Fapplier", "~c3", "Mixed Case", "日本語", "😀"]


def _forbidden(decoded: str, reserved: frozenset[str]) -> bool:
    return ("/" in decoded or "\\" in decoded or decoded in (".", "..") or decoded in reserved
            or any(c in CONTROL for c in decoded))


@pytest.mark.parametrize("reserved", [RESERVED_SCHEMA_DIRS, RESERVED_TABLE_DIRS])
@pytest.mark.parametrize("name", NAMES)
def test_each_name_round_trips_and_decodes_to_nothing_dangerous(name: str, reserved: frozenset[str]) -> None:
    component = _path_component(name, reserved)
    assert decode_path_component(component) == name
    assert not _forbidden(component, reserved), component
    assert unquote(component) == component  # nothing a percent-decoding reader reads differently
    assert not _forbidden(unquote(unquote(component)), reserved)
    assert len(component.encode()) <= 4 * len(name.encode())  # 63-byte identifiers fit in 255-byte names


@pytest.mark.parametrize(("name", "component"), [
    ("..", "%u2E."), (".", "%u2E"), ("a/b", "a%u2Fb"), ("a\\b", "a%u5Cb"), ("100%", "100%u25"),
    ("a\nb", "a%u0Ab"), ("\x7f", "%u7F"), ("\x00", "%u00"), ("_delta_log", "%u5Fdelta_log"), ("plain", "plain"),
    ("ünï.cødé", "ünï.cødé"), ("a b", "a b")])
def test_the_escapes_people_see(name: str, component: str) -> None:
    assert _path_component(name) == component


def test_reserved_names_are_escaped_only_where_reserved() -> None:
    assert _path_component("_applier", RESERVED_SCHEMA_DIRS) == "%u5Fapplier"
    assert _path_component("_applier") == "_applier"  # a table may be called that: it sits in its schema


def test_random_names_round_trip_and_never_collide() -> None:
    rng = random.Random(77)
    alphabet = string.ascii_letters[:6] + "%./\\_u0123456789EF" + "\n\x00\x7f" + "ü"
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(30_000)}
    names |= set(NAMES)
    for reserved in (RESERVED_SCHEMA_DIRS, RESERVED_TABLE_DIRS):
        components = {_path_component(n, reserved) for n in names}
        assert len(components) == len(names)  # injective
        for name in names:
            component = _path_component(name, reserved)
            assert decode_path_component(component) == name
            assert unquote(component) == component and not _forbidden(component, reserved)


#: (a name with a '~' and two hex digits was written as it is before the safe escape, and reads as one now:
#: its table is found by its path, and listed under the name the escape gives)
@pytest.mark.parametrize("name", [n for n in NAMES if not re.search("~[0-9A-F]{2}", n)])
def test_a_directory_an_earlier_release_wrote_still_decodes_to_its_name(name: str) -> None:
    for reserved in (RESERVED_SCHEMA_DIRS, RESERVED_TABLE_DIRS):
        assert decode_path_component(_legacy_path_component(name, reserved)) == name


def _delta_table(path: Path) -> Path:
    (path / "_delta_log").mkdir(parents=True)
    return path


def test_a_table_an_earlier_release_wrote_is_found_where_it_is(tmp_path: Path) -> None:
    """Old ``%XX`` directories: the mirror (through ``path_for``), ``status`` and ``verify`` go on with them;
    a new table, or an old name without a table there, takes the new name."""
    old = {("_applier", "spill"): "%5Fapplier/spill", ("public", ".."): "public/%2E.",
           ("public", "100%"): "public/100%25", ("x/y", "a/b"): "x%2Fy/a%2Fb"}
    for (schema, table), directory in old.items():
        _delta_table(tmp_path / directory)
        assert table_location(tmp_path, schema, table) == str(tmp_path / directory)
    assert table_location(tmp_path, "public", ".") == str(tmp_path / "public" / "%u2E")
    assert table_location(tmp_path, "public", "a\nb") == str(tmp_path / "public" / "a%u0Ab")
    assert sorted(source_name_of(d) for d in mirrored_table_dirs(tmp_path)) == sorted(old)
    # once a table is at its new name (moved there, or written anew) the new name wins
    _delta_table(tmp_path / "public" / "%u2E.")
    assert table_location(tmp_path, "public", "..") == str(tmp_path / "public" / "%u2E.")
    assert sorted(source_name_of(d) for d in mirrored_table_dirs(tmp_path)).count(("public", "..")) == 2


@pytest.mark.parametrize("name", ["..", "a/b", "a\\b", "a\nb", "100%"])
def test_an_object_store_target_refuses_a_name_that_needs_an_escape(name: str) -> None:
    with pytest.raises(ConfigError, match="(?s)tables.rules.*tables.exclude") as info:
        table_location("s3://bucket/lake", "public", name)
    assert info.value.context["table"] == f"public.{name}"
    assert table_location("s3://bucket/lake", "public", "plain") == "s3://bucket/lake/public/plain"


@pytest.mark.parametrize("reserved", [RESERVED_SCHEMA_DIRS, RESERVED_TABLE_DIRS])
@pytest.mark.parametrize("name", NAMES)
def test_a_safe_name_round_trips_and_holds_nothing_a_url_escapes(name: str, reserved: frozenset[str]) -> None:
    component = _path_component(name, reserved, safe=True)
    assert decode_path_component(component) == name
    assert not _forbidden(component, reserved), component
    assert quote(component, safe="") == component  # what delta-rs hands Polars is the name on disk
    assert len(component.encode()) <= 3 * len(name.encode())  # 63-byte identifiers fit in 255-byte names


@pytest.mark.parametrize(("name", "component"), [
    ("Mixed Case", "Mixed~20Case"), ("é", "~C3~A9"), ("~", "~7E"), ("..", "~2E."), ("a/b", "a~2Fb"),
    ("100%", "100~25"), ("plain_name-1.x", "plain_name-1.x"), ("_delta_log", "~5Fdelta_log")])
def test_the_safe_escapes_people_see(name: str, component: str) -> None:
    assert _path_component(name, safe=True) == component


def test_a_tilde_that_reads_as_a_safe_escape_is_escaped_under_keep() -> None:
    assert _path_component("a~41") == "a%u7E41" and _path_component("a~4") == "a~4"
    assert _path_component("~ok") == "~ok" and _path_component("a~e9") == "a~e9"  # (the escape is upper case)


def test_random_names_round_trip_and_never_collide_under_either_choice() -> None:
    rng = random.Random(78)
    alphabet = "aB_-. %~/\\u0123456789ACEF" + "\n\x7f" + "üé日"
    names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(30_000)}
    names |= set(NAMES)
    for safe in (False, True):
        for reserved in (RESERVED_SCHEMA_DIRS, RESERVED_TABLE_DIRS):
            components = {_path_component(n, reserved, safe=safe) for n in names}
            assert len(components) == len(names)  # injective
            for name in names:
                assert decode_path_component(_path_component(name, reserved, safe=safe)) == name


def test_a_table_written_under_keep_is_found_there_under_safe(tmp_path: Path) -> None:
    """A target that turns ``path_names: safe`` on keeps its tables: a derived table (history, change feed)
    is found by name, not by a binding, and must not start anew beside the one it has."""
    _delta_table(tmp_path / "public" / "Mixed Case")
    assert table_location(tmp_path, "public", "Mixed Case", safe=True) == str(tmp_path / "public" / "Mixed Case")
    assert table_location(tmp_path, "public", "Other Case", safe=True) == str(tmp_path / "public" / "Other~20Case")
    _delta_table(tmp_path / "public" / "Mixed~20Case")  # once at its safe name, the safe name wins
    assert table_location(tmp_path, "public", "Mixed Case", safe=True) == str(tmp_path / "public" / "Mixed~20Case")
    assert sorted(source_name_of(d) for d in mirrored_table_dirs(tmp_path)) == [("public", "Mixed Case")] * 2


@pytest.mark.parametrize("name", ["..", "a/b", "100%", "a\\b", "a\nb"])
def test_an_object_store_target_takes_a_safe_name(name: str) -> None:
    """(Names keep refuses there: no table can be at their keep name, so the store is not asked.)"""
    path = table_location("s3://bucket/lake", "public", name, safe=True)
    assert path == "s3://bucket/lake/public/" + _path_component(name, safe=True) and "%" not in path
