"""Consistent cuts (issue 51) against a real PostgreSQL, read back with delta-rs.

The workload writes ``orders`` and ``order_lines`` in the same transactions, with an invariant Postgres
keeps at every commit: each order's total is the sum of its lines, and every line has its order. A
mirror applies it in groups of two transactions while a reader thread reads both Delta tables again and
again at the newest cut: every read must hold the invariant. The same Delta logs show that reading the
newest version of each table does not: between the two tables' commits of a group, one table is at the
group's version and the other at the one before, and those pairs are read and must break it (else the
test would prove nothing). Then: a SIGKILL between a group's commits and its cut, the CLI, the API,
``status``, ``maintain`` and a replay.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from applier.checks.cuts import find_cut
from applier.cli import main
from applier.config import ApplySettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.errors import NoCutError
from applier.lsn import format_lsn, parse_lsn
from applier.sink.cuts import CutLog, cuts_path
from applier.sink.spec import app_id_for
from applier.spark.session import SparkProvider

pytestmark = [pytest.mark.postgres]

deltalake = pytest.importorskip("deltalake")

REPO = Path(__file__).resolve().parents[2]
SCHEMA = ("CREATE TABLE orders (id int PRIMARY KEY, total int NOT NULL)",
          "CREATE TABLE order_lines (id int PRIMARY KEY, order_id int NOT NULL, amount int NOT NULL)")


def _no_spark() -> SparkProvider:
    """A provider that fails the test if anything starts Spark: cuts are written and read with delta-rs."""
    def refuse() -> Any:
        raise AssertionError("Spark was started")
    return SparkProvider(refuse)


def _config(pg, target: Path, publication: str, slot: str) -> MirrorConfig:
    return MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot=slot, publication=publication),
                        target=TargetSettings(path=str(target)),
                        apply=ApplySettings(max_group_transactions=2, max_group_seconds=60.0))


def _setup(conn, publication: str) -> None:
    for sql in SCHEMA:
        conn.execute(sql)
    conn.execute(f"CREATE PUBLICATION {publication} FOR TABLE orders, order_lines")


def _workload(conn, transactions: int, seed: int, first_id: int = 1) -> None:
    """Multi-table transactions that keep the invariant: new orders with lines, a line added to an order
    (its total raised), an order deleted with its lines."""
    rng = random.Random(seed)
    next_id = first_id * 100
    orders: list[int] = [r[0] for r in conn.execute("SELECT id FROM orders")]
    for i in range(transactions):
        with conn.transaction():
            if orders and i % 5 == 4:
                victim = orders.pop(rng.randrange(len(orders)))
                conn.execute("DELETE FROM order_lines WHERE order_id = %s", (victim,))
                conn.execute("DELETE FROM orders WHERE id = %s", (victim,))
            elif orders and i % 3 == 2:
                order, amount = rng.choice(orders), rng.randint(1, 50)
                next_id += 1
                conn.execute("INSERT INTO order_lines VALUES (%s, %s, %s)", (next_id, order, amount))
                conn.execute("UPDATE orders SET total = total + %s WHERE id = %s", (amount, order))
            else:
                order = first_id + i
                amounts = [rng.randint(1, 50) for _ in range(rng.randint(1, 3))]
                conn.execute("INSERT INTO orders VALUES (%s, %s)", (order, sum(amounts)))
                for amount in amounts:
                    next_id += 1
                    conn.execute("INSERT INTO order_lines VALUES (%s, %s, %s)", (next_id, order, amount))
                orders.append(order)


def _rows(target: Path, table: str, version: int | None) -> list[dict[str, Any]]:
    dt = deltalake.DeltaTable(str(target / "public" / table), version=version)
    return dt.to_pyarrow_table().to_pylist()


def _broken(orders: list[dict[str, Any]], lines: list[dict[str, Any]]) -> list[str]:
    """What breaks the invariant in one read of both tables."""
    totals = {o["id"]: o["total"] for o in orders}
    sums: dict[int, int] = {}
    problems = []
    for line in lines:
        if line["order_id"] not in totals:
            problems.append(f"line {line['id']} without its order {line['order_id']}")
        sums[line["order_id"]] = sums.get(line["order_id"], 0) + line["amount"]
    problems += [f"order {o}: total {t} != lines {sums.get(o, 0)}" for o, t in totals.items() if sums.get(o, 0) != t]
    return problems


def _versions(cut) -> tuple[int, int]:
    by_name = {t.name: t.version for t in cut.tables if t.kind == "mirror"}
    return by_name["public.orders"], by_name["public.order_lines"]


def _at_cut(target: Path, cut) -> list[str]:
    orders_v, lines_v = _versions(cut)
    return _broken(_rows(target, "orders", orders_v), _rows(target, "order_lines", lines_v))


def test_reads_at_a_cut_never_see_half_a_transaction(pg, tmp_path):
    target = tmp_path / "delta"
    config = _config(pg, target, "cut_pub", "cut")
    with pg.connect() as conn:
        _setup(conn, "cut_pub")
        conn.execute("INSERT INTO orders VALUES (0, 5)")
        conn.execute("INSERT INTO order_lines VALUES (0, 0, 5)")
        mirror(_no_spark(), config, once=True)  # the copy: tables exist before the groups
        _workload(conn, 40, seed=51)

        done = threading.Event()
        reads: list[tuple[int, list[str]]] = []
        errors: list[BaseException] = []

        def reader() -> None:
            while not done.is_set():
                try:
                    cut = find_cut(target)
                except NoCutError:
                    continue
                try:
                    reads.append((cut.lsn, _at_cut(target, cut)))
                except BaseException as e:  # noqa: BLE001 - reported by the test thread
                    errors.append(e)
                    return

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        try:
            summary = mirror(_no_spark(), config, once=True)
        finally:
            done.set()
            thread.join(60)
        assert not errors, errors
        assert summary.transactions == 40

        cuts = CutLog(str(target)).cuts()
        # the copy's (at the slot's snapshot), then one per group: of two transactions, or of one when the
        # stream held nothing more at that moment (the follower applies a group then: ReplicationFollower.run;
        # a CI run made a group of one when the collector got faster, and counted 22)
        assert 21 <= len(cuts) <= 41, len(cuts)
        # exactly one cut per group: every transaction writes orders, so each group is one commit to it
        assert len(cuts) - 1 == _versions(cuts[-1])[0] - _versions(cuts[0])[0]
        assert [c.lsn for c in cuts] == sorted({c.lsn for c in cuts})  # each once, in order
        assert cuts[0].commit_time is None and all(c.commit_time is not None for c in cuts[1:])
        assert {t.relation_oid for c in cuts for t in c.tables} == {
            r[0] for r in conn.execute("SELECT oid::int FROM pg_class WHERE relname IN ('orders', 'order_lines')")}
        # the reader read while the mirror applied: every read at a cut held
        assert reads, "the reader read no cut while the mirror ran"
        assert all(not problems for _lsn, problems in reads), [r for r in reads if r[1]][:3]
        # every cut holds, and the last is Postgres now
        for cut in cuts:
            assert not _at_cut(target, cut), format_lsn(cut.lsn)
        final_orders, final_lines = _versions(cuts[-1])
        assert sorted((r["id"], r["total"]) for r in _rows(target, "orders", final_orders)) == sorted(
            conn.execute("SELECT id, total FROM orders").fetchall())
        assert sorted((r["id"], r["amount"]) for r in _rows(target, "order_lines", final_lines)) == sorted(
            conn.execute("SELECT id, amount FROM order_lines").fetchall())

    # What a reader of each table's newest version sees while a group commits: one table at the group's
    # version, the other still at the one before. Those reads break the invariant.
    mixed = 0
    for before, after in zip(cuts, cuts[1:], strict=False):
        (ob, lb), (oa, la) = _versions(before), _versions(after)
        if ob == oa or lb == la:
            continue
        mixed += bool(_broken(_rows(target, "orders", oa), _rows(target, "order_lines", lb)))
        mixed += bool(_broken(_rows(target, "orders", ob), _rows(target, "order_lines", la)))
    assert mixed > 0, "no read of the newest versions broke the invariant: the test proves nothing"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "applier.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_sigkill_before_the_cut_leaves_the_last_cut_and_the_next_run_records_it(pg, tmp_path):
    target = tmp_path / "delta"
    path = tmp_path / "mirror.yaml"
    path.write_text(yaml.safe_dump({"source": {"slot": "crash", "publication": "crash_pub"},
                                    "target": {"path": str(target)},
                                    "apply": {"max_group_transactions": 2, "max_group_seconds": 60.0}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "APPLIER_DSN": pg.dsn}
    env.pop("APPLIER_CRASH_AT", None)
    with pg.connect() as conn:
        _setup(conn, "crash_pub")
        assert _cli("mirror", "--config", str(path), "--once", env=env).returncode == 0, "the copy"
        assert len(CutLog(str(target)).cuts()) == 1  # the copy's
        _workload(conn, 6, seed=7)
        killed = _cli("mirror", "--config", str(path), "--once", env={**env, "APPLIER_CRASH_AT": "before_cut:2"})
        assert killed.returncode == -9, killed.stderr[-2000:]
        cuts = CutLog(str(target)).cuts()
        assert len(cuts) == 2  # and the first group's; the second group's commits exist, its cut does not
        applied = deltalake.DeltaTable(str(target / "public" / "orders")).transaction_version(
            app_id_for("public.orders"))
        assert applied is not None and applied > cuts[-1].lsn
        assert not _at_cut(target, cuts[-1])

        again = _cli("mirror", "--config", str(path), "--once", env=env)
        assert again.returncode == 0, again.stderr[-2000:]
        cuts = CutLog(str(target)).cuts()
        assert len(cuts) == 4 and cuts[2].lsn == applied  # the missing cut recorded, once
        for cut in cuts:
            assert not _at_cut(target, cut)
        # a run with nothing new records nothing
        assert _cli("mirror", "--config", str(path), "--once", env=env).returncode == 0
        assert len(CutLog(str(target)).cuts()) == 4


@pytest.mark.spark
def test_cli_api_status_maintain_and_replay(pg, spark, tmp_path, capsys):
    import applier
    from applier.config import ReplayConfig
    from applier.drivers.replay import replay_log
    from applier.sources.rawlog_writer import write_raw_log
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    target = tmp_path / "delta"
    config = _config(pg, target, "api_pub", "api")
    with pg.connect() as conn:
        _setup(conn, "api_pub")
        assert main(["cut", "--target", str(target)]) == 3  # nothing copied yet: no cut
        assert "no consistent cut" in capsys.readouterr().err
        mirror(_no_spark(), config, once=True)
        copied = CutLog(str(target)).cuts()  # the copy's cut, at the slot's snapshot, before any group
        assert len(copied) == 1 and copied[0].commit_time is None and len(copied[0].tables) == 2
        create_slot(conn, "raw")  # a raw log of the same transactions, for the replay below
        _workload(conn, 6, seed=3)
        mirror(_no_spark(), config, once=True)
        raw = tmp_path / "raw.parquet"
        write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "raw", pgoutput_options("api_pub"))))
    cuts = CutLog(str(target)).cuts()[1:]  # the groups' (after the copy's)
    assert len(cuts) == 3
    first, newest = cuts[0], cuts[-1]
    assert first.commit_time is not None

    assert main(["cut", "--target", str(target)]) == 0
    out = capsys.readouterr().out
    assert f"cut {newest.cut_id} at LSN {format_lsn(newest.lsn)}" in out and "public.order_lines" in out
    assert "ago" in out and next(t.table_id for t in newest.tables) in out
    assert main(["cut", "--target", str(target), "--json", "--at", format_lsn(newest.lsn - 1)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert parse_lsn(shown["lsn"]) == cuts[1].lsn
    assert {t["table"] for t in shown["tables"]} == {"public.orders", "public.order_lines"}
    assert {t["path"] for t in shown["tables"]} == {"public/orders", "public/order_lines"}
    assert shown["id"] == cuts[1].cut_id and {t["table_id"] for t in shown["tables"]} == {
        str(deltalake.DeltaTable(str(target / "public" / name)).metadata().id) for name in ("orders", "order_lines")}
    assert main(["cut", "--target", str(target), "--json", "--at-time", first.commit_time.isoformat()]) == 0
    assert parse_lsn(json.loads(capsys.readouterr().out)["lsn"]) == first.lsn
    assert main(["cut", "--target", str(target), "--json", "--at", format_lsn(first.lsn - 1)]) == 0
    assert parse_lsn(json.loads(capsys.readouterr().out)["lsn"]) == copied[0].lsn
    assert main(["cut", "--target", str(target), "--at", format_lsn(copied[0].lsn - 1)]) == 3
    assert main(["cut", "--target", str(target), "--at", "yesterday"]) == 2
    assert main(["cut", "--target", str(target), "--at-time", "0/16B3748"]) == 2
    capsys.readouterr()

    assert applier.cut(target).lsn == newest.lsn
    assert applier.cut(str(target), at=format_lsn(cuts[1].lsn)).lsn == cuts[1].lsn
    assert applier.cut(target, at=first.commit_time).lsn == first.lsn
    frames = applier.read_consistent(spark, target, ["public.orders", "public.order_lines"], at=cuts[1].lsn)
    orders = [r.asDict() for r in frames["public.orders"].collect()]
    lines = [r.asDict() for r in frames["public.order_lines"].collect()]
    assert orders and not _broken(orders, lines)
    assert sorted(r["id"] for r in orders) == sorted(r["id"] for r in _rows(target, "orders", _versions(cuts[1])[0]))

    assert main(["status", "--target", str(target), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert parse_lsn(status["cut"]["lsn"]) == newest.lsn and status["cut"]["age_seconds"] >= 0
    assert main(["status", "--target", str(target)]) == 0
    assert f"consistent cut: LSN {format_lsn(newest.lsn)}" in capsys.readouterr().out

    # maintain keeps every cut younger than the retention (and always the newest), and the cuts table compact
    assert main(["maintain", "--target", str(target), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cuts_pruned"] == 0 and len(CutLog(str(target)).cuts()) == 4
    assert report["cuts"] is not None and "_applier/cuts" not in {t["table"] for t in report["tables"]}
    assert CutLog(str(target)).prune(168, now=datetime.now(UTC) + timedelta(days=8)) == 3
    assert [c.lsn for c in CutLog(str(target)).cuts()] == [newest.lsn]

    # a replay records cuts as well (the raw log holds the same six transactions)
    replayed = tmp_path / "replayed"
    replay_log(_no_spark(), ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(replayed)),
                                         apply=ApplySettings(max_group_transactions=2),
                                         distributed={"mode": "off"}))
    again = CutLog(str(replayed)).cuts()
    assert [c.lsn for c in again] == [c.lsn for c in cuts]
    assert not _at_cut(replayed, again[1])
    assert Path(cuts_path(str(replayed))).is_dir()

    # and so does the catch-up on Spark's executors: a cut after each group it commits, with its time
    folded = tmp_path / "folded"
    stats = replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(folded)),
                                           apply=ApplySettings(max_group_transactions=2),
                                           distributed={"mode": "on", "partition_messages": 4}))
    assert stats.ranges and stats.ranges > 1, stats
    on_executors = CutLog(str(folded)).cuts()
    assert len(on_executors) > 1 and on_executors[-1].lsn == cuts[-1].lsn, on_executors
    assert all(c.commit_time is not None for c in on_executors)
    assert {c.commit_time for c in on_executors} <= {c.commit_time for c in cuts}
    assert not any(_at_cut(folded, c) for c in on_executors)


def _old_cut_rows(cut) -> Any:
    """A cut as releases before cut ids wrote it: no ``cut_id``, no ``table_id`` in its tables."""
    import pyarrow as pa

    table = pa.struct([pa.field("relation_oid", pa.int64()), pa.field("table", pa.string()),
                       pa.field("kind", pa.string()), pa.field("path", pa.string()),
                       pa.field("version", pa.int64())])
    schema = pa.schema([pa.field("lsn", pa.string()), pa.field("lsn_value", pa.int64()),
                        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
                        pa.field("recorded_at", pa.timestamp("us", tz="UTC")), pa.field("tables", pa.list_(table))])
    tables = [{"relation_oid": t.relation_oid, "table": t.name, "kind": t.kind, "path": t.path, "version": t.version}
              for t in cut.tables]
    return pa.Table.from_pylist([{"lsn": format_lsn(cut.lsn), "lsn_value": cut.lsn, "commit_time": cut.commit_time,
                                  "recorded_at": cut.recorded_at, "tables": tables}], schema=schema)


def test_cuts_have_ids_their_tables_delta_ids_and_a_table_written_anew_is_refused(pg, tmp_path, monkeypatch):
    """Each cut has an id, and each table in it its Delta table id beside its version (issue 75, item 4). A
    cuts table written before ids is evolved by the next append, its old cuts kept (ids None). A table
    written anew at its path after a cut (another id) is refused at that cut: its version there holds
    other rows, which a reader must not be handed as the cut's."""
    import applier.sink.cuts as cuts_module
    from applier.checks.cuts import table_at
    from applier.errors import CutTableReplacedError

    target = tmp_path / "delta"
    config = _config(pg, target, "ids_pub", "ids")
    with pg.connect() as conn:
        _setup(conn, "ids_pub")
        with monkeypatch.context() as patch:
            patch.setattr(cuts_module, "cut_to_arrow", _old_cut_rows)
            mirror(_no_spark(), config, once=True)  # the copy's cut, in the old form
        (old,) = CutLog(str(target)).cuts()
        assert old.cut_id is None and all(t.table_id is None for t in old.tables)
        _workload(conn, 6, seed=11)
        mirror(_no_spark(), config, once=True)
    cuts = CutLog(str(target)).cuts()
    assert len(cuts) == 4 and cuts[0].lsn == old.lsn and cuts[0].cut_id is None  # kept as it was
    assert len({c.cut_id for c in cuts[1:]}) == 3 and all(c.cut_id for c in cuts[1:])
    ids = {name: str(deltalake.DeltaTable(str(target / "public" / name)).metadata().id)
           for name in ("orders", "order_lines")}
    for cut in cuts[1:]:
        assert {t.name: t.table_id for t in cut.tables} == {f"public.{n}": i for n, i in ids.items()}
    fields = deltalake.DeltaTable(cuts_path(str(target))).schema().to_arrow()
    assert "cut_id" in fields.names

    # public.orders written anew at its path: another table id
    import shutil

    orders = target / "public" / "orders"
    rows = deltalake.DeltaTable(str(orders)).to_pyarrow_table()
    shutil.rmtree(orders)
    deltalake.write_deltalake(str(orders), rows)
    for cut in cuts[1:]:
        with pytest.raises(CutTableReplacedError, match="written anew since") as info:
            table_at(cut, target, "public.orders")
        assert info.value.context["recorded_table_id"] == ids["orders"]
        entry, _ = table_at(cut, target, "public.order_lines")  # the other table is still the one recorded
        assert entry.table_id == ids["order_lines"]
    table_at(cuts[0], target, "public.orders")  # a cut without ids: nothing to compare (as before)
