"""``columnar.text_values`` gives, column by column, exactly the bytes the reference decoder gives for each
message, on streams captured from real servers (tests/fixtures/pgoutput: TOAST values of kilobytes, NULLs,
empty strings, every common type as text), by both of its ways: the byte gather of small values and Arrow's
views over the block, forced here for every size (values of up to 12 bytes inline in the view, longer ones
by offset)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
from foldcompare import FIXTURES, captured

from applier.protocol import MessageDecoder, columnar
from applier.protocol.messages import Delete, Insert, Relation, TupleData, Update


@pytest.mark.parametrize("views_from", [0, 1 << 40], ids=["views", "gather"])
@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_text_values_are_the_decoders_values(fixture, views_from, monkeypatch):
    monkeypatch.setattr(columnar, "_VIEWS_FROM_BYTES", views_from)
    lsns, datas = captured(fixture)
    decoder = MessageDecoder()
    natts: dict[int, int] = {}
    runs: dict[tuple[int, int], list[int]] = defaultdict(list)  # (relation, columns) -> plain row messages
    decoded = []
    for i, (lsn, data) in enumerate(zip(lsns, datas, strict=True)):
        msg = decoder.decode(data, lsn)
        decoded.append(msg)
        if isinstance(msg, Relation):
            natts[msg.oid] = len(msg.columns)
        elif isinstance(msg, Insert | Update | Delete) and msg.xid is None:  # outside a stream block
            runs[(msg.relation_oid, natts[msg.relation_oid])].append(i)
    block = columnar.message_block(datas)
    compared = 0
    for (_oid, columns), index in runs.items():
        spans = columnar.scan_row_messages(block, np.array(index), columns)
        assert spans is not None
        for rows, tuples, image in ((spans.new_rows, spans.new, "new"), (spans.old_rows, spans.old, "old")):
            for column in range(columns):
                values = columnar.text_values(block, tuples, column)
                if values is None:  # an unchanged TOAST value or a binary one: the reference path's
                    continue
                expected = []
                for row in rows:
                    tuple_data = getattr(decoded[index[row]], image)
                    assert isinstance(tuple_data, TupleData)
                    expected.append(tuple_data.values[column])
                assert values.to_pylist() == expected, (fixture.stem, image, column)
                compared += len(expected)
    assert compared > 0


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: p.stem)
def test_commit_fields_are_the_decoders(fixture):
    """``columnar.commit_fields`` reads every Commit's LSNs and time at once: the decoder's values."""
    from applier.protocol.messages import Begin, Commit

    lsns, datas = captured(fixture)
    decoder = MessageDecoder()
    decoded = [decoder.decode(data, lsn) for lsn, data in zip(lsns, datas, strict=True)]
    begins = np.array([i for i, m in enumerate(decoded) if isinstance(m, Begin)], dtype=np.int64)
    commits = np.array([i for i, m in enumerate(decoded) if isinstance(m, Commit)], dtype=np.int64)
    assert commits.size
    block = columnar.message_block(datas)
    fields = columnar.commit_fields(block, begins, commits)
    assert fields is not None
    wanted = [decoded[c] for c in commits]
    assert fields[0].tolist() == [m.commit_lsn for m in wanted]
    assert fields[1].tolist() == [m.end_lsn for m in wanted]
    assert fields[2].tolist() == [m.commit_time for m in wanted]
    # a Commit or a Begin cut short or too long is the decoder's to report: not read here
    for damaged in (commits[0], begins[0]):
        for data in (datas[damaged][:-1], datas[damaged] + b"\0"):
            changed = [*datas[:damaged], data, *datas[damaged + 1:]]
            assert columnar.commit_fields(columnar.message_block(changed), begins, commits) is None
