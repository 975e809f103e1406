"""verify's comparison keeps digests, not row texts (issue 77), and reports what it reported before.

The reference below is the comparison as it was: a Counter of every row's text on each side, and the
first ``show`` elements of each difference."""

from __future__ import annotations

import os
import random
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest

from applier.checks import rowdigests
from applier.checks.verify import compare, row_text


def reference(src: list[tuple[Any, ...]], tgt: list[tuple[Any, ...]], show: int) -> tuple[list[str], list[str]]:
    a, b = Counter(row_text(r) for r in src), Counter(row_text(r) for r in tgt)
    return list((a - b).elements())[:show], list((b - a).elements())[:show]


def random_rows(rng: random.Random, n: int) -> list[tuple[Any, ...]]:
    values = [None, "a", "b\\c", "x\x1fy", "\udcff", 1, 2, Decimal("1.50"), Decimal("1.5"), 1.0, float("nan"),
              datetime(2024, 1, 1, tzinfo=UTC), b"\x00", True, [1, None], {"k": 1}]
    return [(rng.randrange(20), rng.choice(values)) for _ in range(n)]


@pytest.mark.parametrize("form", ["iterator", "function", "list", "spilled"])
def test_same_report_as_the_texts_gave(form: str) -> None:
    rng = random.Random(77)
    for _ in range(60):
        src = random_rows(rng, rng.randrange(0, 80))
        tgt = [r for r in src if rng.random() < 0.8] + random_rows(rng, rng.randrange(0, 10))
        rng.shuffle(tgt)
        show = rng.choice([0, 1, 3, 10, 1000])

        def given(rows: list[tuple[Any, ...]]) -> Any:
            if form == "iterator":
                return iter(rows)
            if form == "list":
                return rows
            return lambda: iter(rows)

        budget = 48 if form == "spilled" else rowdigests.DEFAULT_BUDGET  # two records: spills all the time
        res = compare("t", given(src), given(tgt), show=show, budget=budget)
        assert (res.only_in_source, res.only_in_target) == reference(src, tgt, show)
        assert res.equal == (Counter(map(row_text, src)) == Counter(map(row_text, tgt)))
        assert (res.source_rows, res.target_rows) == (len(src), len(tgt))


def test_duplicates_are_counted_and_listed_in_first_seen_order() -> None:
    src = [("a",), ("b",), ("a",), ("c",), ("a",)]
    res = compare("t", lambda: iter(src), iter([("b",), ("a",), ("d",)]))
    assert not res.equal
    assert res.only_in_source == ["a", "a", "c"] and res.only_in_target == ["d"]
    assert compare("t", iter([(1, "a")] * 3), iter([(1, "a")] * 3)).equal


def test_spilled_digests_are_removed(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    res = compare("t", iter([(i,) for i in range(500)]), iter([(i,) for i in range(1, 501)]), budget=240)
    assert res.only_in_source == ["0"] and res.only_in_target == ["500"]
    assert os.listdir(tmp_path) == []


def test_the_second_pass_stops_at_the_rows_it_lists() -> None:
    """A side given as a function is read again on a mismatch, only as far as its listed rows, and closed."""
    reads: list[int] = []
    closed: list[bool] = []

    def rows() -> Iterator[tuple[int]]:
        reads.append(0)
        try:
            for i in range(1000):
                reads[-1] += 1
                yield (i,)
        finally:
            closed.append(True)

    res = compare("t", rows, iter([(i,) for i in range(5, 1000)]), show=3)
    assert res.only_in_source == ["0", "1", "2"] and res.only_in_target == []
    assert reads == [1000, 3] and closed == [True, True]


def test_memory_is_digests_not_row_texts() -> None:
    """100k rows of ~60 characters on each side, a few differing: the old comparison held each side's texts
    (30 MB traced here); this one holds their digests (24 bytes a row; 10 MB traced in all)."""
    n = 100_000

    def side(changed: bool) -> Iterator[tuple[Any, ...]]:
        for i in range(n):
            yield (i, f"name {i:08d} " + "x" * 40 + ("!" if changed and i % 25_000 == 0 else ""), Decimal(i) / 100)

    tracemalloc.start()
    try:
        res = compare("t", lambda: side(False), lambda: side(True), show=10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not res.equal and len(res.only_in_source) == len(res.only_in_target) == 4
    assert res.only_in_target[0].startswith("0\x1fname 00000000 xxx") and res.only_in_target[0].endswith("!\x1f0")
    assert peak < 2 * n * rowdigests.RECORD.size * 2 + 4 * 2**20, f"{peak / 2**20:.1f} MB traced"
