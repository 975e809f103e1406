"""Targets on an object store (issues 33 and 50): replay and mirror into s3://, abfss:// (and az://) and gs://
on a real server of each protocol on loopback.

The servers: moto's standalone S3 server (applier/devtools/s3server.py), Azurite, Microsoft's Azure
Storage emulator (devtools/azurite.py), and fake-gcs-server (devtools/gcsserver.py), each reached through
its cloud's standard variables only (or ``target.storage_options`` alone); delta-rs commits to them and
the writer lock is a lease object taken with a conditional write. The tests that need nothing of Spark
run against every store (the ``store`` fixture); those that need Spark run against S3 only, because
Spark's ABFS driver needs the DFS endpoint Azurite does not have (docs/object-storage.md). Every test
compares data: the tables on the store against the same replay into a local directory (itself checked
against Postgres elsewhere), or against Postgres itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import unavailable
from deltalake import DeltaTable

from applier.cli import main
from applier.commands.exitcodes import ExitCode
from applier.lsn import parse_lsn
from applier.sink.naming import mirrored_table_dirs, source_name_of, table_location
from applier.sources.rawlog_writer import write_raw_log
from applier.storage.lease import LOCK_KEY, store_lease
from applier.storage.objects import ObjectStore

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput" / "pg15_basic_proto1_text.jsonl"


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path):
    for name, value in s3_server.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))  # the local state of s3:// targets
    return s3_server


@dataclass
class Store:
    """One store under test, as a test needs it: its URI scheme, the standard variables that reach it,
    a new empty bucket (container), and the ``target.storage_options`` that reach it without them."""

    scheme: str
    env: dict[str, str]
    new_root: Callable[[], str]  # "s3://bucket", "abfss://container@account.dfs.core.windows.net", "gs://bucket"
    options: dict[str, str] = field(default_factory=dict)
    missing_root: str = ""  # a bucket (container) that does not exist


def _store(kind: str, request: pytest.FixtureRequest) -> Store:
    from applier.devtools.azurite import ACCOUNT, ACCOUNT_KEY

    if kind == "s3":
        server = request.getfixturevalue("s3_server")
        env = server.env
        return Store("s3", env, lambda: f"s3://{server.new_bucket()}",
                     {"aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
                      "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"], "aws_region": env["AWS_REGION"],
                      "aws_endpoint_url": env["AWS_ENDPOINT_URL"], "aws_allow_http": "true"}, "s3://no-such-bucket")
    if kind in ("abfss", "az"):
        azurite = request.getfixturevalue("azurite_server")
        host = f"@{ACCOUNT}.dfs.core.windows.net" if kind == "abfss" else ""
        return Store(kind, azurite.env, lambda: f"{kind}://{azurite.new_container()}{host}",
                     {"azure_storage_account_name": ACCOUNT, "azure_storage_account_key": ACCOUNT_KEY,
                      "azure_storage_endpoint": f"{azurite.endpoint}/{ACCOUNT}", "azure_allow_http": "true"},
                     f"{kind}://no-such-container{host}")
    gcs = request.getfixturevalue("gcs_server")
    return Store("gs", gcs.env, lambda: f"gs://{gcs.new_bucket()}",
                 {"google_service_account": str(gcs.service_account), "google_allow_http": "true"},
                 "gs://no-such-bucket")


#: Every store whose emulator delta-rs can write to, each through its cloud's standard variables (az:// is
#: abfss:// spelled otherwise: one test). Not gs://: fake-gcs-server has no XML API for writing an object
#: (fsouza/fake-gcs-server#331), the only API object_store writes with; gs:// is tested below as far as it can.
STORES = ["s3", "abfss"]
_CLOUD_VARIABLES = ("AWS_", "AZURE_", "AZURITE_", "GOOGLE_")


@pytest.fixture(params=STORES)
def store(request, monkeypatch, tmp_path) -> Store:
    """Each store in turn, reached through its standard variables alone (any other cloud's are unset)."""
    chosen = _store(request.param, request)
    for name in os.environ:
        if name.startswith(_CLOUD_VARIABLES):
            monkeypatch.delenv(name)
    for name, value in chosen.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state-home"))  # the local state of store targets
    return chosen


def _raw_log(tmp_path: Path) -> Path:
    rows = [json.loads(x) for x in FIXTURE.read_text().splitlines()]
    raw = tmp_path / "raw.parquet"
    write_raw_log(raw, ((parse_lsn(r["lsn"]), r["xid"], bytes.fromhex(r["data"])) for r in rows))
    return raw


def _config(tmp_path: Path, raw: Path, target: str, **apply: object) -> Path:
    """Every keyed table of the capture: delta-rs writes them all, no JVM (the key-less one is left to
    test_target_storage_options_alone...)."""
    import yaml

    path = tmp_path / f"replay-{abs(hash(target))}.yaml"
    path.write_text(yaml.safe_dump({"source_log": str(raw), "target": {"path": target}, "apply": apply,
                                    "tables": {"exclude": ["public.full_rows"]}, "distributed": {"mode": "off"}}))
    return path


def _mirror_on_store(pg, root: str, tmp_path: Path, name: str, *statements: str) -> tuple[str, Path]:
    """Run ``statements``, publish every table (publication and slot named after ``name``), and write a
    mirror config whose target is under ``root`` (a new bucket's URI): (target URI, config path)."""
    import yaml

    with pg.connect() as conn:
        for statement in statements:
            conn.execute(statement)
        conn.execute(f"CREATE PUBLICATION {name}_pub FOR ALL TABLES")
    target = f"{root}/mirror"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"source": {"dsn": pg.dsn, "slot": f"{name}_slot", "publication": f"{name}_pub"},
                                      "target": {"path": target}}))
    return target, config


