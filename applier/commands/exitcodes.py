"""The exit codes of every ``applier`` command, in one place.

A service manager or a scheduler decides what to do from the code alone: 2 needs a person to fix a
flag or a config (restarting will not help), 3 may cure itself (restart later), 4 needs the data
looked at (fix the source, or ``--skip-transaction``), 6 says the server is holding the slot's changes
back for a standby (start that standby; a restart once it is back goes on). 1 is kept for "the check ran and found
differences", as ``diff`` and ``cmp`` use it, so no failure of the tool itself ever exits 1.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a finished command says to its caller (meanings in ``MEANING``)."""

    OK = 0
    DIFFERENCES = 1
    USAGE = 2
    UNAVAILABLE = 3
    BAD_DATA = 4
    INTERNAL = 5
    HELD_BACK = 6
    INTERRUPTED = 130
    BROKEN_PIPE = 141


MEANING: dict[ExitCode, str] = {
    ExitCode.OK: "done",
    ExitCode.DIFFERENCES: "`verify` (or `demo`) ran and found tables that differ from Postgres",
    ExitCode.USAGE: "usage or config error: a flag, the config file or the DSN is wrong or missing (also "
    "an invalid sslmode), Java / the Delta jars are missing, the raw log is not one, or the target's tables are "
    "not the ones applier wrote (gone, replaced, ahead of the log, or behind what earlier runs recorded: "
    "`applier resync --table`), or the slot cannot serve the mirror (lost: its WAL "
    "was removed; physical, or another plugin than pgoutput); fix it, a restart will not help",
    ExitCode.UNAVAILABLE: "source or target unavailable: no connection or login refused, the connection "
    "lost for longer than the retries, Delta refused a commit, the disk full, another "
    "writer holds the target",
    ExitCode.BAD_DATA: "bad data stopped the run: a transaction could not be applied exactly (every table "
    "is as after the transaction before it; fix the source, or `--skip-transaction LSN`), a raw log is "
    "out of order or holds a message twice (fix the log), or a column changed type in a way Delta cannot "
    "widen, a Delta table diverged from Postgres or a column rename could not be proven (re-copy that table: "
    "`applier resync --table`; apply.schema_changes: resync does it by itself)",
    ExitCode.INTERNAL: "internal error (a bug): the traceback is printed, with secrets removed",
    ExitCode.HELD_BACK: "the server is holding the slot's changes back for a standby (PostgreSQL 17+: the slot "
    "is a failover slot and a physical slot named in synchronized_standby_slots is missing, has no standby "
    "connected, or is behind): `mirror --once` or `capture` waited source.standby_wait_seconds and stopped, "
    "not caught up; the log names the standby slot. Start that standby or remove its slot from "
    "synchronized_standby_slots, then run again (restarting before that meets the same wait)",
    ExitCode.INTERRUPTED: "stopped by a second Ctrl-C (128 + SIGINT)",
    ExitCode.BROKEN_PIPE: "the reader of stdout went away (`applier inspect --json | head`): 128 + SIGPIPE, "
    "as for any Unix tool; nothing is printed",
}


def for_exception(error: BaseException) -> ExitCode:
    """The exit code for an error that ended a command."""
    from applier.errors import (
        ApplierError,
        ConfigError,
        DataError,
        EnvironmentSetupError,
        HeldBackError,
        InputError,
        SchemaDecisionError,
        SlotUnusableError,
    )
    from applier.protocol.order import LogOrderError

    if disk_full(error) is not None:  # whatever layer it surfaced in
        return ExitCode.UNAVAILABLE
    if isinstance(error, HeldBackError):
        return ExitCode.HELD_BACK
    if isinstance(error, ConfigError | EnvironmentSetupError | InputError | SlotUnusableError):
        return ExitCode.USAGE
    if isinstance(error, DataError | LogOrderError | SchemaDecisionError):
        return ExitCode.BAD_DATA
    if isinstance(error, ApplierError):
        return ExitCode.UNAVAILABLE
    if _is_connection_failure(error):
        return ExitCode.UNAVAILABLE
    return ExitCode.INTERNAL


def disk_full(error: BaseException) -> str | None:
    """The one line to say when ``error`` (or what caused it) is a full disk: Python's ENOSPC, or delta-rs's
    and Arrow's errors, which carry the OS error as text ("No space left on device (os error 28)"). A
    full disk is an outage (exit 3: free space, run again; nothing applied is lost), not a bug."""
    import errno

    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current)
        if (isinstance(current, OSError) and current.errno == errno.ENOSPC) or "No space left on device" in text \
                or "os error 28" in text:
            where = getattr(current, "filename", None)
            return ("the disk is full (No space left on device" + (f": {where}" if where else "") + "); free space "
                    "and run again: nothing applied is lost, and the run goes on from the last commit")
        current = current.__cause__ or current.__context__
    return None


def _is_connection_failure(error: BaseException) -> bool:
    """psycopg's OperationalError (a connection refused, dropped or timed out) that a command did not
    wrap; told by class so that this module does not import psycopg."""
    return any(c.__module__.startswith("psycopg") and c.__name__ == "OperationalError"
               for c in type(error).__mro__)


def table_markdown() -> str:
    """The exit-code table as Markdown (docs/operations.md and ``--help`` show the same words)."""
    rows = [f"| {c.value} | {MEANING[c].replace('|', chr(92) + '|')} |" for c in ExitCode]
    return "| code | meaning |\n| --- | --- |\n" + "\n".join(rows)


def epilog() -> str:
    """The exit codes as plain text, for ``applier --help``."""
    return "exit codes:\n" + "\n".join(f"  {c.value:>3}  {MEANING[c].replace('`', '')}" for c in ExitCode)
