"""Read-only reports: ``verify`` (Delta vs Postgres), ``status`` (applied positions), ``inspect`` (a raw log)."""
