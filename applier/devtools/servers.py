"""What the loopback test servers (S3, Azure, GCS) share: a free port, waiting until one listens, stopping.

Why here and not in each server's module: the three start the same way (a child process on a port
chosen now, its output in a log file for a failing test) and must fail the same way (a clear
RuntimeError naming the log), so a run that cannot start one says why instead of timing out later.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["free_port", "stop", "wait_listening"]


def find_executable(variable: str, cached: Path, name: str) -> Path | None:
    """A test server's executable: the one the environment ``variable`` names, else ``cached`` (where
    scripts/setup-test-servers installs it), else ``name`` on the PATH; None when there is none."""
    named = os.environ.get(variable)
    if named:
        return Path(named) if Path(named).exists() else None
    if cached.exists():
        return cached
    found = shutil.which(name)
    return Path(found) if found else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(process: subprocess.Popen[bytes], port: int, what: str, log: Path, seconds: float = 60) -> None:
    """Return once ``port`` accepts connections; raise (killing ``process``) when it exits or never listens."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"{what} did not listen within {seconds:.0f} s: see {log}")


def stop(process: subprocess.Popen[bytes], grace: float = 10) -> None:
    """Ask the server to stop, killing it after ``grace`` seconds."""
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
