"""A transaction larger than ``apply.memory_budget_mb`` (issue 47, repro 19): it is spilled to disk and
read back, and the run said nothing for minutes meanwhile. Read back, each chunk of the spill held its own
copies of the schema version, so one transaction became a batch per chunk, and its Delta commit said
``transactions=`` that many. Now the run says what it does, and the commit says one transaction."""

from __future__ import annotations

import logging

import deltalake
import pytest

from applier.assembly import feeder
from applier.checks.verify import verify_against_postgres
from applier.config import ApplySettings, DistributedSettings, MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.sink import engine
from applier.spark.session import SparkProvider

pytestmark = [pytest.mark.postgres]


def test_a_spilled_transaction_is_reported_and_committed_as_one(pg, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(feeder, "LARGE_TRANSACTION_CHANGES", 1000)
    monkeypatch.setattr(engine, "LARGE_FOLD_ROWS", 1000)
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="huge", publication="huge"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          apply=ApplySettings(memory_budget_mb=1), distributed=DistributedSettings(mode="off"))
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE h (id int PRIMARY KEY, v int, pad text)")
        conn.execute("INSERT INTO h SELECT g, g, repeat('p', 60) FROM generate_series(1, 20000) g")
        conn.execute("CREATE PUBLICATION huge FOR TABLE h")
        mirror(no_spark, config, once=True)
        conn.execute("UPDATE h SET v = v + 1, pad = pad || 'x'")
        with caplog.at_level(logging.INFO):
            mirror(no_spark, config, once=True)
        said = caplog.text
        for line in ("over apply.memory_budget_mb (1 MB): spilled to disk", "converting its 20,000 changes",
                     "public.h: folding 20,000 row changes of 1 transaction(s)", "public.h: merging 20,000 rows",
                     "public.h: merged 20,000 rows"):
            assert line in said, (line, said)
        [last] = deltalake.DeltaTable(str(tmp_path / "delta" / "public" / "h")).history(1)
        assert " transactions=1 " in last["userMetadata"], last
        results = verify_against_postgres(no_spark, conn, str(tmp_path / "delta"), [("public", "h")])
        assert all(r.equal for r in results), [(r.source_rows, r.target_rows, r.problems) for r in results]
