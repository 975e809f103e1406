"""Delta deletion vectors byte for byte (``applier.sink.store.dvformat``).

Round trips with fixed seeds over every container kind and bucket boundary; bitmaps with run containers
and empty buckets built by hand from RoaringFormatSpec (applier never writes them, Spark does); damaged
bitmaps and files refused with the byte offset; Z85 against ZeroMQ's vector and the uuids of a real
Spark/Delta 4.4 DELETE. tests/integration/test_dvformat_spark.py reads what Spark writes.
"""

from __future__ import annotations

import struct
import uuid
import zlib

import numpy as np
import pytest

from applier.sink.store.dvformat import (
    COOKIE_NO_RUNS,
    COOKIE_RUNS,
    MAGIC,
    MAX_POSITION,
    DeletionVectorError,
    decode_positions,
    descriptor_id,
    dv_file_bytes,
    dv_file_name,
    dv_path,
    encode_positions,
    new_descriptor,
    read_dv,
    z85_decode,
    z85_encode,
)


def u64(values) -> np.ndarray:
    return np.asarray(values, dtype=np.uint64)


def positions(seed: int, n: int, high: int) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(0, high, n, dtype=np.uint64))


def cookies(data: bytes) -> list[int]:
    """The cookie of every bucket of an encoded bitmap (walks only what encode_positions writes)."""
    (count,) = struct.unpack_from("<q", data, 4)
    at, found = 12, []
    for _ in range(count):
        cookie, n = struct.unpack_from("<II", data, at + 4)
        cards = struct.unpack_from(f"<{2 * n}H", data, at + 12)[1::2]
        found.append(cookie)
        at += 12 + 8 * n + sum(8192 if c + 1 > 4096 else 2 * (c + 1) for c in cards)
    assert at == len(data)
    return found


CASES = {
    "empty": u64([]),
    "zero": u64([0]),
    "one": u64([123_456]),
    "boundaries": u64([65_535, 65_536]),
    "chunk edges": u64([0, 65_535, 65_536, 131_071, 131_072, 2**32 - 1]),
    "4096 in a chunk (array)": np.arange(0, 4096 * 3, 3, dtype=np.uint64),
    "4097 in a chunk (bitmap)": np.arange(0, 4097 * 3, 3, dtype=np.uint64),
    "full chunk": np.arange(65_536, 2 * 65_536, dtype=np.uint64),
    "dense": positions(1, 200_000, 1_000_000),
    "sparse": positions(2, 1_000, 10**9),
    "every third of 100000": np.arange(0, 100_000, 3, dtype=np.uint64),
    "several keys": np.concatenate([positions(3, 5_000, 2**32), 2**32 + positions(4, 50_000, 70_000),
                                    7 * 2**32 + u64([0, 1, 65_535, 65_536]), u64([2**40 + 5])]),
    "largest": u64([0, MAX_POSITION]),
}


@pytest.mark.parametrize("values", CASES.values(), ids=CASES.keys())
def test_round_trip(values):
    data = encode_positions(values)
    assert struct.unpack_from("<i", data)[0] == MAGIC
    assert struct.unpack_from("<q", data, 4)[0] == len(np.unique(values >> np.uint64(32)))
    assert set(cookies(data)) <= {COOKIE_NO_RUNS}
    back = decode_positions(data)
    assert back.dtype == np.uint64
    np.testing.assert_array_equal(back, values)


def test_container_kinds_and_sizes():
    # 4096 values: one array container of 2 bytes each; 4097: a bitmap of 8 KiB; header 4 + 8, then per
    # bucket key 4, cookie 4, count 4, (key, cardinality - 1) 4 and an offset 4 per container
    assert len(encode_positions(CASES["4096 in a chunk (array)"])) == 12 + 12 + 8 + 2 * 4096
    assert len(encode_positions(CASES["4097 in a chunk (bitmap)"])) == 12 + 12 + 8 + 8192
    one = encode_positions(u64([2**32 + 65_536 + 7]))
    assert one == (struct.pack("<iqI", MAGIC, 1, 1)  # magic, 1 bucket, key 1
                   + struct.pack("<IIHHI", COOKIE_NO_RUNS, 1, 1, 0, 16)  # 1 container: key 1, 1 value, at byte 16
                   + struct.pack("<H", 7))


