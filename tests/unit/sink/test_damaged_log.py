"""A target table whose newest commit file is truncated (issue 77, weak case): every command exited 3 with
a Rust backtrace in its message. It is damage, not an outage: exit 2, one line, and the remedy."""

from __future__ import annotations

import deltalake
import pyarrow as pa
import pytest

from applier.commands.exitcodes import ExitCode, for_exception
from applier.sink.store.deltars import DamagedTableError, DeltaRsStore


def test_a_truncated_commit_file_is_a_damaged_table_with_its_remedy(tmp_path, monkeypatch):
    monkeypatch.setenv("RUST_BACKTRACE", "1")
    path = tmp_path / "public" / "t"
    deltalake.write_deltalake(str(path), pa.table({"id": [1, 2]}))
    deltalake.write_deltalake(str(path), pa.table({"id": [3]}), mode="append")
    newest = sorted((path / "_delta_log").glob("*.json"))[-1]
    newest.write_bytes(newest.read_bytes()[:100])
    with pytest.raises(DamagedTableError) as info:
        DeltaRsStore.open(str(path))
    message = str(info.value)
    assert "applier resync" in message and "Truncated" in message and "<unknown>" not in message, message
    assert len(message.splitlines()) == 1
    assert for_exception(info.value) == ExitCode.USAGE
