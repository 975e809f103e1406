"""One writer per target: a second `replay`, `mirror` or `capture` on the same target (raw log) is
refused at once with a clear message, before Spark starts; the lock dies with its process, so a
run after `kill -9` proceeds, and removes the spill files the killed run left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from applier.cli import main as cli_main
from applier.errors import TargetLockedError
from applier.infra.lock import writer_lock
from applier.lsn import parse_lsn
from applier.sources.rawlog_writer import write_raw_log

REPO = Path(__file__).resolve().parents[2]
BASIC = REPO / "tests" / "fixtures" / "pgoutput" / "pg15_basic_proto1_text.jsonl"


def hold_lock(directory: Path, lock_name: str = "writer.lock") -> subprocess.Popen[str]:
    """Another process holding the writer lock, as a running applier would."""
    code = ("import sys, time; from applier.infra.lock import writer_lock\n"
            f"with writer_lock({str(directory)!r}, 'target', lock_name={lock_name!r}):\n"
            "    print('held', flush=True); time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_writer_is_refused_for_replay_mirror_and_capture(tmp_path, capsys):
    target, log = tmp_path / "delta", tmp_path / "raw-log"
    holders = [hold_lock(target / "_applier"), hold_lock(log, "_applier_writer.lock")]
    try:
        commands = {
            "replay": ["replay", "--source", str(tmp_path / "any.parquet"), "--target", str(target)],
            "mirror": ["mirror", "--dsn", "host=/nonexistent dbname=x", "--publication", "p", "--slot", "s",
                       "--target", str(target), "--once"],
            "capture": ["capture", "--dsn", "host=/nonexistent dbname=x", "--publication", "p", "--slot", "s",
                        "--log", str(log)],
        }
        for name, argv in commands.items():
            started = time.monotonic()
            assert cli_main(argv) == 3, name  # another writer holds it: may cure itself, like an outage
            err = capsys.readouterr().err
            assert "another applier run is writing to this" in err and "pid " in err, (name, err)
            assert "Traceback" not in err and "nonexistent" not in err, err
            assert time.monotonic() - started < 5, name  # refused before Spark or a connection
    finally:
        for proc in holders:
            proc.kill()
            proc.wait()
    # kill -9 released the locks: they can be taken again at once
    with writer_lock(target / "_applier", "target"):
        with pytest.raises(TargetLockedError):
            with writer_lock(target / "_applier", "target"):
                pass


@pytest.mark.spark
def test_after_kill_9_the_next_replay_runs_and_removes_stale_spill_files(spark, tmp_path, capsys):
    rows = [(parse_lsn(r["lsn"]), r["xid"], bytes.fromhex(r["data"]))
            for r in map(json.loads, BASIC.read_text().splitlines())]
    log, target = tmp_path / "log.parquet", tmp_path / "delta"
    write_raw_log(log, rows)
    holder = hold_lock(target / "_applier")
    spill = target / "_applier" / "spill"
    spill.mkdir(parents=True)
    (spill / "applier-spill-killed.pkl").write_bytes(b"x" * 1000)  # what a killed run leaves behind
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert cli_main(["replay", "--source", str(log), "--target", str(target)]) == 0, capsys.readouterr().err
    assert "removed 1 spill file(s) left by a killed run" in capsys.readouterr().err
    assert not list(spill.glob("applier-spill-*"))
    assert list((target / "public").glob("*/_delta_log"))
