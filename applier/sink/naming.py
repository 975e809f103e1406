"""Where each source table lives in Delta, and how identifiers are quoted in Spark SQL.

Postgres identifiers may contain anything (quotes, spaces, backticks, dots, unicode). Spark SQL
only ever sees them backtick-quoted, and values never go into SQL text at all.
"""

from __future__ import annotations

import re
from pathlib import Path

#: Characters Delta refuses in column names unless column mapping is on (plus names Spark mangles).
_NEEDS_COLUMN_MAPPING = re.compile(r"[ ,;{}()\n\t=]")


def quote_identifier(name: str) -> str:
    """Backtick-quote one identifier for Spark SQL (a backtick inside is doubled)."""
    return "`" + name.replace("`", "``") + "`"


def delta_path_sql(path: str | Path) -> str:
    """``delta.`<path>``` with the path quoted as an identifier."""
    return "delta." + quote_identifier(str(path))


def needs_column_mapping(column_names: list[str] | tuple[str, ...]) -> bool:
    return any(_NEEDS_COLUMN_MAPPING.search(name) for name in column_names)


def _path_component(name: str) -> str:
    """A schema or table name as one path component: kept exactly, except '/' and NUL which cannot be."""
    if name in (".", ".."):
        return f"%2E{name[1:]}"
    return name.replace("%", "%25").replace("/", "%2F").replace("\x00", "%00")


def table_location(target_dir: str | Path, namespace: str, table: str) -> Path:
    """``DIR/<schema>/<table>``, names exactly as in Postgres (pg_catalog when the wire sends '')."""
    return Path(target_dir) / _path_component(namespace or "pg_catalog") / _path_component(table)


def sql_string_literal(value: str) -> str:
    """A Spark SQL string literal for places that take no parameter markers (TBLPROPERTIES).

    Spark's lexer treats backslash as an escape inside quotes, so both backslash and quote are escaped.
    """
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def mirrored_table_dirs(target_dir: str | Path) -> list[Path]:
    """The Delta tables in the ``DIR/<schema>/<table>`` layout (the ``_applier`` state directory excluded)."""
    return sorted(d.parent for d in Path(target_dir).glob("*/*/_delta_log") if d.parent.parent.name != "_applier")
