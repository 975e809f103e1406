"""Benchmarks cannot rot (issue 49, item 6): every script in bench/ runs here at a smoke size, as a user
runs it (``python bench/X.py ...`` from the checkout, a process of its own that starts its own servers),
and must exit 0 with its last line the one JSON object the benchmarks print: its figures numbers, and
``verified_equal`` (or the script's own name for it) true where it checks the mirror against Postgres.

Why: the benchmarks import applier's internals and drive its CLI, and nothing else ran them; one broke
on an Arrow-schema change (``bench/apply.py``: ``'StructField' object has no attribute 'type'``) and
nobody noticed until its next measurement. The sizes here only prove that each still runs and checks
what it measured (seconds, not minutes: bench/README.md lists them); they measure nothing.

A new ``bench/*.py`` must get an entry in ``SMOKES`` (or, if it is a module the scripts import, in
``LIBRARIES``): ``test_every_bench_script_has_a_smoke_size`` fails until it does.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import unavailable

from applier.devtools.pgcluster import find_installation
from applier.errors import EnvironmentSetupError

pytestmark = [pytest.mark.postgres, pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
#: one script's smoke run may not take longer (they take seconds to a minute; a hang must not stall the suite)
TIMEOUT_SECONDS = 600


@dataclass(frozen=True, slots=True)
class Smoke:
    """How one script runs small. ``args`` follow the script's name; ``{tmp}`` is the test's own directory
    and ``{repo}`` the checkout. ``figures``: dotted paths into the JSON whose values must be numbers
    (``*`` stands for every key at that level). ``equal``: the key that says the script found its
    Delta result equal to Postgres (None where it has no such check). ``before``: another script and
    its smoke, run first in the same directory (e.g. to make the input), checked the same way."""

    args: tuple[str, ...]
    figures: tuple[str, ...]
    equal: str | None = "verified_equal"
    before: tuple[str, Smoke] | None = None


def _decode_args() -> tuple[str, ...]:
    """pypgoutput, decode.py's baseline, is in the optional ``bench`` extra that ``make setup`` leaves out."""
    baseline = importlib.util.find_spec("pypgoutput") is not None
    return ("{tmp}/decode_log.parquet", "--repeat", "1", *(() if baseline else ("--no-baseline",)))


SMOKES: dict[str, Smoke] = {
    "apply.py": Smoke(("--transactions", "50", "--accounts", "100", "--sample", "3", "--runs", "1", "--same-process"),
                      ("grouped_seconds", "per_transaction_seconds_each", "append_seconds", "append_rows",
                       "memory.*.python_peak_rss_mb")),
    "assemble.py": Smoke(("--rows", "20000", "--budget-mb", "1", "--runs", "1"),
                         ("seconds_median", "peak_rss_mb_max", "spills"), equal=None),
    "catchup.py": Smoke(("--transactions", "20", "--rows-per-transaction", "10", "--group-transactions", "5"),
                        ("applier_seconds", "postgres_subscription_seconds", "changes", "final_rows")),
    "decode.py": Smoke(_decode_args(), ("messages", "ours_msgs_per_s", "ours_with_conversion_msgs_per_s"),
                       equal=None,
                       before=("make_decode_log.py", Smoke(("{tmp}/decode_log.parquet", "--transactions", "200"),
                                                           ("transactions", "messages"), equal=None))),
    "follow.py": Smoke(("--scale", "1", "--clients", "2", "--seconds", "3", "--stops", "1"),
                       ("postgres.tps", "postgres.drain_seconds", "applier.tps", "applier.drain_seconds",
                        "postgres.drain_median_seconds", "applier.drain_median_seconds",
                        "applier.memory.python_peak_rss_mb", "tps_beside_applier_vs_postgres")),
    "huge_transaction.py": Smoke(("--rows", "1000", "--runs", "1"), ("median_seconds", "median_peak_rss_mb")),
    "lag.py": Smoke(("--rate", "20", "--seconds", "2", "--warmup", "1"), ("p50_s", "p99_s", "rate_achieved")),
    # a comparison of two checkouts: this one twice (two spellings, so the JSON has both entries)
    "lazy.py": Smoke(("--code", "{repo}", "--code", "{repo}/.", "--scale", "0.01", "--runs", "1"),
                     ("rows", "codes.*.copy_median", "codes.*.up_to_date_median")),
    "maintain.py": Smoke(("--transactions", "50", "--rows-per-transaction", "10", "--group-transactions", "5"),
                         ("maintain_seconds", "before.data_files", "after.data_files", "after.rows"),
                         equal="equal_to_postgres"),
    "readback.py": Smoke(("--code", "{repo}", "--code", "{repo}/.", "--scale", "0.01", "--runs", "1"),
                         ("messages_per_catch_up", "codes.*.catch_up_median")),
    "rename_rewrite.py": Smoke(("--rows", "2000", "--no-warmup"),
                               ("sizes.*.size_mb", "sizes.*.rewrite_s", "sizes.*.map_s"), equal=None),
    "replay.py": Smoke(("--transactions", "20", "--rows-per-transaction", "10", "--runs", "1", "--smoke"),
                       ("messages", "median_seconds.*", "speedup_executors_vs_driver_path")),
    "snapshot.py": Smoke(("--scale", "1", "--parallelism", "1", "--where", "driver,executors"),
                         ("rows", "postgres_subscription_seconds", "deltars_seconds", "applier.*.seconds")),
    "stream_read.py": Smoke(("--transactions", "20", "--rows-per-transaction", "10", "--runs", "1"),
                            ("plain.messages", "plain.reader_cpu_s", "gathered.messages", "gathered.wall_s"),
                            equal=None),
    "verify_memory.py": Smoke(("--rows", "2000", "--runs", "1"),
                              ("rows", "codes.*.median_seconds", "codes.*.median_peak_rss_mb",
                               "codes.*.changed_peak_rss_mb")),
}

