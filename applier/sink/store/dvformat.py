"""Delta deletion vectors, byte for byte: the bitmap, the DV file, the descriptor and Delta's Z85.

Why: delta-rs 1.6 reads deletion vectors but writes none, so through it a MERGE that deletes or updates a
few thousand rows of a big table rewrites every file those rows are in. applier writes the deletion
vectors itself and keeps the files. This module is only the formats (no I/O but :func:`read_dv`'s local
read), checked against Delta's PROTOCOL.md ("Deletion Vectors", "Deletion Vector Format") and Spark's
implementation (RoaringBitmapArray, DeletionVectorStore, DeletionVectorDescriptor, Codec.Base85Codec).

Row positions are numpy uint64 arrays, sorted and unique; every step is vectorized, so a commit that
deletes millions of rows costs a Python loop per 2^32 bucket and per bitmap or run container (at most
one per 2^16 positions), never one per row or per array container.

The bitmap (all little endian): int32 magic 1681511377, then RoaringFormatSpec's portable 64-bit format
(int64 number of buckets, then per bucket in ascending order an uint32 key, the high 32 bits, and a
standard 32-bit Roaring bitmap of the low 32 bits). Delta requires the top bit of every key clear, and
Spark's reader keeps a bitmap per key up to the largest in an array, so applier writes keys below 2^31 - 1.

The file (big endian): one version byte (1), then per DV an int32 size, the bitmap, and the CRC-32 of the
bitmap. A descriptor's ``offset`` points at the size, ``sizeInBytes`` is the size.
"""

from __future__ import annotations

import uuid as uuidlib
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
import numpy.typing as npt

from applier.errors import SinkError

#: RoaringBitmapArray's portable format (Spark's PortableRoaringBitmapArraySerializationFormat). Its
#: "native" format (1681511376) is Spark-internal and never stored in a table.
MAGIC = 1681511377
#: The first byte of a DV file.
FILE_FORMAT_VERSION = 1
#: RoaringFormatSpec's cookies: no run containers (then an int32 container count follows), or runs (the
#: high 16 bits hold the container count - 1).
COOKIE_NO_RUNS = 12346
COOKIE_RUNS = 12347
#: With COOKIE_RUNS the offset header is only written from this many containers on.
NO_OFFSET_THRESHOLD = 4
#: A container of up to this many values is an array of uint16, above a bitmap of 2^16 bits (8 KiB).
ARRAY_MAX = 4096
BITMAP_BYTES = 8192
#: A Z85-encoded uuid's length: the random prefix of a 'u' descriptor is what comes before it.
ENCODED_UUID_LENGTH = 20

Z85_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_ENCODE = np.frombuffer(Z85_ALPHABET.encode("ascii"), dtype=np.uint8)
_Z85_DECODE = np.full(256, 255, dtype=np.uint8)
_Z85_DECODE[_Z85_ENCODE] = np.arange(85, dtype=np.uint8)
_Z85_POWERS = np.array([85**4, 85**3, 85**2, 85, 1], dtype=np.uint64)

_INT32_MAX = 2**31 - 1
#: The largest key Spark's RoaringBitmapArray holds (an array of key + 1 bitmaps, Java's limit 2^31 - 1).
MAX_POSITION = ((_INT32_MAX - 1) << 32) | 0xFFFFFFFF
#: Spark's other RoaringBitmapArray format, in memory only: never in a table, not in the protocol.
_NATIVE_MAGIC = 1681511376

Positions = npt.NDArray[np.uint64]


class DeletionVectorError(SinkError):
    """A deletion vector that cannot be read: bad magic, cookie or checksum, truncated, inconsistent. The
    table is damaged (or written by a writer this module does not know): a MERGE stops on it rather than
    treat deleted rows as live."""


# ----------------------------------------------------------------------------------------------- bitmap


