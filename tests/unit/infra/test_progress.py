"""The catch-up's progress fields: done fraction, net rate and ETA of a backlog of WAL bytes."""

from applier.infra.progress import Backlog, byte_size


def test_a_backlog_worked_down_says_how_much_is_done_the_rate_and_when_it_ends():
    backlog = Backlog(100 << 20, clock=0.0)
    assert backlog.line(60 << 20, clock=10.0) == "60.0 MB behind, 40% of 100.0 MB done, 4.0 MB/s, ETA 15s"
    assert backlog.line(0, clock=20.0) == "caught up"


def test_a_mirror_that_falls_further_behind_says_so_instead_of_an_eta():
    backlog = Backlog(10 << 20, clock=0.0)
    line = backlog.line(12 << 20, clock=5.0)
    assert "not catching up" in line and "ETA" not in line and "0% of 10.0 MB done" in line


def test_sizes_in_binary_units():
    assert [byte_size(n) for n in (512, 1536, 5 << 30)] == ["512 B", "1.5 kB", "5.0 GB"]


def test_a_count_against_its_total_or_an_estimate():
    from applier.infra.progress import count_line

    assert count_line(1_200, 40_000, 2.0, "rows", estimate=True) == "1,200 rows of ~40,000 (3%), 600 rows/s, ETA 65s"
    assert count_line(50, 50, 1.0, "messages") == "50 messages of 50 (100%), 50 messages/s"
    assert count_line(7, None, 0.0, "rows") == "7 rows, 0 rows/s"


def test_the_numbers_travel_with_the_line_as_fields():
    from applier.infra.progress import ProgressReport, count_fields

    report = ProgressReport("x", count_fields("replay", 1_200, 40_000, 2.0, "messages"))
    assert report == "x" and isinstance(report, str)  # every progress callback takes it as a line
    assert report.fields == {"task": "replay", "done": 1_200, "total": 40_000, "unit": "messages",
                             "rate_per_s": 600.0, "eta_seconds": 64.7, "elapsed_seconds": 2.0}
    backlog = Backlog(100 << 20, clock=0.0).fields(60 << 20, clock=10.0)
    assert backlog["done"] == 40 << 20 and backlog["total"] == 100 << 20 and backlog["behind_bytes"] == 60 << 20
    assert backlog["eta_seconds"] == 15.0 and backlog["unit"] == "bytes"


class _Terminal:
    """A stream that says it is a terminal (what a user's stderr is), recording what is written."""

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


def _records(monkeypatch, fmt: str, messages: list[object]) -> str:
    import logging
    import sys

    from applier.commands.logsetup import configure

    stream = _Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    configure(logging.INFO, fmt)
    log = logging.getLogger("applier.test")
    for message in messages:
        log.info("%s", message)
    return stream.text


def test_on_a_terminal_a_progress_line_with_a_total_is_a_live_bar(monkeypatch):
    from applier.infra.progress import ProgressReport, count_fields

    half = ProgressReport("copied half", count_fields("snapshot: public.t", 500, 1000, 10.0, "rows"))
    more = ProgressReport("copied more", count_fields("snapshot: public.t", 900, 1000, 18.0, "rows"))
    text = _records(monkeypatch, "text", [half, more, "a plain line", ProgressReport("no total", {"task": "x"})])
    clear = "\r\x1b[K"
    draws = text.split(clear)
    assert draws[0] == ""
    assert draws[1].startswith("snapshot: public.t:  50%|") and "500/1000" in draws[1] and "\n" not in draws[1]
    assert draws[2].startswith("snapshot: public.t:  90%|") and "\n" not in draws[2]  # redrawn in place
    # any other line clears the bar first; a progress line without a total stays a log line
    [plain, no_total] = draws[3].splitlines()
    assert plain.endswith("INFO applier.test: a plain line") and no_total.endswith("INFO applier.test: no total")
    assert len(draws) == 4


def test_json_logs_carry_the_numbers(monkeypatch):
    import json

    from applier.infra.progress import ProgressReport, count_fields

    text = _records(monkeypatch, "json", [ProgressReport("copied", count_fields("snapshot: t", 5, 10, 1.0, "rows")),
                                          "plain"])
    first, second = (json.loads(line) for line in text.splitlines())
    assert first["msg"] == "copied" and first["progress"]["done"] == 5 and first["progress"]["total"] == 10
    assert "progress" not in second and "\r" not in text  # JSON lines draw no bars, even on a terminal
