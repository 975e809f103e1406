"""One record, one line: a name from the source that holds a newline (or any control character) cannot
forge a record in the text log or in the error line a command ends with; a traceback stays under its
record, indented; JSON lines carry the message as it is."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys

from applier.cli import _report
from applier.commands.logsetup import JsonFormatter, TextFormatter, bar_text, one_line
from applier.errors import ConfigError

FORGED = "x\n2026-12-07T00:00:00.000Z ERROR applier.fake: forged"
RECORD = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ \S+: ")


def _record(message: str, *args: object, exc_info: object = None) -> logging.LogRecord:
    return logging.LogRecord("applier.mirror", logging.INFO, __file__, 1, message, args or None,
                             exc_info)  # type: ignore[arg-type]


def test_a_name_with_a_newline_stays_on_its_record_line() -> None:
    line = TextFormatter().format(_record("copying %s", FORGED))
    assert line.splitlines() == [line] and len(RECORD.findall(line)) == 1
    assert line.endswith("INFO applier.mirror: copying x\\n2026-12-07T00:00:00.000Z ERROR applier.fake: forged")


def test_every_control_character_and_line_separator_is_escaped() -> None:
    text = one_line("a\rb\tc\x1b[2Kd\x00e\x7ff\x85g\u2028h\u2029i\x0bj ü")
    assert text == "a\\rb\\tc\\x1b[2Kd\\x00e\\x7ff\\x85g\\u2028h\\u2029i\\x0bj ü"
    assert text.splitlines() == [text] and text.isprintable()


def test_a_traceback_follows_its_record_indented_and_cannot_forge_one() -> None:
    try:
        raise ValueError(f"cannot open {FORGED}")
    except ValueError:
        text = TextFormatter().format(_record("the run failed", exc_info=sys.exc_info()))
    first, *rest = text.split("\n")
    assert RECORD.match(first) and first.endswith("the run failed")
    assert rest[0] == "    Traceback (most recent call last):" and rest[-2] == "    ValueError: cannot open x"
    # the exception's own newline is kept, as Python prints it, but its next line is the traceback's too
    assert rest[-1] == "    2026-12-07T00:00:00.000Z ERROR applier.fake: forged"
    assert all(line.startswith("    ") for line in rest) and not any(RECORD.match(line) for line in rest)


def test_json_lines_keep_the_message_as_it_is() -> None:
    line = JsonFormatter().format(_record("copying %s", FORGED))
    assert line.splitlines() == [line] and json.loads(line)["msg"] == f"copying {FORGED}"


def test_a_progress_bar_keeps_to_its_line() -> None:
    bar = bar_text({"task": f"snapshot: public.{FORGED}", "done": 1, "total": 2, "unit": "rows"}, width=200)
    assert "\n" not in bar and "public.x\\n2026" in bar


def test_the_error_line_a_command_ends_with_cannot_forge_a_record(capsys) -> None:
    args = argparse.Namespace(command="mirror", log_format="text")
    _report(args, f"error: {ConfigError('cannot write the table', table=f'public.{FORGED}')}")
    _report(args, f"error: {ConfigError('the config has problems', problems=['a.yaml:1: x: bad', 'a.yaml:2: y: bad'])}")
    try:
        raise RuntimeError(FORGED)
    except RuntimeError as e:
        import traceback

        _report(args, "internal error", detail="".join(traceback.format_exception(e)))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == ("applier mirror: error: cannot write the table (table=public.x\\n2026-12-07T00:00:00.000Z "
                        "ERROR applier.fake: forged)")
    assert lines[1:4] == ["applier mirror: error: the config has problems", "  a.yaml:1: x: bad", "  a.yaml:2: y: bad"]
    assert lines[4] == "applier mirror: internal error" and lines[5] == "    Traceback (most recent call last):"
    assert all(line.startswith(("applier mirror: ", "  ")) for line in lines)
