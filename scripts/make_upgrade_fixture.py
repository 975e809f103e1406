"""Make tests/fixtures/upgrade/v1-5593802/: targets, their state directories and a raw log written by the
previous release (commit 5593802, the last before the state format was recorded), for
tests/integration/test_upgrade.py.

Why a fixture and not the old code at test time: CI may run on a shallow clone, without the old commit.
So this script, run by hand, checks the release out in a temporary git worktree, starts a throw-away
PostgreSQL 15 cluster (applier.devtools.pgcluster), and in its ``postgres`` database runs the fixture's
SQL and the release's own commands (its CLI, in a subprocess whose PYTHONPATH is the worktree):

0. ``00_before_the_log.sql`` (a publication of every table), then ``capture --once``: the log's slot;
1. ``01_before_first_run.sql`` (tables keyed and key-less, a TOAST value, the mirror's publication), then
   ``capture --once``, ``replay`` of the log into a target of its own, and ``mirror --once`` (the slot,
   the copy);
2. ``02_before_second_run.sql`` (updates, deletes, duplicate rows, a column renamed, an update that leaves
   the TOAST value unchanged), then ``capture --once`` and ``mirror --once`` again (streamed): the replay
   target stays behind its log;
3. the release's ``applier verify`` of the mirror, which must find every table equal.

The mirror's target, the log and the replay's target (each target with its state directory, ``_applier``)
are packed into ``release.tar.gz``, byte for byte but for one thing: the states record absolute paths (and
a table's first Delta commit its location, in its ``commitInfo``), and the directory holding the three is
written there as ``@ROOT@``, which the test puts back as the directory it unpacks to (the script checks
that nothing else names it). ``manifest.json`` says what the test needs to rebuild the server side: the
relation OIDs and relfilenodes the states record (the same SQL in a fresh cluster gives the same ones,
which the test checks) and the last LSN each slot confirmed (a fresh slot must start after them). Run it
again only to remake the fixture (its bytes differ each time: table ids, times)::

    .venv/bin/python scripts/make_upgrade_fixture.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from applier.devtools.pgcluster import PgCluster, find_installation  # noqa: E402

RELEASE = "5593802"
FIXTURE = REPO / "tests" / "fixtures" / "upgrade" / "v1-5593802"
SQL_FILES = ("00_before_the_log.sql", "01_before_first_run.sql", "02_before_second_run.sql")
#: what the release's paths are written as in the archive (the directory holding its three parts)
PLACEHOLDER = "@ROOT@"
#: the archive's parts: the mirror's target, the capture's raw log, the replay's target
PARTS = ("mirror", "log", "replay")
SLOT, PUBLICATION = "upgrade", "upgrade_pub"
LOG_SLOT, LOG_PUBLICATION = "upgrade_log", "upgrade_log_pub"
TABLES = ("public.accounts", "public.events", "app.people", "public.docs")
#: as the test suite's clusters (tests/conftest.py)
SETTINGS = {"logical_decoding_work_mem": "64kB"}
MAJOR = 15
#: the archive must stay small: it is committed
MAX_BYTES = 400_000


def old_applier(worktree: Path, *args: str) -> None:
    """``applier ARGS`` of the release checked out at ``worktree``: its own code, this venv's packages."""
    code = ("import sys, applier; assert applier.__file__.startswith(sys.argv[1]), applier.__file__; "
            "from applier.cli import run; run(sys.argv[2:])")
    env = {**os.environ, "PYTHONPATH": str(worktree), "APPLIER_CACHE_DIR": os.environ.get(
        "APPLIER_CACHE_DIR", str(REPO / ".cache"))}
    print(f"$ applier@{RELEASE} {' '.join(args)}", file=sys.stderr, flush=True)
    done = subprocess.run([sys.executable, "-c", code, str(worktree), *args], cwd=worktree, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"applier@{RELEASE} {args[0]} exited {done.returncode}")


