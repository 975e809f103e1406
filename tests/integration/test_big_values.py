"""Values over pyarrow's CSV block (issue 47, repro 13a): a table holding one bytea of ~17 MB (text of
~70 MB) could never be copied, resynced or re-added (exit 3, "straddling object straddles two block
boundaries"), though the same value arriving in the stream applied fine. 100 MB of each here."""

from __future__ import annotations

import pytest

from applier.checks.verify import verify_against_postgres
from applier.config import MirrorConfig, SourceSettings, TargetSettings
from applier.drivers.mirror import mirror
from applier.spark.session import SparkProvider

pytestmark = [pytest.mark.postgres]


def test_values_of_100_mb_are_copied_and_followed(pg, tmp_path):
    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="big", publication="big"),
                          target=TargetSettings(path=str(tmp_path / "delta")))
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE big (id int PRIMARY KEY, b bytea, t text)")
        conn.execute("INSERT INTO big VALUES (1, decode(repeat('ab', 100 << 20), 'hex'), 'small'), "
                     "(2, '\\x00', repeat('x', 100 << 20)), (3, NULL, NULL)")
        conn.execute("CREATE PUBLICATION big FOR TABLE big")
        mirror(no_spark, config, once=True)
        conn.execute("UPDATE big SET t = repeat('y', 30 << 20) WHERE id = 3")  # and through the stream
        mirror(no_spark, config, once=True)
        results = verify_against_postgres(no_spark, conn, str(tmp_path / "delta"), [("public", "big")])
        assert all(r.equal for r in results), [(r.source_rows, r.target_rows, r.problems) for r in results]
