"""Durable staging of prepared transactions (two-phase), one file per gid.

A slot advanced past a Prepare never sends those changes again: COMMIT PREPARED arrives alone, maybe
days later, maybe after a restart. So the changes (with the schema versions they were decoded with)
are written to disk atomically (temp file, fsync, rename, fsync of the directory) before anything
lets the slot move past the Prepare, and read back at Commit Prepared.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from applier.state import atomic_write

_CHUNK = 10_000


@dataclass(frozen=True, slots=True)
class StagedTransaction:
    gid: str
    xid: int
    origin: str | None
    prepare_lsn: int
    end_lsn: int
    changes: Iterable[Any]  # read lazily from the staged file, in chunks


class _StagedChanges:
    """Iterates the changes of a staged file chunk by chunk (a prepared transaction may exceed memory)."""

    def __init__(self, path: Path) -> None:
        self._path = path

    def __iter__(self) -> Iterator[Any]:
        with open(self._path, "rb") as f:
            pickle.load(f)  # header
            while True:
                try:
                    chunk = pickle.load(f)
                except EOFError:
                    return
                yield from chunk


class PreparedStore:
    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, gid: str) -> Path:
        return self.directory / f"{gid.encode('utf-8').hex()}.prepared"

    def has(self, gid: str) -> bool:
        return self._path(gid).is_file()

    def gids(self) -> list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(bytes.fromhex(p.stem).decode("utf-8") for p in self.directory.glob("*.prepared"))

    def stage(self, gid: str, xid: int, origin: str | None, prepare_lsn: int, end_lsn: int,
              changes: Iterable[Any]) -> None:
        def write(f: IO[bytes]) -> None:
            pickle.dump((gid, xid, origin, prepare_lsn, end_lsn), f, protocol=pickle.HIGHEST_PROTOCOL)
            chunk: list[Any] = []
            for change in changes:
                chunk.append(change)
                if len(chunk) >= _CHUNK:
                    pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)
                    chunk = []
            if chunk:
                pickle.dump(chunk, f, protocol=pickle.HIGHEST_PROTOCOL)

        atomic_write(self._path(gid), write)
        self._done_path(gid).unlink(missing_ok=True)  # a gid used again: its old tombstone no longer applies

    def load(self, gid: str) -> StagedTransaction:
        path = self._path(gid)
        with open(path, "rb") as f:
            sgid, xid, origin, prepare_lsn, end_lsn = pickle.load(f)  # our own file, written by stage()
        return StagedTransaction(sgid, xid, origin, prepare_lsn, end_lsn, _StagedChanges(path))

    def discard(self, gid: str) -> None:
        self._path(gid).unlink(missing_ok=True)

    def _done_path(self, gid: str) -> Path:
        return self.directory / f"{gid.encode('utf-8').hex()}.committed"

    def committed(self, gid: str, end_lsn: int) -> None:
        """The transaction's Commit Prepared (ending at ``end_lsn``) is applied: drop the staged changes
        and keep a tombstone, so that the same Commit Prepared re-sent after a crash (the slot not yet
        advanced past it) is known to be applied rather than mistaken for lost changes."""
        atomic_write(self._done_path(gid), lambda f: f.write(str(end_lsn).encode()))
        self.discard(gid)

    def committed_end_lsn(self, gid: str) -> int | None:
        path = self._done_path(gid)
        return int(path.read_text()) if path.is_file() else None
