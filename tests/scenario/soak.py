"""The schema walk as a soak, by hand (issue 73 item 8): a long seeded walk (tests/schemawalk.py) followed by
several mirrors with the default config, ``mirror --once`` every k steps (k drawn from 1..30), and in the
middle of it what a database's life does to a mirror nobody watches:

- **SIGKILLs**: a run is ``python -m applier.cli mirror --config F --once`` in a process group of its own,
  killed (the group: the JVM too) at a random moment of its expected length; the next run must go on;
- **walsender terminations**: ``pg_terminate_backend`` of every backend holding one of the database's
  logical slots while a run is going (the mirror reconnects by itself);
- **a server restart**: the primary crashes (``pg_ctl restart -m immediate``) while a run is going;
- **a failover** (PostgreSQL 17+): the slots are failover slots, synchronized to a hot standby
  (applier.devtools.pgcluster.start_standby; the primary names its physical slot in
  ``synchronized_standby_slots``); once every mirror's slot has a synced copy there, a few more steps, the
  primary is halted (immediate), the standby promoted, and the walk and the mirrors go on against it.

The property is the suite's (tests/scenario/test_schema_walk.py): no run stops (any exit but 0 of a run
that was not killed, any exception of one run in this process), and every table of every mirror equals
Postgres after every round of runs. A soak goes on past a stop or a difference, to see the rest: a stop
gets the remedy it prints (``applier resync --table``, what a person would have had to do, counted as a
remedy) and the run again; each stop and difference is recorded, printed, and counted in the last line,
one JSON object: steps, runs, kills, terminations, auto-copies, set-asides, stops, remedies, differences,
seconds, ``all_equal``. ``--out`` keeps the targets, the walk's trace (``trace.txt``, the events at its
end) and the statements it ran (``statements.sql``), what a finding's reproduction is cut from.

    .venv/bin/python tests/scenario/soak.py --seed 1 --steps 1000 --minutes 40 [--major 18] [--out DIR]

``--minutes`` bounds the walk's wall time: it stops stepping then, runs every mirror a last time and
checks. Not in the suite (a file pytest does not collect): it takes most of an hour on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import yaml
from pyspark import InheritableThread

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
sys.path.insert(0, str(TESTS))

from schemawalk import SchemaWalk  # noqa: E402

from applier.checks.verify import verify_against_postgres  # noqa: E402
from applier.config import MirrorConfig  # noqa: E402
from applier.devtools.pgcluster import PgCluster, find_installation, start_standby  # noqa: E402
from applier.drivers.mirror import mirror  # noqa: E402
from applier.infra.stops import mends  # noqa: E402
from applier.state import StateDir  # noqa: E402

#: the mirrors: (apply settings, protocol, distributed settings), as in the suite's walk: one transaction a
#: group on protocol 1; small groups and pieces on 2; the defaults on 4 (parallel streaming; 3 on 15); every
#: backlog caught up in ranges from a copy of the slot on 2
FOLLOWERS: dict[str, tuple[dict[str, object], int, dict[str, object] | None]] = {
    "one": ({"max_group_transactions": 1}, 1, None),
    "three": ({"max_group_transactions": 3, "max_group_rows": 7, "piece_rows": 8}, 2, None),
    "default": ({}, 4, None),
    "ranges": ({}, 2, {"mode": "on", "min_backlog_mb": 0, "backlog_folds": "driver"}),
}


def _scalar(cursor: psycopg.Cursor[Any]) -> Any:
    """The first column of the one row a query returns."""
    row = cursor.fetchone()
    assert row is not None
    return row[0]


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Follower:
    name: str
    config_file: Path
    raw: dict[str, Any]
    runs: int = 0  # runs started (in this process or as a subprocess)
    kills: int = 0  # subprocess runs SIGKILLed while running
    kills_too_late: int = 0  # subprocess runs that ended before their kill
    terminations: int = 0  # runs during which a walsender (or slot-holding backend) of theirs was terminated
    mended: list[str] = field(default_factory=list)
    seconds: float = 20.0  # how long a subprocess run took lately (where the kills are drawn)

    @property
    def config(self) -> MirrorConfig:
        return MirrorConfig.model_validate(self.raw)

    def set_dsn(self, dsn: str) -> None:
        self.raw["source"]["dsn"] = dsn
        self.config_file.write_text(yaml.safe_dump(self.raw))

    def mends(self) -> dict[str, Any]:
        return mends(StateDir.for_target(self.raw["target"]["path"]))

    def count(self, how: str) -> int:
        return sum(f": {how}" in line for line in self.mended)


def follower(root: Path, dsn: str, name: str, major: int, failover: bool) -> Follower:
    apply, proto, distributed = FOLLOWERS[name]
    if proto == 4 and major < 16:
        proto = 3
    source: dict[str, object] = {"dsn": dsn, "slot": f"soak_{name}", "publication": "walk", "proto_version": proto,
                                 "failover": failover}
    if proto >= 2:
        source["streaming"] = "parallel" if proto >= 4 else "on"
    if proto >= 3:
        source["two_phase"] = True
    raw: dict[str, Any] = {"source": source, "target": {"path": str(root / name / "delta")},
                           "apply": {"special_values": "clamp", **apply},
                           "spark": {"master": "local[2]", "jit": "quick"}}
    if distributed:
        raw["distributed"] = distributed
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return Follower(name, path, raw)


class _Statements:
    """The walk's connection, writing the statements it writes with to ``statements.sql`` (a step a comment):
    what a reproduction of a finding is cut from."""

    def __init__(self, conn: psycopg.Connection, soak: Soak) -> None:
        self._conn, self._soak = conn, soak

    def execute(self, query: Any, params: Any = None) -> Any:
        if not str(query).lstrip().upper().startswith("SELECT"):
            out = self._soak.statements
            out.write(f"/* step {self._soak.walk.steps} */ {query}" + (f" /* {params} */" if params else "") + ";\n")
        return self._conn.execute(query, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class Soak:
    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.root = root
        self.rng = random.Random(args.seed)
        self.chaos = random.Random(args.seed * 7919 + 1)  # the events' own draws: the walk stays the walk
        self.started = time.monotonic()
        self.stops: list[dict[str, Any]] = []
        self.differences: dict[tuple[str, str, str], int] = {}  # (follower, table, first problem) -> step
        self.events: list[str] = []
        self.rounds = 0
        self.connections = self.reported_connections = 0  # the most connections seen between rounds
        self.left_by_runs = self.baseline = 0  # the most client connections one run left open, before collecting
        self.harness_errors: list[str] = []
        self.remedies = 0  # stops a person would have had to mend: the printed remedy, run by the soak
        self.restarts = 0
        self.failovers = 0
        installation = find_installation(args.major)
        settings = {"logical_decoding_work_mem": "64kB"}
        if args.major >= 16:
            settings["debug_logical_replication_streaming"] = "buffered"
        self.failover = args.major >= 17 and not args.no_failover
        if self.failover:
            settings["synchronized_standby_slots"] = "'standby1'"
        self.primary = PgCluster(installation, settings).start()
        self.clusters = [self.primary]
        with psycopg.connect(self.primary.dsn(), autocommit=True) as conn:
            conn.execute('CREATE DATABASE "soak"')
        self.standby: PgCluster | None = None
        if self.failover:
            self.standby = start_standby(self.primary, dbname="soak")
            self.clusters.append(self.standby)
        self.server = self.primary
        self.conn = psycopg.connect(self.dsn, autocommit=True)
        self.work = psycopg.connect(self.dsn, autocommit=True)
        self.statements = (root / "statements.sql").open("w")
        self.walk = SchemaWalk(_Statements(self.work, self), self.rng, self.dsn)
        names = args.followers.split(",") if args.followers else list(FOLLOWERS)
        self.followers = [follower(root, self.dsn, n, args.major, self.failover) for n in names]
        from applier.spark.session import SparkSettings, build_spark_session

        self.spark = build_spark_session(SparkSettings(
            master="local[2]", app_name="applier-soak", shuffle_partitions=2,
            warehouse_dir=str(root / "warehouse"), driver_memory="3g",
            extra={"spark.databricks.delta.delta.log.cacheSize": "32",
                   "spark.databricks.delta.delta.log.cacheRetentionMinutes": "5"}))

    @property
    def dsn(self) -> str:
        return self.server.dsn("soak")

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def note(self, event: str) -> None:
        self.events.append(f"step {self.walk.steps}: {event}")
        say(f"[{self.elapsed():6.0f}s] step {self.walk.steps}: {event}")

    def reconnect(self) -> None:
        """The walk's and the checks' connections, again (after a restart or a failover)."""
        for c in (self.conn, self.work):
            try:
                c.close()
            except psycopg.Error:
                pass
        deadline = time.monotonic() + 120
        while True:
            try:
                self.conn = psycopg.connect(self.dsn, autocommit=True)
                self.work = psycopg.connect(self.dsn, autocommit=True)
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self.walk.conn, self.walk.dsn = _Statements(self.work, self), self.dsn

    # --- runs -------------------------------------------------------------------------------------

    def stop(self, f: Follower, how: str, error: str) -> None:
        self.stops.append({"follower": f.name, "step": self.walk.steps, "how": how, "error": error[:2000]})
        self.note(f"STOP {f.name} ({how}): {error[:400]}")

    def _counted(self, f: Follower, before: int) -> None:
        record = f.mends()
        new = int(record.get("count", 0)) - before
        for mend in reversed(record.get("recent", [])[:new]):
            f.mended.append(f"step {self.walk.steps}: {mend['how']}: {mend['tables']}: {mend['error'][:200]}")
            self.note(f"{f.name} mended: {f.mended[-1]}")

    def remedy(self, f: Follower, error: BaseException) -> None:
        """What a person would do about a stop: the remedy it prints (``applier resync --table``, by the
        relation's OID where it has one), so that the soak sees the rest of the walk."""
        context = getattr(error, "context", {}) or {}
        which = context.get("relation_oid") or context.get("table")
        if which is None or "applier resync" not in str(error):
            self.note(f"{f.name}: the stop names no remedy")
            return
        from applier.cli import main as cli_main

        rc = cli_main(["resync", "--config", str(f.config_file), "--table", str(which)])
        self.remedies += 1
        self.note(f"{f.name}: applier resync --table {which}: exit {rc}")

    def run_here(self, f: Follower, *, during: Any = None) -> bool:
        """``mirror --once`` in this process (``during``: called meanwhile, from this thread); False: it stopped."""
        f.runs += 1
        before = int(f.mends().get("count", 0))
        lines: list[str] = []
        failure: list[BaseException] = []

        def go() -> None:
            try:
                mirror(self.spark, f.config, once=True, progress=lines.append)
            except Exception as e:  # noqa: BLE001 - every stop is the soak's finding
                failure.append(e)

        # (PySpark's pinned threads: a plain thread's JVM side has no active session, which Delta's Scala code
        # asks for; the CLI runs the mirror on its main thread)
        thread = InheritableThread(target=go, name=f"mirror-{f.name}")
        thread.daemon = True
        thread.start()
        if during is not None:
            during(thread)
        thread.join()
        self._collect()
        self._counted(f, before)
        if failure:
            self.stop(f, "in process", f"{type(failure[0]).__name__}: {failure[0]}\n" + "\n".join(lines[-30:]))
            self.remedy(f, failure[0])
            return False
        return True

    def run_killed(self, f: Follower) -> None:
        """``applier mirror --config F --once`` as a process of its own, SIGKILLed at a random moment."""
        f.runs += 1
        before = int(f.mends().get("count", 0))
        delay = self.chaos.uniform(0.3, max(f.seconds, 3.0) * 1.1)
        log = self.root / f"{f.name}-killed-{f.runs}.log"
        started = time.monotonic()
        with log.open("w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "applier.cli", "mirror", "--config", str(f.config_file),
                                     "--once"], cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(delay)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                f.kills += 1
                self._counted(f, before)
                self.note(f"{f.name}: SIGKILL after {delay:.1f} s")
                return
        f.seconds = 0.5 * f.seconds + 0.5 * (time.monotonic() - started)
        f.kills_too_late += 1
        self._counted(f, before)
        if rc != 0:
            self.stop(f, f"process, exit {rc}", log.read_text(errors="replace")[-3000:])
        else:
            log.unlink()

    def terminate_walsenders(self, thread: threading.Thread) -> None:
        """While the run goes: after a random moment, every backend holding a logical slot of the database."""
        deadline = time.monotonic() + self.chaos.uniform(0.2, 6.0)
        while thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not thread.is_alive():
            return
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:
                pids = [r[0] for r in conn.execute(
                    "SELECT pg_terminate_backend(active_pid), slot_name FROM pg_replication_slots "
                    "WHERE active_pid IS NOT NULL AND database = current_database()")]
        except psycopg.Error as e:
            self.harness_errors.append(f"step {self.walk.steps}: terminating walsenders: {e}")
            self.note(f"could not terminate walsenders: {e}")
            return
        self.terminated = len(pids)

    def restart_during(self, thread: threading.Thread) -> None:
        deadline = time.monotonic() + self.chaos.uniform(0.5, 5.0)
        while thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.server.restart("immediate")
        self.restarts += 1

    def run(self, f: Follower) -> None:
        """One run of ``f``, perhaps with a kill or a walsender termination in it; then, after a kill, the run
        that must go on from where the killed one left off."""
        c = self.chaos.random()
        if c < self.args.kill_rate:
            self.run_killed(f)
            if self.chaos.random() < 0.3:  # killed again, before it could finish
                self.run_killed(f)
        elif c < self.args.kill_rate + self.args.terminate_rate:
            self.terminated = 0
            ok = self.run_here(f, during=self.terminate_walsenders)
            if self.terminated:
                f.terminations += 1
                self.note(f"{f.name}: {self.terminated} slot backend(s) terminated during a run "
                          f"({'went on' if ok else 'stopped'})")
            if not ok:
                self.run_here(f)
            return
        if not self.run_here(f):
            self.run_here(f)  # one more: a soak goes on, the stop is counted

    def check(self) -> bool:
        equal = True
        tables = self.walk.tables()
        for f in self.followers:
            for result in verify_against_postgres(self.spark, self.conn, f.raw["target"]["path"], tables):
                if result.equal:
                    continue
                equal = False
                problem = (result.problems or [f"rows: {result.source_rows} in Postgres, {result.target_rows} "
                                               f"in Delta, only in Postgres {result.only_in_source[:3]}, only in "
                                               f"Delta {result.only_in_target[:3]}"])[0]
                key = (f.name, result.source_name, problem[:200])
                if key not in self.differences:
                    self.differences[key] = self.walk.steps
                    self.note(f"DIFFERENCE {f.name} {result.source_name}: {problem[:300]}")
        return equal

    def round(self) -> bool:
        self.rounds += 1
        for f in self.followers:
            self.run(f)
        equal = self.check()
        self.census()
        return equal

    def _connections(self) -> int:
        return int(_scalar(self.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND backend_type = 'client backend' AND pid <> pg_backend_pid()")))

    def _collect(self) -> None:
        """What the CLI's process ending does after a run: this one lives on, and the mirror leaves its live
        catalog's connection (applier.sources.catalog_lookup.LiveCatalog, never closed by ``Mirror.run``) to
        the garbage collector, which ``collect_between_groups`` has kept from running; without this, one
        connection a run piles up until the server refuses connections. Counted: ``connections_left_by_a_run``."""
        import gc

        try:
            before = self._connections()
            gc.collect()
            after = self._connections()
        except psycopg.Error as e:  # (a restart or failover under way: the next round counts)
            self.harness_errors.append(f"step {self.walk.steps}: counting connections: {e}")
            return
        self.left_by_runs = max(self.left_by_runs, before - self.baseline)
        self.baseline = after

    def census(self) -> None:
        """The server's connections to the database between two rounds (the soak's own two, and nothing of a
        mirror that ended): a leak shows here long before the server refuses connections."""
        rows = self.conn.execute(
            "SELECT coalesce(nullif(application_name, ''), backend_type), state, left(query, 80), count(*) "
            "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "GROUP BY 1, 2, 3 ORDER BY 4 DESC").fetchall()
        total = sum(int(r[3]) for r in rows)
        self.connections = max(self.connections, total)
        if total > self.reported_connections + 5:
            self.reported_connections = total
            self.note(f"{total} connections to the database between rounds: {rows[:6]}")

    # --- the failover -----------------------------------------------------------------------------

    def fail_over(self) -> None:
        """Once every mirror's slot has a synced copy on the standby: a few more steps, the primary halted,
        the standby promoted; the walk and the mirrors go on there."""
        assert self.standby is not None
        deadline = time.monotonic() + 180
        names = [f"soak_{f.name}" for f in self.followers]
        with psycopg.connect(self.standby.dsn("soak"), autocommit=True) as standby:
            while True:
                self.conn.execute("SELECT pg_log_standby_snapshot()")
                for f in self.followers:
                    self.run_here(f)
                wanted = _scalar(self.conn.execute("SELECT pg_current_wal_flush_lsn()"))
                while not _scalar(standby.execute("SELECT pg_last_wal_replay_lsn() >= %s", (wanted,))):
                    if time.monotonic() > deadline:
                        raise AssertionError(f"the standby did not replay up to {wanted}")
                    time.sleep(0.05)
                standby.execute("SELECT pg_sync_replication_slots()")
                synced = _scalar(standby.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY(%s) "
                                         "AND synced AND NOT temporary", (names,)))
                if synced == len(names):
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"only {synced} of the slots {names} synced on the standby")
        more = self.chaos.randint(0, 3)
        for _ in range(more):
            self.walk.step()
        self.primary.halt("immediate")
        with psycopg.connect(self.standby.dsn(), autocommit=True) as promoted:
            promoted.execute("SELECT pg_promote()")
            promoted.execute("ALTER SYSTEM SET synchronized_standby_slots = ''")  # (copied from the primary)
            promoted.execute("SELECT pg_reload_conf()")
        self.server = self.standby
        self.reconnect()
        for f in self.followers:
            f.set_dsn(self.dsn)
        self.failovers += 1
        self.note(f"failover: the primary halted {more} step(s) after the slots were synced; the standby promoted")

    # --- the soak ---------------------------------------------------------------------------------

    def go(self) -> dict[str, Any]:
        args = self.args
        self.walk.create()
        self.baseline = self._connections()
        self.round()
        next_run = self.rng.randint(1, 30)
        budget = args.minutes * 60
        while self.walk.steps < args.steps and self.elapsed() < budget:
            self.walk.step()
            # a third of the way (of the steps, or of the time if that comes first): the restart; two thirds: the
            # failover
            way = max(self.walk.steps / args.steps, self.elapsed() / budget)
            if way >= 1 / 3 and not self.restarts:
                f = self.chaos.choice(self.followers)
                f_ok = self.run_here(f, during=self.restart_during)
                self.note(f"server restarted (immediate) during a run of {f.name} ({'went on' if f_ok else 'stopped'})")
                self.reconnect()
                if not f_ok:
                    self.run_here(f)
            if self.failover and way >= 0.6 and not self.failovers:
                self.fail_over()
            if self.walk.steps >= next_run:
                next_run = self.walk.steps + self.rng.randint(1, 30)
                self.round()
                say(f"[{self.elapsed():6.0f}s] step {self.walk.steps}, round {self.rounds}: " + ", ".join(
                    f"{f.name} {f.runs} runs {f.kills} kills {len(f.mended)} mends" for f in self.followers))
        for f in self.followers:  # the last round: no chaos, every mirror drained, then the check
            self.run_here(f)
        return self.report(self.check())

    def report(self, all_equal: bool | None) -> dict[str, Any]:
        return {
            "seed": self.args.seed, "major": self.args.major, "steps": self.walk.steps, "rounds": self.rounds,
            "seconds": round(self.elapsed()),
            "runs": sum(f.runs for f in self.followers),
            "kills": sum(f.kills for f in self.followers),
            "kills_after_the_end": sum(f.kills_too_late for f in self.followers),
            "walsender_terminations": sum(f.terminations for f in self.followers),
            "restarts": self.restarts, "failovers": self.failovers,
            "auto_copies": sum(f.count("copied again") for f in self.followers),
            "set_asides": sum(f.count("set aside") for f in self.followers),
            "stops": len(self.stops), "remedies": self.remedies, "differences": len(self.differences),
            "all_equal": all_equal, "most_connections_between_rounds": self.connections,
            "connections_left_by_a_run": self.left_by_runs,
            "harness_errors": self.harness_errors,
            "followers": {f.name: {"protocol": f.config.source.proto_version, "runs": f.runs, "kills": f.kills,
                                   "terminations": f.terminations, "mends": len(f.mended)}
                          for f in self.followers},
            "schema_changes": dict(self.walk.kinds().most_common()),
            "out": str(self.root),
        }

    def close(self) -> None:
        (self.root / "trace.txt").write_text(self.walk.trace() + "\n\nevents:\n" + "\n".join(self.events) + "\n")
        self.statements.close()
        for c in (self.conn, self.work):
            try:
                c.close()
            except psycopg.Error:
                pass
        self.spark.stop()
        for cluster in reversed(self.clusters):
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=40.0, help="stop stepping after this long")
    parser.add_argument("--major", type=int, default=18)
    parser.add_argument("--followers", default="", help="comma-separated: " + ",".join(FOLLOWERS))
    parser.add_argument("--kill-rate", type=float, default=0.15, help="share of runs SIGKILLed")
    parser.add_argument("--terminate-rate", type=float, default=0.1, help="share of runs whose walsender is ended")
    parser.add_argument("--no-failover", action="store_true")
    parser.add_argument("--out", default=None, help="keep the targets, logs and trace here")
    args = parser.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="applier-soak-"))
    root.mkdir(parents=True, exist_ok=True)
    soak = Soak(args, root)
    try:
        result = soak.go()
    except Exception as e:  # noqa: BLE001 - the figures so far are the soak's result too
        import traceback

        traceback.print_exc()
        result = {**soak.report(None), "aborted": f"step {soak.walk.steps}: {type(e).__name__}: {e}"}
    finally:
        soak.close()
    for s in soak.stops:
        say(f"stop at step {s['step']} of {s['follower']} ({s['how']}): {s['error'][:1500]}")
    for (name, table, problem), step in soak.differences.items():
        say(f"difference first seen at step {step}: {name} {table}: {problem}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