def _contents(root: str | Path) -> dict[str, tuple[int, list[str]]]:
    out = {}
    for table in mirrored_table_dirs(root):
        delta = DeltaTable(str(table))
        rows = sorted(map(str, delta.to_pyarrow_table().to_pylist()))
        out[f"{table.parent.name}.{table.name}"] = (delta.version(), rows)
    return out


@pytest.mark.parametrize("store", ["s3", "abfss", "az"], indirect=True)
def test_replay_into_a_store_equals_the_same_replay_into_a_directory_once(store, tmp_path, no_spark, capsys):
    raw = _raw_log(tmp_path)
    target = f"{store.new_root()}/mirror"
    local = tmp_path / "local"
    assert main(["replay", "--config", str(_config(tmp_path, raw, str(local)))]) == ExitCode.OK
    assert main(["replay", "--config", str(_config(tmp_path, raw, target))]) == ExitCode.OK
    on_s3, in_dir = _contents(target), _contents(local)
    assert set(on_s3) == {"public.items", "public.docs", "public.parent", "public.child"}
    assert {k: rows for k, (_, rows) in on_s3.items()} == {k: rows for k, (_, rows) in in_dir.items()}
    assert any(rows for _, rows in on_s3.values())
    # exactly once: the same log again writes no version, and the lock object is gone after each run
    assert main(["replay", "--config", str(_config(tmp_path, raw, target))]) == ExitCode.OK
    assert _contents(target) == on_s3
    assert ObjectStore(target).get(LOCK_KEY) is None
    assert not list(Path.cwd().glob(f"{store.scheme}:*"))  # never joined as a local path
    capsys.readouterr()
    assert main(["status", "--target", target]) == ExitCode.OK  # read through delta-rs, no JVM
    listed = capsys.readouterr().out
    assert all(name in listed for name in on_s3), listed


def test_a_second_writer_is_refused_while_the_lease_is_held_and_a_dead_holder_is_taken_over(store, tmp_path, no_spark,
                                                                                           capsys):
    raw = _raw_log(tmp_path)
    target = f"{store.new_root()}/mirror"
    config = str(_config(tmp_path, raw, target))
    objects = ObjectStore(target)
    with store_lease(objects, "target", on_lost=lambda reason: None):  # another run, alive, holds the target
        code = main(["replay", "--config", config])
        err = capsys.readouterr().err
        assert code != ExitCode.OK and "another applier run is writing to this target" in err, err
        assert f"pid {os.getpid()}" in err
    assert _contents(target) == {}  # the refused run wrote nothing
    # a run killed while holding the lock: its process is gone, so the lock is taken over at once
    dead = subprocess.Popen(["true"])
    dead.wait()
    objects.put(LOCK_KEY, json.dumps({"host": socket.gethostname(), "pid": dead.pid, "token": "x",
                                    "since": "then", "expires": 4e9}).encode())
    assert main(["replay", "--config", config]) == ExitCode.OK
    assert _contents(target)
    # a holder on another host whose lease has not expired: refused; expired: taken over
    objects.put(LOCK_KEY, json.dumps({"host": "elsewhere", "pid": 1, "token": "y", "since": "then",
                                    "expires": 4e9}).encode())
    assert main(["replay", "--config", config]) != ExitCode.OK
    assert "elsewhere pid 1" in capsys.readouterr().err
    objects.put(LOCK_KEY, json.dumps({"host": "elsewhere", "pid": 1, "token": "y", "since": "then",
                                    "expires": 1.0}).encode())
    assert main(["replay", "--config", config]) == ExitCode.OK
    assert objects.get(LOCK_KEY) is None


def test_a_bucket_that_does_not_exist_is_exit_2_naming_it(store, tmp_path, no_spark, capsys):
    raw = _raw_log(tmp_path)
    assert main(["replay", "--config", str(_config(tmp_path, raw, f"{store.missing_root}/m"))]) == ExitCode.USAGE
    err = capsys.readouterr().err
    what = "container 'no-such-container'" if store.scheme in ("abfss", "az") else "bucket 'no-such-bucket'"
    assert f"the {what} does not exist" in err and len(err.strip().splitlines()) == 1, err


