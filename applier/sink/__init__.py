"""The Delta sink: one Delta table per source table, changed only through idempotent commits."""
