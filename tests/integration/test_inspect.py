"""`applier inspect` and the raw-log reader, on logs made of messages captured from real servers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from applier.cli import main
from applier.errors import SourceError
from applier.lsn import format_lsn, parse_lsn
from applier.sources.rawlog import RawMessage, read_raw_log
from applier.sources.rawlog_writer import write_raw_log

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "pgoutput"


def captured(name: str) -> list[tuple[int, int, bytes]]:
    with open(FIXTURES / name, encoding="utf-8") as f:
        return [(parse_lsn(o["lsn"]), o["xid"], bytes.fromhex(o["data"])) for o in map(json.loads, f)]


def manifest_entry(name: str) -> dict:
    return next(e for e in json.loads((FIXTURES / "manifest.json").read_text())["files"] if e["file"] == name)


STREAMING = "pg15_streaming_proto2_streaming.jsonl"
TWOPHASE = "pg15_twophase_proto3_twophase.jsonl"


def expected_summary(name: str) -> dict:
    rows = captured(name)
    kinds = manifest_entry(name)["kinds"]  # counted from raw type bytes at capture time
    return {"messages": len(rows), "by_kind": kinds,
            "lsn_range": {"first": format_lsn(min(r[0] for r in rows)), "last": format_lsn(max(r[0] for r in rows))}}


def test_inspect_json_in_process_counts_a_streaming_log(tmp_path, capsys):
    log = tmp_path / "log.parquet"
    write_raw_log(log, captured(STREAMING))
    assert main(["inspect", "--source", str(log), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    expected = expected_summary(STREAMING)
    assert out["messages"] == expected["messages"] == 193
    assert out["by_kind"] == expected["by_kind"]
    assert out["lsn_range"] == expected["lsn_range"]
    # One streamed commit + one plain commit before and one after the aborted stream.
    assert out["transactions"] == {"committed": 3, "streamed": 2, "prepared": 0, "aborted": 1,
                                   "subtransaction_aborts": 1}
    assert [r["name"] for r in out["relations"]] == ["public.bulk", "public.side"]


def test_inspect_as_subprocess_on_a_directory_of_parts(tmp_path):
    rows = captured(TWOPHASE)
    logdir = tmp_path / "log"
    write_raw_log(logdir / "part-000.parquet", rows[:30])
    write_raw_log(logdir / "part-001.parquet", rows[30:])
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "applier"), "inspect", "--source", str(logdir), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["by_kind"] == expected_summary(TWOPHASE)["by_kind"]
    assert out["transactions"] == {"committed": 3, "streamed": 1, "prepared": 3, "aborted": 1,
                                   "subtransaction_aborts": 0}
    proc = subprocess.run([sys.executable, "-m", "applier.cli", "inspect", "--source", str(logdir)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "  p  Stream Prepare     1" in proc.stdout
    assert "committed 3, streamed 1, prepared 3, aborted 1" in proc.stdout


def test_inspect_reports_lsn_and_offset_of_a_bad_message(tmp_path, capsys):
    rows = captured(STREAMING)
    bad_at = next(i for i, r in enumerate(rows) if r[2][:1] == b"I")
    lsn, xid, data = rows[bad_at]
    rows[bad_at] = (lsn, xid, data[:-2])
    log = tmp_path / "bad.parquet"
    write_raw_log(log, rows)
    assert main(["inspect", "--source", str(log)]) == 4  # ExitCode.BAD_DATA
    err = capsys.readouterr().err
    assert f"lsn={format_lsn(lsn)}" in err and f"offset={len(data) - 2}" in err and "kind=Insert" in err


def test_progress_goes_to_stderr(tmp_path, capsys, monkeypatch):
    import applier.checks.inspect as inspect_module

    log = tmp_path / "log.parquet"
    write_raw_log(log, captured(STREAMING))
    original = inspect_module.inspect_messages
    monkeypatch.setattr("applier.checks.inspect.inspect_messages",  # the command imports it when it runs
                        lambda msgs, progress: original(msgs, progress=progress, progress_every=50))
    assert main(["inspect", "--source", str(log)]) == 0
    captured_io = capsys.readouterr()
    assert captured_io.err.count("inspect: ") == 193 // 50
    assert "messages: 193" in captured_io.out


def test_raw_log_reads_int_lsns_in_small_batches(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = captured(TWOPHASE)
    table = pa.table({"lsn": pa.array([r[0] for r in rows], pa.int64()), "xid": [r[1] for r in rows],
                      "data": pa.array([r[2] for r in rows], pa.binary())})
    pq.write_table(table, tmp_path / "int.parquet", row_group_size=10)
    assert list(read_raw_log(tmp_path / "int.parquet", batch_rows=7)) == [RawMessage(*r) for r in rows]


def test_raw_log_errors_name_the_file(tmp_path):
    with pytest.raises(SourceError, match="not found"):
        list(read_raw_log(tmp_path / "missing"))
    (tmp_path / "junk.parquet").write_bytes(b"not parquet")
    with pytest.raises(SourceError, match="cannot read raw log file") as info:
        list(read_raw_log(tmp_path / "junk.parquet"))
    assert info.value.context["path"].endswith("junk.parquet")


@pytest.mark.spark
def test_raw_log_reads_an_append_only_delta_table_in_commit_order(spark, tmp_path):
    rows = captured(STREAMING)
    table = str(tmp_path / "delta_log_table")
    for chunk in (rows[:50], rows[50:120], rows[120:]):
        df = spark.createDataFrame([(format_lsn(lsn), xid, bytearray(data)) for lsn, xid, data in chunk],
                                   "lsn string, xid long, data binary")
        df.coalesce(1).write.format("delta").mode("append").save(table)
    assert list(read_raw_log(table)) == [RawMessage(*r) for r in rows]
