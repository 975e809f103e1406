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
