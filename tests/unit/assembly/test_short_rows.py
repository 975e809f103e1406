"""ShortRowReader (applier.assembly.shortrows) gives the long way's row change or None, never another.

The long way is the reference: decode the message, convert its tuples with the schema's
RowConverter, make the TableChange with rowchanges.row_change. Checked on every Insert, Update and
Delete outside a stream block of the streams captured from real servers (tests/fixtures/pgoutput),
and on those messages damaged: cut short, a byte changed, bytes added."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from applier.assembly.rowchanges import row_change
from applier.assembly.shortrows import ShortRowReader
from applier.catalog import RelationCache, SchemaVersion
from applier.errors import ApplierError
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import COL_BINARY, Delete, Insert, Relation, Type, Update
from applier.values import RowConverter

FIXTURES = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "pgoutput").glob("pg*.jsonl"))


def _row_messages(fixture: Path) -> list[tuple[int, bytes, SchemaVersion]]:
    """Every I/U/D outside a stream block, with the schema version its relation had at that point."""
    catalog = RelationCache()
    decoder = MessageDecoder()
    out = []
    for line in fixture.read_text().splitlines():
        row = json.loads(line)
        lsn, data = parse_lsn(row["lsn"]), bytes.fromhex(row["data"])
        in_stream = decoder.in_stream
        msg = decoder.decode(data, lsn)
        if isinstance(msg, Relation):
            catalog.update(msg)
        elif isinstance(msg, Type):
            catalog.update_type(msg)
        elif data[:1] in (b"I", b"U", b"D") and not in_stream:
            out.append((lsn, data, catalog.get(msg.relation_oid)))  # type: ignore[union-attr]
    return out


def _long_way(data: bytes, lsn: int, schema: SchemaVersion, converter: RowConverter) -> Any:
    """The reference row change, or the error class it stops with. (The relation OID in the bytes
    chose the reader, as it chooses ``schema`` here: both ways read with the same schema version.)"""
    try:
        msg = MessageDecoder().decode(data, lsn)
        if not isinstance(msg, (Insert, Update, Delete)):
            return "not a row change"
        return row_change(msg, schema, 7, converter.convert)
    except ApplierError as e:
        return type(e)


def _reader(schema: SchemaVersion, types: Any, policy: str = "error") -> tuple[ShortRowReader, RowConverter]:
    converter = RowConverter(schema, types, policy)  # type: ignore[arg-type]
    return ShortRowReader(converter.text_parsers, schema.key_indexes), converter


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_every_captured_row_change_reads_as_the_long_way_or_not_at_all(fixture):
    messages = _row_messages(fixture)
    read = 0
    for lsn, data, schema in messages:
        for policy in ("error", "null"):
            reader, converter = _reader(schema, None, policy)
            short = reader.read(data, 7)
            if short is not None:
                assert short == _long_way(data, lsn, schema, converter), (fixture.stem, data.hex())
                read += 1
    if "text" in fixture.stem or "streaming" in fixture.stem:
        assert read > 0, "the short reader took none of the captured rows"

    binary = [(lsn, data, schema) for lsn, data, schema in messages if _has_binary_column(data, lsn)]
    if "binary" in fixture.stem:
        assert binary, "the binary fixture has no binary column"
    assert all(_reader(schema, None)[0].read(data, 7) is None for _lsn, data, schema in binary)


def _has_binary_column(data: bytes, lsn: int) -> bool:
    msg = MessageDecoder().decode(data, lsn)
    tuples = [getattr(msg, "new", None), getattr(msg, "old", None)]
    return any(t is not None and COL_BINARY in t.kinds for t in tuples)


def test_damaged_row_changes_never_read_as_something_else():
    """Cut short, one byte changed, bytes added: the reader returns None or exactly the long way's
    change (never a change where the long way stops, never a different one)."""
    rng = random.Random(22)
    checked = accepted = 0
    for fixture in FIXTURES:
        for lsn, data, schema in _row_messages(fixture):
            reader, converter = _reader(schema, None)
            variants = [data[:cut] for cut in range(1, len(data))]
            variants += [data + b"\0", data + b"t\0\0\0\0"]
            # each text column re-labelled binary: the same bytes mean another value (or none)
            variants += [data[:at] + b"b" + data[at + 1:] for at in _text_kind_offsets(data)]
            for _ in range(12):
                at = rng.randrange(1, len(data))
                variants.append(data[:at] + bytes([rng.randrange(256)]) + data[at + 1:])
            for bad in variants:
                short = reader.read(bad, 7)
                checked += 1
                if short is not None:
                    accepted += 1
                    assert short == _long_way(bad, lsn, schema, converter), (fixture.stem, bad.hex())
    assert checked > 10_000 and accepted > 0


def _text_kind_offsets(data: bytes) -> list[int]:
    """Where the kind bytes of the 't' columns of an I/U/D message (outside a stream block) are."""
    offsets, pos = [], 5
    while pos < len(data) and data[pos] in b"NKO":
        natts = int.from_bytes(data[pos + 1:pos + 3], "big")
        pos += 3
        for _ in range(natts):
            if data[pos] == ord("t"):
                offsets.append(pos)
                pos += 5 + int.from_bytes(data[pos + 1:pos + 5], "big")
            else:
                pos += 1
    return offsets
