"""Origin filtering and logical decoding messages, on a captured real stream."""

from __future__ import annotations

import json
from pathlib import Path

from applier.assembly.feeder import TransactionFeeder
from applier.config import ApplySettings
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.state import StateDir

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pgoutput" / "pg15_basic_proto1_messages.jsonl"


def run(tmp_path: Path, **settings) -> tuple[TransactionFeeder, list]:
    feeder = TransactionFeeder.from_state(StateDir(tmp_path), ApplySettings(**settings))
    dec = MessageDecoder()
    out = []
    for line in FIXTURE.read_text().splitlines():
        row = json.loads(line)
        lsn = parse_lsn(row["lsn"])
        for txn, batches in feeder.feed(lsn, dec.decode(bytes.fromhex(row["data"]), lsn)):
            out.append((txn, batches))
            feeder.applied(txn)
    return feeder, out


def test_transactions_from_a_skipped_origin_are_dropped_but_still_counted(tmp_path):
    _f, everything = run(tmp_path / "a")
    from_origin = [t for t, _b in everything if t.origin == "capture_capture_basic"]
    assert len(from_origin) == 1 and any(b for t, b in everything if t is from_origin[0])
    feeder, filtered = run(tmp_path / "b", skip_origins=["capture_capture_basic"])
    assert [t.end_lsn for t, _b in filtered] == [t.end_lsn for t, _b in everything]  # LSNs still advance
    assert [b for t, b in filtered if t.origin] == [[]] and feeder.skipped_by_origin == 1
    feeder_any, _ = run(tmp_path / "c", skip_any_origin=True)
    assert feeder_any.skipped_by_origin == 1


def test_logical_messages_reach_the_callback_including_non_transactional_ones(tmp_path):
    feeder, _ = run(tmp_path)
    payloads = sorted(m.content for _lsn, m in feeder.messages)
    assert payloads == [b"non-transactional payload", b"sent although rolled back", b"transactional payload"]
    assert {m.transactional for _lsn, m in feeder.messages} == {True, False}


def test_truncate_reaches_the_sink_with_both_bits_for_every_listed_table(tmp_path):
    """TRUNCATE parent RESTART IDENTITY CASCADE (captured): one 'T' change per listed table, parent AND
    the cascaded child, each carrying CASCADE and RESTART IDENTITY."""
    _f, everything = run(tmp_path)
    truncates = [(b.name, c) for _t, batches in everything for b in batches for c in b.changes if c.op == "T"]
    assert sorted(name for name, _c in truncates) == ["child", "parent"]
    assert all(c.cascade and c.restart_identity for _name, c in truncates)
