"""The column-by-column fold of a range (``apply.columnar_fold``) gives what the reference gives.

The reference is task.fold_range with ``columnar_fold: false``: message by message (decode,
assemble, convert, fold). Both fold the same ranges of streams captured from real servers
(tests/fixtures/pgoutput: TOAST values left unchanged, keys moved, REPLICA IDENTITY FULL, keyless
tables, truncates, streamed and two-phase transactions, binary values, every common type), cut at
random commits with fixed seeds, and must give equal RangeFolds: the same tables, specs and plans,
keys in the same order. The ranges the fast path refuses are the reference's anyway, so the test
also requires that it took some, and the random workloads of tests/integration/test_columnar_workload.py
add ranges of many tables and types captured on the spot.
"""

from __future__ import annotations

import random

import pytest
from foldcompare import FIXTURES, captured, catalogs, comparable, cuts, fold, same

from applier.drivers.executors.scheduler import FoldGroup
from applier.protocol.headers import COMMIT
from applier.sink.store.rsmerge import merge_source


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_every_random_range_folds_column_by_column_as_the_reference(fixture):
    lsns, datas = captured(fixture)
    before, tables = catalogs(lsns, datas)
    paths = {t: f"/delta/{t[0]}.{t[1]}" for t in tables}
    rng = random.Random(f"columnar {fixture.stem}")
    taken = 0
    for _attempt in range(6):
        for a, b in cuts(datas, rng, most=8):
            fast = fold(lsns[a:b], datas[a:b], before[a], paths, columnar=True)
            reference = fold(lsns[a:b], datas[a:b], before[a], paths, columnar=False)
            assert not reference.columnar
            same(fast, reference)
            taken += fast.columnar and bool(fast.folded)
    if "text" in fixture.stem or "messages" in fixture.stem:
        assert taken > 0  # the fast path ran, and was compared