def encode_positions(positions: npt.ArrayLike) -> bytes:
    """``positions`` (sorted, unique, at most MAX_POSITION) as Delta's portable RoaringBitmapArray bytes.

    Containers are arrays up to 4096 values and bitmaps above, never runs (every reader reads all three; a
    DELETE's bitmap then has Spark's own bytes unless its run-optimize found runs smaller). Only non-empty
    buckets are written: Spark writes one per key up to the largest, but the format allows gaps and Spark's
    reader fills them."""
    pos = _checked_positions(positions)
    out = [np.array([MAGIC], dtype="<i4").tobytes()]
    if pos.size == 0:
        out.append(np.zeros(1, dtype="<u8").tobytes())
        return b"".join(out)
    chunk = pos >> np.uint64(16)  # (bucket key << 16) | container key: one value per container
    starts = np.flatnonzero(np.concatenate(([True], chunk[1:] != chunk[:-1])))
    ends = np.append(starts[1:], pos.size)
    cards = ends - starts
    ckeys = chunk[starts]
    bkeys = ckeys >> np.uint64(16)
    bstarts = np.flatnonzero(np.concatenate(([True], bkeys[1:] != bkeys[:-1])))
    bends = np.append(bstarts[1:], ckeys.size)
    out.append(np.array([bstarts.size], dtype="<u8").tobytes())
    low16 = (pos & np.uint64(0xFFFF)).astype("<u2")
    for b0, b1 in zip(bstarts.tolist(), bends.tolist(), strict=True):
        out.append(np.array([bkeys[b0]], dtype="<u4").tobytes())
        out.append(_encode_roaring32(low16, ckeys[b0:b1], starts[b0:b1], cards[b0:b1]))
    return b"".join(out)


def _checked_positions(positions: npt.ArrayLike) -> Positions:
    arr = np.asarray(positions)
    if arr.ndim != 1:
        raise ValueError(f"row positions must be one-dimensional, not of shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.uint64)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"row positions must be integers, not {arr.dtype}")
    if np.issubdtype(arr.dtype, np.signedinteger) and bool(np.any(arr < 0)):
        raise ValueError(f"row positions must not be negative: {arr.min()}")
    pos = arr.astype(np.uint64, copy=False)
    if pos.size > 1 and bool(np.any(pos[1:] <= pos[:-1])):
        raise ValueError("row positions must be sorted and unique")
    if pos[-1] > np.uint64(MAX_POSITION):
        raise ValueError(f"row position {pos[-1]} is above {MAX_POSITION}, the largest Spark can read")
    return pos


def _encode_roaring32(low16: npt.NDArray[np.uint16], ckeys: Positions, starts: npt.NDArray[np.intp],
                      cards: npt.NDArray[np.intp]) -> bytes:
    """One bucket's 32-bit Roaring bitmap, cookie 12346: count, (key, cardinality - 1) pairs, offsets, data."""
    n = ckeys.size
    header = np.empty(2 * n, dtype="<u2")
    header[0::2] = (ckeys & np.uint64(0xFFFF)).astype(np.uint16)
    header[1::2] = (cards - 1).astype(np.uint16)
    sizes = np.where(cards > ARRAY_MAX, BITMAP_BYTES, 2 * cards)
    offsets = 8 + 8 * n + np.concatenate(([0], np.cumsum(sizes[:-1])))
    parts = [np.array([COOKIE_NO_RUNS, n], dtype="<u4").tobytes(), header.tobytes(), offsets.astype("<u4").tobytes()]
    # The array containers between two bitmap containers are one slice of low16: a loop per bitmap only.
    after = int(starts[0])
    for i in np.flatnonzero(cards > ARRAY_MAX).tolist():
        start, card = int(starts[i]), int(cards[i])
        parts.append(low16[after:start].tobytes())
        bits = np.zeros(1 << 16, dtype=bool)
        bits[low16[start:start + card]] = True
        parts.append(np.packbits(bits, bitorder="little").tobytes())
        after = start + card
    parts.append(low16[after:int(starts[-1] + cards[-1])].tobytes())
    return b"".join(parts)


def decode_positions(data: bytes) -> Positions:
    """The sorted row positions of Delta's portable RoaringBitmapArray ``data`` (array, bitmap and run
    containers, either cookie). Raises DeletionVectorError naming the byte offset of what is wrong."""
    buf = memoryview(data)
    _need(buf, 0, 12, "the magic number and bucket count")
    magic = int(np.frombuffer(buf, dtype="<i4", count=1)[0])
    if magic != MAGIC:
        native = " (Spark's native format, not allowed in a table)" if magic == _NATIVE_MAGIC else ""
        raise DeletionVectorError(f"bad deletion vector magic number {magic} at byte 0{native}, expected {MAGIC}")
    nbuckets = int(np.frombuffer(buf, dtype="<i8", count=1, offset=4)[0])
    if not 0 <= nbuckets <= (len(buf) - 12) // 12:  # a bucket takes at least a key and a cookie header
        raise DeletionVectorError(f"bad bucket count {nbuckets} at byte 4 for {len(buf)} bytes")
    pieces: list[Positions] = []
    at = 12
    previous = -1
    for _ in range(nbuckets):
        _need(buf, at, 4, "a bucket key")
        key = int(np.frombuffer(buf, dtype="<u4", count=1, offset=at)[0])
        if key >= 2**31 or key <= previous:
            raise DeletionVectorError(f"bad bucket key {key} at byte {at} (after {previous}; keys ascend, "
                                      "below 2^31)")
        previous = key
        at = _decode_roaring32(buf, at + 4, np.uint64(key) << np.uint64(32), pieces)
    if at != len(buf):
        raise DeletionVectorError(f"{len(buf) - at} trailing bytes after the deletion vector at byte {at}")
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint64)


