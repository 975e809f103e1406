"""A real S3-protocol server on loopback for the object-storage tests and benchmarks: moto's standalone
HTTP server (the test extra installs it).

Why a server and not a mock: delta-rs, obstore and Spark's S3A speak HTTP to it exactly as
to AWS, conditional writes (If-None-Match / If-Match) included; nothing in applier is patched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path


@dataclass
class S3Server:
    endpoint: str
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that point delta-rs, obstore and boto3 at this server."""
        return {"AWS_ACCESS_KEY_ID": "applier-test", "AWS_SECRET_ACCESS_KEY": "applier-test-secret",
                "AWS_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true"}

    def new_bucket(self) -> str:
        import boto3  # type: ignore[import-untyped]

        name = f"lake-{uuid.uuid4().hex[:12]}"
        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                              aws_access_key_id="applier-test", aws_secret_access_key="applier-test-secret")
        client.create_bucket(Bucket=name)
        return name

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def serve_this_process(stack: ExitStack, work: Path) -> str:
    """(Benchmarks) start a server stopped with ``stack``, point this process and its children at it
    (the AWS variables; the local state of store targets under ``work``), and return a new bucket's URI."""
    server = start_s3_server(work)
    stack.callback(server.stop)
    os.environ.update(server.env)
    os.environ["XDG_STATE_HOME"] = str(work / "state")
    return f"s3://{server.new_bucket()}"


def start_s3_server(log_dir: Path) -> S3Server:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(log_dir / "moto.log", "wb")  # noqa: SIM115 - the server's output, for a failing test
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto's S3 server exited with {process.returncode}: see {log_dir / 'moto.log'}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return S3Server(f"http://127.0.0.1:{port}", process)
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError("moto's S3 server did not listen within 60 s")
