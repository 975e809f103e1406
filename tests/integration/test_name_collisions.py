"""Source names cannot collide with the applier's own: a schema named ``_applier`` (tables ``spill``,
``prepared``, ``skipped_transactions``) does not land in the state directory, a table named
``_delta_log`` does not turn its schema directory into a broken Delta table, user columns named
like the MERGE's internal columns (``__applier_op``, ``__applier_img``, ``__applier_t0``) merge
fine on every later run, and ``verify``/``status`` find tables whose names were escaped into paths
(``..``). Two replays of a real capture (the second one MERGEs, with unchanged TOAST values taken
from the target), then everything is compared with Postgres."""

from __future__ import annotations

import json
import random
import string

import pytest

from applier.checks.verify import verify_against_postgres
from applier.cli import main as cli_main
from applier.config import ApplySettings, ReplayConfig, TargetSettings
from applier.drivers.replay import replay_log
from applier.sink.naming import mirrored_table_dirs, source_name_of, table_location
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

TABLES = [("_applier", "spill"), ("_applier", "prepared"), ("_applier", "skipped_transactions"),
          ("public", "_delta_log"), ("public", ".."), ("public", "cols"), ("public", "bag")]


@pytest.mark.usefixtures("replay_path")
def test_reserved_names_do_not_collide_and_every_later_run_works(pg, spark, tmp_path, capsys):
    big = "".join(random.Random(7).choices(string.ascii_letters, k=20_000))  # incompressible: TOASTed
    with pg.connect() as conn:
        conn.execute('CREATE SCHEMA "_applier"')
        for name in ("spill", "prepared", "skipped_transactions"):
            conn.execute(f'CREATE TABLE "_applier"."{name}" (id int PRIMARY KEY, v text)')
        conn.execute('CREATE TABLE public."_delta_log" (id int PRIMARY KEY, v text)')
        conn.execute('CREATE TABLE public.".." (id int PRIMARY KEY, v text)')
        conn.execute('CREATE TABLE public.cols (id int PRIMARY KEY, "__applier_op" text, "__applier_img" int, '
                     '"__applier_t0" text)')
        conn.execute('CREATE TABLE public.bag ("__applier_img" int, "__applier_op" text)')
        conn.execute("ALTER TABLE public.bag REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        create_slot(conn, "s")
        for schema, name in TABLES[:5]:
            conn.execute(f'INSERT INTO "{schema}"."{name}" VALUES (1, %s), (2, %s)', (f"{name}-1", f"{name}-2"))
        conn.execute("INSERT INTO public.cols VALUES (1, 'op', 1, %s), (2, 'op2', 2, 'small')", (big,))
        conn.execute("INSERT INTO public.bag VALUES (1, 'a'), (1, 'a'), (2, 'b')")
        first = [(m.lsn, m.xid, bytes(m.data)) for m in peek(conn, "s", pgoutput_options("pub"))]
        for schema, name in TABLES[:5]:
            conn.execute(f'UPDATE "{schema}"."{name}" SET v = v || \'!\' WHERE id = 1')
            conn.execute(f'DELETE FROM "{schema}"."{name}" WHERE id = 2')
        # __applier_t0 stays: an unchanged TOAST value the second replay takes from the target
        conn.execute("UPDATE public.cols SET \"__applier_op\" = 'changed', \"__applier_img\" = 9")
        conn.execute("DELETE FROM public.bag WHERE ctid = "
                     "(SELECT min(ctid) FROM public.bag WHERE \"__applier_img\" = 1)")
        conn.execute("UPDATE public.bag SET \"__applier_op\" = 'B' WHERE \"__applier_img\" = 2")
        rows = [(m.lsn, m.xid, bytes(m.data)) for m in peek(conn, "s", pgoutput_options("pub"))]
        assert any(b"u" in d for _l, _x, d in rows if d[:1] == b"U")

        target = tmp_path / "delta"
        for n, part in enumerate((first, rows)):
            log = tmp_path / f"log{n}.parquet"
            write_raw_log(log, part)
            replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)),
                                           apply=ApplySettings(grouping="transaction")))
        again = replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target))))
        assert again.applied == 0  # a third run finds everything applied, and does not crash

        # Nothing of the source landed in the state directory; the reserved names were escaped.
        state = target / "_applier"
        assert not any((state / n / "_delta_log").exists() for n in ("spill", "prepared", "skipped_transactions"))
        assert (target / "%u5Fapplier" / "spill" / "_delta_log").is_dir()
        assert (target / "public" / "%u5Fdelta_log" / "_delta_log").is_dir()
        assert not (target / "public" / "_delta_log").exists()
        assert table_location(target, "public", "..") == str(target / "public" / "%u2E.")
        assert sorted(source_name_of(d) for d in mirrored_table_dirs(target)) == sorted(TABLES)

        for result in verify_against_postgres(spark, conn, str(target), TABLES):
            assert result.equal, (result.source_name, result.only_in_source[:2], result.only_in_target[:2])

    capsys.readouterr()
    assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "UndefinedTable" not in out
    assert cli_main(["status", "--target", str(target), "--json"]) == 0
    names = {t["table"] for t in json.loads(capsys.readouterr().out)["tables"]}
    assert names == {f"{s}.{t}" for s, t in TABLES}
