"""Issue 30 row 13: mistakes in a flag or the config exit 2 with one line, before Spark starts.

A target that is a regular file or on a read-only mount, a publication the database does not have,
a slot name PostgreSQL refuses. Every test here fails if Spark is started (``no_spark``), and the
server is a real PostgreSQL: the publication is looked up in its catalog.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from applier.cli import main
from applier.commands.exitcodes import ExitCode

pytestmark = pytest.mark.usefixtures("no_spark")


@pytest.fixture(autouse=True)
def no_dsn_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APPLIER_DSN", raising=False)
    for var in ("PGHOST", "PGHOSTADDR", "PGSERVICE", "PGDATABASE", "PGPORT"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def published(pg):
    """A database with a publication 'pub' of one table: everything right but the mistake under test."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION pub FOR TABLE t")
    return pg


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def slots(pg) -> list[str]:
    with pg.connect() as conn:
        return [r[0] for r in conn.execute("SELECT slot_name FROM pg_replication_slots")]


def test_target_that_is_a_regular_file_is_exit_2(published, tmp_path, capsys):
    target = tmp_path / "target"
    target.write_text("not a directory\n")
    base = ["--dsn", published.dsn, "--publication", "pub", "--slot", "s1"]
    assert main(["mirror", *base, "--target", str(target), "--once"]) == ExitCode.USAGE
    line = one_line_error(capsys)
    assert f"target.path (--target) {target} is a regular file, not a directory" in line, line
    assert target.read_text() == "not a directory\n"
    # a file further up the path is the same mistake
    assert main(["mirror", *base, "--target", str(target / "sub"), "--once"]) == ExitCode.USAGE
    assert f"{target} is a regular file" in one_line_error(capsys)
    assert main(["capture", *base, "--log", str(target)]) == ExitCode.USAGE
    assert f"log_path (--log) {target} is a regular file" in one_line_error(capsys)
    assert main(["replay", "--source", str(tmp_path / "log.parquet"), "--target", str(target)]) == ExitCode.USAGE
    assert "is a regular file" in one_line_error(capsys)
    assert slots(published) == []  # nothing was started on the server either


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a real read-only bind mount (root ignores file modes, not a read-only mount)."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(src), str(ro)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("mount --bind is not allowed here")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("remount read-only is not allowed here")
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_target_on_a_read_only_mount_is_exit_2(published, read_only_dir, capsys):
    base = ["--dsn", published.dsn, "--publication", "pub", "--slot", "s1", "--once"]
    for target in (read_only_dir, read_only_dir / "new"):  # an existing directory, and one to create
        assert main(["mirror", *base, "--target", str(target)]) == ExitCode.USAGE
        line = one_line_error(capsys)
        assert f"{target} cannot be written" in line and "read-only file system" in line, line
    assert list(read_only_dir.iterdir()) == []
    assert slots(published) == []


@pytest.mark.parametrize("command", ["mirror", "capture"])
def test_publication_that_does_not_exist_is_exit_2(published, tmp_path, capsys, command):
    where = ["--target", str(tmp_path / "t"), "--once"] if command == "mirror" else ["--log", str(tmp_path / "l")]
    assert main([command, "--dsn", published.dsn, "--publication", "pubb", "--slot", "s1", *where]) == ExitCode.USAGE
    line = one_line_error(capsys)
    assert "publication 'pubb' does not exist" in line and "CREATE PUBLICATION" in line, line
    assert slots(published) == []


def test_slot_name_postgres_refuses_is_exit_2_from_a_flag_and_a_config(published, tmp_path, capsys):
    base = ["--dsn", published.dsn, "--publication", "pub", "--target", str(tmp_path / "t"), "--once"]
    assert main(["mirror", *base, "--slot", "MySlot"]) == ExitCode.USAGE
    line = one_line_error(capsys)
    assert "not a valid replication slot name: 'MySlot'" in line and "'myslot'" in line and "--slot" in line, line
    cfg = tmp_path / "m.yaml"
    cfg.write_text(f"source:\n  dsn: '{published.dsn}'\n  publication: pub\n  slot: my-slot\ntarget:\n  path: t\n")
    assert main(["mirror", "--config", str(cfg), "--once"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "not a valid replication slot name: 'my-slot'" in err and str(cfg) in err and "Traceback" not in err, err
    assert main(["capture", "--dsn", published.dsn, "--publication", "pub", "--slot", "a" * 64,
                 "--log", str(tmp_path / "l")]) == ExitCode.USAGE
    assert "at most 63 characters" in one_line_error(capsys)
    assert slots(published) == [] and not (tmp_path / "t").exists()


def test_a_valid_slot_name_is_accepted() -> None:
    from applier.config import SourceSettings

    assert SourceSettings(slot="applier_2").slot == "applier_2"
    assert SourceSettings(slot="a" * 63).slot == "a" * 63