def _run_sql(dsn: str, name: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute((FIXTURE / name).read_text(encoding="utf-8"))


def _one(conn: psycopg.Connection, sql: str, *params: object) -> Any:
    row = conn.execute(sql, params).fetchone()
    assert row is not None, sql
    return row[0]


def make(out: Path, work: Path) -> None:
    worktree, root = work / "release", work / "made"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), RELEASE], check=True)
    try:
        release = subprocess.run(["git", "-C", str(worktree), "rev-parse", "HEAD"], check=True, capture_output=True,
                                 text=True).stdout.strip()
        with PgCluster(find_installation(MAJOR), SETTINGS) as cluster:
            dsn = cluster.dsn()
            mirror = ("mirror", "--once", "--dsn", dsn, "--publication", PUBLICATION, "--slot", SLOT,
                      "--target", str(root / "mirror"))
            capture = ("capture", "--dsn", dsn, "--publication", LOG_PUBLICATION, "--slot", LOG_SLOT,
                       "--log", str(root / "log"))
            _run_sql(dsn, SQL_FILES[0])
            old_applier(worktree, *capture)  # its slot, before the tables: the log holds every change
            _run_sql(dsn, SQL_FILES[1])
            old_applier(worktree, *capture)
            old_applier(worktree, "replay", "--source", str(root / "log"), "--target", str(root / "replay"))
            old_applier(worktree, *mirror)  # the slot, the copy
            _run_sql(dsn, SQL_FILES[2])
            old_applier(worktree, *capture)  # the replay target stays as it was: the log goes on past it
            old_applier(worktree, *mirror)  # streamed
            old_applier(worktree, "verify", "--dsn", dsn, "--target", str(root / "mirror"))
            with psycopg.connect(dsn, autocommit=True) as conn:
                oids = {name: _one(conn, "SELECT %s::regclass::oid", name) for name in TABLES}
                filenodes = {name: _one(conn, "SELECT pg_relation_filenode(%s::regclass)", name) for name in TABLES}
                rows = {name: _one(conn, f"SELECT count(*) FROM {name}") for name in TABLES}
                confirmed = {slot: _one(conn, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                        "WHERE slot_name = %s", slot) for slot in (SLOT, LOG_SLOT)}
                version = _one(conn, "SHOW server_version")
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
    relocate(root)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "release.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for part in PARTS:
            tar.add(root / part, arcname=part, filter=_plain)
    if archive.stat().st_size > MAX_BYTES:
        raise SystemExit(f"{archive} is {archive.stat().st_size} bytes, more than {MAX_BYTES}: make the workload "
                         "smaller")
    manifest = {
        "release": release, "made_by": "scripts/make_upgrade_fixture.py", "archive": archive.name,
        "postgres_major": MAJOR, "server_version": version, "database": "postgres", "sql": list(SQL_FILES),
        "placeholder": PLACEHOLDER, "state_dir": "_applier",
        "mirror": {"target": "mirror", "slot": SLOT, "publication": PUBLICATION},
        "capture": {"log": "log", "slot": LOG_SLOT, "publication": LOG_PUBLICATION, "replay_target": "replay"},
        "relation_oids": oids, "relfilenodes": filenodes, "rows": rows, "slots_confirmed": confirmed,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {archive} ({archive.stat().st_size} bytes) and {out / 'manifest.json'}", file=sys.stderr)


def relocate(root: Path) -> None:
    """Write ``root`` as ``@ROOT@`` where the release recorded it: the states' JSON files (the tables'
    paths), and the ``commitInfo`` of a Delta commit (a table's creation records its location, which no
    reader uses; Hadoop's checksum file beside such a log file is dropped, as it would no longer match);
    fail if any other file or line names it."""
    wrong: list[str] = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if str(root).encode() not in path.read_bytes():
            continue
        where = str(path.relative_to(root))
        if path.suffix != ".json":
            wrong.append(where)
            continue
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        if path.parent.name == "_delta_log":
            wrong += [f"{where}: {line[:60]}" for line in lines
                      if str(root) in line and not line.startswith('{"commitInfo"')]
            (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
        elif "_applier" not in path.relative_to(root).parts:
            wrong.append(where)
            continue
        path.write_text("".join(line.replace(str(root), PLACEHOLDER) for line in lines), encoding="utf-8")
    if wrong:
        raise SystemExit(f"these files name the release's directory where the test cannot put it back: {wrong}")


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """No owner names or ids of the machine that made it."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE, help="where to write release.tar.gz and manifest.json")
    parser.add_argument("--keep", type=Path, help="work in this directory and keep it (default: a temporary one)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        make(args.out, args.keep.resolve())
        return
    with tempfile.TemporaryDirectory(prefix="applier-upgrade-") as work:
        make(args.out, Path(work))


if __name__ == "__main__":
    main()
