"""Where setup keeps downloads; shared by the Spark session (jars) and the dev clusters (PostgreSQL wheels)."""

from __future__ import annotations

import os
from pathlib import Path


def default_cache_dir() -> Path:
    """Where setup keeps downloads (Delta jars, PostgreSQL wheels).

    ``$APPLIER_CACHE_DIR`` when set; else ``.cache`` of the source checkout the package runs from
    (what ``scripts/setup`` fills, and readable by the ``postgres`` user, unlike ``/root``); else
    ``~/.cache/applier`` for an installed package.
    """
    env = os.environ.get("APPLIER_CACHE_DIR")
    if env:
        return Path(env)
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return checkout / ".cache"
    return Path.home() / ".cache" / "applier"
