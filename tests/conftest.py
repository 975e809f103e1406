"""Shared fixtures: real PostgreSQL servers and one real local Spark with Delta per test run.

Locally, a test whose server or Spark is missing is skipped with the reason; in CI (``CI=true``) the
same absence fails the test, so a broken setup can never pass as green.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import psycopg
import pytest

from applier.devtools.azurite import AzuriteServer, start_azurite
from applier.devtools.gcsserver import GcsServer, start_gcs_server
from applier.devtools.hivemetastore import HiveMetastore, start_hive_metastore
from applier.devtools.pgcluster import PgCluster, find_installation, find_installations
from applier.devtools.s3server import S3Server, start_s3_server
from applier.errors import EnvironmentSetupError

pytest_plugins = ("pytester",)

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("APPLIER_CACHE_DIR", str(REPO / ".cache"))
# The CLI runs the tests start (kill matrices, jobs) live for seconds: their JVMs compile with C1 only
# (spark.jit: quick), which roughly halves what a fresh JVM costs on the 2-core CI machine.
os.environ.setdefault("APPLIER_SPARK__JIT", "quick")
def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")

#: Every test cluster gets these on top of applier.devtools.pgcluster.BASE_SETTINGS: small transactions
#: stream (protocol 2+) so streaming paths get exercised by ordinary-sized workloads.
TEST_SETTINGS = {"logical_decoding_work_mem": "64kB"}


def unavailable(reason: str) -> None:
    """Skip locally, fail in CI: a missing real part is never a pass there."""
    if in_ci():
        pytest.fail(f"required test dependency missing in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pg-major", action="append", type=int, default=None,
                     help="PostgreSQL major(s) for multi-version tests (default: every installed one)")


TIERS = ("unit", "integration", "scenario")
SERVER_FIXTURES = {"pg", "pg_any", "pg_module", "pg_pool", "spark", "s3_server", "azurite_server", "gcs_server",
                   "standby_pairs", "hive_metastore"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The folder is the tier (``-m unit``, ``-m integration``, ``-m scenario`` select them; ``make
    test-fast`` runs tests/unit). A test outside the tier folders, or a unit test that needs a
    server, is a mistake in where it was put: the run stops and says so."""
    tests_dir = Path(__file__).resolve().parent
    misplaced = []
    for item in items:
        parts = item.path.resolve().relative_to(tests_dir).parts
        tier = parts[0] if len(parts) > 1 and parts[0] in TIERS else None
        if tier is None:
            misplaced.append(f"{item.nodeid}: not under tests/unit, tests/integration or tests/scenario")
            continue
        item.add_marker(getattr(pytest.mark, tier))
        if tier == "unit" and (item.get_closest_marker("postgres") or item.get_closest_marker("spark")
                               or SERVER_FIXTURES & set(getattr(item, "fixturenames", ()))):
            misplaced.append(f"{item.nodeid}: needs PostgreSQL or Spark, so it belongs in tests/integration")
    if misplaced:
        raise pytest.UsageError("tests in the wrong tier:\n  " + "\n  ".join(misplaced))
    _longest_files_first(items, tests_dir)


#: seconds a file with no figure in tests/durations.json is taken to need, by tier
_UNKNOWN_FILE_SECONDS = {"unit": 1.0, "integration": 30.0, "scenario": 120.0}


