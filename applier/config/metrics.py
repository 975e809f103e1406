"""``metrics``: Prometheus metrics and /healthz while a mirror or capture runs."""

from __future__ import annotations

from pydantic import Field

from applier.config.base import SettingsModel


class MetricsSettings(SettingsModel):
    """Prometheus metrics and a health check while the mirror runs (docs/operations.md, "Metrics")."""

    port: int | None = Field(
        None, ge=0, le=65535, description="serve /metrics (Prometheus text format) and /healthz on this port while "
        "mirror or capture runs (--metrics-port), and for a mirror a status page at / (its data at /status.json); "
        "unset: no server; 0: a free port, logged")
    host: str = Field(
        "127.0.0.1", min_length=1, description="the address the metrics server listens on (--metrics-host); the "
        "default answers this machine only: /metrics, /healthz and the status page have no "
        "authentication, so give an address "
        "others reach (0.0.0.0: every interface) only on a network you trust or behind a proxy that guards it")
    stall_seconds: float = Field(
        300.0, gt=0, description="/healthz answers 503 when the loop has not moved (read, applied a group, or "
        "found the stream idle and caught up) for this long; 200 otherwise")