def _decode_roaring32(buf: memoryview, at: int, base: np.uint64, pieces: list[Positions]) -> int:
    """Appends the positions of the 32-bit Roaring bitmap at ``at`` (plus ``base``) to ``pieces``;
    returns where it ends."""
    start = at
    _need(buf, at, 4, "a Roaring cookie")
    cookie = int(np.frombuffer(buf, dtype="<u4", count=1, offset=at)[0])
    if cookie == COOKIE_NO_RUNS:
        _need(buf, at + 4, 4, "a container count")
        n = int(np.frombuffer(buf, dtype="<u4", count=1, offset=at + 4)[0])
        if n > 1 << 16:
            raise DeletionVectorError(f"bad container count {n} at byte {at + 4} (at most 65536)")
        runs = np.zeros(n, dtype=bool)
        at += 8
        has_offsets = True
    elif cookie & 0xFFFF == COOKIE_RUNS:
        n = (cookie >> 16) + 1
        flags = (n + 7) // 8
        _need(buf, at + 4, flags, "the run container flags")
        runs = np.unpackbits(np.frombuffer(buf, dtype=np.uint8, count=flags, offset=at + 4),
                             bitorder="little")[:n].astype(bool)
        at += 4 + flags
        has_offsets = n >= NO_OFFSET_THRESHOLD
    else:
        raise DeletionVectorError(f"unknown Roaring cookie {cookie} at byte {at} (expected {COOKIE_NO_RUNS} "
                                  f"or {COOKIE_RUNS} in the low 16 bits)")
    _need(buf, at, 4 * n, "the container headers")
    header = np.frombuffer(buf, dtype="<u2", count=2 * n, offset=at).astype(np.int64)
    ckeys, cards = header[0::2], header[1::2] + 1
    if n > 1 and bool(np.any(ckeys[1:] <= ckeys[:-1])):
        raise DeletionVectorError(f"container keys not ascending in the header at byte {at}")
    at += 4 * n
    if has_offsets:
        _need(buf, at, 4 * n, "the container offsets")
        at += 4 * n
    # Array containers are read in bulk, up to the next bitmap or run container: a loop per those only.
    kind = np.where(runs, 2, np.where(cards > ARRAY_MAX, 1, 0))
    i = 0
    for j in [*np.flatnonzero(kind != 0).tolist(), n]:
        if j > i:
            at = _decode_arrays(buf, at, ckeys[i:j], cards[i:j], base, pieces)
        if j == n:
            break
        card = int(cards[j])
        if runs[j]:
            _need(buf, at, 2, "a run count")
            nruns = int(np.frombuffer(buf, dtype="<u2", count=1, offset=at)[0])
            _need(buf, at + 2, 4 * nruns, f"{nruns} runs")
            pairs = np.frombuffer(buf, dtype="<u2", count=2 * nruns, offset=at + 2).astype(np.int64)
            values = _expand_runs(pairs[0::2], pairs[1::2] + 1, at)
            at += 2 + 4 * nruns
        else:
            _need(buf, at, BITMAP_BYTES, "a bitmap container")
            bits = np.unpackbits(np.frombuffer(buf, dtype=np.uint8, count=BITMAP_BYTES, offset=at), bitorder="little")
            values = np.flatnonzero(bits)
            at += BITMAP_BYTES
        if values.size != card:
            raise DeletionVectorError(f"container {j} of the bitmap at byte {start} holds {values.size} values, "
                                      f"its header says {card}")
        pieces.append(values.astype(np.uint64) + (base | np.uint64(int(ckeys[j]) << 16)))
        i = j + 1
    return at


