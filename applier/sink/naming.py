"""Where each source table lives in Delta, and how identifiers are quoted in Spark SQL.

Postgres identifiers may contain anything (quotes, spaces, backticks, dots, unicode). Spark SQL
only ever sees them backtick-quoted, and values never go into SQL text at all.
"""

from __future__ import annotations

import re
from pathlib import Path

from applier.storage.layout import RETIRED_DIR as RETIRED_DIR  # (these three re-exported: their callers')
from applier.storage.layout import decode_path_component as decode_path_component
from applier.storage.layout import source_name_of as source_name_of
from applier.storage.location import is_object_store, join
from applier.storage.paths import TablePath, location

#: Characters Delta refuses in column names unless column mapping is on (plus names Spark mangles).
_REFUSED_IN_DELTA = " ,;{}()\n\t="
_NEEDS_COLUMN_MAPPING = re.compile(f"[{re.escape(_REFUSED_IN_DELTA)}]")


def quote_identifier(name: str) -> str:
    """Backtick-quote one identifier for Spark SQL (a backtick inside is doubled)."""
    return "`" + name.replace("`", "``") + "`"


def quote_table_name(name: str) -> str:
    """``a.b.c`` with each part backtick-quoted (catalog names are dotted; their parts hold no dots)."""
    return ".".join(map(quote_identifier, name.split(".")))


def delta_path_sql(path: str | Path) -> str:
    """``delta.`<path>``` with the path quoted as an identifier."""
    return "delta." + quote_identifier(str(path))


def needs_column_mapping(column_names: list[str] | tuple[str, ...]) -> bool:
    return any(_NEEDS_COLUMN_MAPPING.search(name) for name in column_names)


#: What ``column_names: safe`` escapes: the characters above, and '%' itself (so that the escape is
#: reversible: no two Postgres names give one Delta name).
_UNSAFE_IN_DELTA = re.compile(f"[{re.escape(_REFUSED_IN_DELTA + '%')}]")
_ESCAPE = re.compile(r"%([0-9A-F]{2})")


def safe_column_name(name: str) -> str:
    """The Delta name of a Postgres column under ``column_names: safe``: each character Delta cannot hold
    without column mapping, and '%', written as '%' and its two hex digits (``Weird col`` ->
    ``Weird%20col``, ``a=b`` -> ``a%3Db``, ``100%`` -> ``100%25``); any other name is kept. One rule,
    no state: every part of the mirror (the fold on an executor, the copy, verify) maps alike, and
    :func:`postgres_column_name` undoes it."""
    return _UNSAFE_IN_DELTA.sub(lambda m: f"%{ord(m.group()):02X}", name)


