"""The cuts table's appends (applier.sink.cuts.CutLog): after delta-rs's first append, a local table's
cuts are appended by applier itself (applier.sink.store.dvcommit.append_file), and only while nobody
else committed to it. Whatever wrote it, delta-rs reads every cut, and the ``txn`` version is the newest
cut's LSN (what a run after a crash reads to write a missing cut once)."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from deltalake import DeltaTable

from applier.sink import cuts as cuts_module
from applier.sink.cuts import CUTS_APP_ID, Cut, CutLog, CutTable, cuts_path


def _cut(lsn: int) -> Cut:
    now = datetime.now(UTC)
    return Cut(lsn, now, now, tuple(CutTable(100 + k, f"public.t{k}", f"public/t{k}", "mirror", lsn % 1000)
                                    for k in range(3)))


def _engines(target: Path) -> list[str]:
    """Who wrote each version of the cuts table, oldest first."""
    log = Path(cuts_path(str(target))) / "_delta_log"
    return [json.loads(p.read_text().splitlines()[0])["commitInfo"].get("engineInfo", "")
            for p in sorted(log.glob("*.json"))]


def test_cuts_after_the_first_are_appended_here_and_read_by_delta_rs(tmp_path: Path) -> None:
    log = CutLog(str(tmp_path))
    for lsn in (1000, 2000, 3000, 4000):
        assert log.append(_cut(lsn))
    assert not log.append(_cut(4000))  # a re-run's: recorded already
    engines = _engines(tmp_path)
    assert len(engines) == 4 and all(e == "applier" for e in engines[1:]) and engines[0] != "applier"
    table = DeltaTable(cuts_path(str(tmp_path)))
    assert table.transaction_version(CUTS_APP_ID) == 4000
    assert [c.lsn for c in CutLog(str(tmp_path)).cuts()] == [1000, 2000, 3000, 4000]
    assert CutLog(str(tmp_path)).cuts()[-1].tables == _cut(4000).tables
    assert CutLog(str(tmp_path)).newest_lsn() == 4000


def test_another_writers_commit_is_read_before_the_next_append(tmp_path: Path) -> None:
    log = CutLog(str(tmp_path))
    for lsn in (1000, 2000, 3000):
        log.append(_cut(lsn))
    # ``maintain`` prunes the old cuts in between (a commit this log did not write)
    assert CutLog(str(tmp_path)).prune(1, now=datetime.now(UTC) + timedelta(hours=2)) == 2
    assert log.append(_cut(5000))
    assert [c.lsn for c in CutLog(str(tmp_path)).cuts()] == [3000, 5000]
    assert DeltaTable(cuts_path(str(tmp_path))).transaction_version(CUTS_APP_ID) == 5000


def test_a_cuts_table_made_anew_is_not_appended_to_as_the_old_one(tmp_path: Path) -> None:
    """The new table's log is shorter than the old one's: an append at the old one's next version would
    leave a gap in it."""
    log = CutLog(str(tmp_path))
    for lsn in (1000, 2000, 3000, 4000):
        log.append(_cut(lsn))
    shutil.rmtree(cuts_path(str(tmp_path)))
    CutLog(str(tmp_path)).append(_cut(100))
    assert log.append(_cut(5000))
    assert [c.lsn for c in CutLog(str(tmp_path)).cuts()] == [100, 5000]
    assert DeltaTable(cuts_path(str(tmp_path))).version() == 1


def test_a_checkpoint_is_taken_at_its_interval(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuts_module, "CHECKPOINT_INTERVAL", 5)
    log = CutLog(str(tmp_path))
    for lsn in range(1000, 1008):
        log.append(_cut(lsn))
    checkpoints = sorted(p.name for p in (Path(cuts_path(str(tmp_path))) / "_delta_log").glob("*.checkpoint.parquet"))
    assert checkpoints == [f"{5:020d}.checkpoint.parquet"]
    assert [c.lsn for c in CutLog(str(tmp_path)).cuts()] == list(range(1000, 1008))