def _decode_arrays(buf: memoryview, at: int, ckeys: npt.NDArray[np.int64], cards: npt.NDArray[np.int64],
                   base: np.uint64, pieces: list[Positions]) -> int:
    """Consecutive array containers: their values are one run of uint16s, each container's ascending."""
    count = int(cards.sum())
    _need(buf, at, 2 * count, f"{cards.size} array containers of {count} values")
    values = np.frombuffer(buf, dtype="<u2", count=count, offset=at).astype(np.uint64)
    owner = np.repeat(np.arange(cards.size), cards)
    if count > 1 and bool(np.any((values[1:] <= values[:-1]) & (owner[1:] == owner[:-1]))):
        bad = int(np.flatnonzero((values[1:] <= values[:-1]) & (owner[1:] == owner[:-1]))[0])
        raise DeletionVectorError(f"array container values not ascending at byte {at + 2 * bad + 2}")
    pieces.append(values + (base | (ckeys.astype(np.uint64) << np.uint64(16))[owner]))
    return at + 2 * count


def _expand_runs(starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], at: int) -> npt.NDArray[np.int64]:
    """The values of runs (start, length), vectorized: each run's start repeated, plus 0, 1, ... within it."""
    ends = starts + lengths
    if bool(np.any(ends > 1 << 16)) or (starts.size > 1 and bool(np.any(starts[1:] <= ends[:-1] - 1))):
        raise DeletionVectorError(f"runs overlap, are out of order or pass 65535 in the run container at byte {at}")
    total = int(lengths.sum())
    firsts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    return np.repeat(starts - firsts, lengths) + np.arange(total, dtype=np.int64)


def _need(buf: memoryview, at: int, size: int, what: str) -> None:
    if at + size > len(buf):
        raise DeletionVectorError(f"deletion vector truncated: {what} needs {size} bytes at byte {at}, "
                                  f"{max(len(buf) - at, 0)} left")


# ----------------------------------------------------------------------------------------------- Z85


