"""Development helpers: throw-away PostgreSQL clusters, a throw-away standalone Spark cluster and sample
data (demo, tests, benchmarks, capture scripts).

Runtime code does not import this package; only ``applier demo`` and ``applier setup`` (listing the
servers found) do."""
