"""Reading configs: YAML 1.2, duplicate keys, every problem with its line, paths from the file's folder,
APPLIER_* variables and flags on top of the file."""

from __future__ import annotations

import pytest

from applier.config import CaptureConfig, MirrorConfig, ReplayConfig, load_config
from applier.errors import ConfigError


def write(tmp_path, text: str, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_block_written_twice_is_refused_naming_both_lines(tmp_path):
    f = write(tmp_path, "source_log: x\ntarget: {path: y}\napply:\n  grouping: transaction\n"
                        "tables: {}\napply:\n  max_group_rows: 5\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, ReplayConfig)
    assert "'apply' is written twice" in str(e.value) and "lines 3 and 6" in str(e.value)


def test_a_nested_duplicate_key_names_its_lines_and_never_its_values(tmp_path):
    f = write(tmp_path, "target: {path: y}\nsource:\n  slot: a\n  dsn: 'password=hunter2secret'\n"
                        "  dsn: 'password=other-secret'\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, MirrorConfig)
    assert "'dsn' is written twice" in str(e.value) and "lines 4 and 5" in str(e.value)
    assert "secret" not in str(e.value)


def test_yaml_1_2_keeps_on_as_a_string(tmp_path):
    f = write(tmp_path, "target: {path: y}\nsource:\n  proto_version: 2\n  streaming: on\n  binary: yes\n")
    cfg = load_config(f, MirrorConfig)
    assert cfg.source.streaming == "on" and cfg.source.binary is True


def test_every_problem_is_reported_with_its_line(tmp_path):
    f = write(tmp_path, "target: {path: y}\nsource:\n  proto_version: 9\napply:\n  grupo: 5\n"
                        "  max_group_rows: 0\ntables:\n  rules:\n    - {match: 'a.*', key_columns: 3}\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, MirrorConfig)
    text = str(e.value)
    assert "4 problems" in text
    for line, key in ((3, "source.proto_version"), (5, "apply.grupo"), (6, "apply.max_group_rows"),
                      (9, "tables.rules.0.key_columns")):
        assert f"{f}:{line}: {key}:" in text, text
    assert e.value.line == 3 and len(e.value.problems) == 4


def test_relative_paths_are_resolved_from_the_config_files_folder(tmp_path, monkeypatch):
    sub = tmp_path / "etc"
    sub.mkdir()
    f = write(sub, "source_log: ../logs/raw\ntarget:\n  path: out\n  state_dir: /abs/state\n"
                   "tables:\n  rules:\n    - {match: 'a.b', target: s3://bucket/ab}\n"
                   "    - {match: 'a.c', target: rel/ac}\napply:\n  messages_table: ~/msgs\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(f, ReplayConfig)
    assert cfg.source_log == str(sub / "../logs/raw") and cfg.target.path == str(sub / "out")
    assert cfg.target.state_dir == "/abs/state" and cfg.tables.rules[0].target == "s3://bucket/ab"
    assert cfg.tables.rules[1].target == str(sub / "rel/ac")
    assert cfg.apply.messages_table is not None and not cfg.apply.messages_table.startswith("~")
    cap = load_config(write(sub, "log_path: raw\n", "cap.yaml"), CaptureConfig)
    assert cap.log_path == str(sub / "raw")
    # a flag's path is the user's own, from the working directory
    flagged = load_config(f, ReplayConfig, overrides={"target.path": ("here", "--target")})
    assert flagged.target.path == "here"


def test_environment_variables_override_the_file_and_flags_override_both(tmp_path, monkeypatch):
    f = write(tmp_path, "target: {path: y}\napply:\n  max_group_rows: 10\n")
    monkeypatch.setenv("APPLIER_APPLY__MAX_GROUP_ROWS", "20")
    monkeypatch.setenv("APPLIER_SOURCE__SLOT", "from_env")
    monkeypatch.setenv("APPLIER_TABLES__INCLUDE", '["shop.*"]')
    cfg = load_config(f, MirrorConfig, overrides={"source.slot": ("from_flag", "--slot")})
    assert cfg.apply.max_group_rows == 20 and cfg.source.slot == "from_flag" and cfg.tables.include == ["shop.*"]
    monkeypatch.setenv("APPLIER_APPLY__MAX_GROUP_ROWS", "many")
    with pytest.raises(ConfigError, match=r"\$APPLIER_APPLY__MAX_GROUP_ROWS: apply.max_group_rows"):
        load_config(f, MirrorConfig)


def test_not_yaml_and_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(write(tmp_path, "target: [1\nx: 2\n"), MirrorConfig)
    assert "not valid YAML" in str(e.value) and e.value.line == 2
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"), MirrorConfig)


@pytest.mark.parametrize("key", ["path", "state_dir"])
def test_an_empty_path_is_a_config_error_naming_the_setting(tmp_path, key):
    """Issue 77: ``target.path: ""`` was resolved to the config file's folder, and the mirror wrote there."""
    body = "target:\n  path: ''\n" if key == "path" else "target:\n  path: out\n  state_dir: ' '\n"
    f = write(tmp_path, "source_log: raw\n" + body)
    with pytest.raises(ConfigError) as e:
        load_config(f, ReplayConfig)
    line = 3 if key == "path" else 4
    assert f"target.{key}: is empty" in str(e.value) and e.value.line == line, str(e.value)
    with pytest.raises(ConfigError, match="--target: is empty"):  # a flag's empty path too
        load_config(f, ReplayConfig, overrides={"target.path": ("", "--target")})


def test_an_empty_target_path_exits_2(tmp_path, capsys):
    from applier.cli import main

    f = write(tmp_path, "source_log: raw\ntarget:\n  path: ''\n")
    assert main(["replay", "--config", str(f)]) == 2
    assert "target.path: is empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]  # nothing written beside the config