def z85_encode(data: bytes) -> str:
    """``data`` in Delta's Z85: ZeroMQ's alphabet and 4-byte blocks, an unaligned tail padded with zero
    bytes (ZeroMQ's Z85 refuses it; Delta pads, and the reader cuts at ``sizeInBytes``)."""
    padded = bytes(data) + b"\0" * (-len(data) % 4)
    words = np.frombuffer(padded, dtype=">u4").astype(np.uint64)
    digits = (words[:, None] // _Z85_POWERS) % np.uint64(85)
    chars: bytes = _Z85_ENCODE[digits.ravel()].tobytes()
    return chars.decode("ascii")


def z85_decode(text: str) -> bytes:
    """The bytes of Delta's Z85 ``text``: 4 per 5 characters, padding included (cut to the known size)."""
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError as e:
        raise DeletionVectorError(f"not Z85: non-ASCII character at {e.start} of {text!r}") from None
    if len(raw) % 5:
        raise DeletionVectorError(f"not Z85: {len(raw)} characters, not a multiple of 5: {text!r}")
    digits = _Z85_DECODE[np.frombuffer(raw, dtype=np.uint8)]
    bad = np.flatnonzero(digits == 255)
    if bad.size:
        raise DeletionVectorError(f"not Z85: character {text[int(bad[0])]!r} at {int(bad[0])} of {text!r}")
    words = digits.reshape(-1, 5).astype(np.uint64) @ _Z85_POWERS
    over = np.flatnonzero(words > np.uint64(0xFFFFFFFF))
    if over.size:
        raise DeletionVectorError(f"not Z85: block at {5 * int(over[0])} of {text!r} exceeds 32 bits")
    return words.astype(">u4").tobytes()


# ----------------------------------------------------------------------------------------------- files


def dv_file_bytes(bitmaps: list[bytes]) -> tuple[bytes, list[int]]:
    """A DV file holding ``bitmaps`` (from :func:`encode_positions`), and each one's ``offset``."""
    parts = [bytes([FILE_FORMAT_VERSION])]
    offsets: list[int] = []
    at = 1
    for bitmap in bitmaps:
        if len(bitmap) > _INT32_MAX or at > _INT32_MAX:
            raise ValueError(f"a deletion vector of {len(bitmap)} bytes at offset {at} passes Delta's int32 sizes")
        offsets.append(at)
        parts += [len(bitmap).to_bytes(4, "big"), bitmap, zlib.crc32(bitmap).to_bytes(4, "big")]
        at += 8 + len(bitmap)
    return b"".join(parts), offsets


def dv_file_name(uuid: uuidlib.UUID) -> str:
    """The file name of the DV file ``uuid`` names (in the table root, or its random-prefix folder)."""
    return f"deletion_vector_{uuid}.bin"


def new_descriptor(uuid: uuidlib.UUID, offset: int, size: int, cardinality: int) -> dict[str, Any]:
    """The log's ``deletionVector`` of a DV at ``offset`` of size ``size`` in file ``uuid`` of the table root."""
    return {"storageType": "u", "pathOrInlineDv": z85_encode(uuid.bytes), "offset": offset,
            "sizeInBytes": size, "cardinality": cardinality}


def descriptor_id(descriptor: Mapping[str, Any]) -> str:
    """The protocol's uniqueId: ``<storageType><pathOrInlineDv>``, then ``@<offset>`` when there is one.
    Tells the same data file with different DVs apart (an add and the remove of its earlier DV)."""
    ident = f"{descriptor['storageType']}{descriptor['pathOrInlineDv']}"
    offset = descriptor.get("offset")
    return ident if offset is None else f"{ident}@{offset}"


def dv_path(table_root: str | Path, descriptor: Mapping[str, Any]) -> Path:
    """The local file of an on-disk descriptor: 'u' is ``<root>/<random prefix>/deletion_vector_<uuid>.bin``
    (the last 20 characters are the Z85 uuid, what precedes them the prefix), 'p' an absolute path or
    file: URI, percent-escaped as the add action's ``path``."""
    kind, where = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if kind == "u":
        if len(where) < ENCODED_UUID_LENGTH:
            raise DeletionVectorError(f"'u' deletion vector {where!r} is shorter than a Z85 uuid")
        prefix, encoded = where[:-ENCODED_UUID_LENGTH], where[-ENCODED_UUID_LENGTH:]
        name = dv_file_name(uuidlib.UUID(bytes=z85_decode(encoded)))
        root = Path(table_root)
        return root / prefix / name if prefix else root / name
    if kind == "p":
        parts = urlsplit(where)
        if parts.scheme not in ("", "file") or (parts.netloc not in ("", "localhost")):
            raise DeletionVectorError(f"deletion vector {where!r} is not on the local filesystem")
        path = Path(unquote(parts.path))
        if not path.is_absolute():
            raise DeletionVectorError(f"'p' deletion vector {where!r} is not an absolute path")
        return path
    raise DeletionVectorError(f"deletion vector storage type {kind!r} has no file (expected 'u' or 'p')")


def read_dv(table_root: str | Path, descriptor: Mapping[str, Any]) -> Positions:
    """The deleted row positions of ``descriptor`` (the log JSON's ``deletionVector``): inline ('i') or in a
    local file ('u', 'p'), its size, CRC and cardinality checked."""
    size = int(descriptor["sizeInBytes"])
    cardinality = int(descriptor["cardinality"])
    if cardinality == 0:  # Spark's empty descriptor is inline and empty, and is never read
        return np.zeros(0, dtype=np.uint64)
    if descriptor["storageType"] == "i":
        where = "inline deletion vector"
        data = z85_decode(descriptor["pathOrInlineDv"])
        if len(data) < size:
            raise DeletionVectorError(f"{where} holds {len(data)} bytes, its sizeInBytes is {size}")
        data = data[:size]
    else:
        path = dv_path(table_root, descriptor)
        offset = int(descriptor.get("offset") or 0)
        where = f"deletion vector file {path} at offset {offset}"
        data = _read_range(path, offset, size, where)
    try:
        positions = decode_positions(data)
    except DeletionVectorError as e:
        raise DeletionVectorError(f"{where} (byte offsets within its bitmap): {e}") from None
    if positions.size != cardinality:
        raise DeletionVectorError(f"{where} holds {positions.size} rows, its cardinality is {cardinality}")
    return positions


def _read_range(path: Path, offset: int, size: int, where: str) -> bytes:
    """The bitmap at ``offset`` of a DV file, after the version byte, size and CRC are checked."""
    try:
        with open(path, "rb") as f:
            version = f.read(1)
            if version != bytes([FILE_FORMAT_VERSION]):
                raise DeletionVectorError(f"{where}: format version {version!r} at byte 0, expected 1")
            f.seek(offset)
            head = f.read(4)
            data = f.read(size)
            tail = f.read(4)
    except OSError as e:
        raise DeletionVectorError(f"{where}: {e}") from e
    if len(head) < 4 or len(data) < size or len(tail) < 4:
        raise DeletionVectorError(f"{where}: file truncated, {size + 8} bytes expected")
    stored = int.from_bytes(head, "big")
    if stored != size:
        raise DeletionVectorError(f"{where}: the file says {stored} bytes, the descriptor's sizeInBytes {size}")
    crc = int.from_bytes(tail, "big")
    if crc != zlib.crc32(data):
        raise DeletionVectorError(f"{where}: CRC-32 mismatch ({crc:#010x} stored, {zlib.crc32(data):#010x} computed)")
    return data
