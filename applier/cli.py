"""The ``applier`` command line: one subcommand per job, each in its own module under applier.commands.

This module owns what every command shares: the logging flags (accepted before or after the
subcommand), turning an error into one line on stderr and an exit code from applier.commands.exitcodes, and
keeping secrets out of both, tracebacks included.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import logging
import os
import sys
import textwrap
import threading
import traceback
from collections.abc import Sequence
from typing import NoReturn

from applier import __version__
from applier.commands import COMMAND_MODULES
from applier.commands.exitcodes import ExitCode, disk_full, epilog, for_exception
from applier.commands.logsetup import add_logging_arguments, configure_from
from applier.infra.redact import scrub
from applier.infra.rustpanics import RustPanicFilter

DESCRIPTION = """\
Mirror PostgreSQL tables into Delta Lake by replaying PostgreSQL's logical replication stream
(pgoutput), exactly once and in commit order, with PySpark and delta-spark.

Run `applier COMMAND --help` for each command's options. The logging options below are also
accepted after the command (`applier inspect -v ...`). Progress and errors go to stderr, results to
stdout."""


SHORT_EPILOG = textwrap.fill(
    "exit codes: 0 done, 1 tables differ (verify, demo), 2 usage or config error (flags, config, DSN), 3 source "
    "or target unavailable, 4 bad data stopped the run, 5 internal error; `applier --help` explains each.", 100)


def build_parser() -> argparse.ArgumentParser:
    # allow_abbrev=False: else the top level reads `capture --log` as an ambiguous --log-level/--log-format.
    parser = argparse.ArgumentParser(prog="applier", description=DESCRIPTION, epilog=epilog(), allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"applier {__version__}")
    add_logging_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(f"applier.commands.{name}").register(sub)
    for subparser in sub.choices.values():
        add_logging_arguments(subparser, suppress_defaults=True)
        subparser.epilog = SHORT_EPILOG
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_from(args)
    with RustPanicFilter() as panics:
        code = _run(args)
    if panics.held:
        _after_panics(args, code, panics.held)
    return code


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The command's process: ``main``, then an exit that skips the C++ runtime's teardown.

    delta-rs's object-store scans leave native threads behind (delta-io/delta-rs #2184); now and then one
    is still there when the C++ runtime tears down, and the process aborts with "terminate called without
    an active exception" (exit 134) after a run that succeeded. So the process ends as the interpreter
    would (non-daemon threads joined, ``atexit`` handlers run: logging's flush, temporary directories,
    Spark's gateway), then with ``os._exit``. ``main`` itself returns, for tests that call it in-process.
    """
    try:
        code = main(argv)
    except SystemExit as e:  # --help, --version and argparse's usage errors
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else _usage_message(e.code))
    _exit_process(code)


def _usage_message(message: object) -> int:
    print(message, file=sys.stderr)
    return 1


def _exit_process(code: int) -> NoReturn:
    main_thread = threading.main_thread()
    for thread in threading.enumerate():
        if thread is not main_thread and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: main has already said so in its exit code
            pass
    os._exit(code)


def _after_panics(args: argparse.Namespace, code: int, held: list[str]) -> None:
    """A run that stopped with an error of its own (a full disk: exit 3) has said what happened in one
    line; the panics of delta-rs's threads on the way there go to the debug log. Otherwise they are
    news, and shown as Rust would have shown them."""
    if code in (ExitCode.OK, ExitCode.INTERNAL):
        print("\n\n".join(held), file=sys.stderr, flush=True)
    else:
        logging.getLogger(f"applier.{args.command}").debug(
            "delta-rs's own threads panicked while the run stopped (the error line says why):\n%s", "\n\n".join(held))


def _run(args: argparse.Namespace) -> int:
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, inside the handler below, not at interpreter exit
        return code
    except BrokenPipeError:
        _stdout_to_devnull()
        return ExitCode.BROKEN_PIPE
    except KeyboardInterrupt:
        _report(args, "interrupted")
        return ExitCode.INTERRUPTED
    except Exception as e:  # noqa: BLE001 - every failure becomes one line and a documented code
        return _failed(args, e)


def _failed(args: argparse.Namespace, error: Exception) -> int:
    from applier.commands.skip import way_forward
    from applier.errors import ApplierError

    code = for_exception(error)
    if code == ExitCode.INTERNAL:
        trace = "".join(traceback.format_exception(error))
        _report(args, f"internal error (a bug; please report it with the traceback below): "
                      f"{type(error).__name__}: {error}", detail=trace)
        return code
    full = disk_full(error)
    if full is not None:
        _report(args, f"error: {full}")
    elif isinstance(error, ApplierError):
        _report(args, f"error: {error}")
        hint = way_forward(args.command, error) if args.command in ("replay", "mirror") else None
        if hint:
            _report(args, hint)
    else:  # psycopg's OperationalError outside the commands' own checks
        from applier.sources.dsn import one_line

        _report(args, f"error: cannot reach PostgreSQL: {one_line(str(error))}")
    return code


def _report(args: argparse.Namespace, message: str, *, detail: str | None = None) -> None:
    """One line on stderr (a JSON object with --log-format json), secrets masked. In text, control
    characters are escaped (applier.commands.logsetup.one_line) but for the line breaks of a config
    error's list of problems (each indented by two spaces), and the traceback of ``detail`` is indented
    under it: a name from the source that holds a newline cannot start a line that reads as a record
    of the log."""
    from applier.commands.logsetup import indented_traceback, one_line

    if getattr(args, "log_format", "text") == "json":
        log = logging.getLogger(f"applier.{args.command}")
        log.error("%s", message if detail is None else f"{message}\n{detail}")
        return
    text = scrub(f"applier {args.command}: {message}")
    print("\n  ".join(one_line(part) for part in text.split("\n  ")), file=sys.stderr, flush=True)
    if detail:
        print(indented_traceback(scrub(detail).rstrip("\n")), file=sys.stderr, flush=True)


def _stdout_to_devnull() -> None:
    """After EPIPE, point stdout at /dev/null so that the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (pytest's capture)
        pass


if __name__ == "__main__":
    run()
