"""Logging fit for a service: timestamps and levels on stderr, JSON on request, --quiet, the same flags
for jobs/*.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from applier.cli import main
from applier.sources.rawlog_writer import write_raw_log

REPO = Path(__file__).resolve().parents[3]
FIXTURE = REPO / "tests" / "fixtures" / "pgoutput" / "pg15_streaming_proto2_streaming.jsonl"


@pytest.fixture
def log_with_progress(tmp_path, monkeypatch):
    import applier.checks.inspect as inspect_module

    rows = []
    for o in map(json.loads, FIXTURE.read_text().splitlines()):
        hi, lo = o["lsn"].split("/")
        rows.append(((int(hi, 16) << 32) | int(lo, 16), o["xid"], bytes.fromhex(o["data"])))
    path = tmp_path / "log.parquet"
    write_raw_log(path, rows)
    original = inspect_module.inspect_messages
    monkeypatch.setattr("applier.checks.inspect.inspect_messages",  # imported by the command when it runs
                        lambda msgs, progress: original(msgs, progress=progress, progress_every=50))
    return path


def test_text_progress_lines_have_a_timestamp_and_a_level(log_with_progress, capsys):
    assert main(["inspect", "--source", str(log_with_progress)]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3
    for line in lines:
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO applier\.inspect: \d+ messages read, at .*",
                            line), line


def test_json_lines_and_quiet(log_with_progress, capsys):
    assert main(["inspect", "--source", str(log_with_progress), "--log-format", "json"]) == 0
    captured = capsys.readouterr()
    entries = [json.loads(line) for line in captured.err.strip().splitlines()]
    assert len(entries) == 3 and {e["level"] for e in entries} == {"INFO"}
    assert all(e["logger"] == "applier.inspect" and e["ts"].endswith("Z") for e in entries)
    assert "messages: " in captured.out  # results stay on stdout, as text
    assert main(["inspect", "--source", str(log_with_progress), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["--log-level", "error", "inspect", "--source", str(log_with_progress)]) == 0
    assert capsys.readouterr().err == ""


def test_an_error_in_json_mode_is_one_json_line(tmp_path, capsys):
    assert main(["inspect", "--source", str(tmp_path / "none"), "--log-format", "json"]) == 3
    (entry,) = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]
    assert entry["level"] == "ERROR" and "raw log not found" in entry["msg"]


@pytest.mark.parametrize("job", ["replay", "mirror"])
def test_jobs_accept_the_logging_flags(job):
    proc = subprocess.run([sys.executable, str(REPO / "jobs" / f"{job}.py"), "--log-format", "json", "-q", "--help"],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert proc.returncode == 0 and "--log-format" in proc.stdout and "--log-level" in proc.stdout, proc.stderr
