"""``jobs/stream.py`` started by ``spark-submit`` with a Python that lacks applier (no venv activated, no
PYSPARK_PYTHON): it says which variable to set, exit 2, instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

JOB = Path(__file__).resolve().parents[2] / "jobs" / "stream.py"


def test_stream_job_without_applier_says_to_set_pyspark_python(tmp_path):
    # -S: no site-packages (so no applier), -I: nothing from the environment or the working directory
    done = subprocess.run([sys.executable, "-I", "-S", str(JOB), "--help"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "PYSPARK_PYTHON=/path/to/.venv/bin/python spark-submit" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
