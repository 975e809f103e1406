"""Random groups of changes for the store contract tests (tests/unit/sink/test_store_contract.py for
delta-rs, tests/integration/sink/test_store_contract_spark.py for Spark, each against the in-memory
store): updates whose unchanged TOAST value must come from the committed row, and a key-less table's
row copies, NULLs included (matched as equal, as PostgreSQL's FULL identity matches them)."""

from __future__ import annotations

import random

from applier.changes import OP_DELETE, OP_INSERT, OP_TRUNCATE, OP_UPDATE, TableChange
from applier.values import UNCHANGED_TOAST


def changes_group(rng: random.Random, live: dict[int, str], n: int, *, keys: int, moved_to: int, truncate: float,
                  insert: float, delete: float, move: float, values: int = 100) -> list[TableChange]:
    """Inserts, updates, deletes, key changes (to a key in ``keys``..``moved_to``) and truncates of a keyed
    table ``(id, a)`` whose rows ``live`` holds; each change's chance is its roll's range, the threshold
    given (a key not live is always inserted)."""
    out: list[TableChange] = []
    for i in range(n):
        key, roll = rng.randrange(keys), rng.random()
        if roll < truncate:
            out.append(TableChange(OP_TRUNCATE, None, None, None, i))
            live.clear()
        elif key not in live or roll < insert:
            live[key] = f"v{rng.randrange(values)}"
            out.append(TableChange(OP_INSERT, None, None, (key, live[key]), i))
        elif roll < delete:
            del live[key]
            out.append(TableChange(OP_DELETE, (key,), None, None, i))
        elif roll < move and (moved := rng.randrange(keys, moved_to)) not in live:  # a key change
            live[moved] = live.pop(key)
            out.append(TableChange(OP_UPDATE, (key,), None, (moved, live[moved]), i))
        else:
            live[key] = f"u{rng.randrange(values)}"
            out.append(TableChange(OP_UPDATE, None, None, (key, live[key]), i))
    return out


def keyed_group(rng: random.Random, live: dict[int, str], n: int) -> list[TableChange]:
    """Updates that leave ``a`` unchanged (TOAST): its value comes from the row as committed before."""
    out = []
    for i in range(n):
        key, roll = rng.randrange(6), rng.random()
        if key not in live:
            live[key] = f"v{rng.randrange(50)}"
            out.append(TableChange(OP_INSERT, None, None, (key, live[key]), i))
        elif roll < 0.3:
            del live[key]
            out.append(TableChange(OP_DELETE, (key,), None, None, i))
        else:
            out.append(TableChange(OP_UPDATE, None, None, (key, UNCHANGED_TOAST), i, new_partial=True))
    return out


def bag_group(rng: random.Random, bag: list[tuple[int, str | None]], n: int) -> list[TableChange]:
    out = []
    for i in range(n):
        if bag and rng.random() < 0.4:
            row = bag.pop(rng.randrange(len(bag)))
            if rng.random() < 0.5:
                out.append(TableChange(OP_DELETE, None, row, None, i))
            else:
                new = (row[0], rng.choice(["w0", "w1", None]))
                bag.append(new)
                out.append(TableChange(OP_UPDATE, None, row, new, i))
        else:
            row = (rng.randrange(3), rng.choice(["w0", "w1", None]))  # few images: duplicates are the point
            bag.append(row)
            out.append(TableChange(OP_INSERT, None, None, row, i))
    return out
