"""Which table paths delta-rs (the ``deltalake`` package) can be given.

delta-rs treats a local path as a URL and decodes percent escapes in it (after checking that the
literal path exists, and differently when it writes), so it cannot open a table whose local path
holds ``%``: applier's escape for names such as ``..`` or a schema ``_applier`` (``%2E%2E``,
``%5Fapplier``). Characters a URL may not hold unescaped (``[ ] ^ | \\``) make its writer panic
("Invalid object store url"), wherever they are in the path, the target directory's own name
included. Those tables are read and written through Spark instead; everything else goes to delta-rs.
"""

from __future__ import annotations

from pathlib import Path

_NOT_IN_LOCAL_PATHS = frozenset("%[]^|\\")


def deltars_can_open(path: str | Path) -> bool:
    text = str(path)
    return "://" in text or not _NOT_IN_LOCAL_PATHS.intersection(text)


def deltars_path(path: str | Path) -> str:
    """``path`` for delta-rs (callers check :func:`deltars_can_open` first where it may be false)."""
    return str(path)
