"""Benchmark: following a busy database, applier vs PostgreSQL's own logical replication (issue 49, item 2).

    .venv/bin/python bench/follow.py [--scale 10] [--clients 4] [--seconds 60]

A server started by the script; pgbench's TPC-B-like tables (``pgbench -i -s SCALE``, with a primary key
given to ``pgbench_history``: a bigserial ``hid``) published with a marker table. Two runs, one after the
other on the same server, each with pgbench at full rate (``-c CLIENTS -j 2 -T SECONDS``) while a follower
replicates:

1. PostgreSQL's own subscription (``CREATE SUBSCRIPTION`` into a second database of the same server, its
   initial copy done before pgbench starts);
2. ``applier mirror`` (following the slot, not ``--once``) in its own process, its initial copy done
   before pgbench starts.

For each run: pgbench's TPS (beside that follower), and the **drain time**: from pgbench's end until the
follower holds everything (a marker row committed just after pgbench ends is visible in the replica; the
applier's slot is confirmed past the marker, which it does only once every Delta commit up to it exists),
polled every 10 ms on both sides.
With ``--stops N`` each side then runs N more loads of 2-5 s, each followed by a drain: where in the
applier's round pgbench stops moves its drain by up to a round's fold and commit, and one stop per run
is one sample of that; the median over all of them is reported beside the first.
The applier's peak RSS (Python and JVM) and CPU seconds (up to the first drain) are reported. Both copies
are verified: the replica's tables against the primary's (an md5 of every table's ordered rows), the Delta
tables against Postgres row by row. The last line is one JSON object.

Goals (issue 49): the applier's drain time no longer than PostgreSQL's, pgbench's TPS beside the applier at
least 90% of its TPS beside PostgreSQL's subscriber.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from memory import children, peak_rss_mb  # noqa: E402  (bench/memory.py)

TABLES = ("pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history")
#: a table of its own in the publication: its row after pgbench's end says "everything before is here"
MARKER = "CREATE TABLE follow_marker (id int PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"
#: the server: checkpoints and the buffer pool out of the comparison's way (the same for both runs)
SERVER = {"shared_buffers": "256MB", "max_wal_size": "8GB", "checkpoint_timeout": "30min",
          "max_replication_slots": "8", "max_wal_senders": "8", "max_logical_replication_workers": "4"}
WAIT_SECONDS = float(os.environ.get("BENCH_FOLLOW_WAIT", "600"))
#: how often a drain's end is polled (both sides): at 50 ms a drain read 0.10 or 0.15 s for anything between
DRAIN_POLL = 0.01


def log(msg: str) -> None:
    print(f"bench/follow: {msg}", file=sys.stderr, flush=True)


def pgbench(binary: str, dsn_args: list[str], *args: str) -> str:
    out = subprocess.run([binary, *args, *dsn_args], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench/follow: pgbench {' '.join(args)} failed:\n{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def run_load(binary: str, dsn_args: list[str], clients: int, seconds: int) -> float:
    """pgbench's TPC-B-like load; its TPS (without the connections' start)."""
    out = pgbench(binary, dsn_args, "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds))
    found = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", out)
    if found is None:
        raise SystemExit(f"bench/follow: no TPS in pgbench's output:\n{out[-2000:]}")
    return float(found.group(1))


def one(conn, sql: str, params: tuple[object, ...] = ()) -> Any:
    """The first column of a query's one row (None when it has none)."""
    row = conn.execute(sql, params).fetchone()
    return None if row is None else row[0]


