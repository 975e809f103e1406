"""spark-submit entry point for `applier mirror`.

    APPLIER_DSN='host=... dbname=...' spark-submit --packages io.delta:delta-spark_4.2_2.13:4.4.0 \
        jobs/mirror.py --config configs/mirror.yaml [--once]

Under spark-submit the Delta jars come from --packages or the cluster, so APPLIER_DELTA_JARS defaults
to 'provided' here; the arguments are exactly those of `applier mirror`, the logging flags included
(`--log-format json`, `--log-level`, `-q`, `-v`), and so are the exit codes (applier/commands/exitcodes.py).
"""

import os
import sys

os.environ.setdefault("APPLIER_DELTA_JARS", "provided")

from applier.cli import run  # noqa: E402

if __name__ == "__main__":
    run(["mirror", *sys.argv[1:]])
