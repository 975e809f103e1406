"""Transaction assembly on captured real message streams, and its state rules in isolation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from applier.assembly import PreparedStore, TransactionAssembler
from applier.assembly.buffer import ChangeBuffer
from applier.changes import SkippedTransaction
from applier.errors import AssemblyError
from applier.lsn import parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import (
    Begin,
    Commit,
    Insert,
    Message,
    Relation,
    RelationColumn,
    StreamAbort,
    StreamCommit,
    StreamStart,
    StreamStop,
    TupleData,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pgoutput"


def messages(name: str):
    dec = MessageDecoder()
    for line in (FIXTURES / name).read_text().splitlines():
        row = json.loads(line)
        lsn = parse_lsn(row["lsn"])
        yield lsn, dec.decode(bytes.fromhex(row["data"]), lsn)


def assemble(name: str, tmp_path: Path, **kw):
    asm = TransactionAssembler(prepared=PreparedStore(tmp_path / "prepared"), spill_dir=tmp_path / "spill", **kw)
    out = [t for lsn, m in messages(name) for t in asm.feed(lsn, m)]
    return asm, out


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.jsonl")))
def test_every_captured_stream_assembles_in_commit_order(name, tmp_path):
    asm, txns = assemble(name, tmp_path)
    assert txns, "no committed transaction"
    ends = [t.end_lsn for t in txns]
    assert ends == sorted(ends)
    for t in txns:
        changes = list(t.changes)
        assert [c.ordinal for c in changes] == list(range(len(changes)))
        assert all(c.lsn <= t.end_lsn for c in changes)
    assert asm.open_transactions() == 0 or "twophase" in name


def test_streamed_fixture_drops_aborted_work_and_spills_under_a_tiny_budget(tmp_path):
    _asm, big_budget = assemble("pg15_streaming_proto2_streaming.jsonl", tmp_path / "a")
    asm, tiny = assemble("pg15_streaming_proto2_streaming.jsonl", tmp_path / "b", memory_budget_bytes=1024)
    assert [(t.xid, len(tuple(t.changes))) for t in tiny] == [(t.xid, len(tuple(t.changes))) for t in big_budget]
    assert any(t.kind == "streamed" for t in tiny)
    assert list((tmp_path / "b" / "spill").glob("*"))  # the tiny budget did spill
    for t in tiny:
        asm.finished(t)
    assert not list((tmp_path / "b" / "spill").glob("*"))  # released once applied


REL = Relation(None, 1, "public", "t", "d", (RelationColumn(1, "id", 23, -1),))


def ins(xid: int | None, v: int) -> Insert:
    return Insert(xid, 1, TupleData(b"t", (str(v).encode(),)))


def values(txn) -> list[bytes]:
    return [c.message.new.values[0] for c in txn.changes]


def test_subtransaction_abort_drops_its_changes_and_everything_after_its_first_change():
    asm = TransactionAssembler()
    feed: list[Message] = [
            StreamStart(100, True), REL, ins(100, 1), ins(101, 2), ins(100, 3), ins(102, 4), StreamStop(),
            StreamStart(100, False), ins(101, 5), StreamStop(),
            StreamAbort(100, 103),  # a subxact that streamed nothing: no effect
            StreamAbort(100, 101),  # drops 2 and everything after it: 3, 4, 5
            StreamStart(100, False), ins(100, 6), StreamStop(), StreamCommit(100, 0, 10, 11, 0)]
    out = [t for i, m in enumerate(feed) for t in asm.feed(i, m)]
    assert [values(t) for t in out] == [[b"1", b"6"]]


def test_resent_transaction_replaces_the_stale_buffer_and_framing_errors_are_loud():
    asm = TransactionAssembler()
    resent: list[Message] = [StreamStart(7, True), REL, ins(7, 1), StreamStop(),
                             StreamStart(7, True), REL, ins(7, 2), StreamStop(), StreamCommit(7, 0, 5, 6, 0)]
    for i, m in enumerate(resent):
        out = asm.feed(i, m)
    assert [values(t) for t in out] == [[b"2"]]
    asm.feed(20, Begin(30, 0, 8))
    asm.feed(21, ins(None, 9))
    asm.feed(22, Begin(30, 0, 8))  # the same xid from its start: a new session re-sent it
    asm.feed(23, ins(None, 10))
    assert [values(t) for t in asm.feed(24, Commit(0, 29, 30, 0))] == [[b"10"]]
    with pytest.raises(AssemblyError, match="Commit without Begin") as e:
        asm.feed(25, Commit(0, 31, 32, 0))
    assert e.value.lsn == 25
    with pytest.raises(AssemblyError, match="outside a transaction"):
        asm.feed(26, ins(None, 1))


def test_prepared_changes_survive_a_restart_and_commit_prepared_applies_them(tmp_path):
    rows = [json.loads(x) for x in (FIXTURES / "pg15_twophase_proto3_twophase.jsonl").read_text().splitlines()]
    dec = MessageDecoder()
    decoded = [(parse_lsn(r["lsn"]), dec.decode(bytes.fromhex(r["data"]))) for r in rows]
    commit_at = next(i for i, (_l, m) in enumerate(decoded) if type(m).__name__ == "CommitPrepared")
    first = TransactionAssembler(prepared=PreparedStore(tmp_path))
    for lsn, m in decoded[:commit_at]:
        first.feed(lsn, m)
    staged = PreparedStore(tmp_path).gids()
    assert staged
    # A new process: fresh assembler, catalog rebuilt from the stream; the staged files are all it has.
    second = TransactionAssembler(prepared=PreparedStore(tmp_path))
    for lsn, m in decoded[:commit_at]:
        if type(m).__name__ in ("Relation", "Type"):
            second.feed(lsn, m)
    out = second.feed(*decoded[commit_at])
    assert len(out) == 1 and out[0].kind == "prepared" and out[0].gid in staged and tuple(out[0].changes)
    second.finished(out[0])
    assert out[0].gid not in PreparedStore(tmp_path).gids()


def test_change_buffer_truncate_across_the_spill_boundary(tmp_path):
    buf = ChangeBuffer(budget_bytes=10, spill_dir=tmp_path)
    for i in range(10):
        buf.append(i, 4)
    assert buf.spilled and list(buf) == list(range(10))
    buf.truncate(3)
    assert list(buf) == [0, 1, 2]
    buf.append(99, 1)
    assert list(buf) == [0, 1, 2, 99]
    buf.discard()
    assert list(buf) == [] and not list(tmp_path.glob("*"))


def test_a_bad_change_is_held_to_its_commit_dropped_with_its_subtransaction_or_skipped():
    from applier.errors import DecodeError

    def bad(lsn: int) -> DecodeError:
        return DecodeError("cut short", kind="Insert", offset=9, lsn=lsn)

    # streamed: the bad change sits in subxact 101, which aborts: the transaction commits clean
    asm = TransactionAssembler()
    streamed: list[Message] = [StreamStart(100, True), REL, ins(100, 1), ins(101, 2)]
    for i, m in enumerate(streamed):
        asm.feed(i, m)
    asm.feed_error(4, bad(4))
    aborted: list[Message] = [StreamStop(), StreamAbort(100, 101)]
    for i, m in enumerate(aborted, start=5):
        asm.feed(i, m)
    assert [values(t) for t in asm.feed(7, StreamCommit(100, 0, 10, 11, 0))] == [[b"1"]]

    # regular: raised at its Commit, naming the commit LSN; listed to skip: dropped and reported
    skipped: list[SkippedTransaction] = []
    asm = TransactionAssembler(skip_lsns=frozenset({29}), on_skip=skipped.append)
    regular: list[tuple[int, Message]] = [(20, REL), (21, Begin(40, 0, 8)), (22, ins(None, 1))]
    for lsn, msg in regular:
        asm.feed(lsn, msg)
    asm.feed_error(23, bad(23))
    with pytest.raises(DecodeError) as e:
        asm.feed(24, Commit(0, 39, 40, 0))
    assert (e.value.commit_lsn, e.value.xid, e.value.lsn) == (39, 8, 23)
    asm.feed(30, Begin(30, 0, 9))
    asm.feed(31, ins(None, 2))
    assert asm.feed(32, Commit(0, 29, 30, 0)) == [] and [(s.commit_lsn, s.xid) for s in skipped] == [(29, 9)]
    # outside any transaction, or a framing message: raised at once
    with pytest.raises(DecodeError):
        asm.feed_error(33, bad(33))
    with pytest.raises(DecodeError):
        asm.feed(34, Begin(50, 0, 10))
        asm.feed_error(35, DecodeError("cut short", kind="Commit", offset=2, lsn=35))


def test_a_commit_prepared_resent_after_its_apply_is_recognised(tmp_path):
    from applier.protocol.messages import BeginPrepare, CommitPrepared, Prepare

    store = PreparedStore(tmp_path / "prepared")
    asm = TransactionAssembler(prepared=store)
    prepared: list[tuple[int, Message]] = [(1, REL), (2, BeginPrepare(20, 25, 0, 7, "g")), (3, ins(None, 1)),
                                           (4, Prepare(0, 20, 25, 0, 7, "g"))]
    for lsn, m in prepared:
        asm.feed(lsn, m)
    [txn] = asm.feed(5, CommitPrepared(0, 30, 35, 0, 7, "g"))
    asm.finished(txn)  # applied: the staged copy goes, a tombstone stays
    assert not store.has("g")
    again = TransactionAssembler(prepared=store)  # a restart; the slot re-sends the COMMIT PREPARED
    assert again.feed(5, CommitPrepared(0, 30, 35, 0, 7, "g")) == []
    with pytest.raises(AssemblyError, match="not staged"):  # another end LSN: really lost
        again.feed(6, CommitPrepared(0, 40, 45, 0, 7, "g"))


def test_a_transaction_joining_a_pending_group_frees_its_buffered_changes_and_keeps_its_rows(tmp_path):
    from applier.assembly.feeder import TransactionFeeder
    from applier.catalog import RelationCache
    from applier.config import ApplySettings
    from applier.loop import PendingGroup

    catalog = RelationCache()
    assembler = TransactionAssembler(catalog, prepared=PreparedStore(tmp_path / "prepared"),
                                     spill_dir=tmp_path / "spill", memory_budget_bytes=1024)  # spills
    feeder = TransactionFeeder(catalog, assembler, ApplySettings())
    group = PendingGroup(ApplySettings())
    spill = tmp_path / "spill"
    spilled = False
    for lsn, msg in messages("pg15_streaming_proto2_streaming.jsonl"):
        for txn, batches in feeder.feed(lsn, msg):
            assert len(tuple(txn.changes)) > 0  # readable by the feed's consumer
            spilled = spilled or bool(list(spill.glob("*")))
            assert isinstance(batches, list)  # (no piece_rows set: whole)
            group.add(txn, batches)
            with pytest.raises(AssemblyError, match="released already"):
                list(txn.changes)  # the decoded messages are gone once the group holds the rows
    assert spilled  # the tiny budget did spill
    assert group.rows > 0 and all(b.changes for _end, batches in group.transactions for b in batches)
    assert not list(spill.glob("*"))  # spill files too, before the group is applied


def test_a_lone_commit_prepared_is_empty_only_where_the_store_proves_no_prepare_was_sent(tmp_path):
    """PostgreSQL 15/16 send Commit Prepared alone for a prepared transaction that changed nothing
    (BEGIN; SELECT ... FOR SHARE; PREPARE TRANSACTION); the same lone message is lost changes when the
    slot moved past a Prepare without this applier (applier.assembly.staging)."""
    from applier.protocol.messages import CommitPrepared

    store = PreparedStore(tmp_path / "prepared")
    lone = CommitPrepared(0, 300, 310, 0, 7, "x")
    # no record of the slot (a store from before, a raw log): stops as before
    with pytest.raises(AssemblyError, match="not staged"):
        TransactionAssembler(prepared=store).feed(300, lone)
    store.cover("m", 100)  # the mirror created slot m at 100
    store.confirming(200)  # ... and has confirmed it up to 200
    assert store.vouch("m", 200) and TransactionAssembler(prepared=store).feed(300, lone) == []
    assert store.vouch("m", 150)  # the server's position may lag ours (advance is made durable lazily)
    assert TransactionAssembler(prepared=store).feed(300, lone) == []
    # a commit at or before the slot's creation point cannot be vouched for
    with pytest.raises(AssemblyError, match="not staged"):
        TransactionAssembler(prepared=store).feed(90, CommitPrepared(0, 90, 95, 0, 7, "x"))
    # something else moved the slot beyond what this applier confirmed: a Prepare may have been lost
    assert not store.vouch("m", 250)
    with pytest.raises(AssemblyError, match="not staged"):
        TransactionAssembler(prepared=store).feed(300, lone)
    assert not store.vouch("other", 200)  # another slot's session
    with pytest.raises(AssemblyError, match="not staged"):
        TransactionAssembler(prepared=store).feed(300, lone)
    store.confirming(180)  # never moves back
    assert store.vouch("m", 200)
    # the way past one the store cannot vouch for (known empty, or the tables rebuilt): skip its commit LSN
    assert not store.vouch("m", 250)
    skipped: list[object] = []
    listed = TransactionAssembler(prepared=store, skip_lsns=frozenset({300}), on_skip=skipped.append)
    assert listed.feed(300, lone) == []
    assert len(skipped) == 1
