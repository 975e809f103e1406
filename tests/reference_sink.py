"""A pure-Python reference sink, for tests only: applies row images one by one, the way PostgreSQL's
apply worker does (no folding), so it is an independent oracle for the Delta sink's grouped MERGEs.

Keyed tables: dict key -> row; 'u' columns keep the current row's value (of the OLD key on a key
change). Key-less FULL-identity tables: a list, one matching row removed per update/delete.
"""

from __future__ import annotations

from typing import Any

from applier.assembly import CommittedTransaction
from applier.assembly.rowimage import row_images
from applier.values import UNCHANGED_TOAST


class ReferenceSink:
    def __init__(self, convert: Any) -> None:
        self.convert = convert  # (schema, TupleData) -> values, the pipeline's converter
        self.keyed: dict[str, dict[tuple[Any, ...], tuple[Any, ...]]] = {}
        self.bags: dict[str, list[tuple[Any, ...]]] = {}

    def rows(self, qualified: str) -> list[tuple[Any, ...]]:
        if qualified in self.bags:
            return list(self.bags[qualified])
        return list(self.keyed.get(qualified, {}).values())

    def apply(self, txn: CommittedTransaction) -> None:
        for change in txn.changes:
            for im in row_images(change, self.convert):
                name = im.schema.qualified_name
                if im.schema.relation.replica_identity == "f":
                    self._bag(name, im)
                else:
                    self._keyed(name, im)

    def _keyed(self, name: str, im: Any) -> None:
        table = self.keyed.setdefault(name, {})
        keys = im.schema.key_indexes
        if im.op == "T":
            table.clear()
            return
        old_key = im.identity_key
        if im.op == "D":
            del table[old_key]
            return
        new_key = tuple(im.new[i] for i in keys)
        current = table.get(old_key if old_key is not None else new_key)
        row = tuple(current[i] if v is UNCHANGED_TOAST else v for i, v in enumerate(im.new))
        if old_key is not None and old_key != new_key:
            del table[old_key]
        table[new_key] = row

    def _bag(self, name: str, im: Any) -> None:
        bag = self.bags.setdefault(name, [])
        if im.op == "T":
            bag.clear()
            return
        if im.op in ("U", "D"):
            bag.remove(im.old)  # exactly one matching row
        if im.op in ("I", "U"):
            bag.append(tuple(o if v is UNCHANGED_TOAST else v for v, o in zip(im.new, im.old or im.new, strict=True)))
