"""A table sync's temporary slot, created on a thread of its own.

Creating a logical slot waits until every transaction that holds a transaction id on the server has
ended, prepared ones too, and a prepared transaction may wait for a user for days. PostgreSQL's
tablesync worker waits alone while the apply worker goes on; this is the same: the slot is asked for
here, on its own replication connection and thread, and the mirror keeps applying the other tables
until ``created`` says the slot (and its exported snapshot) exists. The snapshot stays importable as
long as that connection runs no other command, so the copy may start any time after.
"""

from __future__ import annotations

import threading

from applier.sources.walsender import CreatedSlot, WalSenderStream


class SyncSlot:
    """``CREATE_REPLICATION_SLOT name TEMPORARY LOGICAL pgoutput (SNAPSHOT 'export')`` in the background
    (``temporary=False``: the mirror's own slot, made the same way so that its first run can say what the
    creation waits for and stop on Ctrl-C, which a blocking command on the main thread would ignore)."""

    def __init__(self, dsn: str, name: str, *, temporary: bool = True, two_phase: bool = False,
                 failover: bool = False) -> None:
        self.name = name
        self._options = {"temporary": temporary, "two_phase": two_phase, "failover": failover}
        self.walsender = WalSenderStream(dsn)  # connected here: a refused connection is raised to the caller
        self._created: CreatedSlot | None = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._create, name="applier-sync-slot", daemon=True)
        self._thread.start()

    def _create(self) -> None:
        try:
            self._created = self.walsender.create_slot(self.name, export_snapshot=True, **self._options)
        except BaseException as e:  # noqa: BLE001 - raised by ``created`` on the caller's thread
            self._error = e
        finally:
            self._done.set()

    def created(self, timeout: float | None = 0.0) -> CreatedSlot | None:
        """The slot once it exists (waiting up to ``timeout`` seconds, None: for ever); None while creation
        still waits. The creation's error, if any, is raised here."""
        if not self._done.wait(timeout):
            return None
        if self._error is not None:
            raise self._error
        assert self._created is not None
        return self._created

    def close(self) -> None:
        """Cancel a creation still waiting, then close the connection (the server drops a temporary
        slot with it)."""
        if not self._done.is_set() and not self.walsender.conn.closed:
            self.walsender.pgconn.get_cancel().cancel()
            self._done.wait(30)
        self.walsender.close()
