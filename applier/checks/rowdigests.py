"""Multisets of row digests in bounded memory, for ``verify`` (issue 77: row texts took 824 MB for 1M rows).

A row is kept as 24 bytes: a 16-byte digest of its canonical text and its ordinal in the stream (so the
first rows that differ can be found again, in stream order, by a second pass). The records go to one of
256 buckets by the digest's first byte; past a memory budget the buckets are appended to temporary files.
Two spools are compared bucket by bucket (one bucket's records in memory at a time), as multisets:
a digest counted more often on one side is that many rows only on that side.
"""

from __future__ import annotations

import heapq
import os
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

DIGEST_BYTES = 16
RECORD = struct.Struct(f"<{DIGEST_BYTES}sQ")  # digest, ordinal of the row in its stream
BUCKETS = 256
DEFAULT_BUDGET = 32 * 2**20  # in-memory records per spool before they go to disk (~1.4M rows)


class DigestSpool:
    """The digests of one stream's rows, with their ordinals, in buckets; spilled to files past ``budget``
    bytes. A context manager: its files are removed on exit."""

    def __init__(self, budget: int = DEFAULT_BUDGET) -> None:
        self.budget = budget
        self.rows = 0
        self.buckets = [bytearray() for _ in range(BUCKETS)]
        self.held = 0
        self.dir: tempfile.TemporaryDirectory[str] | None = None
        self.spilled = [False] * BUCKETS

    def add(self, digest: bytes) -> None:
        self.buckets[digest[0]] += RECORD.pack(digest, self.rows)
        self.rows += 1
        self.held += RECORD.size
        if self.held >= self.budget:
            self.spill()

    def spill(self) -> None:
        if self.dir is None:
            self.dir = tempfile.TemporaryDirectory(prefix="applier-verify-")
        for i, bucket in enumerate(self.buckets):
            if bucket:
                with open(os.path.join(self.dir.name, str(i)), "ab") as f:
                    f.write(bucket)
                self.spilled[i] = True
                self.buckets[i] = bytearray()
        self.held = 0

    def bucket(self, i: int) -> bytes:
        """Bucket ``i``'s records in stream order: those on disk, then those in memory."""
        if not self.spilled[i]:
            return bytes(self.buckets[i])
        assert self.dir is not None
        with open(os.path.join(self.dir.name, str(i)), "rb") as f:
            return f.read() + bytes(self.buckets[i])

    def close(self) -> None:
        self.buckets = [bytearray() for _ in range(BUCKETS)]
        if self.dir is not None:
            self.dir.cleanup()
            self.dir = None

    def __enter__(self) -> DigestSpool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Excess:
    """A digest counted ``count`` times more on one side than on the other; ``first``: the ordinal of its
    first row on that side."""

    first: int
    digest: bytes
    count: int


def _grouped(records: bytes) -> tuple[Any, Any, Any]:
    """Distinct digests (sorted), how often each occurs, and the ordinal of its first occurrence."""
    import numpy as np

    arr = np.frombuffer(records, dtype=np.dtype([("d", f"S{DIGEST_BYTES}"), ("o", "<u8")]))
    order = np.argsort(arr["d"], kind="stable")  # records are in stream order: first occurrence first
    digests, ordinals = arr["d"][order], arr["o"][order]
    if len(digests) == 0:
        return digests, np.zeros(0, dtype=np.int64), ordinals
    starts = np.flatnonzero(np.concatenate(([True], digests[1:] != digests[:-1])))
    counts = np.diff(np.append(starts, len(digests)))
    return digests[starts], counts, ordinals[starts]


def _excess(mine: tuple[Any, Any, Any], theirs: tuple[Any, Any, Any], limit: int) -> Iterator[Excess]:
    """Of the digests ``mine`` counts more often than ``theirs``, the ``limit`` first in ``mine``'s stream."""
    import numpy as np

    digests, counts, firsts = mine
    other, other_counts, _ = theirs
    if len(digests) == 0:
        return
    if len(other):
        at = np.searchsorted(other, digests)
        inside = np.minimum(at, len(other) - 1)
        counts = counts - np.where((at < len(other)) & (other[inside] == digests), other_counts[inside], 0)
    more = np.flatnonzero(counts > 0)
    if len(more) > limit:
        more = more[np.argpartition(firsts[more], limit - 1)[:limit]] if limit > 0 else more[:0]
    for i in more:
        yield Excess(int(firsts[i]), bytes(digests[i]).ljust(DIGEST_BYTES, b"\0"), int(counts[i]))


def first_differences(source: DigestSpool, target: DigestSpool, limit: int) -> tuple[list[Excess], list[Excess]]:
    """The digests found more often in ``source`` than in ``target``, and the other way round: of each,
    the ``limit`` whose first row comes first in its stream, in that order (enough for ``limit`` rows)."""
    only_source: list[Excess] = []
    only_target: list[Excess] = []
    for i in range(BUCKETS):
        src, tgt = _grouped(source.bucket(i)), _grouped(target.bucket(i))
        only_source = heapq.nsmallest(limit, [*only_source, *_excess(src, tgt, limit)], key=lambda e: e.first)
        only_target = heapq.nsmallest(limit, [*only_target, *_excess(tgt, src, limit)], key=lambda e: e.first)
    return only_source, only_target


class TextSpool:
    """Row texts of a stream that cannot be read twice, on disk (length-prefixed UTF-8) for the second pass."""

    def __init__(self) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="applier-verify-")

    def add(self, encoded: bytes) -> None:
        self.file.write(len(encoded).to_bytes(4, "little"))
        self.file.write(encoded)

    def texts(self) -> Iterator[bytes]:
        self.file.flush()
        self.file.seek(0)
        while head := self.file.read(4):
            yield self.file.read(int.from_bytes(head, "little"))

    def close(self) -> None:
        self.file.close()