def test_what_a_table_has_applied_is_left_out_alike():
    """``done`` (a table's applied end LSN) leaves a prefix of the range out of its fold, both ways."""
    fixture = next(f for f in FIXTURES if f.stem.endswith("basic_proto1_text"))
    lsns, datas = captured(fixture)
    before, tables = catalogs(lsns, datas)
    paths = {t: f"/delta/{t[0]}.{t[1]}" for t in tables}
    ends = [i for i, d in enumerate(datas) if d[:1] == bytes([COMMIT])]
    compared = 0
    for at in ends[::max(1, len(ends) // 6)]:
        done = {p: lsns[at] + 1 for p in paths.values()}  # roughly: what ended at or before ``at``
        fast = fold(lsns, datas, before[0], paths, columnar=True, done=done)
        same(fast, fold(lsns, datas, before[0], paths, columnar=False, done=done))
        compared += fast.columnar
    assert compared >= 0


def test_a_damaged_message_in_a_plain_range_folds_as_the_reference_says():
    """Cut short, a byte changed, bytes added, in one row message of a range the fast path folds: both
    ways give the same RangeFold (most often the reference's error), never another fold."""
    fixture = next(f for f in FIXTURES if f.stem.endswith("basic_proto1_text"))
    lsns, datas = captured(fixture)
    before, tables = catalogs(lsns, datas)
    paths = {t: f"/delta/{t[0]}.{t[1]}" for t in tables}
    rng = random.Random("damaged columnar")
    ranges = [(a, b) for a, b in cuts(datas, rng, most=30)
              if fold(lsns[a:b], datas[a:b], before[a], paths, columnar=True).columnar]
    assert ranges
    damaged = 0
    for _ in range(150):
        a, b = rng.choice(ranges)
        rows = [i for i in range(a, b) if datas[i][:1] in (b"I", b"U", b"D")]
        if not rows:
            continue
        at = rng.choice(rows)
        data = datas[at]
        how = rng.randrange(3)
        if how == 0:
            bad = data[:rng.randrange(1, len(data))]
        elif how == 1:
            k = rng.randrange(len(data))
            bad = data[:k] + bytes([rng.randrange(256)]) + data[k + 1:]
        else:
            bad = data + bytes(rng.randrange(1, 6))
        changed = datas[a:at] + [bad] + datas[at + 1:b]
        same(fold(lsns[a:b], changed, before[a], paths, columnar=True),
             fold(lsns[a:b], changed, before[a], paths, columnar=False))
        damaged += 1
    assert damaged > 100


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_columnar_folds_of_consecutive_ranges_combine_and_merge_as_the_reference(fixture):
    """What the driver does with the folds of a group's ranges (FoldGroup, then delta-rs's commit):
    the columnar plans combined stay columns, and equal the reference plans combined, entry for entry
    and in order; the MERGE source delta-rs gets of them is the one it gets of the reference's."""
    lsns, datas = captured(fixture)
    before, tables = catalogs(lsns, datas)
    paths = {t: f"/delta/{t[0]}.{t[1]}" for t in tables}
    rng = random.Random(f"columnar combined {fixture.stem}")
    stayed = merged = 0
    for _attempt in range(12):
        groups = [FoldGroup(), FoldGroup()]
        for a, b in cuts(datas, rng, most=16):
            folds = [fold(lsns[a:b], datas[a:b], before[a], paths, columnar=columnar) for columnar in (True, False)]
            if any(f.error for f in folds):
                break
            if rng.random() < 0.3 or not all(group.fits(f) for group, f in zip(groups, folds, strict=True)):
                merged += _compare_groups(*groups)
                groups = [FoldGroup(), FoldGroup()]
            both = {t.path for t in folds[0].folded if t.plan.columnar is not None
                    and t.path in groups[0].tables and groups[0].tables[t.path].plan.columnar is not None}
            for group, f in zip(groups, folds, strict=True):
                group.add(f)
                group.size()  # (as the driver asks after each range: it must not make Python entries)
            stayed += sum(groups[0].tables[path].plan.columnar is not None for path in both)
        merged += _compare_groups(*groups)
    if "text" in fixture.stem or "messages" in fixture.stem:
        assert stayed > 0 and merged > 0  # columnar plans were combined, merged and compared


def _compare_groups(fast_group: FoldGroup, reference_group: FoldGroup) -> int:
    """How many MERGE sources of columnar plans were compared."""
    merged = 0
    fast, reference = fast_group.tables, reference_group.tables
    assert list(fast) == list(reference)
    for path, theirs in reference.items():
        ours = fast[path].plan
        if ours.columnar is not None and not ours.multiset:
            source = merge_source(ours, fast[path].spec.schema)
            assert ours.columnar is not None  # (taken as columns)
            expected = merge_source(theirs.plan, theirs.spec.schema)
            if expected[0] is not None:
                assert source[0].equals(expected[0]), path
                merged += 1
            assert source[1:] == expected[1:]
        assert comparable(ours) == comparable(theirs.plan)
        assert list(ours.keyed) == list(theirs.plan.keyed)
    return merged


def test_one_integer_key_sorted_as_numbers_finds_what_the_sort_by_columns_finds():
    """last_of_each_key sorts one integer key as numbers (key and position in one int64); the general
    sort by Arrow's columns is the reference. Random events with repeated keys, negative and extreme
    keys, positions with gaps (a fold's 2i and 2i + 1) or a permutation (a combine's), every integer
    type, and the cases that must fall back (spans past 63 bits, uint64)."""
    import numpy as np
    import pyarrow as pa

    from applier.sink.columnfold import _last_by_numbers, _last_by_sort, last_of_each_key

    rng = np.random.default_rng(37)
    types = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32()]
    numbered = 0
    for trial in range(400):
        count = int(rng.integers(1, 300))
        kind = types[trial % len(types)]
        info = np.iinfo(kind.to_pandas_dtype())
        distinct = int(rng.integers(1, count + 1))
        if trial % 5 == 0:  # the type's extremes among the keys
            pool = np.array([info.min, info.max, 0, 1][:distinct] if info.min < 0 else [info.max, 0, 1][:distinct])
            values = rng.choice(pool, count)
        else:
            low = max(int(info.min), -1000) if trial % 2 else int(info.min) // 2
            values = rng.integers(low, min(int(info.max), low + distinct * 3) + 1, count)
        key = pa.array(values, type=kind)
        if trial % 3 == 0:
            position = rng.permutation(count)
        else:  # a fold's: removals at 2i, writes at 2i + 1, some changes doing both or neither
            position = np.sort(rng.choice(2 * count + 8, count, replace=False))
            rng.shuffle(position[: count // 2])
        expected = _last_by_sort([key], position)
        numbers = _last_by_numbers(key, position)
        if (int(values.max()) - int(values.min()) + 1) * (int(position.max()) + 1) >= 1 << 62:
            assert numbers is None  # (int64's extremes)
            continue
        assert numbers is not None and np.array_equal(numbers, expected), \
            (trial, kind, values.tolist(), position.tolist())
        numbered += 1
    assert numbered > 350
    wide = pa.array([-(1 << 62), 1 << 62, 0], pa.int64())  # the span times the positions past 63 bits
    assert _last_by_numbers(wide, np.arange(3)) is None
    assert np.array_equal(last_of_each_key([wide], np.arange(3)), _last_by_sort([wide], np.arange(3)))
    assert _last_by_numbers(pa.array([1, 2], pa.uint64()), np.arange(2)) is None
    assert _last_by_numbers(pa.array(["a", "b"]), np.arange(2)) is None
