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


def test_toast_values_are_decoded_without_a_copy_and_applied_equal(pg, tmp_path):
    """A real server's TOAST values (300 kB, 20 kB: over ``VIEW_FROM_BYTES``; 3 kB: under it) come out of
    the decoder as views of their messages, equal to what Postgres holds; and the mirror, which converts,
    spills (a budget of 1 MB) and folds them, ends equal to Postgres: inserts, an update leaving a TOAST
    value unchanged, a key change, a REPLICA IDENTITY FULL table's old rows, deletes."""
    from applier.protocol import MessageDecoder
    from applier.protocol.messages import Insert, Update
    from applier.protocol.tupledata import VIEW_FROM_BYTES
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    config = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="views", publication="views"),
                          target=TargetSettings(path=str(tmp_path / "delta")),
                          apply={"memory_budget_mb": 1})
    no_spark = SparkProvider(lambda: pytest.fail("Spark started"))
    tables = [("public", "keyed"), ("public", "full_rows")]
    # md5 chains: text that pglz cannot shrink much, so the values are really stored out of line
    long_text = "(SELECT string_agg(md5(i::text || g::text), '') FROM generate_series(1, {n} / 32) g)"
    with pg.connect() as conn:
        conn.execute("CREATE TABLE keyed (id int PRIMARY KEY, big text, mid text, small text, n int)")
        conn.execute("CREATE TABLE full_rows (id int, big text)")
        conn.execute("ALTER TABLE full_rows REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION views FOR TABLE keyed, full_rows")
        mirror(no_spark, config, once=True)
        create_slot(conn, "peeked")
        conn.execute(f"INSERT INTO keyed SELECT i, {long_text.format(n=300_000)}, {long_text.format(n=20_000)}, "
                     f"{long_text.format(n=3_000)}, i FROM generate_series(1, 12) i")
        conn.execute(f"INSERT INTO full_rows SELECT i, {long_text.format(n=100_000)} FROM generate_series(1, 6) i")
        conn.commit()
        conn.execute("UPDATE keyed SET n = n + 1 WHERE id <= 4")  # big and mid unchanged: sent as 'u'
        conn.execute("UPDATE keyed SET id = id + 100 WHERE id IN (5, 6)")  # a key change
        conn.execute("UPDATE full_rows SET id = id + 10 WHERE id <= 2")  # the old row is sent whole
        conn.execute("DELETE FROM keyed WHERE id = 7")
        conn.execute("DELETE FROM full_rows WHERE id = 3")
        conn.commit()

        sent = {row[0]: row[1:] for row in conn.execute(  # what each insert sent, computed again
            f"SELECT i, {long_text.format(n=300_000)}, {long_text.format(n=20_000)}, {long_text.format(n=3_000)} "
            "FROM generate_series(1, 12) i")}
        decoder = MessageDecoder()
        viewed = copied = unchanged = 0
        for m in peek(conn, "peeked", pgoutput_options("views")):
            msg = decoder.decode(m.data, m.lsn)
            if isinstance(msg, Insert) and len(msg.new) == 5:
                key, *values, _n = msg.new.values
                assert key is not None
                for value, was in zip(values, sent[int(bytes(key))], strict=True):
                    assert value is not None and value == was.encode()  # a view equals its bytes
                    assert (type(value) is memoryview) == (len(was) >= VIEW_FROM_BYTES)
                    viewed += type(value) is memoryview
                    copied += type(value) is bytes
            elif isinstance(msg, Update) and len(msg.new) == 5:
                unchanged += msg.new.kinds[1:3] == b"uu"
        # big and mid of 12 rows viewed, small copied; the 4 updates and 2 key changes left big and mid unchanged
        assert (viewed, copied, unchanged) == (24, 12, 6)
        conn.execute("SELECT pg_drop_replication_slot('peeked')")
        conn.commit()

        mirror(no_spark, config, once=True)
        results = verify_against_postgres(no_spark, conn, str(tmp_path / "delta"), tables)
        assert all(r.equal for r in results), [(r.source_rows, r.target_rows, r.problems) for r in results]
        assert sorted(r.source_rows for r in results) == [5, 11]
