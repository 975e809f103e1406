"""Origin filtering and logical decoding messages, on a captured real stream."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.assembly.feeder import TransactionFeeder
from applier.config import ApplySettings
from applier.errors import ApplierError
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import Commit
from applier.state import StateDir

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "pgoutput" / "pg15_basic_proto1_messages.jsonl"


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


# -- feed_range: the folds' short way for plain transactions equals feeding message by message ----

FIXTURES = sorted((Path(__file__).resolve().parents[2] / "fixtures" / "pgoutput").glob("pg*.jsonl"))


def _captured(fixture: Path) -> tuple[list[int], list[bytes]]:
    rows = [json.loads(line) for line in fixture.read_text().splitlines()]
    return [parse_lsn(r["lsn"]) for r in rows], [bytes.fromhex(r["data"]) for r in rows]


def _fed(tmp_path: Path, lsns: list[int], datas: list[bytes], *, whole: bool, **settings) -> tuple[str, int]:
    """What a feeder made of the messages (repr of every transaction and batch, the logical messages
    and the skipped), and how many transactions went the short way."""
    feeder = TransactionFeeder.from_state(StateDir(tmp_path), ApplySettings(**settings), check_order=False)
    dec = MessageDecoder()
    if whole:
        produced = feeder.feed_range(dec, lsns, None, datas)
    else:
        produced = ((txn, batches) for lsn, data in zip(lsns, datas, strict=True)
                    for txn, batches in feeder.feed_raw(dec, lsn, None, data) if isinstance(batches, list))
    seen, short = [], 0
    for txn, batches in produced:
        short += txn.changes == ()
        seen.append((txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, txn.origin, txn.kind, txn.gid,
                     [(b.relation_oid, b.namespace, b.name, b.schema.relation, b.commit_lsn, b.end_lsn,
                       list(b.changes), b.commit_time) for b in batches]))
        feeder.applied(txn)
    return repr((seen, feeder.messages, feeder.skipped, feeder.skipped_by_origin)), short


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_a_range_fed_whole_gives_what_message_by_message_gives(tmp_path, fixture):
    lsns, datas = _captured(fixture)
    whole, short = _fed(tmp_path / "whole", lsns, datas, whole=True)
    one_by_one, _ = _fed(tmp_path / "one", lsns, datas, whole=False)
    assert whole == one_by_one
    if "basic" in fixture.stem:
        assert short > 0  # the short way was taken, not just the long one


def test_a_damaged_change_or_a_listed_commit_in_a_plain_transaction_takes_the_long_way(tmp_path):
    """A value cut short inside a plain transaction: both ways stop with the same error; listed in
    skip_transactions, both drop the same transaction and go on alike."""
    lsns, datas = _captured(FIXTURES[0])
    at = next(i for i, d in enumerate(datas) if d[:1] == b"I" and datas[i - 1][:1] == b"B")
    damaged = datas[:at] + [datas[at][:-3]] + datas[at + 1:]
    errors = []
    for as_whole in (True, False):
        with pytest.raises(ApplierError) as e:
            _fed(tmp_path / f"bad{as_whole}", lsns, damaged, whole=as_whole)
        errors.append(str(e.value))
    assert errors[0] == errors[1] and "commit" in errors[0].lower()
    commit = next(i for i in range(at, len(datas)) if datas[i][:1] == b"C")
    commit_msg = MessageDecoder().decode(datas[commit])
    assert isinstance(commit_msg, Commit)
    skip = [format_lsn(commit_msg.commit_lsn)]
    whole, _ = _fed(tmp_path / "skip1", lsns, damaged, whole=True, skip_transactions=skip)
    one_by_one, _ = _fed(tmp_path / "skip2", lsns, damaged, whole=False, skip_transactions=skip)
    assert whole == one_by_one and "SkippedTransaction" in whole
