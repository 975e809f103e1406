"""``StorePath``: the few ``pathlib`` operations the target layout needs, on an object-store URI.

Why: the layout code (``DIR/<schema>/<table>``, the registry, status) walks directories with
``Path`` (``/``, ``name``, ``parent``, ``is_dir``, ``iterdir``). On a store a directory is a key
prefix; this class answers the same questions by listing prefixes, so that code runs unchanged on
both. ``location(text)`` gives a ``Path`` for a local path and a ``StorePath`` for a URI.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import total_ordering
from pathlib import Path

from applier.storage.location import is_object_store, scheme_of
from applier.storage.objects import ObjectStore
from applier.storage.options import in_force

__all__ = ["StorePath", "TablePath", "location"]


@total_ordering
class StorePath:
    """An object-store 'directory' (a key prefix) below a root URI, listed through one ObjectStore."""

    __slots__ = ("_root", "_parts", "_store")

    def __init__(self, root: str, parts: tuple[str, ...] = (), store: ObjectStore | None = None) -> None:
        self._root = root.rstrip("/")
        self._parts = parts
        self._store = store

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            self._store = ObjectStore(self._root)
        return self._store

    def __truediv__(self, part: str) -> StorePath:
        return StorePath(self._root, (*self._parts, *[p for p in str(part).split("/") if p]), self._store)

    def __str__(self) -> str:
        return "/".join((self._root, *self._parts))

    def __repr__(self) -> str:
        return f"StorePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StorePath) and str(self) == str(other)

    def __lt__(self, other: StorePath) -> bool:
        return str(self) < str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def name(self) -> str:
        return self._parts[-1] if self._parts else self._root.rsplit("/", 1)[-1]

    @property
    def parent(self) -> StorePath:
        if self._parts:
            return StorePath(self._root, self._parts[:-1], self._store)
        head, _, _ = self._root.rpartition("/")
        return StorePath(head if scheme_of(head) else self._root)

    def _prefix(self) -> str:
        return "/".join(self._parts)

    def iterdir(self) -> Iterator[StorePath]:
        for name in self.store.directories(self._prefix()):
            yield self / name

    def files(self) -> list[StorePath]:
        """The objects directly under this prefix (``iterdir`` gives the prefixes)."""
        return [self / name for name in self.store.files(self._prefix())]

    @property
    def suffix(self) -> str:
        name = self.name
        return name[name.rindex("."):] if "." in name.lstrip(".") else ""

    def open_input_file(self) -> object:
        """A seekable Arrow file of this object (pyarrow's own S3/GCS/Azure file system, which reads the
        same environment as delta-rs): Parquet footers and row groups read by range, not the whole object."""
        from pyarrow import fs

        uri = str(self)
        if uri.startswith("s3a://"):
            uri = "s3://" + uri.removeprefix("s3a://")
        explicit = in_force(uri)
        if explicit is not None and explicit.is_s3:
            return fs.S3FileSystem(**explicit.pyarrow_s3()).open_input_file(uri.split("://", 1)[1])
        filesystem, path = fs.FileSystem.from_uri(uri)
        return filesystem.open_input_file(path)

    def is_dir(self) -> bool:
        """A prefix with at least one key under it (a store has no empty directories)."""
        return self.store.any_under(self._prefix())

    def exists(self) -> bool:
        return self.is_dir()


#: A table's (or a layout directory's) location: a local ``Path`` or a ``StorePath`` on an object store.
TablePath = Path | StorePath


def location(text: str | Path) -> TablePath:
    """A ``Path`` for a local path (or ``file://``... kept as given), a ``StorePath`` for a store URI."""
    return StorePath(str(text)) if is_object_store(text) else Path(text)