def test_mirror_copies_and_follows_into_a_store_equal_to_postgres(store, pg, tmp_path, no_spark):
    import yaml

    with pg.connect() as conn:
        conn.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance bigint)")
        conn.execute("CREATE TABLE notes (id bigint PRIMARY KEY, body text)")
        conn.execute("INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 500) g")
        conn.execute("INSERT INTO notes SELECT g, repeat('n', g % 50) FROM generate_series(1, 200) g")
        conn.execute("CREATE PUBLICATION s3_pub FOR TABLE accounts, notes")
    target = f"{store.new_root()}/mirror"
    config = tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"source": {"dsn": pg.dsn, "slot": "s3_slot", "publication": "s3_pub"},
                                      "target": {"path": target}}))
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK  # the initial copy
    with pg.connect() as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id % 7 = 0")
        conn.execute("DELETE FROM accounts WHERE id % 11 = 0")
        conn.execute("INSERT INTO notes VALUES (1000, 'late'), (1001, NULL)")
        conn.execute("UPDATE notes SET body = 'changed' WHERE id < 20")
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK  # the stream
    with pg.connect() as conn:
        expected = {
            "public.accounts": sorted(map(str, [{"id": i, "owner": o, "balance": b} for i, o, b in
                                                conn.execute("SELECT id, owner, balance FROM accounts")])),
            "public.notes": sorted(map(str, [{"id": i, "body": b} for i, b in
                                             conn.execute("SELECT id, body FROM notes")]))}
    assert {k: rows for k, (_, rows) in _contents(target).items()} == expected
    before = _contents(target)
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK  # nothing new: no version written
    assert _contents(target) == before
    if store.scheme != "s3":
        return  # Spark's ABFS driver cannot reach Azurite (no DFS endpoint): docs/object-storage.md
    # `applier verify` on the store: Spark reads the tables through S3A (a fresh process: its JVM gets the
    # connector); one row changed behind the mirror's back is found
    with pg.connect() as conn:
        conn.execute("ALTER PUBLICATION s3_pub DROP TABLE notes")
        conn.execute("UPDATE notes SET body = 'not mirrored' WHERE id = 1000")
    verify = subprocess.run([sys.executable, "-m", "applier.cli", "verify", "--dsn", pg.dsn, "--target", target],
                            capture_output=True, text=True, timeout=600, env={**os.environ, **store.env})
    assert verify.returncode == ExitCode.DIFFERENCES, verify.stderr[-3000:]
    assert "public.accounts: postgres 455 rows, delta 455 rows: equal" in verify.stdout, verify.stdout
    assert "public.notes: postgres 202 rows, delta 202 rows: DIFFERENT" in verify.stdout, verify.stdout


def test_a_stale_second_delta_rs_writer_does_not_overwrite_a_commit_on_the_server(store):
    """Delta commits on the store are put-if-absent: a writer that read version 1 and commits after another
    writer's version 2 gets version 3 (delta-rs' conflict check), never a replaced version 2."""
    import pyarrow as pa
    from deltalake import write_deltalake

    table = f"{store.new_root()}/t"
    write_deltalake(table, pa.table({"a": [0]}))
    first, stale = DeltaTable(table), DeltaTable(table)
    write_deltalake(first, pa.table({"a": [1]}), mode="append")
    write_deltalake(stale, pa.table({"a": [2]}), mode="append")
    after = DeltaTable(table)
    assert after.version() == 2 and sorted(after.to_pyarrow_table()["a"].to_pylist()) == [0, 1, 2]


def test_replay_into_s3_killed_again_and_again_then_restarted_ends_equal_to_the_local_replay(s3, tmp_path):
    """SIGKILL at the named crash points (a table committed and the next not, all committed and the
    progress not saved, mid-decode) and at moments chosen by time (inside delta-rs' writes of data files
    and commits): every restart takes the dead run's lease over at once, and the last one ends with
    the tables equal to a replay that was never killed (no half commit, nothing applied twice)."""
    import signal
    import time

    raw = _raw_log(tmp_path)
    target = f"s3://{s3.new_bucket()}/mirror"
    local = tmp_path / "local"
    assert main(["replay", "--config", str(_config(tmp_path, raw, str(local)))]) == ExitCode.OK
    config = str(_config(tmp_path, raw, target, max_group_transactions=2))  # many groups, many commits
    env = {**os.environ, **s3.env}
    command = [sys.executable, "-m", "applier.cli", "replay", "--config", config]
    killed = []
    for point in ("between_tables:2", "decode:25", "before_confirm:2", "between_tables:3"):
        run = subprocess.run(command, env={**env, "APPLIER_CRASH_AT": point}, capture_output=True, text=True,
                             timeout=300)
        assert run.returncode in (-signal.SIGKILL, 0), (point, run.stderr[-2000:])
        killed.append(run.returncode == -signal.SIGKILL)
    assert killed.count(True) >= 3, killed  # the points were reached: the runs died there
    for delay in (0.8, 1.2, 1.6):
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        proc.kill()
        proc.wait()
    assert subprocess.run(command, env=env, capture_output=True, timeout=300).returncode == 0
    assert {k: rows for k, (_, rows) in _contents(target).items()} == \
        {k: rows for k, (_, rows) in _contents(local).items()}
    assert ObjectStore(target).get(LOCK_KEY) is None