def test_encode_takes_any_integer_array_and_refuses_what_delta_cannot_hold():
    np.testing.assert_array_equal(decode_positions(encode_positions(np.array([1, 5], dtype=np.int32))), u64([1, 5]))
    np.testing.assert_array_equal(decode_positions(encode_positions([3, 4])), u64([3, 4]))
    for bad in ([2, 1], [1, 1], [-1, 2], [MAX_POSITION + 1]):
        with pytest.raises(ValueError):
            encode_positions(np.array(bad, dtype=np.int64 if -1 in bad else np.uint64))
    with pytest.raises(ValueError):
        encode_positions(np.array([1.0]))


def roaring32(containers: list[tuple[int, str, list[int]]]) -> bytes:
    """A 32-bit Roaring bitmap with cookie 12347, by RoaringFormatSpec: the cookie (low 16 bits 12347, high
    16 bits the container count - 1), a bit per container (LSB first) set for run containers, per container
    (key, cardinality - 1) as uint16, an uint32 offset per container from the cookie only from 4 containers
    on, then the containers: runs as an uint16 count and (start, length - 1) pairs, arrays as uint16
    values, bitmaps as 1024 uint64 words. ``containers``: (key, "run"|"array"|"bitmap", values; for runs
    the flat (start, length - 1) pairs)."""
    n = len(containers)
    flags = bytearray((n + 7) // 8)
    header, bodies = b"", []
    for i, (key, kind, values) in enumerate(containers):
        if kind == "run":
            flags[i // 8] |= 1 << (i % 8)
            card = sum(length + 1 for length in values[1::2])
            bodies.append(struct.pack(f"<H{len(values)}H", len(values) // 2, *values))
        elif kind == "array":
            card = len(values)
            bodies.append(struct.pack(f"<{card}H", *values))
        else:
            card = len(values)
            bits = np.zeros(65_536, dtype=bool)
            bits[values] = True
            bodies.append(np.packbits(bits, bitorder="little").tobytes())
        header += struct.pack("<HH", key, card - 1)
    offsets = b""
    if n >= 4:
        at = 4 + len(flags) + 8 * n
        for body in bodies:
            offsets += struct.pack("<I", at)
            at += len(body)
    return struct.pack("<I", COOKIE_RUNS | (n - 1) << 16) + bytes(flags) + header + offsets + b"".join(bodies)


def array64(*buckets: tuple[int, bytes]) -> bytes:
    """Delta's bitmap around 32-bit bitmaps: magic, int64 bucket count, then uint32 key and bitmap each."""
    return struct.pack("<iq", MAGIC, len(buckets)) + b"".join(struct.pack("<I", k) + b for k, b in buckets)


def test_run_containers_by_hand():
    # Bucket key 1 (values 2^32 + ...), cookie 12347 with 2 containers (so no offset header):
    #   3b 30 01 00   cookie: 12347 | (2 - 1) << 16
    #   01            run flags: container 0 is a run container, container 1 is not
    #   00 00 05 00   container 0: key 0, cardinality 6 - 1
    #   03 00 01 00   container 1: key 3, cardinality 2 - 1
    #   02 00 0a 00 04 00 64 00 00 00   2 runs: 10 and 4 more (10..14), 100 and none more
    #   07 00 09 00   array container: 7, 9
    bitmap = bytes.fromhex("3b300100" "01" "00000500" "03000100" "02000a0004006400" "0000" "07000900")
    assert bitmap == roaring32([(0, "run", [10, 4, 100, 0]), (3, "array", [7, 9])])
    base = 2**32
    expected = [base + v for v in (10, 11, 12, 13, 14, 100)] + [base + 3 * 65_536 + 7, base + 3 * 65_536 + 9]
    np.testing.assert_array_equal(decode_positions(array64((1, bitmap))), u64(expected))


def test_run_containers_with_offsets_and_every_kind():
    # 5 containers, so the offset header is there; a full container is one run 0..65535 (cardinality 65536)
    bitmap = roaring32([(0, "array", [1, 2, 65_535]), (1, "run", [0, 65_535]), (2, "bitmap", list(range(0, 65_536, 7))),
                        (4, "run", [5, 2, 40_000, 9, 65_530, 5]), (9, "array", [0])])
    values = decode_positions(array64((0, bitmap), (5, bitmap)))
    one = np.concatenate([u64([1, 2, 65_535]), 65_536 + np.arange(65_536, dtype=np.uint64),
                          2 * 65_536 + np.arange(0, 65_536, 7, dtype=np.uint64),
                          4 * 65_536 + u64([5, 6, 7, *range(40_000, 40_010), *range(65_530, 65_536)]),
                          u64([9 * 65_536])])
    np.testing.assert_array_equal(values, np.concatenate([one, (5 << 32) + one]))


def test_empty_buckets_as_spark_writes_them():
    # Spark's RoaringBitmapArray writes a bucket for every key up to the largest, empty ones included:
    # an empty 32-bit bitmap is cookie 12346 and 0 containers
    empty = struct.pack("<II", COOKIE_NO_RUNS, 0)
    data = array64((0, empty), (1, empty), (2, roaring32([(0, "run", [3, 1])])))
    np.testing.assert_array_equal(decode_positions(data), u64([2 * 2**32 + 3, 2 * 2**32 + 4]))
    assert decode_positions(array64((0, empty))).size == 0


def test_bad_magic():
    data = encode_positions(u64([1, 2, 3]))
    with pytest.raises(DeletionVectorError, match="magic number 1681511376 at byte 0 .*native"):
        decode_positions(struct.pack("<i", 1681511376) + data[4:])
    with pytest.raises(DeletionVectorError, match="magic number .* at byte 0"):
        decode_positions(b"\0" * len(data))


def test_every_truncation_is_refused():
    data = array64((0, roaring32([(0, "array", [1, 2]), (1, "run", [0, 9]), (2, "bitmap", list(range(5000))),
                                  (3, "array", [4])])),
                   (3, encode_positions(u64([5, 70_000]))[16:]))
    assert decode_positions(data).size == 2 + 10 + 5000 + 1 + 2
    # every cut in the headers and small containers, every 97th in the bitmap container's 8 KiB
    for end in sorted({*range(200), *range(len(data) - 120, len(data)), *range(0, len(data), 97)}):
        with pytest.raises(DeletionVectorError, match="truncated|bucket count"):
            decode_positions(data[:end])
    with pytest.raises(DeletionVectorError, match="3 trailing bytes"):
        decode_positions(data + b"abc")


def test_unknown_cookie_and_inconsistent_bitmaps():
    data = bytearray(encode_positions(u64([5, 70_000])))
    data[16:20] = struct.pack("<I", 12345)
    with pytest.raises(DeletionVectorError, match="unknown Roaring cookie 12345 at byte 16"):
        decode_positions(bytes(data))
    empty = struct.pack("<II", COOKIE_NO_RUNS, 0)
    with pytest.raises(DeletionVectorError, match="bad bucket key 1 at byte 24"):  # keys must ascend
        decode_positions(array64((1, empty), (1, empty)))
    with pytest.raises(DeletionVectorError, match="bad bucket key"):  # Delta keeps the top bit clear
        decode_positions(array64((2**31, empty)))
    # one run container, key 0, header cardinality 4 (3 + 1), one run 0..2
    three = struct.pack("<IBHHHHH", COOKIE_RUNS, 1, 0, 3, 1, 0, 2)
    with pytest.raises(DeletionVectorError, match="holds 3 values, its header says 4"):
        decode_positions(array64((0, three)))
    with pytest.raises(DeletionVectorError, match="not ascending"):
        decode_positions(array64((0, roaring32([(0, "array", [2, 1])]))))
    with pytest.raises(DeletionVectorError, match="runs overlap"):
        decode_positions(array64((0, roaring32([(0, "run", [65_530, 9])]))))


def test_z85_zeromq_vector():
    hello = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert z85_encode(hello) == "HelloWorld"
    assert z85_decode("HelloWorld") == hello


# pathOrInlineDv and DV file name pairs of a real Spark/Delta 4.4 DELETE (Delta writes the uuid's 16 bytes,
# most significant first, as 4 big-endian blocks)
SPARK_UUIDS = {"h#KSEA6c)CG(y$2YP^pD": "37fd19d9-703c-4e80-8570-6f9cbc946e12",
               ")LZBq./OErT(4o/aI8/G": "ee369807-c374-4944-addf-ca9720ba7881"}


@pytest.mark.parametrize("encoded", SPARK_UUIDS)
def test_z85_uuids_of_spark(encoded, tmp_path):
    uid = uuid.UUID(SPARK_UUIDS[encoded])
    assert uuid.UUID(bytes=z85_decode(encoded)) == uid
    assert z85_encode(uid.bytes) == encoded
    assert new_descriptor(uid, 1, 16_424, 33_334)["pathOrInlineDv"] == encoded
    assert dv_path(tmp_path, {"storageType": "u", "pathOrInlineDv": encoded}) == tmp_path / dv_file_name(uid)
    assert dv_file_name(uid) == f"deletion_vector_{SPARK_UUIDS[encoded]}.bin"


def test_z85_pads_as_delta_does():
    rng = np.random.default_rng(5)
    for n in range(0, 30):
        data = rng.bytes(n)
        text = z85_encode(data)
        assert len(text) == 5 * ((n + 3) // 4)
        assert z85_decode(text) == data + b"\0" * (-n % 4)
    for bad, what in (("Hello", None), ("Hell", "multiple of 5"), ("Hell\"", "character"), ("Hellé", "non-ASCII"),
                      ("#####", "exceeds 32 bits")):
        if what is None:
            z85_decode(bad)
            continue
        with pytest.raises(DeletionVectorError, match=what):
            z85_decode(bad)


def test_protocol_relative_path_example():
    # PROTOCOL.md, "JSON Example 1": a 2-character random prefix is a folder of the table root
    descriptor = {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": 4, "sizeInBytes": 40,
                  "cardinality": 6}
    expected = "/mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    assert dv_path("/mytable", descriptor).as_posix() == expected
    assert descriptor_id(descriptor) == "uab^-aqEH.-t@S}K{vb[*k^@4"


def test_descriptor_ids():
    uid = uuid.UUID("37fd19d9-703c-4e80-8570-6f9cbc946e12")
    assert descriptor_id(new_descriptor(uid, 1, 10, 2)) == "uh#KSEA6c)CG(y$2YP^pD@1"
    inline = {"storageType": "i", "pathOrInlineDv": "abcde", "sizeInBytes": 4, "cardinality": 1}
    assert descriptor_id(inline) == "iabcde"
    assert descriptor_id({"storageType": "p", "pathOrInlineDv": "file:/x.bin", "offset": None}) == "pfile:/x.bin"


def test_file_with_several_dvs(tmp_path):
    sets = [CASES["sparse"], CASES["dense"], CASES["several keys"]]
    bitmaps = [encode_positions(s) for s in sets]
    data, offsets = dv_file_bytes(bitmaps)
    assert data[0] == 1 and offsets[0] == 1
    assert offsets == [1, 1 + 8 + len(bitmaps[0]), 1 + 16 + len(bitmaps[0]) + len(bitmaps[1])]
    assert len(data) == 1 + sum(8 + len(b) for b in bitmaps)
    at, bitmap = offsets[1], bitmaps[1]
    assert data[at:at + 4] == len(bitmap).to_bytes(4, "big")
    assert data[at + 4 + len(bitmap):at + 8 + len(bitmap)] == zlib.crc32(bitmap).to_bytes(4, "big")

    uid = uuid.UUID(int=0x1234)
    (tmp_path / dv_file_name(uid)).write_bytes(data)
    for values, bitmap, offset in zip(sets, bitmaps, offsets, strict=True):
        back = read_dv(str(tmp_path), new_descriptor(uid, offset, len(bitmap), len(values)))
        np.testing.assert_array_equal(back, values)

    (tmp_path / "xy").mkdir()
    (tmp_path / "xy" / dv_file_name(uid)).write_bytes(data)
    prefixed = {**new_descriptor(uid, offsets[2], len(bitmaps[2]), len(sets[2]))}
    prefixed["pathOrInlineDv"] = "xy" + prefixed["pathOrInlineDv"]
    np.testing.assert_array_equal(read_dv(tmp_path, prefixed), sets[2])
    assert dv_file_bytes([]) == (b"\x01", [])


def test_absolute_paths_and_inline(tmp_path):
    values = u64([3, 4, 7, 11, 18, 29, 2**33])
    bitmap = encode_positions(values)
    data, (offset,) = dv_file_bytes([bitmap])
    folder = tmp_path / "a b%"
    folder.mkdir()
    (folder / "dv.bin").write_bytes(data)
    common = {"storageType": "p", "offset": offset, "sizeInBytes": len(bitmap), "cardinality": len(values)}
    for where in (folder.as_uri() + "/dv.bin", "file://" + folder.as_uri()[len("file://"):] + "/dv.bin"):
        np.testing.assert_array_equal(read_dv("/elsewhere", {**common, "pathOrInlineDv": where}), values)
    with pytest.raises(DeletionVectorError, match="not on the local filesystem"):
        read_dv("/t", {**common, "pathOrInlineDv": "s3://bucket/dv.bin"})

    assert len(bitmap) % 4 != 0  # so the inline text is padded
    inline = {"storageType": "i", "pathOrInlineDv": z85_encode(bitmap), "sizeInBytes": len(bitmap),
              "cardinality": len(values)}
    np.testing.assert_array_equal(read_dv("/t", inline), values)
    empty = {"storageType": "i", "pathOrInlineDv": "", "sizeInBytes": 0, "cardinality": 0}  # Spark's EMPTY
    assert read_dv("/t", empty).size == 0
    with pytest.raises(DeletionVectorError, match="inline deletion vector holds 7 rows, its cardinality is 6"):
        read_dv("/t", {**inline, "cardinality": 6})
    with pytest.raises(DeletionVectorError, match="storage type 'r'"):
        read_dv("/t", {**common, "storageType": "r", "pathOrInlineDv": "dv.bin"})


def test_damaged_files(tmp_path):
    values = CASES["dense"]
    bitmap = encode_positions(values)
    data, offsets = dv_file_bytes([encode_positions(u64([1])), bitmap])
    offset = offsets[1]  # the second DV of the file
    uid = uuid.UUID(int=7)
    path = tmp_path / dv_file_name(uid)
    descriptor = new_descriptor(uid, offset, len(bitmap), len(values))

    def damaged(at: int, byte: int) -> None:
        broken = bytearray(data)
        broken[at] = byte
        path.write_bytes(bytes(broken))

    damaged(offset + 4 + 1000, data[offset + 4 + 1000] ^ 0x10)
    with pytest.raises(DeletionVectorError, match=rf"{path.name} at offset {offset}: CRC-32 mismatch"):
        read_dv(tmp_path, descriptor)
    damaged(offset + 3, data[offset + 3] ^ 1)
    with pytest.raises(DeletionVectorError, match="sizeInBytes"):
        read_dv(tmp_path, descriptor)
    damaged(0, 2)
    with pytest.raises(DeletionVectorError, match="format version"):
        read_dv(tmp_path, descriptor)
    path.write_bytes(data[:-1])
    with pytest.raises(DeletionVectorError, match=rf"at offset {offset}: file truncated"):
        read_dv(tmp_path, descriptor)
    path.unlink()
    with pytest.raises(DeletionVectorError, match="No such file"):
        read_dv(tmp_path, descriptor)
    # a bitmap that is damaged but has a matching CRC is refused naming the file, the offset and the byte
    bad = bytearray(bitmap)
    bad[16:20] = struct.pack("<I", 4242)
    path.write_bytes(dv_file_bytes([bytes(bad)])[0])
    with pytest.raises(DeletionVectorError, match=rf"{path.name} at offset 1 .*unknown Roaring cookie 4242 at byte 16"):
        read_dv(tmp_path, {**descriptor, "offset": 1})
    path.write_bytes(dv_file_bytes([bitmap])[0])
    with pytest.raises(DeletionVectorError, match="cardinality"):
        read_dv(tmp_path, {**descriptor, "offset": 1, "cardinality": len(values) + 1})
