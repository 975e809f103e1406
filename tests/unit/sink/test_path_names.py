"""Schema and table names as directory names (applier.sink.naming): every name round-trips, no two names
share a directory, and no directory name means anything else to a reader that percent-decodes paths
(delta-rs and Polars decode ``%XX`` in a local path once before they read the table's log:
docs/delta-tables.md, "Directory names"). A directory an earlier release wrote with URL escapes still
decodes to its name, and a table there is still found."""

from __future__ import annotations

import random
import string
from pathlib import Path
from urllib.parse import unquote

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
         "\x1b[31mred", "\x7f", "a b", "ünï.cødé", "tab le.\"q\"`ü", "plain", "%%", "%u", "u2E"]


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


@pytest.mark.parametrize("name", NAMES)
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