def test_capture_into_s3_then_replay_the_log_from_s3_into_s3_equal_to_postgres(s3, pg, tmp_path, capsys):
    """`applier capture` writes its Delta raw log on the store (Spark through S3A, in a fresh process, the
    log's lock a lease object beside it); `applier replay --source s3://... --target s3://...` reads it
    back through pyarrow's S3 file system (Parquet footers and row groups by range) and delta-rs."""
    import yaml

    with pg.connect() as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, item text, qty int)")
        conn.execute("CREATE PUBLICATION cap_pub FOR TABLE orders")
        conn.execute("SELECT pg_create_logical_replication_slot('cap_slot', 'pgoutput')")
        conn.execute("INSERT INTO orders SELECT g, 'item ' || g, g FROM generate_series(1, 300) g")
        conn.execute("UPDATE orders SET qty = qty * 2 WHERE id % 3 = 0")
        conn.execute("DELETE FROM orders WHERE id % 10 = 0")
        expected = sorted(str({"id": i, "item": t, "qty": q}) for i, t, q in
                          conn.execute("SELECT id, item, qty FROM orders"))
    bucket = s3.new_bucket()
    log, target = f"s3://{bucket}/raw-log", f"s3://{bucket}/mirror"
    config = tmp_path / "capture.yaml"
    config.write_text(yaml.safe_dump({"source": {"dsn": pg.dsn, "slot": "cap_slot", "publication": "cap_pub"},
                                      "log_path": log}))
    done = subprocess.run([sys.executable, "-m", "applier.cli", "capture", "--config", str(config)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **s3.env})
    assert done.returncode == 0, done.stderr[-3000:]
    assert ObjectStore(log).get("_applier_writer.lock.json") is None  # the lease was given back
    assert main(["replay", "--source", log, "--target", target]) == ExitCode.OK
    assert _contents(target)["public.orders"][1] == expected


def test_a_renamed_table_moves_on_the_store_even_when_killed_mid_move_and_its_old_name_reused_is_a_new_table(
        store, pg, tmp_path, no_spark):
    """A store has no rename: the renamed table's objects are copied to its new place and then deleted.
    The first try is SIGKILLed after a few objects are copied; the next run finishes the move (its
    intent was saved first) and applies the changes. A new table that takes the old name gets a new
    Delta table; nothing of either is merged into the other. Everything equals Postgres."""
    target, config = _mirror_on_store(pg, store.new_root(), tmp_path, "ren",
                                      "CREATE TABLE t (id int PRIMARY KEY, v text)",
                                      "INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 50) g")
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
    for g in range(3):  # a few commits: the table has log, data and checkpoint-free history to move
        with pg.connect() as conn:
            conn.execute(f"UPDATE t SET v = 'round {g}' WHERE id % 3 = {g}")
        assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
    old_keys = set(ObjectStore(f"{target}/public/t").keys())
    with pg.connect() as conn:
        conn.execute("ALTER TABLE t RENAME TO t_new")
        conn.execute("UPDATE t_new SET v = 'after' WHERE id <= 10")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, w int)")  # the old name, reused
        conn.execute("INSERT INTO t VALUES (1, 100), (2, 200)")
    killed = subprocess.run([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config), "--once"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "APPLIER_CRASH_AT": "object_copied:3"})
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert ObjectStore(f"{target}/public/t").keys()  # the move was interrupted: the old place still holds it
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
    with pg.connect() as conn:
        expected = {"public.t_new": sorted(str({"id": i, "v": v}) for i, v in conn.execute("SELECT id, v FROM t_new")),
                    "public.t": sorted(str({"id": i, "w": w}) for i, w in conn.execute("SELECT id, w FROM t"))}
    assert {k: rows for k, (_, rows) in _contents(target).items()} == expected
    moved = set(ObjectStore(f"{target}/public/t_new").keys())
    assert {k for k in old_keys if not k.startswith("_delta_log/")} <= moved  # the same data files, moved
    assert not any(k.startswith("_applier_moved_from") for k in moved)
    # dropped, and its name taken by a new table: the old Delta table is retired (moved aside), not merged into
    with pg.connect() as conn:
        conn.execute("DROP TABLE t_new")
        conn.execute("CREATE TABLE t_new (id int PRIMARY KEY, x text)")
        conn.execute("INSERT INTO t_new VALUES (7, 'x')")
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
    assert _contents(target)["public.t_new"][1] == [str({"id": 7, "x": "x"})]
    retired = [k for k in ObjectStore(f"{target}/_retired/public").keys() if "/_delta_log/" in k]
    assert retired and all(k.startswith("t_new@") for k in retired), retired
    kept = DeltaTable(f"{target}/_retired/public/{retired[0].split('/')[0]}").to_pyarrow_table().to_pylist()
    assert sorted(map(str, kept)) == expected["public.t_new"]  # the dropped table's rows, as they were