def _longest_files_first(items: list[pytest.Item], tests_dir: Path) -> None:
    """Order the files by the seconds tests/durations.json gives them, longest first; a file's own tests
    keep their order (scripts/test_durations.py says why and how to refresh the figures). Under xdist
    (``--dist loadfile --no-loadscope-reorder``) this is the order workers get the files in."""
    import json

    figures = tests_dir / "durations.json"
    seconds: dict[str, float] = json.loads(figures.read_text()) if figures.is_file() else {}
    root = tests_dir.parent

    def weight(item: pytest.Item) -> float:
        name = item.path.resolve().relative_to(root).as_posix()
        tier = item.path.resolve().relative_to(tests_dir).parts[0]
        return seconds.get(name, _UNKNOWN_FILE_SECONDS.get(tier, 1.0))

    items.sort(key=lambda item: -weight(item))  # stable: a file's tests stay together, in their order


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Tests that take `pg_major` run once per installed major (15 from Debian, 16 and 18 from wheels).
    if "pg_major" in metafunc.fixturenames:
        majors = metafunc.config.getoption("--pg-major") or [i.major for i in find_installations()]
        if in_ci() and not majors:
            majors = [15]  # the fixture will then fail loudly
        metafunc.parametrize("pg_major", majors or [15], ids=lambda m: f"pg{m}")


class ClusterPool:
    """One running cluster per major for the whole run; started on first use."""

    def __init__(self) -> None:
        self._clusters: dict[int, PgCluster] = {}

    def get(self, major: int) -> PgCluster:
        if major not in self._clusters:
            try:
                installation = find_installation(major)
            except EnvironmentSetupError as e:
                unavailable(str(e))
            settings = dict(TEST_SETTINGS)
            if major >= 16:
                settings["debug_logical_replication_streaming"] = "buffered"
            self._clusters[major] = PgCluster(installation, settings).start()
        return self._clusters[major]

    def close(self) -> None:
        for cluster in self._clusters.values():
            cluster.stop()


@pytest.fixture(scope="session")
def pg_pool() -> Iterator[ClusterPool]:
    pool = ClusterPool()
    yield pool
    pool.close()


@dataclass
class PgDatabase:
    """A fresh database on a real cluster, for one test."""

    cluster: PgCluster
    name: str

    @property
    def dsn(self) -> str:
        return self.cluster.dsn(self.name)

    @property
    def major(self) -> int:
        return self.cluster.major

    def connect(self, **kwargs: object) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True, **kwargs)  # type: ignore[arg-type]


_db_counter = itertools.count()


def _fresh_database(cluster: PgCluster) -> Iterator[PgDatabase]:
    name = f"t{os.getpid()}_{next(_db_counter)}"
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    db = PgDatabase(cluster, name)
    yield db
    with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        # Slots pin the database; drop them (and prepared xacts) before the database.
        for (gid,) in conn.execute("SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)):
            with psycopg.connect(cluster.dsn(name), autocommit=True) as c2:
                c2.execute(f"ROLLBACK PREPARED '{gid}'")
        conn.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     "WHERE database = %s AND NOT active", (name,))
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg(pg_pool: ClusterPool) -> Iterator[PgDatabase]:
    """A fresh database on the default server (PostgreSQL 15 from Debian's package)."""
    yield from _fresh_database(pg_pool.get(int(os.environ.get("APPLIER_TEST_PG_MAJOR", "15"))))


@pytest.fixture(scope="module")
def pg_module(pg_pool: ClusterPool) -> Iterator[PgDatabase]:
    """A fresh database on the default server shared by one test module (for a log captured once)."""
    yield from _fresh_database(pg_pool.get(int(os.environ.get("APPLIER_TEST_PG_MAJOR", "15"))))


@pytest.fixture
def pg_any(pg_pool: ClusterPool, pg_major: int) -> Iterator[PgDatabase]:
    """A fresh database on each installed PostgreSQL major in turn (parametrized by ``pg_major``)."""
    yield from _fresh_database(pg_pool.get(pg_major))


