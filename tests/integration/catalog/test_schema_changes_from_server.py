"""Real ALTER TABLEs, read back through a real pgoutput slot, give the schema versions and changes the
sink needs; re-sends in a new decoding session and after a restart from JSON are not changes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from applier.catalog import RelationCache, SchemaVersion
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import Relation
from applier.sources.sql_slot import peek, pgoutput_options

pytestmark = pytest.mark.postgres

STEPS = [
    "CREATE TABLE public.t (id integer PRIMARY KEY, a text, b numeric(10,2))",
    "ALTER TABLE t ADD COLUMN c boolean",
    "ALTER TABLE t DROP COLUMN a",
    "ALTER TABLE t ALTER COLUMN b TYPE numeric(12,4), ALTER COLUMN id TYPE bigint",
    "CREATE SCHEMA s2; ALTER TABLE t RENAME TO t2; ALTER TABLE t2 SET SCHEMA s2",
    "ALTER TABLE s2.t2 REPLICA IDENTITY FULL",
    "UPDATE s2.t2 SET c = false WHERE c IS NULL; "
    "ALTER TABLE s2.t2 REPLICA IDENTITY DEFAULT; ALTER TABLE s2.t2 DROP CONSTRAINT t_pkey; "
    "ALTER TABLE s2.t2 ADD PRIMARY KEY (id, c)",
    "CREATE INDEX t2_c ON s2.t2 (c)",  # invalidates the relcache: re-sent, but not a schema change
]


def relations(conn) -> list[Relation]:
    decoder = MessageDecoder()
    return [msg for m in peek(conn, "s", pgoutput_options("pub"))
            if isinstance(msg := decoder.decode(m.data, m.lsn), Relation)]


@pytest.fixture
def sent(pg) -> Iterator[list[Relation]]:
    with pg.connect() as conn:
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        for i, step in enumerate(STEPS):
            conn.execute(step)
            if i == 0:
                conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
            conn.execute(f"INSERT INTO {'t' if i < 4 else 's2.t2'} (id, c) VALUES ({i}, true)"
                         if i else "INSERT INTO t (id) VALUES (0)")
        yield relations(conn)


def test_each_alter_is_one_version_with_its_change(sent):
    cache = RelationCache()
    versions = [cache.update(rel) for rel in sent]
    distinct: list[SchemaVersion] = list(dict.fromkeys(versions))
    assert [v.version for v in distinct] == [1, 2, 3, 4, 5, 6, 7]
    v1, v2, v3, v4, v5, v6, v7 = distinct
    assert v1.change is None and v1.key_indexes == (0,) and v1.qualified_name == "public.t"
    assert (v2.change is not None and v3.change is not None and v4.change is not None
            and v5.change is not None and v6.change is not None and v7.change is not None)
    assert (v2.change.added, v2.change.dropped, v2.change.retyped) == (("c",), (), ())
    assert (v3.change.added, v3.change.dropped) == ((), ("a",))
    numeric = 1700
    assert set(v4.change.retyped) == {("id", 23, -1, 20, -1),
                                      ("b", numeric, (10 << 16 | 2) + 4, numeric, (12 << 16 | 4) + 4)}
    assert v5.change.renamed_relation == ("public.t", "s2.t2") and v5.qualified_name == "s2.t2"
    assert not (v5.change.added or v5.change.dropped or v5.change.retyped or v5.change.key_changed)
    # REPLICA IDENTITY FULL marks every column as key (logicalrep_write_attrs).
    assert v6.change.replica_identity_changed and v6.change.key_changed and v6.key_indexes == (0, 1, 2)
    assert v7.change.key_changed and v7.key_indexes == (0, 2) and v7.relation.replica_identity == "d"
    # CREATE INDEX invalidates the relcache; the Relation is sent again, unchanged: no new version.
    assert versions[-1] is v7 and len(sent) > len(distinct)


def test_resends_after_a_restart_from_json_are_not_changes(sent, pg):
    cache = RelationCache()
    for rel in sent:
        cache.update(rel)
    restored = RelationCache.from_json(json.loads(json.dumps(cache.to_json())))
    oid = sent[-1].oid
    assert restored.get(oid).version == 7 and restored.get(oid).key_indexes == (0, 2)
    again = restored.update(sent[-1])  # a new decoding session starts by re-sending the relation
    assert again is restored.get(oid) and again.version == 7
    with pg.connect() as conn:
        conn.execute("ALTER TABLE s2.t2 ADD COLUMN d text")
        conn.execute("INSERT INTO s2.t2 (id, c) VALUES (100, false)")
        newest = relations(conn)[-1]
    v8 = restored.update(newest)
    assert v8.version == 8 and v8.change is not None and v8.change.added == ("d",)
