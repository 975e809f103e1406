"""The state directory's format (applier/infra/stateformat.py): stamped on first use, migrated in order by a
writer, and a newer release's state refused before anything is touched (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.commands.exitcodes import ExitCode, for_exception
from applier.drivers.writer import target_writer
from applier.infra import stateformat
from applier.infra.stateformat import (
    CURRENT,
    MIGRATIONS,
    Migration,
    StateFormatError,
    check_readable,
    found_format,
    refuse_newer,
    upgrade,
)
from applier.state import StateDir


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file under ``root`` with its mtime and bytes: what "nothing written" compares."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(root.rglob("*"))
            if p.is_file()}


def _newer(root: Path, version: int = CURRENT + 1) -> StateDir:
    state = StateDir(root)
    state.save("format", {"format": version, "written_by": "applier 9.9.9"})
    state.save("mirror", {"slot": "s", "phase": "streaming", "snapshot_lsn": "0/1"})
    return state


def test_the_migrations_are_a_ladder_to_the_current_format() -> None:
    assert [m.to_format for m in MIGRATIONS] == list(range(2, CURRENT + 1))
    assert stateformat.UNVERSIONED == 1


def test_a_first_run_stamps_the_format_and_a_later_one_writes_nothing(tmp_path: Path) -> None:
    state = StateDir(tmp_path / "state")
    assert found_format(state) == stateformat.UNVERSIONED
    assert upgrade(state, "mirror") == []
    recorded = json.loads((state.root / "format.json").read_text())
    assert recorded["format"] == CURRENT and recorded["written_by"].startswith("applier")
    before = _tree(state.root)
    assert upgrade(StateDir(state.root), "mirror") == []
    assert _tree(state.root) == before


def test_a_state_of_a_release_before_formats_is_format_1_and_kept_as_it_is(tmp_path: Path) -> None:
    state = StateDir(tmp_path)
    state.save("mirror", {"slot": "s", "phase": "streaming", "snapshot_lsn": "0/1"})
    state.save("catalog", {"relations": [], "types": []})
    before = _tree(tmp_path)
    check_readable(state, "status")
    assert _tree(tmp_path) == before  # a reader never stamps
    upgrade(state, "mirror")
    after = _tree(tmp_path)
    assert set(after) - set(before) == {"format.json"}
    assert {k: v for k, v in after.items() if k != "format.json"} == before


@pytest.mark.parametrize("call", [refuse_newer, check_readable, upgrade], ids=lambda f: f.__name__)
def test_a_newer_format_is_refused_with_exit_2_and_nothing_written(tmp_path: Path, call) -> None:
    state = _newer(tmp_path)
    before = _tree(tmp_path)
    with pytest.raises(StateFormatError) as caught:
        call(StateDir(tmp_path), "mirror")
    assert for_exception(caught.value) == ExitCode.USAGE
    text = str(caught.value)
    assert f"state format {CURRENT + 1}" in text and "applier 9.9.9" in text
    assert f"up to {CURRENT}" in text and "`applier mirror` of that release or a later one" in text
    assert str(state.root) in text
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("text", ["{", "[]", '{"format": "1"}', '{"format": 0}', "{}"])
def test_a_format_file_that_names_no_format_is_refused(tmp_path: Path, text: str) -> None:
    (tmp_path / "format.json").write_text(text)
    with pytest.raises(StateFormatError) as caught:
        upgrade(StateDir(tmp_path), "mirror")
    assert for_exception(caught.value) == ExitCode.USAGE
    assert (tmp_path / "format.json").read_text() == text


def test_migrations_run_in_order_each_recorded_and_a_killed_one_goes_on(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The framework with two made-up steps: 1 -> 2 renames a file, 2 -> 3 adds a key (killed once)."""
    ran: list[str] = []
    kill = {"once": True}

    def rename(state: StateDir) -> None:
        ran.append("rename")
        old = state.root / "old_name.json"
        if old.exists():
            old.rename(state.root / "new_name.json")

    def add_key(state: StateDir) -> None:
        ran.append("add_key")
        if kill.pop("once", False):
            raise KeyboardInterrupt  # a kill half-way
        state.save("new_name", {**(state.load("new_name") or {}), "added": True})

    monkeypatch.setattr(stateformat, "MIGRATIONS", (Migration(2, "rename old_name", rename),
                                                    Migration(3, "add a key", add_key, readers_need_it=True)))
    monkeypatch.setattr(stateformat, "CURRENT", 3)
    state = StateDir(tmp_path)
    state.save("old_name", {"kept": 1})  # no format.json: a state of the releases before formats
    with pytest.raises(StateFormatError, match="run the mirror"):
        check_readable(state, "status")  # the second step is one readers need
    with pytest.raises(KeyboardInterrupt):
        upgrade(state, "mirror")
    assert found_format(StateDir(tmp_path)) == 2  # the first step is recorded, the second not
    assert upgrade(StateDir(tmp_path), "mirror") == ["add a key"]
    assert ran == ["rename", "add_key", "add_key"]
    assert found_format(StateDir(tmp_path)) == 3
    assert json.loads((tmp_path / "new_name.json").read_text()) == {"kept": 1, "added": True}
    check_readable(StateDir(tmp_path), "status")
    assert upgrade(StateDir(tmp_path), "mirror") == []  # done once


def test_a_fresh_state_under_a_later_format_takes_every_step_on_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A first run has no files: the steps must accept that, and the stamp is the current format."""
    monkeypatch.setattr(stateformat, "MIGRATIONS", (Migration(2, "nothing to do", lambda s: None),))
    monkeypatch.setattr(stateformat, "CURRENT", 2)
    state = StateDir(tmp_path / "new")
    upgrade(state, "replay")
    assert found_format(state) == 2


@pytest.mark.parametrize("dry_run", [False, True])
def test_target_writer_refuses_a_newer_state_before_the_lock_and_the_probe(tmp_path: Path, dry_run: bool) -> None:
    target = tmp_path / "target"
    _newer(target / "_applier")
    before = _tree(target)
    with pytest.raises(StateFormatError), target_writer(target, command="replay", dry_run=dry_run):
        pytest.fail("the body ran")
    assert _tree(target) == before  # no writer.lock, no write probe, no registry


def test_target_writer_stamps_a_first_state(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    with target_writer(target, command="replay"):
        assert found_format(StateDir(target / "_applier")) == CURRENT
    assert (target / "_applier" / "format.json").is_file()