@dataclass
class StandbyPair:
    """A primary and a hot standby streaming from it through the physical slot ``standby1``
    (applier.devtools.pgcluster.start_standby), clusters of their own, and the database ``src`` on both."""

    primary: PgCluster
    standby: PgCluster
    name: str = "src"

    @property
    def major(self) -> int:
        return self.primary.major

    @property
    def primary_dsn(self) -> str:
        return self.primary.dsn(self.name)

    @property
    def standby_dsn(self) -> str:
        return self.standby.dsn(self.name)

    def replayed(self, timeout: float = 30.0) -> None:
        """Until the standby has replayed everything the primary has flushed now."""
        import time

        with psycopg.connect(self.primary_dsn, autocommit=True) as primary:
            (wanted,) = primary.execute("SELECT pg_current_wal_flush_lsn()").fetchone()  # type: ignore[misc]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.standby_dsn, autocommit=True) as standby:
            while True:
                (done,) = standby.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn",  # type: ignore[misc]
                                          (wanted,)).fetchone()
                if done:
                    return
                assert time.monotonic() < deadline, f"the standby did not replay up to {wanted} in {timeout}s"
                time.sleep(0.05)

    @contextmanager
    def logging_snapshots(self, every: float = 0.5) -> Iterator[None]:
        """``pg_log_standby_snapshot()`` on the primary every ``every`` seconds: a logical slot created on
        the standby waits for such a record, which an idle primary logs only every 15 s, if at all."""
        import threading

        stop = threading.Event()

        def log_snapshots() -> None:
            try:
                with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
                    while not stop.wait(every):
                        conn.execute("SELECT pg_log_standby_snapshot()")
            except psycopg.Error:  # the primary was stopped (a failover): the promoted standby needs none
                pass

        thread = threading.Thread(target=log_snapshots, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(30)


@pytest.fixture
def standby_pairs() -> Iterator[Any]:
    """``make(major, primary_settings={}, standby_settings={})``: a fresh StandbyPair (the database ``src``
    exists before the standby is made, for its ``primary_conninfo``); each is stopped and removed at the
    end. Missing binaries of ``major``: skipped locally, a failure in CI."""
    from applier.devtools.pgcluster import start_standby

    made: list[PgCluster] = []

    def make(major: int, primary_settings: dict[str, str] | None = None,
             standby_settings: dict[str, str] | None = None) -> StandbyPair:
        try:
            installation = find_installation(major)
        except EnvironmentSetupError as e:
            unavailable(str(e))
        primary = PgCluster(installation, {**TEST_SETTINGS, **(primary_settings or {})}).start()
        made.append(primary)
        with psycopg.connect(primary.dsn(), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "src"')
        standby = start_standby(primary, dbname="src", settings=standby_settings)
        made.append(standby)
        return StandbyPair(primary, standby)

    yield make
    for cluster in reversed(made):
        cluster.stop()


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):
    """The one SparkSession of the run: local[2], Delta, 2 shuffle partitions, no UI."""
    from applier.spark.session import SparkSettings, build_spark_session

    warehouse = tmp_path_factory.mktemp("spark-warehouse")
    try:
        # 4g, not the default 2g: this one JVM serves every test of the run (650+), and near the end of a
        # full run a MERGE failed to acquire execution memory (SparkOutOfMemoryError) at 2g
        # Delta keeps up to 10,000 DeltaLogs (each with its snapshot's plans) in a JVM-wide cache for an
        # hour: a full run opens thousands of throw-away tables, and by its last third the old generation
        # of the heap was full of them (3.6 of 4 GB live after a full GC, mostly Catalyst trees), every
        # test paying for the collector. A test never needs a table of an earlier test.
        session = build_spark_session(SparkSettings(
            master="local[2]", app_name="applier-tests", shuffle_partitions=2, warehouse_dir=str(warehouse),
            driver_memory="4g", extra={"spark.databricks.delta.delta.log.cacheSize": "32",
                                       "spark.databricks.delta.delta.log.cacheRetentionMinutes": "5"}))
    except EnvironmentSetupError as e:
        unavailable(str(e))
    yield session
    session.stop()



@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's standalone S3 server on loopback (tests/s3server.py), one per run; each test makes its buckets."""
    server = start_s3_server(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


class _Stoppable(Protocol):
    def stop(self) -> None: ...


_Server = TypeVar("_Server", bound=_Stoppable)


def _served(start: Callable[[Path], _Server], work: Path, *,
            missing: Callable[[str], Any] = unavailable) -> Iterator[_Server]:
    """A test server started in ``work`` for the run, stopped after it; not installed: ``missing`` (skipped
    locally and a failure in CI, unless the server is opt-in)."""
    try:
        server = start(work)
    except FileNotFoundError as e:
        missing(str(e))
        raise  # (missing raises: a skip or a failure)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzuriteServer]:
    """Azurite's Blob service on loopback (applier/devtools/azurite.py), one per run; each test makes its
    containers. Not installed (scripts/setup-test-servers, run by `make test`, installs it into the cache):
    skipped locally, a failure in CI."""
    yield from _served(start_azurite, tmp_path_factory.mktemp("azurite"))


@pytest.fixture(scope="session")
def hive_metastore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HiveMetastore]:
    """A Hive Metastore's Thrift service on loopback (applier/devtools/hivemetastore.py), from pyspark's own
    jars, one per run; each test uses databases of its own."""
    yield from _served(start_hive_metastore, tmp_path_factory.mktemp("hms"))


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    """fake-gcs-server on loopback (applier/devtools/gcsserver.py), one per run; each test makes its buckets.
    Opt-in (``scripts/setup-test-servers --gcs``), so skipped when absent, in CI too: it cannot store an
    object the way delta-rs writes to GCS, so only gs://'s refusals run against it, and it takes a 4-10
    minute Go build that would buy CI little (docs/object-storage.md)."""
    yield from _served(start_gcs_server, tmp_path_factory.mktemp("gcs"), missing=pytest.skip)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting Spark is a failure here, not a slow pass (the CLI must fail before any JVM)."""
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("Spark was started")

    monkeypatch.setattr("applier.spark.session.build_spark_session_for", refuse)
    monkeypatch.setattr("applier.spark.session.build_spark_session", refuse)


@dataclass
class ReplayPaths:
    """What the replays of one test did: replays that went to executors (a failing range hands over to
    the driver path, so such a replay may fold nothing there), and why a replay did not use them."""

    name: str
    attempts: int = 0
    ranges: list[int] = field(default_factory=list)
    driver_only: list[str] = field(default_factory=list)


@pytest.fixture(params=["driver", "executors"])
def replay_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ReplayPaths]:
    """Run a replay test twice: on the driver path, and with decoding and folding on Spark's executors
    (applier.drivers.executors) whenever the log allows it, cut into ranges of ~37 messages so that
    transactions, TOAST chains and key changes cross ranges. Both must give the same tables; in the
    second run, a replay that could use executors must have (checked at teardown)."""
    seen = ReplayPaths(str(request.param))
    if request.param == "executors":
        import applier.drivers.replay as replay
        from applier.drivers.executors import commit, eligibility, survey

        # replay's own names are patched; the originals are in applier.drivers.executors (replay imports them)
        def on_executors(_spark: Any, config: Any, state: Any) -> str | None:
            why = eligibility.eligibility(config, state)
            if why is not None:
                seen.driver_only.append(why)
            return why

        monkeypatch.setattr(replay, "on_executors", on_executors)
        background = survey.BackgroundSurvey
        monkeypatch.setattr(replay, "BackgroundSurvey",
                            lambda path, catalog, partition_messages, **kw: background(path, catalog,
                                                                                       partition_messages=37, **kw))
        run = commit.replay_on_executors

        def replay_on_executors(*args: Any, **kwargs: Any) -> Any:
            seen.attempts += 1
            summary = run(*args, **kwargs)
            seen.ranges.append(summary.ranges)
            return summary

        monkeypatch.setattr(replay, "replay_on_executors", replay_on_executors)
    yield seen
    if request.param == "executors":
        assert seen.attempts or seen.driver_only, "no replay of this test folded a range on executors"
