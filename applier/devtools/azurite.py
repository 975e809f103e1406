"""Azurite (Microsoft's own Azure Storage emulator, the npm package ``azurite``) on loopback, for the
``abfss://`` / ``az://`` tests: its Blob service only, in memory.

Why Azurite: delta-rs and ``obstore`` (Rust ``object_store``) speak the Blob REST API to it exactly as
to an Azure storage account, shared-key signatures and conditional writes (If-None-Match / If-Match)
included; nothing in applier is patched. It has no DFS (ADLS Gen2) endpoint, which is what Spark's
ABFS driver needs (docs/object-storage.md says what that leaves untested).

Installed once into the cache by scripts/setup (``npm install --prefix <cache>/azurite azurite@VERSION``);
``APPLIER_AZURITE`` names another ``azurite-blob`` executable.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import subprocess
import urllib.request
import uuid
from dataclasses import dataclass
from email.utils import formatdate
from pathlib import Path

from applier.devtools.servers import find_executable, free_port, stop, wait_listening
from applier.infra.cache import default_cache_dir

__all__ = ["ACCOUNT", "ACCOUNT_KEY", "AZURITE_VERSION", "AzuriteServer", "find_azurite", "start_azurite"]

AZURITE_VERSION = "3.37.0"
#: Azurite's well-known development account and key (public, the same in every Azurite).
ACCOUNT = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def find_azurite() -> Path | None:
    """``azurite-blob`` from ``APPLIER_AZURITE``, the cache, or the PATH; None when absent."""
    cached = default_cache_dir() / "azurite" / "node_modules" / ".bin" / "azurite-blob"
    return find_executable("APPLIER_AZURITE", cached, "azurite-blob")


@dataclass
class AzuriteServer:
    endpoint: str  # http://127.0.0.1:<port>, the Blob service (the account is the path's first part)
    process: subprocess.Popen[bytes]

    @property
    def env(self) -> dict[str, str]:
        """The standard Azure variables that point delta-rs and obstore at this emulator."""
        return {"AZURE_STORAGE_ACCOUNT_NAME": ACCOUNT, "AZURE_STORAGE_ACCOUNT_KEY": ACCOUNT_KEY,
                "AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": self.endpoint}

    def new_container(self) -> str:
        """A new empty container's name (Create Container, signed with the account key)."""
        name = f"lake-{uuid.uuid4().hex[:12]}"
        date = formatdate(usegmt=True)
        version = "2021-12-02"
        to_sign = "\n".join(["PUT", *[""] * 11, f"x-ms-date:{date}\nx-ms-version:{version}",
                             f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container"])
        signature = base64.b64encode(hmac.new(base64.b64decode(ACCOUNT_KEY), to_sign.encode(),
                                              hashlib.sha256).digest()).decode()
        request = urllib.request.Request(f"{self.endpoint}/{ACCOUNT}/{name}?restype=container", method="PUT",
                                         headers={"x-ms-date": date, "x-ms-version": version,
                                                  "Authorization": f"SharedKey {ACCOUNT}:{signature}"})
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback http
            response.read()
        return name

    def stop(self) -> None:
        stop(self.process, grace=2)  # its state is in memory: nothing to write; it waits on idle clients


def start_azurite(work: Path) -> AzuriteServer:
    """Start Azurite's Blob service on a free loopback port (state in memory, its log in ``work``)."""
    executable = find_azurite()
    if executable is None:
        raise FileNotFoundError(f"Azurite is not installed: run scripts/setup-test-servers (npm install --prefix "
                                f"{default_cache_dir() / 'azurite'} azurite@{AZURITE_VERSION}) or set APPLIER_AZURITE")
    port = free_port()
    log_path = work / "azurite.log"
    log = open(log_path, "wb")  # noqa: SIM115 - the server's output, for a failing test
    process = subprocess.Popen([str(executable), "--blobHost", "127.0.0.1", "--blobPort", str(port),
                                "--inMemoryPersistence", "--skipApiVersionCheck",
                                "--disableProductStyleUrl", "--disableTelemetry"],
                               # telemetry off, and its temporary files (if any) in ``work``, not the machine's /tmp
                               stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "TMPDIR": str(work)})
    wait_listening(process, port, "Azurite", log_path)
    return AzuriteServer(f"http://127.0.0.1:{port}", process)
