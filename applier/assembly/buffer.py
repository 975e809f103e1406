"""A per-transaction change buffer with a memory budget: past the budget, entries spill to a local
file and are read back, in order, at commit.

Why: a streamed or regular transaction can be far larger than memory (bulk loads, big UPDATEs).
The budget counts the raw message bytes (a good proxy for decoded size). Entries are pickled: the
spill file is private to this process and removed when the transaction ends or is discarded.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from applier.errors import SpillError

_PICKLE_CHUNK = 2_000


class ChangeBuffer:
    def __init__(self, budget_bytes: int, spill_dir: Path | None) -> None:
        self._budget = budget_bytes
        self._spill_dir = spill_dir
        self._memory: list[Any] = []
        self._memory_bytes = 0
        self._spill_path: Path | None = None
        self._spilled = 0  # entries in the spill file
        self.spill_events = 0

    def __len__(self) -> int:
        return self._spilled + len(self._memory)

    @property
    def spilled(self) -> bool:
        return self._spilled > 0

    def append(self, entry: Any, size: int) -> None:
        self._memory.append(entry)
        self._memory_bytes += size
        if self._memory_bytes > self._budget:
            self._spill()

    def _spill(self) -> None:
        if self._spill_path is None:
            directory = self._spill_dir or Path(tempfile.gettempdir())
            directory.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="applier-spill-", suffix=".pkl", dir=directory)
            os.close(fd)
            self._spill_path = Path(name)
        size_before = self._spill_path.stat().st_size
        try:
            with open(self._spill_path, "ab") as f:
                # Small pickles: one dump of the whole budget would build a memo and an output
                # buffer as large as the data itself, doubling peak memory.
                for start in range(0, len(self._memory), _PICKLE_CHUNK):
                    pickle.dump(self._memory[start:start + _PICKLE_CHUNK], f, protocol=pickle.HIGHEST_PROTOCOL)
        except OSError as e:
            with contextlib.suppress(OSError):  # leave the file as it was (the changes stay in memory)
                os.truncate(self._spill_path, size_before)
            raise SpillError(
                f"cannot spill a large transaction to disk ({e.strerror}); nothing of it has been applied. "
                "Free space in the spill directory (the state directory's spill/), move the state "
                "directory (target.state_dir), or raise apply.memory_budget_mb, then run again: it "
                "resumes from the last applied transaction", spill_file=str(self._spill_path)) from e
        self._spilled += len(self._memory)
        self._memory = []
        self._memory_bytes = 0
        self.spill_events += 1

    def __iter__(self) -> Iterator[Any]:
        if self._spill_path is not None:
            with open(self._spill_path, "rb") as f:
                while True:
                    try:
                        chunk = pickle.load(f)
                    except EOFError:
                        break
                    yield from chunk
        yield from self._memory

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` entries (subtransaction abort)."""
        if length >= len(self):
            return
        if length >= self._spilled:
            del self._memory[length - self._spilled:]
            return
        kept = [e for _i, e in zip(range(length), self, strict=False)]
        self.discard()
        self._memory = kept
        if kept:
            self._spill()

    def discard(self) -> None:
        if self._spill_path is not None:
            self._spill_path.unlink(missing_ok=True)
            self._spill_path = None
        self._memory = []
        self._memory_bytes = 0
        self._spilled = 0