def marker(conn, n: int) -> int:
    """Commit marker row ``n``; an LSN inside its transaction (the commit's end is past it)."""
    with conn.transaction():
        conn.execute("INSERT INTO follow_marker (id) VALUES (%s)", (n,))
        lsn = one(conn, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
    return int(lsn)


def wait_until(what: str, done, deadline: float = WAIT_SECONDS, poll: float = 0.05) -> float:
    started = time.monotonic()
    while not done():
        if time.monotonic() - started > deadline:
            raise SystemExit(f"bench/follow: {what} did not happen within {deadline:.0f} s")
        time.sleep(poll)
    return time.monotonic() - started


def drains_after_stops(conn, binary: str, dsn_args: list[str], args, caught_up, first: int) -> list[float]:
    """The drain after each of ``args.stops`` more loads (2 to 5 s of pgbench each, in turn): where in the
    follower's round pgbench stops moves a drain by up to a round's fold and commit, so one stop is one
    sample of it. ``caught_up(marker id, lsn)``: the follower holds that marker's transaction."""
    drains = []
    for i in range(args.stops):
        run_load(binary, dsn_args, args.clients, 2 + i % 4)
        ended = time.monotonic()
        lsn = marker(conn, first + i)
        wait_until(f"the drain after stop {i + 1}", lambda i=i, lsn=lsn: caught_up(first + i, lsn), poll=DRAIN_POLL)
        drains.append(round(time.monotonic() - ended, 2))
    if drains:
        log(f"drains after {len(drains)} more stops: {drains}")
    return drains


def idle_markers(conn, args, caught_up, first: int) -> list[float]:
    """The floor of any drain: ``args.idle_markers`` marker rows, each committed after a second without
    load, and the time until the follower holds it (one transaction of one row, nothing else pending)."""
    seconds = []
    for i in range(args.idle_markers):
        time.sleep(1.0)
        started = time.monotonic()
        lsn = marker(conn, first + i)
        wait_until(f"idle marker {i + 1}", lambda i=i, lsn=lsn: caught_up(first + i, lsn), poll=DRAIN_POLL / 10)
        seconds.append(round(time.monotonic() - started, 3))
    if seconds:
        log(f"{len(seconds)} markers on an idle stream: {seconds}")
    return seconds


def table_digests(conn) -> dict[str, tuple[int, str]]:
    """Row count and md5 of the ordered rows of each pgbench table."""
    out = {}
    for table in TABLES:
        key = "hid" if table == "pgbench_history" else {"pgbench_accounts": "aid", "pgbench_branches": "bid",
                                                         "pgbench_tellers": "tid"}[table]
        row = conn.execute(
            f"SELECT count(*), md5(coalesce(string_agg(t::text, ',' ORDER BY {key}), '')) FROM {table} t").fetchone()
        out[table] = (int(row[0]), str(row[1]))
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its waited-for children (clock ticks to seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def follow_with_postgres(conn, cluster, binary: str, dsn_args: list[str], args) -> dict[str, object]:
    import psycopg

    pgbench(binary, [*dsn_args[:-1], "replica"], "-i", "-I", "dtp", "-s", str(args.scale))
    with psycopg.connect(cluster.dsn("replica"), autocommit=True) as rep:
        rep.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        rep.execute(MARKER)
        # on the same server the slot is made apart: CREATE SUBSCRIPTION would wait for its own transaction
        conn.execute("SELECT pg_create_logical_replication_slot('pgsub', 'pgoutput')")
        rep.execute(f"CREATE SUBSCRIPTION pgsub CONNECTION '{cluster.dsn()}' PUBLICATION follow_pub "
                    "WITH (create_slot = false, slot_name = 'pgsub')")
        copied = wait_until("the subscription's initial copy", lambda: one(
            rep, "SELECT count(*) = 0 FROM pg_subscription_rel WHERE srsubstate <> 'r'"))
        log(f"PostgreSQL's subscription copied the tables in {copied:.1f} s; pgbench starts")
        tps = run_load(binary, dsn_args, args.clients, args.seconds)
        ended = time.monotonic()
        marker(conn, 1)
        wait_until("the replica's catch-up", lambda: one(
            rep, "SELECT EXISTS (SELECT 1 FROM follow_marker WHERE id = 1)"), poll=DRAIN_POLL)
        drain = time.monotonic() - ended
        log(f"beside PostgreSQL's subscription: {tps:.0f} TPS; drained {drain:.2f} s after pgbench ended")
        stops = drains_after_stops(conn, binary, dsn_args, args, lambda n, _lsn: one(
            rep, "SELECT EXISTS (SELECT 1 FROM follow_marker WHERE id = %s)", (n,)), 100)
        idle = idle_markers(conn, args, lambda n, _lsn: one(
            rep, "SELECT EXISTS (SELECT 1 FROM follow_marker WHERE id = %s)", (n,)), 300)
        equal = table_digests(rep) == table_digests(conn)
        rep.execute("ALTER SUBSCRIPTION pgsub DISABLE")
        rep.execute("ALTER SUBSCRIPTION pgsub SET (slot_name = NONE)")
        rep.execute("DROP SUBSCRIPTION pgsub")
    # the apply worker's walsender lets go of the slot a moment after the subscription is gone
    wait_until("the subscription's walsender to end", lambda: not one(
        conn, "SELECT active FROM pg_replication_slots WHERE slot_name = 'pgsub'"))
    conn.execute("SELECT pg_drop_replication_slot('pgsub')")
    if not equal:
        raise SystemExit("bench/follow: PostgreSQL's replica differs from the primary")
    return {"tps": round(tps, 1), "drain_seconds": round(drain, 2), "drains_after_stops": stops,
            "drain_median_seconds": statistics.median([round(drain, 2), *stops]), "copy_seconds": round(copied, 1),
            "idle_marker_seconds": idle, "verified_equal": equal}


def follow_with_applier(conn, cluster, binary: str, dsn_args: list[str], args,
                        work: Path) -> dict[str, object]:
    import yaml

    from applier.checks.verify import verify_against_postgres

    config = work / "mirror.yaml"
    target = work / "delta"
    settings: dict[str, object] = {
        "source": {"slot": "applier", "publication": "follow_pub"},
        "target": {"path": str(target)},
        "apply": {"max_group_seconds": args.group_seconds, "overlap_groups": args.overlap},
    }
    if args.deletion_vectors:
        settings["tables"] = {"rules": [{"match": "public.*",
                                         "table_properties": {"delta.enableDeletionVectors": "true"}}]}
    config.write_text(yaml.safe_dump(settings))
    confirmed = ("SELECT coalesce(confirmed_flush_lsn - '0/0'::pg_lsn > %s, false) FROM pg_replication_slots "
                 "WHERE slot_name = 'applier'")
    env = {**os.environ, "APPLIER_DSN": cluster.dsn()}
    started = time.monotonic()
    with open(work / "mirror.log", "w") as err:
        mirror = subprocess.Popen([sys.executable, "-m", "applier.cli", "mirror", "--config", str(config)],
                                  env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until("the slot's creation", lambda: mirror.poll() is not None or one(
            conn, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = 'applier')"))
        ready = marker(conn, 2)
        wait_until("the applier's initial copy", lambda: mirror.poll() is not None
                   or one(conn, confirmed, (ready,)))
        if mirror.poll() is not None:
            raise SystemExit(f"bench/follow: the mirror stopped:\n{(work / 'mirror.log').read_text()[-3000:]}")
        copied = time.monotonic() - started
        log(f"applier mirror copied the tables in {copied:.1f} s (its start included); pgbench starts")
        processes = [mirror.pid, *children(mirror.pid)]
        cpu_before = sum(cpu_seconds(p) for p in processes)
        tps = run_load(binary, dsn_args, args.clients, args.seconds)
        ended = time.monotonic()
        done = marker(conn, 3)
        wait_until("the applier's catch-up", lambda: mirror.poll() is not None
                   or one(conn, confirmed, (done,)), poll=DRAIN_POLL)
        drain = time.monotonic() - ended
        if mirror.poll() is not None:
            raise SystemExit(f"bench/follow: the mirror stopped:\n{(work / 'mirror.log').read_text()[-3000:]}")
        cpu = sum(cpu_seconds(p) for p in processes) - cpu_before
        python_rss = peak_rss_mb(mirror.pid)
        jvm_rss = max((peak_rss_mb(c) or 0 for c in children(mirror.pid)), default=None) or None
        log(f"beside applier mirror: {tps:.0f} TPS; drained {drain:.2f} s after pgbench ended; {cpu:.1f} CPU-s")
        stops = drains_after_stops(conn, binary, dsn_args, args, lambda _n, lsn: mirror.poll() is not None
                                   or one(conn, confirmed, (lsn,)), 200)
        idle = idle_markers(conn, args, lambda _n, lsn: mirror.poll() is not None
                            or one(conn, confirmed, (lsn,)), 400)
        if mirror.poll() is not None:
            raise SystemExit(f"bench/follow: the mirror stopped:\n{(work / 'mirror.log').read_text()[-3000:]}")
    finally:
        mirror.send_signal(signal.SIGINT)
        try:
            mirror.wait(timeout=120)
        except subprocess.TimeoutExpired:
            mirror.kill()
    if args.mirror_log is not None:
        args.mirror_log.write_text((work / "mirror.log").read_text())
    # (tables with deletion vectors are read through delta-rs's DataFusion scan, which applies them: no JVM)
    results = verify_against_postgres(None, conn, str(target), [("public", t) for t in TABLES])
    equal = all(r.equal for r in results)
    if not equal:
        raise SystemExit(f"bench/follow: the Delta tables differ from Postgres: "
                         f"{[(r.source_name, r.source_rows, r.target_rows) for r in results if not r.equal]}")
    return {"tps": round(tps, 1), "drain_seconds": round(drain, 2), "drains_after_stops": stops,
            "drain_median_seconds": statistics.median([round(drain, 2), *stops]), "copy_seconds": round(copied, 1),
            "cpu_seconds_during_load_and_drain": round(cpu, 1), "idle_marker_seconds": idle, "verified_equal": equal,
            "memory": {"python_peak_rss_mb": python_rss, "jvm_peak_rss_mb": jvm_rss}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", type=int, default=10, help="pgbench's scale factor (default 10: 1M accounts)")
    p.add_argument("--clients", type=int, default=4, help="pgbench's clients (-c; default 4)")
    p.add_argument("--seconds", type=int, default=60, help="pgbench's duration (-T; default 60)")
    p.add_argument("--group-seconds", type=float, default=1.0,
                   help="apply.max_group_seconds of the mirror (default 1: a group at least every second)")
    p.add_argument("--mirror-log", type=Path, default=None,
                   help="keep the mirror's log (its progress lines) in this file")
    p.add_argument("--overlap", action="store_true",
                   help="apply.overlap_groups: decode the next group while the previous one commits")
    p.add_argument("--deletion-vectors", action="store_true",
                   help="create the Delta tables with delta.enableDeletionVectors (a MERGE marks the rows it "
                        "replaces instead of rewriting their files: applier/sink/store/dvmerge.py)")
    p.add_argument("--stops", type=int, default=0,
                   help="after the run's drain, this many more loads of 2-5 s, each followed by a drain: the "
                        "drain's median over them all is reported too (default 0)")
    p.add_argument("--idle-markers", type=int, default=0,
                   help="at the end, this many marker rows committed a second apart without load: the time "
                        "until the follower holds each is the floor of any drain (default 0)")
    args = p.parse_args()

    import psycopg

    from applier.devtools.pgcluster import start_cluster

    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp, start_cluster(settings=SERVER) as cluster, \
            psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        work = Path(tmp)
        binary = cluster.installation.binary("pgbench")
        if not Path(binary).is_file():
            raise SystemExit(f"bench/follow: no pgbench beside PostgreSQL {cluster.major}'s server ({binary})")
        dsn_args = ["-h", "127.0.0.1", "-p", str(cluster.port), "-U", "postgres", "postgres"]
        started = time.monotonic()
        pgbench(binary, dsn_args, "-i", "-q", "-s", str(args.scale))
        conn.execute("ALTER TABLE pgbench_history ADD COLUMN hid bigserial PRIMARY KEY")
        conn.execute(MARKER)
        conn.execute(f"CREATE PUBLICATION follow_pub FOR TABLE {', '.join(TABLES)}, follow_marker")
        conn.execute("CREATE DATABASE replica")
        log(f"pgbench -i -s {args.scale} in {time.monotonic() - started:.1f} s")
        postgres = follow_with_postgres(conn, cluster, binary, dsn_args, args)
        conn.execute("VACUUM ANALYZE")
        applier = follow_with_applier(conn, cluster, binary, dsn_args, args, work)

    print(json.dumps({
        "scale": args.scale, "clients": args.clients, "seconds": args.seconds, "group_seconds": args.group_seconds,
        "overlap_groups": args.overlap,
        "deletion_vectors": args.deletion_vectors, "postgres": postgres, "applier": applier,
        "tps_beside_applier_vs_postgres": round(float(applier["tps"]) / float(postgres["tps"]), 2),  # type: ignore[arg-type]
        "drain_applier_minus_postgres_seconds": round(
            float(applier["drain_seconds"]) - float(postgres["drain_seconds"]), 2),  # type: ignore[arg-type]
        "drain_median_applier_minus_postgres_seconds": round(
            float(applier["drain_median_seconds"]) - float(postgres["drain_median_seconds"]), 2),  # type: ignore[arg-type]
        "verified_equal": bool(postgres["verified_equal"] and applier["verified_equal"]),
    }))


if __name__ == "__main__":
    main()
