"""The Python API for notebooks: names, docstrings and laziness (no Spark), and one replay through it."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import applier

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput" / "pg15_streaming_proto2_streaming.jsonl"


def test_names_exist_with_docstrings_and_the_version_comes_from_metadata():
    for name in ("replay", "mirror", "verify"):
        fn = getattr(applier, name)
        assert callable(fn) and fn.__doc__ and len(fn.__doc__) > 100, name
        assert name in applier.__all__
    assert applier.__version__ == metadata.version("applier")
    assert (Path(applier.__file__).parent / "py.typed").exists()
    with pytest.raises(AttributeError):
        applier.no_such_thing  # noqa: B018


def test_import_applier_does_not_import_pyspark():
    code = "import sys, applier; applier.__version__; print('pyspark' in sys.modules, 'psycopg' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_bad_config_raises_config_error_not_exit(monkeypatch):
    from applier.api import plan_verify
    from applier.errors import ConfigError

    for var in ("APPLIER_DSN", "PGHOST", "PGHOSTADDR", "PGSERVICE", "PGDATABASE", "PGPORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ConfigError, match="apply.grupo"):
        applier.replay(None, {"source_log": "x", "target": {"path": "y"}, "apply": {"grupo": 1}})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="no DSN"):
        plan_verify(target="x")


@pytest.mark.spark
def test_replay_through_the_api_equals_the_cli(spark, tmp_path, monkeypatch):
    from applier.cli import main
    from applier.sources.rawlog_writer import write_raw_log

    rows = []
    for o in map(json.loads, FIXTURE.read_text().splitlines()):
        hi, lo = o["lsn"].split("/")
        rows.append(((int(hi, 16) << 32) | int(lo, 16), o["xid"], bytes.fromhex(o["data"])))
    log = tmp_path / "log.parquet"
    write_raw_log(log, rows)
    summary = applier.replay(spark, {"source_log": str(log), "target": {"path": str(tmp_path / "api")}})
    assert summary.transactions > 0
    monkeypatch.setattr("applier.spark.session.build_spark_session_for", lambda _cfg, _locations=(): spark)
    assert main(["replay", "--source", str(log), "--target", str(tmp_path / "cli")]) == 0
    tables = sorted(p.relative_to(tmp_path / "api") for p in (tmp_path / "api").glob("*/*")
                    if (p / "_delta_log").exists() and p.parent.name != "_applier")  # (its cuts: their own times)
    assert tables
    for t in tables:
        api_rows = sorted(map(tuple, spark.read.format("delta").load(str(tmp_path / "api" / t)).collect()))
        cli_rows = sorted(map(tuple, spark.read.format("delta").load(str(tmp_path / "cli" / t)).collect()))
        assert api_rows == cli_rows and api_rows, t


def test_two_writers_through_the_api_and_the_sink_are_refused_like_two_through_the_cli(tmp_path):
    """The one-writer lock is taken by the API and the foreachBatch sink too (before any Spark or
    server work: a held target is refused at once, the session is never touched)."""
    from applier.drivers.streaming import DeltaApplySink
    from applier.drivers.writer import target_writer
    from applier.errors import TargetLockedError

    target = tmp_path / "delta"
    with target_writer(target, command="mirror"):  # another run writing the target
        with pytest.raises(TargetLockedError):
            applier.replay(None, {"source_log": str(tmp_path / "log"), "target": {"path": str(target)}})  # type: ignore[arg-type]
        with pytest.raises(TargetLockedError):
            applier.mirror(None, {"source": {"dsn": "host=/nonexistent dbname=x", "slot": "s",  # type: ignore[arg-type]
                                             "publication": "p"}, "target": {"path": str(target)}})
        with pytest.raises(TargetLockedError):
            DeltaApplySink(str(target))(None, 0)  # type: ignore[arg-type]
    with target_writer(target, command="mirror"):
        pass  # released by each of them


@pytest.mark.spark
def test_the_api_refuses_a_target_whose_table_was_replaced(spark, tmp_path):
    """The target registry is checked by the API as by the CLI: a Delta table swapped for another
    stops the replay (exit 2 from the CLI; TargetMissingError here) instead of merging into it."""
    import shutil

    from applier.sink.registry import TargetMissingError
    from applier.sources.rawlog_writer import write_raw_log

    rows = []
    for o in map(json.loads, FIXTURE.read_text().splitlines()):
        hi, lo = o["lsn"].split("/")
        rows.append(((int(hi, 16) << 32) | int(lo, 16), o["xid"], bytes.fromhex(o["data"])))
    log = tmp_path / "log.parquet"
    write_raw_log(log, rows)
    target = tmp_path / "api"
    config = {"source_log": str(log), "target": {"path": str(target)}}
    assert applier.replay(spark, config).transactions > 0
    tables = sorted(p for p in target.glob("*/*") if (p / "_delta_log").exists() and p.parent.name != "_applier")
    assert len(tables) >= 2, tables
    shutil.rmtree(tables[0])
    shutil.copytree(tables[1], tables[0])  # another Delta table (its own table id) in its place
    with pytest.raises(TargetMissingError, match="no longer the Delta table earlier runs wrote"):
        applier.replay(spark, config)