#: Modules in bench/ that are not scripts: the scripts import them, so their smoke runs run them.
LIBRARIES = {
    # peak memory figures (VmHWM, the JVM's heap pools), `mirror --once` measured in a child process and
    # the Spark settings of a script's own session: apply, catchup (so maintain), huge_transaction, lag,
    # replay and snapshot (so lazy and readback) import it; a module, not a script, so no smoke of its own
    "memory.py",
}


def test_every_bench_script_has_a_smoke_size() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")}
    made_first = {s.before[0] for s in SMOKES.values() if s.before}  # make_decode_log.py: decode.py's input
    missing = sorted(scripts - set(SMOKES) - made_first - LIBRARIES)
    assert not missing, f"bench scripts without a smoke size in {Path(__file__).name} SMOKES: {missing}"
    gone = sorted((set(SMOKES) | made_first | LIBRARIES) - scripts)
    assert not gone, f"SMOKES/LIBRARIES name scripts bench/ no longer has: {gone}"
    for name in LIBRARIES:  # a library that grew a main block is a script now and needs a smoke size
        assert "__main__" not in (BENCH / name).read_text(), f"bench/{name} runs as a script: give it a smoke size"


@pytest.fixture(scope="module")
def servers_available() -> None:
    """The scripts start their own PostgreSQL (the oldest installed) and Spark: skip locally, fail in CI."""
    from applier.spark.jars import check_java

    try:
        find_installation()
        check_java()
    except EnvironmentSetupError as e:
        unavailable(str(e))


def _leaves(value: Any, path: list[str]) -> Iterator[tuple[str, Any]]:
    if not path:
        yield "", value
        return
    head, rest = path[0], path[1:]
    if not isinstance(value, dict):
        yield head, None
        return
    keys = list(value) if head == "*" else [head]
    if not keys:
        yield head, None
    for key in keys:
        for sub, leaf in _leaves(value.get(key), rest):
            yield f"{key}.{sub}".rstrip("."), leaf


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _run(script: str, smoke: Smoke, tmp: Path) -> None:
    """``python bench/SCRIPT ARGS`` from the checkout; its last line parsed and checked."""
    argv = [a.replace("{tmp}", str(tmp)).replace("{repo}", str(REPO)) for a in smoke.args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    started = time.monotonic()
    try:
        out = subprocess.run([sys.executable, str(BENCH / script), *argv], cwd=REPO, env=env, capture_output=True,
                             text=True, timeout=TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        pytest.fail(f"bench/{script} did not finish within {TIMEOUT_SECONDS} s:\n{err[-4000:]}")
    print(f"bench/{script} {' '.join(argv)}: exit {out.returncode} in {time.monotonic() - started:.1f} s")
    assert out.returncode == 0, f"bench/{script} exited {out.returncode}:\n{out.stderr[-4000:]}"
    lines = out.stdout.strip().splitlines()
    assert lines, f"bench/{script} printed nothing on stdout:\n{out.stderr[-4000:]}"
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"bench/{script}'s last line is not JSON: {lines[-1][:500]!r}")
    assert isinstance(result, dict), f"bench/{script}'s last line is not a JSON object: {lines[-1][:500]!r}"
    for figure in smoke.figures:
        for path, value in _leaves(result, figure.split(".")):
            assert _is_number(value), f"bench/{script}: {path or figure} is {value!r}, not a number: {result}"
    if smoke.equal is not None:
        assert result.get(smoke.equal) is True, f"bench/{script}: {smoke.equal} is not true: {result}"


@pytest.mark.parametrize("script", sorted(SMOKES))
def test_bench_script_runs_at_smoke_size(script: str, tmp_path: Path, servers_available: None) -> None:
    smoke = SMOKES[script]
    if smoke.before is not None:
        _run(*smoke.before, tmp_path)
    _run(script, smoke, tmp_path)
