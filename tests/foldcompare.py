"""Shared by the two comparisons of the column-by-column fold with the reference (tests/unit/sink and
tests/integration test_columnar_fold.py): ranges cut at random commits, each folded both ways by
task.fold_range, and the RangeFolds compared."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path

from applier.catalog import RelationCache
from applier.config import ApplySettings, TablesSettings
from applier.drivers.executors.ranges import FoldJob, LogRange, RangeFold
from applier.drivers.executors.task import fold_range
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.headers import COMMIT
from applier.protocol.messages import Relation, Type
from applier.sink.plan import TablePlan, freeze

FIXTURES = sorted((Path(__file__).resolve().parent / "fixtures" / "pgoutput").glob("pg*.jsonl"))


def captured(fixture: Path) -> tuple[list[int], list[bytes]]:
    rows = [json.loads(line) for line in fixture.read_text().splitlines()]
    return [parse_lsn(r["lsn"]) for r in rows], [bytes.fromhex(r["data"]) for r in rows]


def catalogs(lsns: list[int], datas: list[bytes]) -> tuple[list[dict], set[tuple[str, str]]]:
    """The catalog before each message (as the driver's survey hands a range its start), and every table."""
    decoder, cache = MessageDecoder(), RelationCache()
    before, tables = [], set()
    for lsn, data in zip(lsns, datas, strict=True):
        before.append(cache.to_json())
        msg = decoder.decode(data, lsn)
        if isinstance(msg, Relation):
            cache.update(msg)
            tables.add((msg.namespace or "pg_catalog", msg.name))
        elif isinstance(msg, Type):
            cache.update_type(msg)
    return before, tables


def cuts(datas: list[bytes], rng: random.Random, *, most: int) -> list[tuple[int, int]]:
    """Ranges of whole top-level transactions: cut after random Commits (the rest goes to the last)."""
    ends = [i + 1 for i, d in enumerate(datas) if d[:1] == bytes([COMMIT])]
    chosen = sorted(rng.sample(ends, min(len(ends), rng.randint(1, most))))
    starts = [0] + chosen
    return [(a, b) for a, b in zip(starts, chosen + [len(datas)], strict=True) if b > a]


def fold(lsns: list[int], datas: list[bytes], catalog: dict, paths: dict, *, columnar: bool,
         done: dict[str, int] | None = None, **apply) -> RangeFold:
    log_range = LogRange(0, (), catalog, len(datas), lsns[0], lsns[-1], inline=(lsns, datas))
    job = FoldJob(log_range, ApplySettings(columnar_fold=columnar, **apply), TablesSettings(), paths, done or {})
    return fold_range(job)


def comparable(plan: TablePlan) -> object:
    """The plan with NaN made one value (two NaN floats are the same row, but not ``==``)."""
    return (replace(plan, _keyed={}, columnar=None, counts=Counter(), images={}),
            [(k, freeze(e.row), e.unresolved, freeze(e.lookup_key)) for k, e in plan.keyed.items()],
            {freeze(k): n for k, n in plan.counts.items()}, {freeze(k): freeze(v) for k, v in plan.images.items()})


def same(fast: RangeFold, reference: RangeFold) -> None:
    assert fast.error == reference.error
    assert (fast.transactions, fast.last_end_lsn, fast.last_commit_time) == \
        (reference.transactions, reference.last_end_lsn, reference.last_commit_time)
    assert fast.messages == reference.messages and fast.skipped == reference.skipped
    assert [f.path for f in fast.folded] == [f.path for f in reference.folded]
    for ours, theirs in zip(fast.folded, reference.folded, strict=True):
        assert ours.spec == theirs.spec and ours.schema is not None and ours.schema.relation == theirs.schema.relation
        assert comparable(ours.plan) == comparable(theirs.plan)
        assert list(ours.plan.keyed) == list(theirs.plan.keyed)  # the same order too
        for key, entry in ours.plan.keyed.items():  # values of the same types (== says 1 == 1.0 == True)
            other = theirs.plan.keyed[key]
            assert [type(v) for v in entry.row or ()] == [type(v) for v in other.row or ()], key
