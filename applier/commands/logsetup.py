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
import re
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
                       help="text (default: 'time LEVEL logger: message'; a live bar for progress on a terminal) "
                       "or json (one object per line: ts, level, logger, msg; progress with its numbers)")


def level_from(args: argparse.Namespace) -> int:
    if getattr(args, "log_level", None):
        return int(getattr(logging, str(args.log_level).upper()))
    if getattr(args, "verbose", False):
        return logging.DEBUG
    if getattr(args, "quiet", False):
        return logging.WARNING
    return logging.INFO


def progress_fields(record: logging.LogRecord) -> dict[str, Any] | None:
    """The numbers a progress line carries (applier.infra.progress.ProgressReport), if it is one."""
    from applier.infra.progress import ProgressReport

    args = record.args
    if isinstance(args, tuple) and len(args) == 1 and isinstance(args[0], ProgressReport):
        return args[0].fields
    if isinstance(record.msg, ProgressReport):
        return record.msg.fields
    return None


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]  # its stream changes (pytest capture)
    """Writes to whatever ``sys.stderr`` is at the time (pytest's capture, a redirected stream).

    On a terminal, with the text format, a progress line that knows its total (the initial copy, a
    catch-up, replay, capture) is drawn as a live bar (tqdm's meter: done/total, rate, ETA) that the
    next one redraws in place; any other line clears the bar first. Elsewhere (a file, a pipe, the
    journal) every progress line is a log line, and ``--log-format json`` carries its numbers."""

    def __init__(self, *, bars: bool = True) -> None:
        super().__init__(sys.stderr)
        self.bars = bars
        self._bar_shown = False

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass

    def emit(self, record: logging.LogRecord) -> None:
        stream = self.stream
        fields = progress_fields(record) if self.bars else None
        try:
            on_terminal = stream.isatty()
        except (AttributeError, ValueError):
            on_terminal = False
        if not on_terminal or fields is None or not fields.get("total"):
            if self._bar_shown and on_terminal:
                stream.write("\r\x1b[K")
                self._bar_shown = False
            super().emit(record)
            return
        try:
            stream.write("\r\x1b[K" + bar_text(fields))
            done = fields.get("done") or 0
            if done >= fields["total"]:
                stream.write("\n")  # finished: the bar stays as its line
                self._bar_shown = False
            else:
                self._bar_shown = True
            stream.flush()
        except Exception:  # noqa: BLE001 - logging must not raise; the handler reports it as usual
            self.handleError(record)

    def close(self) -> None:
        if self._bar_shown:
            try:
                self.stream.write("\n")
            except (OSError, ValueError):
                pass
            self._bar_shown = False
        super().close()


def bar_text(fields: dict[str, Any], width: int | None = None) -> str:
    """One progress bar line from a report's fields (tqdm's format: ``task:  45%|████   | 450/1000
    [00:12<00:15, 36.0rows/s]``; bytes in binary units)."""
    import shutil

    from tqdm import tqdm

    in_bytes = fields.get("unit") == "bytes"
    task = one_line(str(fields.get("task", "")))  # (a table's name, on the terminal's one line)
    return str(tqdm.format_meter(
        min(fields.get("done") or 0, fields["total"]), fields["total"], float(fields.get("elapsed_seconds") or 0.0),
        ncols=width or min(shutil.get_terminal_size((100, 20)).columns, 120), prefix=task,
        unit="B" if in_bytes else f" {fields.get('unit', 'it')}", unit_scale=in_bytes, unit_divisor=1024))


def _utc(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


#: What a text line never holds as it is: C0 and C1 control characters, DEL, and the characters other
#: programs break lines at (``str.splitlines`` does at all of these)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def one_line(text: str) -> str:
    """``text`` with each control character written as an escape (``\\n``, ``\\r``, ``\\t``, ``\\x1b``,
    ``\\u2028``). Why: messages carry names the source chose (a table named ``x\\n2026-... ERROR ...: ...``),
    and a raw newline in one would start a line that reads as a record of its own."""
    return _CONTROL.sub(lambda m: _escape(m.group()), text)


def indented_traceback(text: str) -> str:
    """A traceback under the line of its record: every line indented by four spaces and escaped as
    :func:`one_line`, so that none of it (an exception's message with a newline included) starts at
    the left margin, where records start."""
    return "\n".join("    " + one_line(line) for line in text.split("\n"))


class TextFormatter(logging.Formatter):
    """``2026-11-23T21:09:08.123Z INFO applier.mirror: message``: one line per record, whatever the
    message holds (:func:`one_line`); a traceback follows on lines of its own, indented."""

    def format(self, record: logging.LogRecord) -> str:
        text = one_line(scrub(f"{_utc(record)} {record.levelname} {record.name}: {record.getMessage()}"))
        if record.exc_info:
            text += "\n" + indented_traceback(scrub(self.formatException(record.exc_info)))
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg (and exc with a traceback; ``progress`` with the
    numbers of a progress line: task, done, total, unit, rate_per_s, eta_seconds...)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"ts": _utc(record), "level": record.levelname, "logger": record.name,
                                 "msg": scrub(record.getMessage())}
        fields = progress_fields(record)
        if fields is not None:
            entry["progress"] = fields
        if record.exc_info:
            entry["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def configure(level: int = logging.INFO, fmt: str = "text") -> None:
    """(Re)configure the root logger's applier handler; calling it again replaces the previous one."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, _StderrHandler):
            root.removeHandler(h)
    handler = _StderrHandler(bars=fmt != "json")
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
