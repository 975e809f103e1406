"""`verify` follows the value policy of the mirror it checks: a table holding `infinity` and BC
values, written under `apply.special_values: clamp` and `null`, verifies equal (it used to exit 2
asking for the very policy the config already set); with the default policy it still says what
to set. Also the config's excluded columns are left out of the comparison."""

from __future__ import annotations

import pytest

from applier.cli import main as cli_main
from applier.config import ApplySettings, ReplayConfig, TablesSettings, TargetSettings
from applier.drivers.replay import replay_log
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


@pytest.mark.parametrize("policy", ["clamp", "null"])
def test_a_clamped_or_nulled_mirror_verifies_equal_under_its_config(pg, spark, tmp_path, capsys, policy):
    with pg.connect() as conn:
        conn.execute("CREATE TABLE sv (id int PRIMARY KEY, ts timestamptz, d date, secret text)")
        conn.execute("CREATE PUBLICATION svp FOR TABLE sv")
        create_slot(conn, "svs")
        conn.execute("INSERT INTO sv VALUES (1, 'infinity', '0044-03-15 BC', 'a'), "
                     "(2, '-infinity', 'infinity', 'b'), (3, '2020-01-01 00:00:00+00', '2020-01-01', 'c')")
        rows = [(m.lsn, m.xid, bytes(m.data)) for m in peek(conn, "svs", pgoutput_options("svp"))]
    log, target = tmp_path / "log.parquet", tmp_path / "delta"
    write_raw_log(log, rows)
    tables = TablesSettings.model_validate({"rules": [{"match": "public.sv", "exclude_columns": ["secret"]}]})
    replay_log(spark, ReplayConfig(source_log=str(log), target=TargetSettings(path=str(target)), tables=tables,
                                   apply=ApplySettings(special_values=policy)))
    config = tmp_path / "mirror.yaml"
    config.write_text(f"source: {{dsn_env: APPLIER_TEST_DSN, slot: svs, publication: svp}}\n"
                      f"target: {{path: '{target}'}}\n"
                      "tables: {rules: [{match: public.sv, exclude_columns: [secret]}]}\n"
                      f"apply: {{special_values: '{policy}'}}\n")
    import os

    os.environ["APPLIER_TEST_DSN"] = pg.dsn
    try:
        capsys.readouterr()
        assert cli_main(["verify", "--config", str(config)]) == 0, capsys.readouterr()
        assert "public.sv: postgres 3 rows, delta 3 rows: equal" in capsys.readouterr().out
        # the same mirror checked under another policy differs (the comparison really uses it)
        other = "null" if policy == "clamp" else "clamp"
        assert cli_main(["verify", "--config", str(config), "--special-values", other]) == 1
        # without any policy: the old behaviour, a clear error naming the setting
        assert cli_main(["verify", "--dsn", pg.dsn, "--target", str(target)]) == 4  # a data error: exit 4
        assert "special_values" in capsys.readouterr().err
    finally:
        del os.environ["APPLIER_TEST_DSN"]
