"""`spark-submit --master spark://...` runs the jobs on that cluster: a real standalone Spark cluster
(a Master and one Worker with 2 cores, from pyspark's own distribution, on loopback ports) runs
`jobs/replay.py` (decoding, folding and MERGE on the executors) and `jobs/mirror.py --once` (its copy, then
its backlog, on the executors) into ``s3://`` on the S3 test server: shared storage,
as on a real cluster. The tables equal Postgres and the master's JSON shows the applications ran there
(the session must not override spark-submit's master with local[2]). A local-directory target is not
submitted again: each spark-submit costs about a minute on 2 cores, jobs/*.py are the CLI's ``main``
(tested throughout), and a directory is one machine's special case of shared storage."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from applier.checks.verify import verify_against_postgres
from applier.devtools.sample import create_schema, run_workload
from applier.devtools.sparkcluster import StandaloneCluster, master_json, spark_home
from applier.infra.cache import default_cache_dir
from applier.sources.rawlog_writer import write_raw_log
from applier.sources.sql_slot import create_slot, peek, pgoutput_options
from applier.spark.jars import delta_jars

pytestmark = [pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SHOP = [("shop", "customers"), ("shop", "products"), ("shop", "orders"), ("shop", "events")]


#: The jobs' JVMs live seconds: C1 only, as the tests' CLI runs (spark.jit: quick) and as a user would for
#: a short job. spark-submit starts the driver, so the job's own jit setting cannot reach it; the
#: ``default`` options leave the ``extra`` ones (the session's time zone) to the job.
QUICK_JIT = {f"spark.{role}.defaultJavaOptions": "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
             for role in ("driver", "executor")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One cluster for the module's tests (each counts only the applications it submitted)."""
    running = StandaloneCluster(tmp_path_factory.mktemp("cluster"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def submit(cluster: StandaloneCluster, job: str, *args: str, dsn: str | None = None,
           extra_env: dict[str, str] | None = None, extra_jars: list[Path] | None = None,
           conf: dict[str, str] | None = None) -> str:
    jars = [*delta_jars(default_cache_dir(), fetch=False), *(extra_jars or [])]
    env = dict(cluster.env, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               APPLIER_DELTA_JARS="provided")  # the jars come with --jars, as on a cluster that ships them
    if dsn is not None:
        env["APPLIER_DSN"] = dsn
    env.update(extra_env or {})
    out = subprocess.run(
        [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.url,
         "--jars", ",".join(str(j) for j in jars), "--driver-memory", "1g", "--executor-memory", "1g",
         "--conf", "spark.cores.max=2", *[f"--conf={k}={v}" for k, v in {**QUICK_JIT, **(conf or {})}.items()],
         str(REPO / "jobs" / job), *args],
        env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-4000:])
    return out.stdout + out.stderr  # the summary on stdout, the progress lines on stderr


def registered_apps(cluster: StandaloneCluster) -> list[dict]:
    state = master_json(cluster.webui_port)
    return state.get("completedapps", []) + state.get("activeapps", [])


def captured_workload(conn, tmp_path: Path, seed: int) -> Path:
    """The sample schema, a slot, a seeded workload, and the slot's messages stored as a raw log."""
    create_schema(conn, "pub")
    create_slot(conn, "s")
    run_workload(conn, transactions=20, seed=seed)
    raw = tmp_path / "raw.parquet"
    write_raw_log(raw, ((m.lsn, m.xid, m.data) for m in peek(conn, "s", pgoutput_options("pub"))))
    return raw


def assert_ran_on_the_cluster(cluster: StandaloneCluster, earlier: set[str], count: int, out: str = "") -> None:
    """``count`` new applications registered with the cluster's master (not a local engine: the session
    must not override spark-submit's master), each with executors the worker launched."""
    apps = [app for app in registered_apps(cluster) if app["id"] not in earlier]
    assert len(apps) == count, ([line for line in out.splitlines() if "starting Spark" in line], apps)
    assert all(app["name"] == "applier" and app["state"] in ("FINISHED", "RUNNING") for app in apps), apps
    for app in apps:  # the worker launched executors for each (their work directories)
        assert list((cluster.workdir / "work" / app["id"]).glob("*/stderr")), app["id"]


def test_replay_on_the_cluster_into_a_target_on_the_s3_server(pg, spark, cluster, s3_server, tmp_path, monkeypatch):
    """Driver and executors meet on shared storage: the cluster's executors decode, fold and MERGE
    (merge_engine 'spark') into tables on the S3 server (Hadoop's S3A connector shipped with --jars, the
    endpoint from the driver's AWS variables, the credentials given to the executors' environment). The
    tables equal the same log replayed locally."""
    from deltalake import DeltaTable

    from applier.config import ReplayConfig, TargetSettings
    from applier.drivers.replay import replay_log
    from applier.sink.naming import mirrored_table_dirs
    from applier.spark.jars import connector_jars

    earlier = {app["id"] for app in registered_apps(cluster)}
    with pg.connect() as conn:
        raw = captured_workload(conn, tmp_path, seed=5)
    local = tmp_path / "local"
    replay_log(spark, ReplayConfig(source_log=str(raw), target=TargetSettings(path=str(local))))
    target = f"s3://{s3_server.new_bucket()}/replayed"
    out = submit(cluster, "replay.py", "--source", str(raw), "--target", target, "--distributed", "on",
                 extra_env={**s3_server.env, "XDG_STATE_HOME": str(tmp_path / "state"),
                            "APPLIER_DISTRIBUTED__PARTITION_MESSAGES": "40", "APPLIER_APPLY__MERGE_ENGINE": "spark"},
                 extra_jars=connector_jars(default_cache_dir(), {"s3"}, fetch=False),
                 conf={f"spark.executorEnv.{k}": v for k, v in s3_server.env.items()})
    assert "folded on executors:" in out, out
    assert_ran_on_the_cluster(cluster, earlier, 1)

    def contents(root: str) -> dict[str, list[str]]:
        return {f"{t.parent.name}.{t.name}": sorted(map(str, DeltaTable(str(t)).to_pyarrow_table().to_pylist()))
                for t in mirrored_table_dirs(root)}

    for key, value in s3_server.env.items():  # the test process reads the tables with delta-rs, as a user would
        monkeypatch.setenv(key, value)
    on_s3 = contents(target)
    assert on_s3 == contents(str(local)) and set(on_s3) == {f"{ns}.{t}" for ns, t in SHOP}


def test_mirror_on_the_cluster_into_a_target_on_the_s3_server(pg, cluster, s3_server, tmp_path, monkeypatch):
    """``jobs/mirror.py`` on the cluster into ``s3://``, twice. The first run copies the tables: the one of
    several chunks on the executors (``snapshot.on_executors: auto`` on a cluster), each task reading its
    chunks under the slot's exported snapshot and writing Parquet through S3A, the driver committing; the
    small ones on the driver meanwhile (delta-rs). The second catches its slot's backlog up on the executors
    (``distributed.mode: on``), which decode and fold ranges, the commits Spark MERGEs whose Parquet the
    executors write through S3A. The tables equal Postgres, read back from the S3 server with delta-rs as a
    user would."""
    from applier.spark.jars import connector_jars

    target = f"s3://{s3_server.new_bucket()}/mirrored"
    env = {**s3_server.env, "XDG_STATE_HOME": str(tmp_path / "state"), "APPLIER_APPLY__MERGE_ENGINE": "spark",
           "APPLIER_DISTRIBUTED__MODE": "on", "APPLIER_DISTRIBUTED__PARTITION_MESSAGES": "40",
           "APPLIER_SNAPSHOT__CHUNK_MB": "1"}
    args = ("--publication", "pub", "--slot", "m", "--target", target, "--once")
    jars = connector_jars(default_cache_dir(), {"s3"}, fetch=False)
    conf = {f"spark.executorEnv.{k}": v for k, v in s3_server.env.items()}
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    with pg.connect() as conn:
        create_schema(conn, "pub")
        conn.execute("INSERT INTO shop.customers (id, name, email, notes, tags) SELECT 10000000 + i, 'c' || i, "
                     "CASE WHEN i % 5 > 0 THEN i || '@example.com' END, repeat('n', i % 200), ARRAY['t' || i % 7] "
                     "FROM generate_series(1, 20000) i")
        conn.execute("ANALYZE shop.customers")
        conn.commit()
        earlier = {app["id"] for app in registered_apps(cluster)}
        out = submit(cluster, "mirror.py", *args, dsn=pg.dsn, extra_env=env, extra_jars=jars, conf=conf)
        assert "snapshot: 1 table(s), " in out and "chunk(s) on Spark's executors" in out, out[-3000:]
        assert "snapshot: shop.customers: 20000 rows in " in out and " on executors" in out, out[-3000:]
        assert_ran_on_the_cluster(cluster, earlier, 1)
        results = verify_against_postgres(None, conn, target, SHOP)
        assert all(r.equal for r in results), [(r.source_name, r.only_in_source[:2], r.problems) for r in results]

        earlier = {app["id"] for app in registered_apps(cluster)}
        run_workload(conn, transactions=40, seed=4)  # the backlog
        conn.execute("UPDATE shop.products SET price = price + 1")
        conn.commit()
        out = submit(cluster, "mirror.py", *args, dsn=pg.dsn, extra_env=env, extra_jars=jars, conf=conf)
        assert "on Spark's executors" in out, out[-3000:]
        assert_ran_on_the_cluster(cluster, earlier, 1)
        results = verify_against_postgres(None, conn, target, SHOP)
    assert all(r.equal for r in results), [(r.source_name, r.only_in_source[:2], r.problems) for r in results]
    assert sum(r.source_rows for r in results) > 0
