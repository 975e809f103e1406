"""A full disk while the stream applies (issue 47, repro 20): exit 3 with one line, no traceback, and
nothing lost once space is freed. The target is a small tmpfs mounted by the test (root, as in CI)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from applier.cli import main as cli_main
from applier.commands.exitcodes import ExitCode

pytestmark = [pytest.mark.postgres]


@pytest.fixture
def small_disk(tmp_path: Path):
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_exit_3_in_one_line_and_nothing_is_lost(pg, small_disk, capsys):
    target = small_disk / "delta"
    argv = ["mirror", "--dsn", pg.dsn, "--slot", "full", "--publication", "pfull", "--target", str(target), "--once"]
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g")
        conn.execute("CREATE PUBLICATION pfull FOR TABLE t")
        assert cli_main(argv) == ExitCode.OK
        capsys.readouterr()
        junk = small_disk / "junk"
        # fill the disk to the last byte; unbuffered, so that closing has nothing left to write (a buffered
        # file's close raised ENOSPC whenever the last write had left part of its block behind)
        with junk.open("wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        conn.execute("INSERT INTO t SELECT g, repeat('x', 2000) || g FROM generate_series(101, 2000) g")
        assert cli_main(argv) == ExitCode.UNAVAILABLE
        err = capsys.readouterr().err
        assert "the disk is full" in err and "Traceback" not in err and "panicked" not in err, err
        assert len([line for line in err.splitlines() if line.startswith("applier mirror: ")]) <= 2, err
        junk.unlink()
        assert cli_main(argv) == ExitCode.OK, capsys.readouterr().err
        capsys.readouterr()
        assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == ExitCode.OK, \
            capsys.readouterr().out


def test_a_full_disk_during_the_initial_copy_is_exit_3_in_one_line(pg, small_disk, capfd):
    target = small_disk / "delta"
    argv = ["mirror", "--dsn", pg.dsn, "--slot", "fullc", "--publication", "pfullc", "--target", str(target), "--once"]
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
        conn.execute("INSERT INTO t SELECT g, md5(g::text) || repeat('x', 500) FROM generate_series(1, 30000) g")
        conn.execute("CREATE PUBLICATION pfullc FOR TABLE t")
    junk = small_disk / "junk"
    with junk.open("wb") as f:  # leave a little room: the state and the log fit, the copy's files do not
        f.write(b"\0" * (7 << 20))
    assert cli_main(argv) == ExitCode.UNAVAILABLE
    err = capfd.readouterr().err
    # delta-rs's object store panics in a writer thread here; the command line holds that back
    assert "the disk is full" in err and "Traceback" not in err and "panicked" not in err, err
    assert len([line for line in err.splitlines() if line.startswith("applier mirror: ")]) == 1, err
    junk.unlink()
    assert cli_main(argv) == ExitCode.OK, capfd.readouterr().err
    capfd.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == ExitCode.OK, capfd.readouterr().out
