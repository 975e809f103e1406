"""applier: mirror PostgreSQL tables into Delta Lake by replaying pgoutput logical replication."""

__version__ = "0.1.0"
