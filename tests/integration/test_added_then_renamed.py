"""A column added after the mirror's last run, written, then renamed before the next (the schema walks,
seed 23 on PostgreSQL 18; issue 73). No Relation could record the added column's attnum: the one that
added it is followed by the rename before the catalog agrees with the stream again. In one group the old
name's values were lost (NULL in Delta, the column taken for one added and dropped again) with exit 0.

The catalog proves the rename when it can (the one live column newer than the recorded baseline, with
no column newer than it dropped since); where it cannot (two such columns), the table is copied again at
a new position. Both end equal to Postgres; neither stops. Each case is run through the CLI with the
default config, as a supervisor would."""

from __future__ import annotations

import pytest
from test_unattended import _assert_equal, _config

from applier.cli import main as cli_main

pytestmark = [pytest.mark.postgres, pytest.mark.spark]


def _runs(pg, tmp_path, capsys, between: list[str]) -> str:
    """t (id, c) and other, mirrored; ``between``; mirrored again (both runs exit 0). The second run's log."""
    with pg.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, c bool); INSERT INTO t VALUES (1, true), (2, false);"
                     "CREATE TABLE other (id int PRIMARY KEY); CREATE PUBLICATION ar FOR ALL TABLES")
    cfg = _config(tmp_path, pg, "ar", "ar")
    assert cli_main(["mirror", "--config", cfg, "--once"]) == 0
    with pg.connect() as conn:
        for statement in between:
            conn.execute(statement)
    capsys.readouterr()
    code = cli_main(["mirror", "--config", cfg, "--once"])
    err = capsys.readouterr().err
    assert code == 0, err
    _assert_equal(None, pg, tmp_path, [("public", "t"), ("public", "other")])
    return err


ADDED_WRITTEN_RENAMED = ["ALTER TABLE t ADD COLUMN a date", "INSERT INTO t VALUES (23, true, '2023-11-03')",
                         "ALTER TABLE t RENAME COLUMN a TO r"]


def test_a_rename_the_catalog_proves_keeps_the_values_with_no_copy(pg, tmp_path, capsys):
    err = _runs(pg, tmp_path, capsys, [*ADDED_WRITTEN_RENAMED, "UPDATE t SET r = '2023-11-05' WHERE id = 1"])
    assert "dropped again" not in err and "copying the table again" not in err, err


def test_with_no_later_change_the_rename_reaches_delta_by_the_end_of_the_run(pg, tmp_path, capsys):
    """No Relation shows the new name: the end of the run brings it (applier.drivers.unsentshapes), proven
    by the catalog as above; it used to wait for the table's next change."""
    err = _runs(pg, tmp_path, capsys, [*ADDED_WRITTEN_RENAMED, "INSERT INTO other VALUES (1)"])
    assert "dropped again" not in err and "copying the table again" not in err, err


def test_a_rename_of_a_column_with_a_default_copies_the_table_again(pg, tmp_path, capsys):
    """Rows that existed take the default under the old name, which no fill of the new name can place:
    copied again."""
    err = _runs(pg, tmp_path, capsys, ["ALTER TABLE t ADD COLUMN a date DEFAULT '2020-01-01'",
                                       "INSERT INTO t VALUES (23, true, '2023-11-03')",
                                       "ALTER TABLE t RENAME COLUMN a TO r",
                                       "UPDATE t SET r = '2023-11-05' WHERE id = 1"])
    assert "copying the table again" in err, err


def test_two_columns_added_and_renamed_copy_the_table_again_rather_than_guess(pg, tmp_path, capsys):
    """Two live columns newer than the baseline: nothing says which old name is which new one (the sink
    used to drop what the old names held): the table is copied again."""
    _runs(pg, tmp_path, capsys, ["ALTER TABLE t ADD COLUMN a date, ADD COLUMN b int",
                                 "INSERT INTO t VALUES (23, true, '2023-11-03', 7)",
                                 "ALTER TABLE t RENAME COLUMN a TO r", "ALTER TABLE t RENAME COLUMN b TO s",
                                 "UPDATE t SET r = '2023-11-05' WHERE id = 1", "INSERT INTO other VALUES (1)"])


def test_a_column_added_and_dropped_again_is_not_taken_for_a_rename(pg, tmp_path, capsys):
    """A column dropped above the baseline: the newer live column may be a new one, never proven the
    old one; the dropped column's value is gone in Postgres too."""
    _runs(pg, tmp_path, capsys, ["ALTER TABLE t ADD COLUMN a date", "INSERT INTO t VALUES (23, true, '2023-11-03')",
                                 "ALTER TABLE t DROP COLUMN a", "ALTER TABLE t ADD COLUMN r date",
                                 "UPDATE t SET r = '2023-11-05' WHERE id = 1"])