def test_a_table_deleted_from_the_store_is_found_before_anything_is_written(store, tmp_path, no_spark, capsys):
    """The target registry (in the local state directory) remembers the tables on the store: one deleted
    since is refused with the way to rebuild it, not silently re-created from later changes alone."""
    raw = _raw_log(tmp_path)
    target = f"{store.new_root()}/mirror"
    config = str(_config(tmp_path, raw, target))
    assert main(["replay", "--config", config]) == ExitCode.OK
    objects = ObjectStore(target)
    for key in objects.keys("public/items"):
        objects.delete(key)
    capsys.readouterr()
    assert main(["replay", "--config", config]) != ExitCode.OK
    err = capsys.readouterr().err
    assert "table public.items was written by an earlier run but its directory is gone" in err, err


def test_the_lease_is_renewed_while_held_and_a_holder_whose_lock_was_taken_over_stops(store):
    """Renewal moves the expiry forward with put-if-unchanged on the holder's own ETag; once another run
    has replaced the object, the next renewal fails and the holder is told (by default it exits: the next test)."""
    import time

    objects = ObjectStore(f"{store.new_root()}/mirror")

    def lock() -> dict:
        held = objects.get(LOCK_KEY)
        assert held is not None
        return json.loads(held.data)

    lost: list[str] = []
    with store_lease(objects, "target", lease_seconds=0.6, on_lost=lost.append) as mine:
        time.sleep(0.9)
        renewed = lock()
        assert renewed["token"] == mine["token"] and renewed["expires"] > mine["expires"]
        assert lost == []
        objects.put(LOCK_KEY, json.dumps({"host": "elsewhere", "pid": 1, "token": "theirs", "expires": 4e9}).encode())
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lost == ["another run took it over, or it was deleted"]
    assert lock()["token"] == "theirs"  # not released: it is not ours any more


def test_a_mirror_whose_lock_is_taken_over_stops_at_once_with_exit_3_and_commits_nothing_more(store, pg, tmp_path):
    """A following `applier mirror` (a fresh process, lease of 3 s) finds at its next renewal that another run
    holds the lock: it ends with exit 3 and one line, as a crash would (not through the Ctrl-C path, which
    commits what it has received first), and leaves the lock object to its new holder."""
    import time

    target, config = _mirror_on_store(pg, store.new_root(), tmp_path, "lease",
                                      "CREATE TABLE leased (id int PRIMARY KEY, v text)",
                                      "INSERT INTO leased VALUES (1, 'a')")
    objects, table = ObjectStore(target), ObjectStore(f"{target}/public/leased")
    follower = subprocess.Popen([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "APPLIER_LEASE_SECONDS": "3"})
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and follower.poll() is None and not table.any_under("_delta_log/"):
            time.sleep(0.2)  # until the copy is done and the mirror follows the stream
        assert follower.poll() is None, follower.communicate()[1][-3000:]
        objects.put(LOCK_KEY, json.dumps({"host": "elsewhere", "pid": 1, "token": "theirs", "expires": 4e9}).encode())
        _, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == ExitCode.UNAVAILABLE, err[-3000:]
    assert "lost the writer lock (another run took it over" in err, err[-3000:]
    held = objects.get(LOCK_KEY)
    assert held is not None and json.loads(held.data)["token"] == "theirs"  # left to its holder


