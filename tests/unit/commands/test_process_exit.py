"""The ``applier`` process ends through ``applier.cli.run``: as the interpreter would, but past the C++
runtime's teardown, where delta-rs's leftover scan threads abort a run that succeeded (exit 134)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from pathlib import Path
    from applier.cli import run

    out = Path(sys.argv[1])
    atexit.register(lambda: (out / "atexit").write_text("ran"))
    def late() -> None:
        time.sleep(0.3)
        (out / "thread").write_text("finished")
    threading.Thread(target=late).start()
    sys.stdout.write("buffered before the command;")  # no newline: still in the pipe's buffer at exit
    run(sys.argv[2:])
""")


def _process(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), *argv], capture_output=True, text=True,
                          timeout=120)


def test_the_process_flushes_joins_threads_and_runs_exit_handlers_before_it_ends(tmp_path):
    done = _process(tmp_path, "status", "--target", str(tmp_path / "nothing-here"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("buffered before the command;")
    assert "no mirrored tables" in done.stdout
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "finished"


def test_the_process_keeps_the_commands_exit_codes(tmp_path):
    assert _process(tmp_path, "--version").returncode == 0
    usage = _process(tmp_path, "no-such-command")
    assert usage.returncode == 2 and "invalid choice" in usage.stderr
    no_target = _process(tmp_path, "status")
    assert no_target.returncode == 2 and "no target" in no_target.stderr