def postgres_column_name(delta_name: str) -> str:
    """The Postgres name a ``column_names: safe`` Delta column stands for (the inverse of :func:`safe_column_name`)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), delta_name)


#: Directory names a schema or table must not take as they are: ``_delta_log`` would make the
#: directory above it look like a Delta table (every later run fails on it), and the default state
#: directory ``_applier`` (its ``spill``, ``prepared``, ``skipped_transactions``) sits beside the
#: schema directories. Such a name is stored with its leading underscore escaped (``%u5F``), which
#: no other name produces because every literal ``%`` is escaped too.
RESERVED_SCHEMA_DIRS = frozenset({"_applier", "_delta_log", "_history", "_changes", "_retired"})
#: where history tables (SCD type 2) and change feed tables go by default: ``DIR/_history/<schema>/<table>``
HISTORY_DIR, CHANGES_DIR = "_history", "_changes"
RESERVED_TABLE_DIRS = frozenset({"_delta_log"})

#: What a directory name never holds as it is: '/' (a separator), a backslash (delta-rs reads a local
#: path as a file: URL, where a backslash is a separator too), control characters (delta-rs refuses
#: them in any path: "illegal character sequence"), '%', the escape itself, and a '~' before two
#: upper-case hex digits (it would read as the escape of ``path_names: safe``).
_ESCAPED_IN_PATHS = re.compile(r"[%/\\\x00-\x1f\x7f]|~(?=[0-9A-F]{2})")
#: What a directory name holds as it is under ``path_names: safe``: nothing a URL escapes.
_UNSAFE_IN_PATHS = re.compile(r"[^A-Za-z0-9_.\-]")


def _path_component(name: str, reserved: frozenset[str] = RESERVED_TABLE_DIRS, *, safe: bool = False) -> str:
    """A schema or table name as one path component: kept exactly, except '/', backslash, control
    characters and '%' (each written ``%u`` and its two hex digits: ``a/b`` -> ``a%u2Fb``, ``100%`` ->
    ``100%u25``, a newline -> ``%u0A``), '.' and '..' (``%u2E``, ``%u2E.``) and the reserved names above
    (``%u5Fapplier``). :func:`decode_path_component` undoes it. ``safe``: see :func:`_safe_path_component`.

    Why ``%u`` and not the URL escape ``%XX``: delta-rs (and Polars, which reads through it) percent-decodes
    a local path before it reads the table's log, so ``DeltaTable("T/%2E./%2E.")`` read the log of
    ``T/../..``, ``T/%5Fapplier/cuts`` applier's own cuts table, and ``T/s/%252E.`` the table ``..``'s
    ``T/s/%2E.``: another table's version, schema and history, without an error. ``%u`` followed by hex
    digits is no percent escape: no reader decodes it, and the names this writes hold no other '%'
    (docs/delta-tables.md, "Directory names")."""
    if safe:
        return _safe_path_component(name, reserved)
    if name in (".", ".."):
        return "%u2E" + name[1:]
    out = _ESCAPED_IN_PATHS.sub(lambda m: f"%u{ord(m.group()):02X}", name)
    return "%u5F" + out[1:] if name in reserved else out


def _safe_path_component(name: str, reserved: frozenset[str]) -> str:
    """A name as a path component under ``path_names: safe``: ASCII letters, digits, '_', '-' and '.' kept,
    any other character written ``~`` and two hex digits per UTF-8 byte (``Mixed Case`` -> ``Mixed~20Case``,
    ``é`` -> ``~C3~A9``, ``~`` -> ``~7E``); '.', '..' and reserved names as under keep (``~2E.``, ``~5Fapplier``).

    Why: delta-rs hands Polars a table's files as URLs (``Mixed%20Case``), which Polars then looks for on
    disk; a directory name with nothing a URL escapes opens in every reader, on object stores too."""
    if name in (".", ".."):
        return "~2E" + name[1:]
    out = _UNSAFE_IN_PATHS.sub(
        lambda m: "".join(f"~{b:02X}" for b in m.group().encode("utf-8", "surrogateescape")), name)
    return "~5F" + out[1:] if name in reserved else out


def _legacy_path_component(name: str, reserved: frozenset[str] = RESERVED_TABLE_DIRS) -> str:
    """How releases before the ``%u`` escape wrote a name (URL escapes, see :func:`_path_component`):
    a target they wrote keeps its tables there, and :func:`table_location` still finds them."""
    if name in (".", ".."):
        return f"%2E{name[1:]}"
    out = name.replace("%", "%25").replace("/", "%2F").replace("\x00", "%00")
    return "%5F" + out[1:] if name in reserved else out


def table_location(target_dir: str | Path, namespace: str, table: str, *, safe: bool = False) -> str:
    """``DIR/<schema>/<table>``, names exactly as in Postgres (pg_catalog when the wire sends ''),
    except the escapes of :func:`_path_component`; a URI target (``s3://...``) joined as a URI.

    A local table an earlier release wrote under its URL-escaped name (``%2E.``, ``%5Fapplier``,
    ``100%25``) is found there: the mirror, ``status`` and ``verify`` go on with it where it is. So is a
    table written under ``path_names: keep`` before the target chose ``safe``, and (locally) one written
    under ``safe`` when a command is not given the config that chose it.

    On an object store a name that needs a ``%u`` escape (``%``, ``/``, a backslash, a control character,
    ``.``/``..``, a reserved name) is refused under keep: delta-rs reads ``%XX`` in a URI as the character
    it encodes and Hadoop's S3A does not, so the two engines would write the same table at two different
    keys, and delta-rs cannot write a backslash or a control character there at all. ``safe`` names hold
    no '%' and are written there too."""
    schema = namespace or "pg_catalog"
    schema_dir, table_dir = _path_component(schema, RESERVED_SCHEMA_DIRS), _path_component(table)
    escaped, on_store = "%" in schema_dir + table_dir, is_object_store(target_dir)
    safe_path = join(target_dir, _safe_path_component(schema, RESERVED_SCHEMA_DIRS),
                     _safe_path_component(table, RESERVED_TABLE_DIRS))
    if escaped and on_store:
        if safe:
            return safe_path  # (refused under keep: nothing was ever written at a keep name there)
        from applier.errors import ConfigError

        raise ConfigError(
            f"{namespace}.{table}: its name needs an escape in a path (a '%', '/', backslash or control "
            "character, '.' or '..', or a reserved name such as _delta_log), which object-store paths do not "
            "carry the same way in delta-rs and Spark; nothing was written for it. Set tables.path_names: safe "
            "(names written with '~' escapes), give the table a plain path of its own (tables.rules: - match: "
            f"\"{namespace}.{table}\", target: \"{join(target_dir, 'some_plain_name')}\") or leave it out "
            "(tables.exclude)", table=f"{namespace}.{table}", target=str(target_dir))
    keep_path = join(target_dir, schema_dir, table_dir)
    if escaped:  # (local: no escape on a store ever was)
        legacy = join(target_dir, _legacy_path_component(schema, RESERVED_SCHEMA_DIRS), _legacy_path_component(table))
        if legacy != keep_path and _holds_table(legacy) and not _holds_table(keep_path):
            keep_path = legacy
    if on_store and not safe:
        return keep_path
    # the other choice's table where this choice's is not: a target that changed path_names, or (locally)
    # verify and status not given the config that chose safe
    chosen, other = (safe_path, keep_path) if safe else (keep_path, safe_path)
    return other if other != chosen and _holds_table(other) and not _holds_table(chosen) else chosen


def _holds_table(path: str) -> bool:
    """A Delta table is at ``path`` (a local directory with a log; on an object store, a key under its log)."""
    if not is_object_store(path):
        return (Path(path) / "_delta_log").is_dir()
    from applier.storage.location import bucket_and_prefix, bucket_root
    from applier.storage.objects import ObjectStore

    return ObjectStore(bucket_root(path)).any_under(bucket_and_prefix(path)[1] + "/_delta_log/")


def sql_string_literal(value: str) -> str:
    """A Spark SQL string literal for places that take no parameter markers (TBLPROPERTIES).

    Spark's lexer treats backslash as an escape inside quotes, so both backslash and quote are escaped.
    """
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def mirrored_table_dirs(target_dir: str | TablePath) -> list[TablePath]:
    """The Delta tables in the ``DIR/<schema>/<table>`` layout (the ``_applier`` state directory
    excluded; names starting with a dot included). Their source names: :func:`source_name_of`."""
    root = location(str(target_dir))
    if not root.is_dir():
        return []
    out: list[TablePath] = []
    for schema in root.iterdir():
        if not schema.is_dir() or schema.name in RESERVED_SCHEMA_DIRS:
            continue
        out += [t for t in schema.iterdir() if (t / "_delta_log").is_dir()]
    return sorted(out)


def retired_table_dirs(target_dir: str | Path) -> list[TablePath]:
    """Delta tables of dropped source tables whose names went to new tables (``DIR/_retired/<schema>/<t>@<oid>``)."""
    root = location(str(target_dir)) / RETIRED_DIR
    if not root.is_dir():
        return []
    return sorted(t for schema in root.iterdir() if schema.is_dir() and not schema.name.startswith(".")
                  for t in schema.iterdir() if (t / "_delta_log").is_dir())