def test_a_name_that_needs_an_escape_is_refused_on_s3_and_a_plain_one_with_spaces_mirrors(s3, pg, tmp_path,
                                                                                          no_spark, capsys):
    """'%' in a key means one thing to delta-rs (a URI escape) and another to Hadoop's S3A: such a name is
    refused with exit 2 before anything is written; spaces and capitals need no escape and mirror."""
    import yaml

    with pg.connect() as conn:
        conn.execute('CREATE SCHEMA "Odd sch"')
        conn.execute('CREATE TABLE "Odd sch"."weird name" (id int PRIMARY KEY, "_applier_op" text)')
        conn.execute('INSERT INTO "Odd sch"."weird name" VALUES (1, \'x\'), (2, NULL)')
        conn.execute('CREATE TABLE public."50% off" (id int PRIMARY KEY)')
        conn.execute('INSERT INTO public."50% off" VALUES (1)')
        conn.execute("CREATE PUBLICATION odd_pub FOR ALL TABLES")
    target = f"s3://{s3.new_bucket()}/mirror"
    config = tmp_path / "mirror.yaml"
    settings: dict = {"source": {"dsn": pg.dsn, "slot": "odd_slot", "publication": "odd_pub"},
                      "target": {"path": target}}
    config.write_text(yaml.safe_dump(settings))
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "public.50% off: its name needs an escape" in errors[0], err
    assert all(not rows for _, rows in _contents(target).values())  # no row written, no table for it
    assert not any("50" in name for name in _contents(target))
    target = f"s3://{s3.new_bucket()}/mirror"  # a fresh start (resuming the stopped copy may need Spark)
    settings = {**settings, "source": {**settings["source"], "slot": "odd_slot_2"}, "target": {"path": target},
                "tables": {"exclude": ["public.50% off"]}}
    config.write_text(yaml.safe_dump(settings))
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
    assert _contents(target)["Odd sch.weird name"][1] == sorted(
        str(r) for r in [{"id": 1, "_applier_op": "x"}, {"id": 2, "_applier_op": None}])
    # a table written under keep is found there under safe (asked of the store), a new name is safe
    assert table_location(target, "Odd sch", "weird name", safe=True) == f"{target}/Odd sch/weird name"
    assert table_location(target, "Odd sch", "other name", safe=True) == f"{target}/Odd~20sch/other~20name"
    # tables.path_names: safe: no name needs a '%', none is refused, and every name decodes back
    target = f"s3://{s3.new_bucket()}/mirror"
    settings = {**settings, "source": {**settings["source"], "slot": "odd_slot_3"}, "target": {"path": target},
                "tables": {"path_names": "safe"}}
    config.write_text(yaml.safe_dump(settings))
    assert main(["mirror", "--config", str(config), "--once"]) == ExitCode.OK
    contents = _contents(target)
    assert set(contents) == {"Odd~20sch.weird~20name", "public.50~25~20off"}
    assert contents["public.50~25~20off"][1] == [str({"id": 1})]
    assert sorted(source_name_of(t) for t in mirrored_table_dirs(target)) == [("Odd sch", "weird name"),
                                                                          ("public", "50% off")]


