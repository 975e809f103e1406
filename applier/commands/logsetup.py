"""Logging for a service: progress and errors on stderr, with timestamps and levels, as text or JSON.

stdout stays for results (summaries, ``--json`` reports), so ``applier status --json | jq`` works
while progress goes to the journal. Every line is scrubbed of registered secrets.
The same flags are accepted before or after the subcommand (``applier -v inspect`` and
``applier inspect -v``), and by ``jobs/*.py``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any, TextIO

from applier.infra.redact import scrub

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")


def add_logging_arguments(parser: argparse.ArgumentParser, *, suppress_defaults: bool = False) -> None:
    """``-v``, ``-q``, ``--log-level``, ``--log-format``. With ``suppress_defaults`` (on subcommands) an
    option not given leaves the value parsed before the subcommand alone."""
    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress_defaults else value

    group = parser.add_argument_group("logging (stderr)")
    group.add_argument("-v", "--verbose", action="store_true", default=default(False),
                       help="debug detail (same as --log-level debug)")
    group.add_argument("-q", "--quiet", action="store_true", default=default(False),
                       help="only warnings and errors (same as --log-level warning)")
    group.add_argument("--log-level", choices=LEVELS, default=default(None),
                       help="debug, info (default), warning or error")
    group.add_argument("--log-format", choices=FORMATS, default=default("text"),
                       help="text (default: 'time LEVEL logger: message') or json (one object per line: ts, "
                       "level, logger, msg)")


def level_from(args: argparse.Namespace) -> int:
    if getattr(args, "log_level", None):
        return int(getattr(logging, str(args.log_level).upper()))
    if getattr(args, "verbose", False):
        return logging.DEBUG
    if getattr(args, "quiet", False):
        return logging.WARNING
    return logging.INFO


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]  # its stream changes (pytest capture)
    """Writes to whatever ``sys.stderr`` is at the time (pytest's capture, a redirected stream)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def _utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class TextFormatter(logging.Formatter):
    """``2026-11-23T21:09:08.123Z INFO applier.mirror: message``."""

    def format(self, record: logging.LogRecord) -> str:
        text = f"{_utc(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return scrub(text)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc with a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"ts": _utc(record), "level": record.levelname, "logger": record.name,
                                 "msg": scrub(record.getMessage())}
        if record.exc_info:
            entry["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def configure(level: int = logging.INFO, fmt: str = "text") -> None:
    """(Re)configure the root logger's applier handler; calling it again replaces the previous one."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _StderrHandler):
            root.removeHandler(h)
    handler = _StderrHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(level)
    # Spark's Python side and py4j chatter at INFO about every JVM call; keep them to warnings.
    for noisy in ("py4j", "pyspark"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def configure_from(args: argparse.Namespace) -> None:
    configure(level_from(args), getattr(args, "log_format", "text") or "text")


def progress(command: str) -> Any:
    """A progress callback for ``command``: one INFO line per call on the ``applier.<command>`` logger."""
    log = logging.getLogger(f"applier.{command}")
    return lambda message: log.info("%s", message)
