"""The apply loop on the in-memory store: streams captured from real servers (PostgreSQL 15, 16 and 18:
plain, streamed, parallel-streamed and two-phase transactions, TOAST, REPLICA IDENTITY FULL, truncates,
binary values) go through the real decoder, assembler, grouping, fold and commit path, and every table
ends as the independent reference sink (row images applied one by one) says, with one transaction per
group and with large groups. No JVM: the Spark provider refuses to start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from reference_sink import ReferenceSink

from applier.assembly.feeder import TransactionFeeder
from applier.config import ApplySettings, TablesSettings
from applier.loop import ApplyLoop
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.sink.store import InMemoryStore, StorePicker
from applier.spark.session import SparkProvider
from applier.state import StateDir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput"
STREAMS = sorted(p.name for p in FIXTURES.glob("*.jsonl"))


def _messages(name: str) -> list[tuple[int, int | None, bytes]]:
    rows = [json.loads(line) for line in (FIXTURES / name).read_text().splitlines()]
    return [(parse_lsn(r["lsn"]), r.get("xid"), bytes.fromhex(r["data"])) for r in rows]


def _no_spark() -> Any:
    raise AssertionError("the in-memory loop started Spark")


def _reference(tmp_path: Path, messages: list[tuple[int, int | None, bytes]]) -> ReferenceSink:
    feeder = TransactionFeeder.from_state(StateDir(tmp_path / "ref-state"), ApplySettings())
    sink = ReferenceSink(feeder._convert)
    decoder = MessageDecoder()
    for lsn, _xid, data in messages:
        for txn, _batches in feeder.feed(lsn, decoder.decode(data, lsn)):
            sink.apply(txn)
            feeder.applied(txn)
    return sink


@pytest.mark.parametrize("grouping", ["transaction", "grouped"])
@pytest.mark.parametrize("stream", STREAMS)
def test_captured_streams_end_in_the_in_memory_store_as_the_reference_sink_says(tmp_path: Path, stream: str,
                                                                                  grouping: str) -> None:
    messages = _messages(stream)
    store = InMemoryStore()
    loop = ApplyLoop(SparkProvider(_no_spark), str(tmp_path / "target"), apply=ApplySettings(grouping=grouping),
                     tables=TablesSettings(), state=StateDir(tmp_path / "state"),
                     stores=StorePicker(None, only=store))
    with loop.running():
        for lsn, xid, data in messages:
            loop.feed(lsn, xid, data)
        loop.flush()
    reference = _reference(tmp_path, messages)
    tables = sorted(set(reference.columns))
    assert tables, "the stream changed no table"
    for table in tables:
        namespace, name = table.split(".", 1)
        path = loop.applier.path_for(namespace, name)
        columns = reference.columns[table]
        held = store.rows(path, columns) if store.exists(path) else []
        assert sorted(held, key=repr) == sorted(reference.rows(table, columns), key=repr), table
        assert store.applied_version(path, f"applier:{table}") is not None, table
    assert loop.applier.stats.transactions > 0


@pytest.mark.parametrize("stream", STREAMS)
def test_captured_streams_folded_as_on_executors_and_committed_through_the_loop_end_as_the_reference_says(
        tmp_path: Path, stream: str) -> None:
    """The executors' path without Spark: the stream cut where nothing is open (the survey), each range
    folded by the executors' task code, the folds combined into groups and committed through
    ``ApplyLoop.commit_folded``, then ``folded_applied``: the tables end as the reference sink says for
    the messages up to the last cut, the catalog as at that cut is saved, and the end of the last group
    is confirmed once, after every commit."""
    from applier.drivers.executors.ranges import FoldJob, LogRange
    from applier.drivers.executors.scheduler import FoldGroup
    from applier.drivers.executors.survey import Surveyor
    from applier.drivers.executors.task import fold_range

    messages = _messages(stream)
    surveyor = Surveyor(None)
    ranges: list[LogRange] = []
    start, taken = surveyor.survey.catalog.to_json(), 0
    for i, (lsn, _xid, data) in enumerate(messages):
        surveyor.add(lsn, data)
        if surveyor.may_cut_after(data):
            part = messages[taken:i + 1]
            ranges.append(surveyor.cut(len(ranges), (), start, len(part), part[0][0], lsn,
                                       ([m[0] for m in part], [m[2] for m in part])))
            start, taken = surveyor.survey.catalog.to_json(), i + 1
    store = InMemoryStore()
    state = StateDir(tmp_path / "state")
    loop = ApplyLoop(SparkProvider(_no_spark), str(tmp_path / "target"), apply=ApplySettings(), tables=TablesSettings(),
                     state=state, stores=StorePicker(None, only=store))
    confirmed: list[int] = []
    loop.confirm = confirmed.append
    paths = {rel: loop.applier.path_for(*rel) for rel in sorted(surveyor.survey.relations)}
    schemas: dict[tuple[int, int], Any] = {}

    def commit(group: FoldGroup) -> None:
        loop.commit_folded(list(group.tables.values()), group.end, group.transactions, group.messages, group.skipped)

    group = FoldGroup()
    for cut in ranges:
        fold = fold_range(FoldJob(cut, loop.settings, TablesSettings(), paths, {}))
        if fold.error is not None:
            pytest.skip(f"a range the driver path would take: {fold.error.splitlines()[0]}")
        for t in fold.folded:
            t.schema = schemas.setdefault((t.schema.relation.oid, t.schema.version), t.schema)
        if not group.fits(fold):
            commit(group)
            group = FoldGroup()
        group.add(fold)
        assert not confirmed, "confirmed before folded_applied"
    commit(group)
    end = loop.folded_applied(catalog=surveyor.survey.catalog)
    assert end is not None and confirmed == [end] and loop.confirmed_lsn == end
    assert end == loop.applier.stats.last_end_lsn == group.end
    assert loop.transactions == loop.applier.stats.transactions > 0
    assert state.load("catalog") == surveyor.survey.catalog.to_json()
    reference = _reference(tmp_path, messages[:taken])
    assert reference.columns, "the stream changed no table before its last cut"
    for table in sorted(set(reference.columns)):
        namespace, name = table.split(".", 1)
        path = loop.applier.path_for(namespace, name)
        columns = reference.columns[table]
        held = store.rows(path, columns) if store.exists(path) else []
        assert sorted(held, key=repr) == sorted(reference.rows(table, columns), key=repr), table


def test_the_loop_and_the_stores_need_no_pyspark(tmp_path: Path) -> None:
    """Decoding, folding, the loop's commits and the delta-rs and in-memory stores work in a process
    where pyspark cannot be imported: a table's columns are Arrow's (applier.values.registry), and only
    the Spark store and Spark's schema changes convert them to Spark's types."""
    import os
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['pyspark'] = None  # import fails\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    here = Path(__file__).resolve()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-k", "not need_no_pyspark",
         str(here), str(here.parent / "sink" / "test_store_contract.py")],
        env=env, cwd=here.parents[2], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout.splitlines()[-1]
