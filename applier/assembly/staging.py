"""Durable staging of prepared transactions (two-phase), one file per gid.

A slot advanced past a Prepare never sends those changes again: COMMIT PREPARED arrives alone, maybe
days later, maybe after a restart. So the changes (with the schema versions they were decoded with)
are written to disk atomically (temp file, fsync, rename, fsync of the directory) before anything
lets the slot move past the Prepare, and read back at Commit Prepared.

A Commit Prepared can also arrive for a transaction whose Prepare was never sent: one that changed
no table the decoder can see (``BEGIN; SELECT ... FOR SHARE; PREPARE TRANSACTION 'x'``: a row lock
gives it an xid but no change). PostgreSQL 15 and 16 then send the Commit Prepared alone (observed
with pg_logical_slot_peek_binary_changes: no Begin Prepare, no Prepare); 18 sends nothing. A prepared
transaction whose changes are all for unpublished tables is different: its Begin Prepare and Prepare
do arrive, with no change between them, and are staged empty like any other. The lone Commit Prepared
looks exactly like the one whose staged changes were lost (the slot moved past the Prepare without
us), and nothing in it (commit LSN, end LSN, xid, gid) says where its Prepare was. What can prove it
empty is the store's own record (:meth:`PreparedStore.cover`): the slot this store has followed since
it was created, and the highest position this applier ever told the server. This applier stages a
Prepare before it confirms past it, so while the slot's confirmed position at the start of a session
is no further than that record (nobody else moved it: ``pg_replication_slot_advance`` by hand, or
another consumer), every Prepare the server sent since the slot's creation is staged here until its
Commit or Rollback Prepared is applied; and a transaction prepared before the slot existed cannot
commit after its creation point (creating a slot waits for prepared transactions too). So a Commit
Prepared after that point with nothing staged had no Prepare sent: nothing to apply. Without the
record (a slot this store did not see created, a store from an older version, a stored raw log) or
with a slot moved past it, the lone Commit Prepared stops the run as before.
"""

from __future__ import annotations

import json
import logging
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from applier.lsn import format_lsn
from applier.state import atomic_write

log = logging.getLogger(__name__)

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
        #: set by :meth:`vouch` for one session: every Prepare the server sent after this LSN is staged
        #: here until applied (see the module docstring); None: nothing is vouched for
        self.covered_from: int | None = None
        self._recorded: dict[str, Any] | None = None  # the coverage file as last read or written here

    # --- what the store has seen of its slot (the module docstring says why) ----------------------

    def _coverage_path(self) -> Path:
        return self.directory / "slot.coverage"

    def _coverage(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self._coverage_path().read_text())
        except FileNotFoundError:
            return None
        return data if isinstance(data, dict) else None

    def cover(self, slot: str, created_at: int) -> None:
        """``slot`` was just created at ``created_at`` (its consistent point) for this store's target:
        from here on every Prepare it sends is received, and staged, by this applier."""
        data = {"slot": slot, "from": created_at, "confirmed": created_at}
        atomic_write(self._coverage_path(), lambda f: f.write(json.dumps(data).encode()))
        self._recorded = data

    def confirming(self, lsn: int) -> None:
        """Record, before telling the server, that this applier confirms the slot up to ``lsn`` (the
        record must never be behind the server's confirmed position, or a session is not vouched for).
        One small atomic write per confirm that moves the slot: the file is read once per process."""
        data = self._recorded if self._recorded is not None else self._coverage()
        if data is None or lsn <= int(data["confirmed"]):
            self._recorded = data
            return
        data = {**data, "confirmed": lsn}
        atomic_write(self._coverage_path(), lambda f: f.write(json.dumps(data).encode()))
        self._recorded = data

    def vouch(self, slot: str, slot_confirmed: int | None) -> bool:
        """At the start of a decoding session of ``slot`` whose confirmed position is ``slot_confirmed``:
        whether this store holds every Prepare the slot sent since its creation (then ``covered_from``
        is the creation point), i.e. the store followed the slot from its creation and nobody else has
        moved it further than this applier did."""
        data = self._recorded = self._coverage()
        self.covered_from = None
        if data is None or data.get("slot") != slot or slot_confirmed is None:
            return False
        if not int(data["from"]) <= slot_confirmed <= int(data["confirmed"]):
            log.warning("slot %s is confirmed to %s, beyond the %s this applier confirmed: something else "
                        "moved it, so a Commit Prepared whose changes are not staged here cannot be told from "
                        "an empty one and stops the run", slot, format_lsn(slot_confirmed),
                        format_lsn(int(data["confirmed"])))
            return False
        self.covered_from = int(data["from"])
        return True

    def never_prepared(self, commit_lsn: int) -> bool:
        """Whether a Commit Prepared at ``commit_lsn`` with nothing staged is provably one whose Prepare
        the server never sent (a prepared transaction with no change to decode)."""
        return self.covered_from is not None and commit_lsn > self.covered_from

    # --- staged transactions ----------------------------------------------------------------------

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
