"""fake-gcs-server (the Go module ``github.com/fsouza/fake-gcs-server``) on loopback, for the ``gs://``
tests: plain http, objects in memory.

Why this server: delta-rs and ``obstore`` (Rust ``object_store``) speak GCS's XML and JSON APIs to it as
to Google, generation preconditions (``x-goog-if-generation-match``) included; nothing in applier is
patched. They reach it through a service-account file of the form object_store accepts for exactly
this (``gcs_base_url`` and ``disable_oauth``: no token is asked for).

Installed once into the cache by scripts/setup (``GOBIN=<cache>/bin go install
github.com/fsouza/fake-gcs-server@VERSION``); ``APPLIER_FAKE_GCS_SERVER`` names another executable.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

from applier.devtools.servers import find_executable, free_port, stop, wait_listening
from applier.infra.cache import default_cache_dir

__all__ = ["FAKE_GCS_VERSION", "GcsServer", "find_fake_gcs_server", "start_gcs_server"]

FAKE_GCS_VERSION = "v1.56.1"


def find_fake_gcs_server() -> Path | None:
    """The executable from ``APPLIER_FAKE_GCS_SERVER``, the cache, or the PATH; None when absent."""
    return find_executable("APPLIER_FAKE_GCS_SERVER", default_cache_dir() / "bin" / "fake-gcs-server",
                           "fake-gcs-server")


@dataclass
class GcsServer:
    endpoint: str  # http://127.0.0.1:<port>
    process: subprocess.Popen[bytes]
    service_account: Path  # the key file that points object_store at this server, without OAuth

    @property
    def env(self) -> dict[str, str]:
        """The standard Google variable (a service-account file) that points delta-rs and obstore here."""
        return {"GOOGLE_SERVICE_ACCOUNT": str(self.service_account)}

    def new_bucket(self) -> str:
        name = f"lake-{uuid.uuid4().hex[:12]}"
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=applier-test", method="POST",
                                         data=json.dumps({"name": name}).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback http
            response.read()
        return name

    def stop(self) -> None:
        stop(self.process)


def service_account_file(path: Path, endpoint: str) -> Path:
    """Write the key file object_store reads for a server that needs no OAuth token (``disable_oauth``)."""
    path.write_text(json.dumps({"gcs_base_url": endpoint, "disable_oauth": True, "client_email": "",
                                "private_key": "", "private_key_id": ""}))
    return path


def start_gcs_server(work: Path) -> GcsServer:
    """Start fake-gcs-server on a free loopback port (objects in memory, its log in ``work``)."""
    executable = find_fake_gcs_server()
    if executable is None:
        raise FileNotFoundError(f"fake-gcs-server is not installed (opt-in): run scripts/setup-test-servers --gcs "
                                f"(GOBIN={default_cache_dir()}/bin go install "
                                f"github.com/fsouza/fake-gcs-server@{FAKE_GCS_VERSION}) or set APPLIER_FAKE_GCS_SERVER")
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = work / "fake-gcs-server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server's output, for a failing test
    process = subprocess.Popen([str(executable), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                                "-backend", "memory", "-public-host", f"127.0.0.1:{port}", "-external-url", endpoint,
                                "-log-level", "warn"],
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    wait_listening(process, port, "fake-gcs-server", log_path)
    return GcsServer(endpoint, process, service_account_file(work / "fake-gcs-sa.json", endpoint))
