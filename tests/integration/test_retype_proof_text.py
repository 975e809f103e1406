"""A widening rewrite (``ALTER ... TYPE bigint``) is proven to have kept the values by comparing the rows it
wrote with the Delta table's (applier.sink.retypes), read from Postgres as the stream sends them: the type's
output text. A ``::text`` cast is not that for every key type (bool casts to 'true', char(n) loses its
padding, inet keeps its /32), and the proof then failed on tables keyed by such a column (a ValueConversionError
for bool), each mended by a copy of the whole table that nothing needed."""

from __future__ import annotations

import pytest
from test_unattended import _assert_equal, _config

from applier.cli import main as cli_main

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


@pytest.mark.parametrize("key_type,keys", [("bool", "true), (false"), ("char(4)", "'a'), ('bb'"),
                                           ("inet", "'10.0.0.1'), ('10.0.0.2/32'")])
def test_a_widening_of_a_table_keyed_by_a_column_whose_cast_to_text_differs_is_proven_kept(
        pg, tmp_path, capsys, key_type, keys):
    with pg.connect() as conn:
        conn.execute(f"CREATE TABLE t (k {key_type} PRIMARY KEY); INSERT INTO t VALUES ({keys});"
                     "ALTER TABLE t ADD COLUMN n int DEFAULT 5; CREATE PUBLICATION rp FOR ALL TABLES")
    cfg = _config(tmp_path, pg, "rp", "rp")
    assert cli_main(["mirror", "--config", cfg, "--once"]) == 0
    with pg.connect() as conn:
        conn.execute("ALTER TABLE t ALTER COLUMN n TYPE bigint")
        conn.execute("UPDATE t SET n = 6 WHERE n = 5 AND ctid = (SELECT min(ctid) FROM t)")
    capsys.readouterr()
    assert cli_main(["mirror", "--config", cfg, "--once", "--verbose"]) == 0
    err = capsys.readouterr().err
    assert "copied again" not in err and "copying the table again" not in err and "cannot prove" not in err, err
    _assert_equal(None, pg, tmp_path, [("public", "t")])
