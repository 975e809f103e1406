"""Every mirrored table registered by name in two real catalogs (issue 75, item 2): a Hive Metastore,
started by the tests from pyspark's own jars and reached over Thrift as other engines reach it, and AWS
Glue's Data Catalog as moto's server (the suite's S3 server) serves its API. ``applier mirror`` runs as a
command (its own Spark session, with the catalog the config names); then a reader looks each table up by
name and must get Postgres's rows: for Hive a second process, a fresh Spark session; for Glue, boto3's
lookup and delta-rs at the location it gives. Then a rename, a move to another schema, a drop and a new
table: the registrations follow, and a re-run changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from applier.sink.catalogs import STATE_KEY
from applier.state import StateDir

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]

#: a fresh Spark session in a process of its own: the tables of each database it is given, and the rows of
#: each table (None: not in the catalog)
READER = """
import json, sys
from applier.spark.session import SparkSettings, build_spark_session
spark = build_spark_session(SparkSettings(extra={"spark.sql.catalogImplementation": "hive",
                                                 "spark.hadoop.hive.metastore.uris": sys.argv[1]}))
asked = json.loads(sys.argv[2])
out = {"databases": {}, "rows": {}}
for db in asked["databases"]:
    out["databases"][db] = sorted(r["tableName"] for r in spark.sql(f"SHOW TABLES IN `{db}`").collect()) \
        if spark.catalog.databaseExists(db) else None
for name in asked["tables"]:
    out["rows"][name] = sorted([list(r) for r in spark.table(name).collect()], key=str) \
        if spark.catalog.tableExists(name) else None
print("RESULT " + json.dumps(out, default=str))
"""


def _read(catalog: tuple[str, str], cwd: Path, databases: list[str], tables: list[str]) -> dict:
    kind, uri = catalog
    if kind == "glue":
        return _read_glue(uri, databases, tables)
    done = subprocess.run([sys.executable, "-c", READER, uri,
                           json.dumps({"databases": databases, "tables": tables})],
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=cwd, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def _read_glue(endpoint: str, databases: list[str], tables: list[str]) -> dict:
    """What a Glue user does: the table looked up by name, read at its location (delta-rs)."""
    import boto3  # type: ignore[import-untyped]
    import deltalake

    glue = boto3.client("glue", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="applier-test",
                        aws_secret_access_key="applier-test-secret")
    out: dict = {"databases": {}, "rows": {}}
    for db in databases:
        try:
            out["databases"][db] = sorted(t["Name"] for t in glue.get_tables(DatabaseName=db)["TableList"])
        except glue.exceptions.EntityNotFoundException:
            out["databases"][db] = None
    for name in tables:
        db, _, table = name.partition(".")
        try:
            found = glue.get_table(DatabaseName=db, Name=table)["Table"]
        except glue.exceptions.EntityNotFoundException:
            out["rows"][name] = None
            continue
        assert found["Parameters"]["table_type"] == "DELTA"
        rows = deltalake.DeltaTable(found["StorageDescriptor"]["Location"]).to_pyarrow_table().to_pylist()
        out["rows"][name] = sorted([list(r.values()) for r in rows], key=str)
    return out


def _mirror(config: Path, dsn: str, cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                          env={**os.environ, **env, "PYTHONPATH": str(REPO), "APPLIER_DSN": dsn}, cwd=cwd,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def _postgres_rows(conn, table: str) -> list[list]:
    return sorted([list(r) for r in conn.execute(f"SELECT * FROM {table}")], key=str)


def _history_open_rows(rows: list[list] | None) -> list[list]:
    """A history table's open versions (``__end_lsn`` NULL) as the table's own columns (id, note)."""
    assert rows is not None
    return sorted([r[:2] for r in rows if r[3] is None], key=str)


@pytest.fixture(params=["hive", "glue"])
def catalog(request) -> tuple[str, str, dict[str, str]]:
    """(kind, uri, the environment a run needs): the Hive Metastore, or Glue as moto's server serves it."""
    if request.param == "hive":
        return "hive", request.getfixturevalue("hive_metastore").uri, {}
    server = request.getfixturevalue("s3_server")
    return "glue", server.endpoint, {k: v for k, v in server.env.items() if k != "AWS_ENDPOINT_URL"}


