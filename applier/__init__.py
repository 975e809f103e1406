"""applier: mirror PostgreSQL tables into Delta Lake by replaying pgoutput logical replication.

The Python API, for notebooks and jobs that already have a SparkSession (see applier.api)::

    import applier
    summary = applier.replay(spark, "configs/replay.yaml")
    summary = applier.mirror(spark, {"target": {"path": "/lake/mirror"}}, once=True)
    results = applier.verify(spark, "configs/mirror.yaml")
    frames = applier.read_consistent(spark, "/lake/mirror", ["public.orders", "public.order_lines"])

``import applier`` stays light: the API functions (and pyspark with them) load on first use.
"""

from __future__ import annotations

from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from applier.api import cut, mirror, read_consistent, replay, verify


def _version() -> str:
    """The installed distribution's version: pyproject.toml is the only place it is written."""
    try:
        return metadata.version("applier")
    except metadata.PackageNotFoundError:  # a source checkout that was never installed
        return "0+unknown"


__version__ = _version()
__all__ = ["__version__", "cut", "mirror", "read_consistent", "replay", "verify"]

_API = ("cut", "mirror", "read_consistent", "replay", "verify")


def __getattr__(name: str) -> Any:
    if name in _API:
        from applier import api

        return getattr(api, name)
    raise AttributeError(f"module 'applier' has no attribute {name!r}")