def test_target_storage_options_alone_reach_the_store_for_both_engines_the_log_and_the_lock(s3, spark, tmp_path):
    """No AWS variable in the process: endpoint, credentials and region come only from the config's
    ``target.storage_options``. A fresh `applier replay` reads its raw log from the target's bucket
    (pyarrow), takes the lease (obstore), writes the tables with delta-rs but the liquid-clustered one
    with Spark (S3A from the cache, per-bucket Hadoop settings; the key-less table: Spark's multiset MERGE
    on the store), and ends equal to the same log replayed into a local directory; `status` reads the
    tables with the same options; no secret is printed. Every table through Spark's MERGE on S3, with the
    endpoint from the AWS variables, is the standalone-cluster replay's (tests/scenario/test_spark_cluster.py)."""
    import yaml

    raw = _raw_log(tmp_path)
    bucket = s3.new_bucket()
    ObjectStore(f"s3://{bucket}/raw").put("part-00000.parquet", raw.read_bytes())
    target = f"s3://{bucket}/mirror"
    secret = s3.env["AWS_SECRET_ACCESS_KEY"]
    options = {"aws_access_key_id": s3.env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": secret,
               "aws_region": s3.env["AWS_REGION"], "aws_endpoint_url": s3.env["AWS_ENDPOINT_URL"],
               "aws_allow_http": "true"}
    section = {"path": target, "storage_options": options}
    config, mirror_config = tmp_path / "options.yaml", tmp_path / "mirror.yaml"
    config.write_text(yaml.safe_dump({"source_log": f"s3://{bucket}/raw", "distributed": {"mode": "off"},
                                      "target": section,
                                      "tables": {"rules": [{"match": "public.full_rows", "cluster_by": ["a"]}]}}))
    mirror_config.write_text(yaml.safe_dump({"target": section}))
    local = tmp_path / "local"
    assert main(["replay", "--source", str(raw), "--target", str(local)]) == ExitCode.OK
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # no instance role to fall back on: the options or nothing
    for command in (["replay", "--config", str(config)], ["status", "--config", str(mirror_config)]):
        done = subprocess.run([sys.executable, "-m", "applier.cli", *command], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert secret not in done.stdout + done.stderr
    assert all(name in done.stdout for name in ("public.items", "public.full_rows")), done.stdout
    on_s3, in_dir = _contents(target), _contents(local)
    assert "public.full_rows" in on_s3 and on_s3["public.full_rows"][1]
    def writers(table: str) -> set[str]:
        return {c.get("engineInfo", c.get("clientVersion", "")).split("/")[0].split(":")[0]
                for c in DeltaTable(f"{target}/public/{table}", storage_options=options).history()}

    assert writers("items") == {"delta-rs"} and writers("full_rows") == {"Apache-Spark"}
    assert {k: rows for k, (_, rows) in on_s3.items()} == {k: rows for k, (_, rows) in in_dir.items()}
    assert ObjectStore(target).get(LOCK_KEY) is None
    # the same config without its options, and no variables: the store cannot be reached, exit 2
    config.write_text(yaml.safe_dump({"source_log": f"s3://{bucket}/raw", "target": {"path": target}}))
    done = subprocess.run([sys.executable, "-m", "applier.cli", "replay", "--config", str(config)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == ExitCode.USAGE, done.stderr[-3000:]


def test_a_gs_target_puts_hadoops_own_gcs_connector_on_a_fresh_spark_and_gs_uris_open_with_it(spark, tmp_path):
    """No GCS emulator is installed here, so this goes as far as the connector: a session whose target is
    gs:// gets ``hadoop-gcp`` matching pyspark's Hadoop (fetched into the cache once, as `applier setup
    --connectors gcs` does) and Hadoop opens gs:// with it; a service-account option becomes its settings."""
    script = tmp_path / "gs.py"
    script.write_text(
        "from applier.spark.session import SparkSettings, build_spark_session\n"
        "from applier.storage.options import StorageOptions, put_in_force\n"
        "put_in_force(StorageOptions.of('gs://applier-gs/m', {'google_service_account': '/keys/sa.json'}))\n"
        "spark = build_spark_session(SparkSettings(locations=('gs://applier-gs/m',)))\n"
        "jvm, conf = spark._jvm, spark._jsc.hadoopConfiguration()\n"
        "keyfile = conf.get('fs.gs.auth.service.account.json.keyfile'), conf.get('fs.gs.auth.type')\n"
        "opening = jvm.org.apache.hadoop.conf.Configuration(conf)\n"
        "opening.set('fs.gs.auth.type', 'COMPUTE_ENGINE')  # no key file here; opening asks nothing of the network\n"
        "fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(jvm.java.net.URI('gs://applier-gs/'), opening)\n"
        "print(fs.getClass().getName(), *keyfile)\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["org.apache.hadoop.fs.gs.GoogleHadoopFileSystem", "/keys/sa.json",
                                 "SERVICE_ACCOUNT_JSON_KEYFILE"], done.stdout


def test_a_move_on_the_store_never_lands_on_someone_elses_table_and_repeating_it_is_harmless(store):
    import pyarrow as pa
    from deltalake import write_deltalake

    from applier.storage.moves import MARKER, TableInTheWay, move_table_on_store

    root = f"{store.new_root()}/m"
    src, dst, foreign = f"{root}/public/a", f"{root}/public/b", f"{root}/public/c"
    for path, rows in ((src, [1, 2, 3]), (foreign, [9])):
        write_deltalake(path, pa.table({"id": rows}))
        write_deltalake(path, pa.table({"id": [r * 10 for r in rows]}), mode="append")
    with pytest.raises(TableInTheWay):
        move_table_on_store(src, foreign)
    assert sorted(DeltaTable(foreign).to_pyarrow_table()["id"].to_pylist()) == [9, 90]  # untouched
    assert move_table_on_store(src, dst) is True
    assert sorted(DeltaTable(dst).to_pyarrow_table()["id"].to_pylist()) == [1, 2, 3, 10, 20, 30]
    assert not ObjectStore(src).keys() and MARKER not in ObjectStore(dst).keys()
    assert move_table_on_store(src, dst) is False  # moved already: repeating changes nothing
    assert DeltaTable(dst).version() == 1


@pytest.mark.parametrize("store", ["abfss"], indirect=True)
def test_target_storage_options_alone_reach_a_store_for_delta_rs_the_lock_and_status(store, tmp_path):
    """No cloud variable in the process: account, key and endpoint come only from ``target.storage_options``.
    A fresh `applier replay` takes the lease (obstore) and writes every keyed table with delta-rs, equal to
    the same log replayed into a local directory; `status` reads them with the same options; the key is
    never printed. (S3 with Spark too: the test above.)"""
    import yaml

    raw = _raw_log(tmp_path)
    target = f"{store.new_root()}/mirror"
    section = {"path": target, "storage_options": store.options}
    config, status_config = tmp_path / "options.yaml", tmp_path / "status.yaml"
    config.write_text(yaml.safe_dump({"source_log": str(raw), "distributed": {"mode": "off"}, "target": section,
                                      "tables": {"exclude": ["public.full_rows"]}}))
    status_config.write_text(yaml.safe_dump({"target": section}))
    local = tmp_path / "local"
    assert main(["replay", "--config", str(_config(tmp_path, raw, str(local)))]) == ExitCode.OK
    env = {k: v for k, v in os.environ.items() if not k.startswith(_CLOUD_VARIABLES)}
    secrets = [v for k, v in store.options.items() if k.endswith("_key")]
    for command in (["replay", "--config", str(config)], ["status", "--config", str(status_config)]):
        done = subprocess.run([sys.executable, "-m", "applier.cli", *command], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert secrets and not any(secret in done.stdout + done.stderr for secret in secrets)
    assert "public.items" in done.stdout, done.stdout
    on_store, in_dir = _contents(target), _contents(local)
    assert set(on_store) == {"public.items", "public.docs", "public.parent", "public.child"}
    assert {k: rows for k, (_, rows) in on_store.items()} == {k: rows for k, (_, rows) in in_dir.items()}


def _refused(tmp_path: Path, target: str, env: dict[str, str], options: dict[str, str] | None = None) -> str:
    """Run `applier replay` into ``target`` in a fresh process with ``env`` (and ``options``): it must stop
    with exit 2 and one line, no traceback; that line."""
    import yaml

    section: dict = {"path": target} | ({"storage_options": options} if options else {})
    config = tmp_path / "refused.yaml"
    config.write_text(yaml.safe_dump({"source_log": str(_raw_log(tmp_path)), "target": section,
                                      "distributed": {"mode": "off"}}))
    base = {k: v for k, v in os.environ.items() if not k.startswith(_CLOUD_VARIABLES)}
    done = subprocess.run([sys.executable, "-m", "applier.cli", "replay", "--config", str(config)],
                          capture_output=True, text=True, timeout=300,
                          env={**base, **env, "XDG_STATE_HOME": str(tmp_path / "state")})
    assert done.returncode == ExitCode.USAGE, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
    return done.stderr


@pytest.mark.parametrize("kind", ["s3", "abfss", "gs"])
def test_an_endpoint_that_does_not_answer_is_exit_2_in_one_line(kind, request, tmp_path):
    """The store's endpoint points at a port nothing listens on: exit 2 at the probe, naming the setting."""
    closed = f"http://127.0.0.1:{_closed_port()}"
    if kind == "gs":  # no server needed to find none: the key file names the endpoint (fake-gcs-server is opt-in)
        from applier.devtools.gcsserver import service_account_file

        env = {"GOOGLE_SERVICE_ACCOUNT": str(service_account_file(tmp_path / "closed-sa.json", closed))}
        err = _refused(tmp_path, "gs://applier-no-server/m", env)
        assert "the endpoint cannot be reached" in err, err
        return
    chosen = _store(kind, request)
    env = dict(chosen.env)
    if kind == "s3":
        env["AWS_ENDPOINT_URL"] = closed
    else:
        env["AZURITE_BLOB_STORAGE_URL"] = closed
    err = _refused(tmp_path, f"{chosen.new_root()}/m", env)
    assert "the endpoint cannot be reached" in err, err


def test_a_wrong_azure_key_is_exit_2_in_one_line_and_never_printed(azurite_server, tmp_path):
    """Azurite checks the shared-key signature as Azure does: a key that is not the account's is refused."""
    import base64

    from applier.devtools.azurite import ACCOUNT

    wrong = base64.b64encode(b"not the key of devstoreaccount1, not at all").decode()
    root = f"abfss://{azurite_server.new_container()}@{ACCOUNT}.dfs.core.windows.net"
    for env, options in (({**azurite_server.env, "AZURE_STORAGE_ACCOUNT_KEY": wrong}, None),
                         ({}, {"azure_storage_account_name": ACCOUNT, "azure_storage_account_key": wrong,
                               "azure_storage_endpoint": f"{azurite_server.endpoint}/{ACCOUNT}",
                               "azure_allow_http": "true"})):
        err = _refused(tmp_path, f"{root}/m", env, options)
        assert "the store refused the credentials (AZURE_STORAGE_ACCOUNT_NAME" in err and wrong not in err, err


def test_gs_against_fake_gcs_server_a_missing_bucket_is_exit_2_in_one_line(gcs_server, tmp_path):
    """As far as gs:// goes against fake-gcs-server (opt-in: it cannot store an object through GCS's XML API,
    which object_store writes with: docs/object-storage.md): a bucket that does not exist is found by the
    probe, exit 2 in one line."""
    err = _refused(tmp_path, "gs://no-such-bucket/m", gcs_server.env)
    assert "the bucket 'no-such-bucket' does not exist" in err, err


def test_gs_a_missing_key_file_is_exit_2_in_one_line(tmp_path):
    """A service-account file that is not there is said before any request (no server needed)."""
    err = _refused(tmp_path, "gs://applier-no-server/m", {"GOOGLE_SERVICE_ACCOUNT": str(tmp_path / "no.json")})
    assert "gs://" in err, err


def _closed_port() -> int:
    from applier.devtools.servers import free_port

    return free_port()


def test_azurite_runs_without_telemetry(tmp_path):
    """Azurite sends telemetry and keeps a ``Microsoft-AzureMonitor-*`` folder in the temporary directory
    unless told not to: the suite's emulator must not reach out, nor leave files behind."""
    from applier.devtools.azurite import start_azurite

    try:
        server = start_azurite(tmp_path)
    except FileNotFoundError as e:
        unavailable(str(e))
    try:
        server.new_container()
        deadline = time.monotonic() + 5  # (without the flag the folder appeared 3 s after the first request)
        while time.monotonic() < deadline and not list(tmp_path.glob("Microsoft-AzureMonitor*")):
            time.sleep(0.1)
    finally:
        server.stop()
    assert not list(tmp_path.glob("Microsoft-AzureMonitor*")), list(tmp_path.iterdir())