def test_tables_are_registered_in_a_catalog_and_follow_renames_moves_and_drops(pg, catalog, tmp_path):
    kind, uri, env = catalog
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"slot": "cat", "publication": "cat_pub"}, "target": {"path": str(target)},
        "tables": {"rules": [{"match": "shop.orders*", "history": True}]},
        "catalog": {"kind": kind, "uri": uri, "database": "m_{schema}"}}))
    with pg.connect() as conn:
        conn.execute("CREATE SCHEMA shop")
        conn.execute("CREATE TABLE shop.orders (id int PRIMARY KEY, note text)")
        conn.execute('CREATE TABLE shop."Mixed Case" (id int PRIMARY KEY, v text)')
        conn.execute("CREATE TABLE public.gone (id int PRIMARY KEY)")
        conn.execute("INSERT INTO shop.orders SELECT i, 'o' || i FROM generate_series(1, 5) i")
        conn.execute("INSERT INTO shop.\"Mixed Case\" VALUES (1, 'a'), (2, 'b')")
        conn.execute("INSERT INTO public.gone VALUES (7)")
        conn.execute("CREATE PUBLICATION cat_pub FOR ALL TABLES")
        _mirror(config, pg.dsn, tmp_path, env)
        conn.execute("UPDATE shop.orders SET note = 'changed' WHERE id = 1")
        _mirror(config, pg.dsn, tmp_path, env)

        seen = _read((kind, uri), tmp_path, ["m_shop", "m_public"],
                     ["m_shop.orders", "m_shop.orders__history", "m_shop.mixed_case", "m_public.gone"])
        assert seen["databases"] == {"m_shop": ["mixed_case", "orders", "orders__history"], "m_public": ["gone"]}
        assert seen["rows"]["m_shop.orders"] == _postgres_rows(conn, "shop.orders")
        assert _history_open_rows(seen["rows"]["m_shop.orders__history"]) == _postgres_rows(conn, "shop.orders")
        assert seen["rows"]["m_shop.mixed_case"] == _postgres_rows(conn, 'shop."Mixed Case"')
        assert seen["rows"]["m_public.gone"] == [[7]]

        # a rename, a move to another schema, a drop, a new table; then the changes after them
        conn.execute("ALTER TABLE shop.orders RENAME TO orders2")
        conn.execute('ALTER TABLE shop."Mixed Case" SET SCHEMA public')
        conn.execute("DROP TABLE public.gone")
        conn.execute("CREATE TABLE shop.later (id int PRIMARY KEY, note text)")
        conn.execute("INSERT INTO shop.later VALUES (1, 'new')")
        conn.execute("INSERT INTO shop.orders2 VALUES (6, 'six')")
        conn.execute("UPDATE public.\"Mixed Case\" SET v = 'moved' WHERE id = 2")
        _mirror(config, pg.dsn, tmp_path, env)
        state = StateDir.for_target(str(target), None)
        registered = state.load(STATE_KEY)
        _mirror(config, pg.dsn, tmp_path, env)  # nothing new: nothing registered again
        assert state.load(STATE_KEY) == registered

        seen = _read((kind, uri), tmp_path, ["m_shop", "m_public"],
                     ["m_shop.orders2", "m_shop.orders2__history", "m_public.mixed_case", "m_shop.later",
                      "m_shop.orders", "m_shop.mixed_case", "m_public.gone"])
        assert seen["databases"] == {"m_shop": ["later", "orders2", "orders2__history"], "m_public": ["mixed_case"]}
        assert seen["rows"]["m_shop.orders2"] == _postgres_rows(conn, "shop.orders2")
        assert _history_open_rows(seen["rows"]["m_shop.orders2__history"]) == _postgres_rows(conn, "shop.orders2")
        assert seen["rows"]["m_public.mixed_case"] == _postgres_rows(conn, 'public."Mixed Case"')
        assert seen["rows"]["m_shop.later"] == _postgres_rows(conn, "shop.later")
        assert seen["rows"]["m_shop.orders"] is None and seen["rows"]["m_public.gone"] is None
    assert registered == {f"m_{n}": str(p) for n, p in [
        ("shop.orders2", target / "shop" / "orders2"),
        ("shop.orders2__history", target / "_history" / "shop" / "orders2"),
        ("public.mixed_case", target / "public" / "Mixed Case"), ("shop.later", target / "shop" / "later")]}

    # status names each table's registration
    done = subprocess.run([sys.executable, "-m", "applier.cli", "status", "--config", str(config), "--json"],
                          env={**os.environ, **env, "PYTHONPATH": str(REPO), "APPLIER_DSN": pg.dsn},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    shown = {(t["table"], t["kind"]): t["catalog_name"] for t in json.loads(done.stdout)["tables"]}
    assert shown[("shop.orders2", "mirror")] == "m_shop.orders2"
    assert shown[("shop.orders2", "history")] == "m_shop.orders2__history"
    assert shown[("public.Mixed Case", "mirror")] == "m_public.mixed_case"



def test_a_catalog_name_another_table_holds_is_never_replaced(pg, s3_server, tmp_path):
    """A name the catalog already holds over another location, which this target did not register, stops
    the run (exit 2, naming where that table is) and stays as it was; once it is gone the next run registers
    the mirror's table there."""
    import boto3

    env = {k: v for k, v in s3_server.env.items() if k != "AWS_ENDPOINT_URL"}
    glue = boto3.client("glue", endpoint_url=s3_server.endpoint, region_name="us-east-1",
                        aws_access_key_id="applier-test", aws_secret_access_key="applier-test-secret")
    glue.create_database(DatabaseInput={"Name": "theirs_public"})
    glue.create_table(DatabaseName="theirs_public", TableInput={
        "Name": "t", "TableType": "EXTERNAL_TABLE", "StorageDescriptor": {"Location": "s3://elsewhere/t"}})
    target = tmp_path / "delta"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({
        "source": {"slot": "taken", "publication": "taken_pub"}, "target": {"path": str(target)},
        "catalog": {"kind": "glue", "uri": s3_server.endpoint, "database": "theirs_{schema}"}}))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE public.t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO public.t VALUES (1)")
        conn.execute("CREATE PUBLICATION taken_pub FOR TABLE public.t")
    run = [sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"]
    run_env = {**os.environ, **env, "PYTHONPATH": str(REPO), "APPLIER_DSN": pg.dsn}
    done = subprocess.run(run, env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "theirs_public.t is taken by a table at s3://elsewhere/t" in done.stderr
    found = glue.get_table(DatabaseName="theirs_public", Name="t")["Table"]
    assert found["StorageDescriptor"]["Location"] == "s3://elsewhere/t"  # untouched

    glue.delete_table(DatabaseName="theirs_public", Name="t")
    done = subprocess.run(run, env=run_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = glue.get_table(DatabaseName="theirs_public", Name="t")["Table"]
    assert found["StorageDescriptor"]["Location"] == str(target / "public" / "t")
