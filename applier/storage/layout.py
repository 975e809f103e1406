"""The target's directory layout as far as reading it goes: which (schema, table) a table directory stands
for, and where retired tables are kept. Here, below the sink, because the state's format migration
(applier.infra.stateformat) reads the layout too; applier.sink.naming writes it."""

from __future__ import annotations

import re

from applier.storage.paths import TablePath

#: where the Delta table of a source table that was dropped while its name went to a new table is kept
#: (``DIR/_retired/<schema>/<table>@<relation OID>``, applier.sink.identity): never merged into, never listed
RETIRED_DIR = "_retired"
#: ``%u`` and two hex digits (what applier.sink.naming's ``_path_component`` writes under ``path_names:
#: keep``), ``~`` and two upper-case hex digits, one per UTF-8 byte (under ``path_names: safe``), or ``%``
#: and two hex digits (what releases before ``%u`` wrote: a directory they made still decodes to its name)
_PATH_ESCAPE = re.compile(r"%u([0-9A-Fa-f]{2})|(?:%[0-9A-Fa-f]{2})+|((?:~[0-9A-F]{2})+)")


def _decode_escape(m: re.Match[str]) -> str:
    from urllib.parse import unquote

    if m.group(1):
        return chr(int(m.group(1), 16))
    if m.group(2):
        try:
            return bytes.fromhex(m.group(2).replace("~", "")).decode("utf-8")
        except UnicodeDecodeError:
            return m.group(2)  # no name applier writes: the directory's own name
    return unquote(m.group())


def decode_path_component(component: str) -> str:
    """The schema or table name a directory name stands for (the inverse of applier.sink.naming's
    ``_path_component``, either choice of ``path_names``, and of the URL escapes of earlier releases)."""
    return _PATH_ESCAPE.sub(_decode_escape, component)


def source_name_of(table_dir: TablePath) -> tuple[str, str]:
    """(schema, table) of a directory in the ``DIR/<schema>/<table>`` layout, escapes decoded."""
    return decode_path_component(table_dir.parent.name), decode_path_component(table_dir.name)
