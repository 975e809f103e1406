"""The key ranges a delta-rs MERGE's condition names (applier.sink.store.rsmerge.key_ranges): every key of
the batch inside one of them, at most ``most`` of them, and apart where the keys are far apart, so that a
batch of recent keys and one old key does not read the files of every key between them."""

from __future__ import annotations

import itertools
import random

import pyarrow as pa
import pytest

from applier.sink.store.rsmerge import key_ranges


def test_recent_keys_and_an_old_one_are_two_ranges():
    keys = pa.array([-1, *range(11_900_000, 12_000_000)], pa.int64())
    assert key_ranges(keys) == [(-1, -1), (11_900_000, 11_999_999)]


def test_keys_close_together_are_one_range():
    assert key_ranges(pa.array(range(1000), pa.int32())) == [(0, 999)]
    assert key_ranges(pa.array([7], pa.int16())) == [(7, 7)]
    assert key_ranges(pa.array([-1, *range(1_000_000)], pa.int64())) == [(-1, 999_999)]


def test_the_whole_span_of_int8_without_an_overflow():
    keys = pa.array([-2**63, -2**62, 1, 7, 100, 2**62, 2**63 - 1], pa.int64())
    assert key_ranges(keys) == [(-2**63, -2**63), (-2**62, -2**62), (1, 100), (2**62, 2**62),
                                (2**63 - 1, 2**63 - 1)]


def test_the_nearest_runs_are_joined_down_to_most():
    keys = pa.array([0, 10, 50, 51, 100, 1000, 5000, 5001, 9000], pa.int64())
    assert key_ranges(keys, most=3) == [(0, 1000), (5000, 5001), (9000, 9000)]
    assert key_ranges(keys, most=1) == [(0, 9000)]


@pytest.mark.parametrize("seed", range(20))
def test_every_key_is_in_a_range(seed):
    rng = random.Random(seed)
    clusters = [rng.randrange(-10**12, 10**12) for _ in range(rng.randrange(1, 12))]
    values = [c + rng.randrange(0, 10**rng.randrange(1, 7)) for c in clusters for _ in range(rng.randrange(1, 200))]
    most = rng.randrange(1, 10)
    ranges = key_ranges(pa.array(values, pa.int64()), most=most)
    assert 1 <= len(ranges) <= most
    assert all(lo <= hi for lo, hi in ranges)
    assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges))  # apart, in order
    assert all(any(lo <= v <= hi for lo, hi in ranges) for v in values)
    assert {lo for lo, _ in ranges} <= set(values) and {hi for _, hi in ranges} <= set(values)  # tight
