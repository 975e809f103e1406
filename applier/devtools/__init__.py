"""Development helpers: throw-away PostgreSQL clusters and sample data (demo, tests, capture scripts).

Runtime code does not import this package; only ``applier demo`` and ``applier setup`` (listing the
servers found) do."""
