"""A throw-away standalone Spark cluster (one Master, one Worker) from pyspark's own distribution, on
loopback ports: what `spark-submit --master spark://...` is tested and benchmarked against.

Why this exists: the jobs must run on a cluster, not only in a local session, and the machine has no
cluster. The daemons are pyspark's ``spark-class`` launchers; their logs stay in ``workdir``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from applier.errors import EnvironmentSetupError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def master_json(webui_port: int) -> dict[str, Any]:
    """The master's state (workers, applications) from its web UI's JSON."""
    with urllib.request.urlopen(f"http://127.0.0.1:{webui_port}/json", timeout=10) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


class StandaloneCluster:
    """A Master and one Worker with ``cores`` cores; ``env`` is what a driver talking to it needs."""

    def __init__(self, workdir: Path, *, cores: int = 2, memory: str = "2g") -> None:
        self.port, self.webui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = dict(os.environ, SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                        SPARK_DAEMON_MEMORY="512m", SPARK_WORKER_DIR=str(workdir / "work"),
                        SPARK_LOG_DIR=str(workdir / "logs"), PYSPARK_PYTHON=sys.executable)
        self.workdir = workdir
        self.cores, self.memory = cores, memory
        self.procs: list[subprocess.Popen[bytes]] = []

    def _daemon(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        self.procs.append(subprocess.Popen([str(spark_home() / "bin" / "spark-class"), *args], env=self.env,
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True))

    def start(self) -> None:
        """The master first, then the worker at the ports the master really bound.

        Why: a port free when chosen can be taken before the master binds it (tests run in parallel),
        and Spark then binds the next one; asking the chosen port would reach some other server.
        """
        self._daemon("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.webui_port))
        deadline = time.monotonic() + 120
        ports = self._bound_ports(deadline)
        if ports is not None:
            self.port, self.webui_port = ports
            self.url = f"spark://127.0.0.1:{self.port}"
            self._daemon("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                         "--cores", str(self.cores), "--memory", self.memory, "--webui-port", str(free_port()),
                         "--work-dir", str(self.workdir / "work"), self.url)
            while time.monotonic() < deadline:
                try:
                    if [w for w in master_json(self.webui_port).get("workers", []) if w.get("state") == "ALIVE"]:
                        return
                except (OSError, ValueError):  # not listening yet, or an empty answer while it starts
                    pass
                if any(p.poll() is not None for p in self.procs):
                    break
                time.sleep(1)
        logs = "\n".join((self.workdir / f"{n}.log").read_text(errors="replace")[-1500:]
                         for n in ("master", "worker") if (self.workdir / f"{n}.log").is_file())
        self.stop()
        raise EnvironmentSetupError(f"the standalone Spark cluster did not come up:\n{logs}")

    def _bound_ports(self, deadline: float) -> tuple[int, int] | None:
        """The master's RPC and web UI ports from its log, once both are bound (None: it died or timed out)."""
        found: dict[str, int] = {}
        while time.monotonic() < deadline and self.procs[0].poll() is None:
            text = (self.workdir / "master.log").read_text(errors="replace")
            for service in ("sparkMaster", "MasterUI"):
                marker = f"Successfully started service '{service}' on port "
                if marker in text:
                    found[service] = int(text.split(marker, 1)[1].split(".", 1)[0])
            if len(found) == 2:
                return found["sparkMaster"], found["MasterUI"]
            time.sleep(0.2)
        return None

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
