"""Make tests/fixtures/upgrade/v1-5593802/: a target and its state directory written by the previous
release (commit 5593802, the last before the state format was recorded), for
tests/integration/test_upgrade.py.

Why a fixture and not the old code at test time: CI may run on a shallow clone, without the old commit.
So this script, run by hand, checks the release out in a temporary git worktree, starts a throw-away
PostgreSQL 15 cluster (applier.devtools.pgcluster), and in its ``postgres`` database runs the fixture's
SQL and the release's own ``applier mirror --once`` (through its CLI, in a subprocess whose PYTHONPATH
is the worktree):

1. ``01_before_first_run.sql`` (tables keyed and key-less, a TOAST value, the publication), then the first
   run: the slot, the copy;
2. ``02_before_second_run.sql`` (updates, deletes, duplicate rows, a column renamed, an update that leaves
   the TOAST value unchanged), then the second run, which streams them;
3. the release's ``applier verify``, which must find every table equal.

The target (with its state directory, ``_applier``) is packed into ``target.tar.gz``, byte for byte but
for one thing: the state records absolute paths (and a table's first Delta commit its location, in its
``commitInfo``), and the target's root is written there as ``@TARGET@``, which the test puts back as the
directory it unpacks to (the script checks that nothing else names the root).
``manifest.json`` says what the test needs to rebuild the server side: the relation OIDs and
relfilenodes the state records (the same SQL in a fresh cluster gives the same ones, which the test
checks) and the last LSN the release applied (a fresh slot must start after it). Run it again only to
remake the fixture (its bytes differ each time: table ids, times)::

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

import psycopg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from applier.devtools.pgcluster import PgCluster, find_installation  # noqa: E402

RELEASE = "5593802"
FIXTURE = REPO / "tests" / "fixtures" / "upgrade" / "v1-5593802"
SQL_FILES = ("01_before_first_run.sql", "02_before_second_run.sql")
PLACEHOLDER = "@TARGET@"
SLOT, PUBLICATION = "upgrade", "upgrade_pub"
TABLES = ("public.accounts", "public.events", "app.people", "public.docs")
#: as the test suite's clusters (tests/conftest.py)
SETTINGS = {"logical_decoding_work_mem": "64kB"}
MAJOR = 15
#: the packed target must stay small: it is committed
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


def make(out: Path, work: Path) -> None:
    worktree, target = work / "release", work / "target"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(worktree), RELEASE], check=True)
    try:
        release = subprocess.run(["git", "-C", str(worktree), "rev-parse", "HEAD"], check=True, capture_output=True,
                                 text=True).stdout.strip()
        with PgCluster(find_installation(MAJOR), SETTINGS) as cluster:
            dsn = cluster.dsn()
            flags = ("--dsn", dsn, "--publication", PUBLICATION, "--slot", SLOT, "--target", str(target))
            for sql in SQL_FILES:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute((FIXTURE / sql).read_text(encoding="utf-8"))  # type: ignore[arg-type]
                old_applier(worktree, "mirror", "--once", *flags)
            old_applier(worktree, "verify", "--dsn", dsn, "--target", str(target))
            with psycopg.connect(dsn, autocommit=True) as conn:
                oids = {name: conn.execute("SELECT %s::regclass::oid", (name,)).fetchone()[0]  # type: ignore[index]
                        for name in TABLES}
                filenodes = {name: conn.execute("SELECT pg_relation_filenode(%s::regclass)",  # type: ignore[index]
                                                (name,)).fetchone()[0] for name in TABLES}
                rows = {name: conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]  # type: ignore[index]
                        for name in TABLES}
                confirmed = conn.execute("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                         "WHERE slot_name = %s", (SLOT,)).fetchone()[0]  # type: ignore[index]
                version = conn.execute("SHOW server_version").fetchone()[0]  # type: ignore[index]
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(worktree)], check=False)
    relocate(target)
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "target.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(target, arcname="target", filter=_plain)
    if archive.stat().st_size > MAX_BYTES:
        raise SystemExit(f"{archive} is {archive.stat().st_size} bytes, more than {MAX_BYTES}: make the workload "
                         "smaller")
    manifest = {
        "release": release,
        "made_by": "scripts/make_upgrade_fixture.py",
        "postgres_major": MAJOR, "server_version": version, "database": "postgres",
        "sql": list(SQL_FILES), "publication": PUBLICATION, "slot": SLOT,
        "target_placeholder": PLACEHOLDER, "state_dir": "_applier",
        "relation_oids": oids, "relfilenodes": filenodes, "rows": rows, "slot_confirmed_lsn": confirmed,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {archive} ({archive.stat().st_size} bytes) and {out / 'manifest.json'}", file=sys.stderr)


def relocate(target: Path) -> None:
    """Write the target's root as ``@TARGET@`` where it is recorded: the state's JSON files (the paths of the
    tables), and the ``commitInfo`` of a table's creation in its Delta log (``operationParameters.location``,
    which no reader uses); fail if any other file or line names it."""
    root = str(target)
    wrong: list[str] = []
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        if root.encode() not in path.read_bytes():
            continue
        where = str(path.relative_to(target))
        if path.suffix != ".json":
            wrong.append(where)
            continue
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        if path.parent.name == "_delta_log":
            if (path.parent / f".{path.name}.crc").exists():
                wrong.append(f"{where} (has a checksum file)")
            wrong += [f"{where}: {line[:60]}" for line in lines
                      if root in line and not line.startswith('{"commitInfo"')]
        elif path.parts[len(target.parts)] != "_applier":
            wrong.append(where)
        path.write_text("".join(line.replace(root, PLACEHOLDER) for line in lines), encoding="utf-8")
    if wrong:
        raise SystemExit(f"these files name the target's root where the test cannot put it back: {wrong}")


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """No owner names or ids of the machine that made it."""
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE, help="where to write target.tar.gz and manifest.json")
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
