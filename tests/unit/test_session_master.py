"""The session sets a master only when nobody chose one: what spark-submit's ``--master`` leaves in
``PYSPARK_SUBMIT_ARGS``, ``MASTER`` or ``spark-defaults.conf`` wins over the config's fallback.
Each case runs in a fresh interpreter with no JVM (a JVM already running would answer for itself;
tests/scenario/test_spark_cluster.py covers real spark-submit)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def preset(env: dict[str, str]) -> str:
    clean = {k: v for k, v in os.environ.items()
             if k not in ("PYSPARK_SUBMIT_ARGS", "MASTER", "SPARK_CONF_DIR", "SPARK_HOME", "PYSPARK_GATEWAY_PORT")}
    clean["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", "from applier.spark.session import preset_master; "
                          "print(preset_master())"], env=clean | env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.parametrize(("env", "want"), [
    ({}, "None"),
    ({"PYSPARK_SUBMIT_ARGS": "--master spark://10.0.0.1:7077 --jars a.jar pyspark-shell"}, "spark://10.0.0.1:7077"),
    ({"PYSPARK_SUBMIT_ARGS": "--master=yarn pyspark-shell"}, "yarn"),
    ({"PYSPARK_SUBMIT_ARGS": "--conf spark.master=local[4] pyspark-shell"}, "local[4]"),
    ({"MASTER": "spark://m:7077"}, "spark://m:7077"),
])
def test_a_master_chosen_outside_the_config_is_found(env, want):
    assert preset(env) == want


def test_spark_defaults_conf_master_is_found(tmp_path):
    (tmp_path / "spark-defaults.conf").write_text("# comment\nspark.master   spark://defaults:7077\n")
    assert preset({"SPARK_CONF_DIR": str(tmp_path)}) == "spark://defaults:7077"
