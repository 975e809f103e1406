"""A group's commit rewrites the files its keys reach, not the whole table.

Without deletion vectors every file holding an updated or deleted row is rewritten. A catch-up whose
every group updates the rows the group before it inserted rewrote the whole table with each group once
delta-rs had written it as one file (its default file size is 100 MiB): the 30M-change catch-up's commits
grew from 0.2 to 7 s and its memory to 1.9 GB. New tables are created with ``delta.targetFileSize``
(``applier.sink.spec.DEFAULT_TARGET_FILE_SIZE``), and the merge's key bounds leave the other files alone.
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable
from test_unattended import _assert_equal, _config, _run

from applier.sink.spec import DEFAULT_TARGET_FILE_SIZE, TARGET_FILE_SIZE

pytestmark = pytest.mark.integration

SCHEMA = """
CREATE TABLE fs_items (id bigint PRIMARY KEY, v int NOT NULL, note text);
CREATE TABLE fs_plain (id int PRIMARY KEY);
CREATE PUBLICATION fs_pub FOR TABLE fs_items, fs_plain;
"""

#: each transaction inserts 200 rows, then updates 50 and deletes 10 of the rows the one before inserted
WORKLOAD = """
DO $$
BEGIN
  FOR i IN 0..11 LOOP
    INSERT INTO fs_items SELECT i * 200 + g, g, repeat('x', 40) || g FROM generate_series(1, 200) g;
    UPDATE fs_items SET v = v + 1 WHERE id > (i - 1) * 200 AND id <= (i - 1) * 200 + 50;
    DELETE FROM fs_items WHERE id > (i - 1) * 200 + 190 AND id <= i * 200;
    COMMIT;
  END LOOP;
END $$
"""


def test_each_group_rewrites_only_the_files_its_keys_reach(pg, spark, tmp_path, capsys):
    with pg.connect() as conn:
        conn.execute(SCHEMA)
    cfg = _config(tmp_path, pg, "fs_slot", "fs_pub",
                  "apply: {max_group_transactions: 2}\n"
                  "tables: {rules: [{match: public.fs_items, table_properties: {delta.targetFileSize: '4096'}}]}\n")
    code, err = _run(cfg, capsys)
    assert code == 0, err  # the slot, and the empty tables
    with pg.connect() as conn:
        conn.autocommit = True  # (the DO block commits each transaction)
        conn.execute(WORKLOAD)  # alone: statements sent together run in one transaction
        conn.execute("INSERT INTO fs_plain VALUES (1)")
    code, err = _run(cfg, capsys)
    assert code == 0, err
    _assert_equal(spark, pg, tmp_path, [("public", "fs_items"), ("public", "fs_plain")])

    items = DeltaTable(str(tmp_path / "delta" / "public" / "fs_items"))
    assert items.metadata().configuration[TARGET_FILE_SIZE] == "4096"  # the rule's own
    files = len(items.file_uris())
    merges = [h for h in items.history() if h.get("operation") == "MERGE"]
    assert len(merges) >= 4, [h.get("operation") for h in items.history()]
    removed = [int(h["operationMetrics"]["num_target_files_removed"]) for h in merges]
    # each group's updates and deletes reach the rows of the group before: a file or two of them, never the
    # table's files of older groups
    assert files > 2 * max(removed), (files, removed)

    plain = DeltaTable(str(tmp_path / "delta" / "public" / "fs_plain"))
    assert plain.metadata().configuration[TARGET_FILE_SIZE] == str(DEFAULT_TARGET_FILE_SIZE)
