"""Summarise a stored raw log: what kinds of messages, how many transactions of each fate, which
relations, which LSN range.

Why decode everything instead of counting type bytes: inspecting a log is how a user checks it
before replaying it, so a malformed message must show up here, with its LSN and byte offset,
rather than later in the middle of an apply.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from applier.lsn import format_lsn
from applier.protocol import MessageDecoder
from applier.protocol.messages import KIND_NAMES, Relation, StreamAbort, StreamStart
from applier.protocol.order import OrderChecker, OrderProblem
from applier.sources.rawlog import RawMessage

__all__ = ["InspectReport", "inspect_messages", "format_report"]

#: Kinds that end a transaction, by fate.
_COMMITTED = {"C", "c", "K"}  # Commit, Stream Commit, Commit Prepared
_PREPARED = {"P", "p"}  # Prepare, Stream Prepare
_ROLLED_BACK_PREPARED = "r"


@dataclass(frozen=True, slots=True)
class InspectReport:
    messages: int
    by_kind: dict[str, int]  # type byte -> count, in KIND_NAMES order
    committed: int  # Commit + Stream Commit + Commit Prepared
    streamed: int  # distinct top-level xids that arrived as streams
    prepared: int  # Prepare + Stream Prepare
    aborted: int  # top-level Stream Abort + Rollback Prepared
    subtransaction_aborts: int  # Stream Abort of a subtransaction (the transaction goes on)
    relations: dict[int, str] = field(default_factory=dict)  # OID -> "schema.name" (latest seen)
    first_lsn: int | None = None
    last_lsn: int | None = None
    problems: tuple[OrderProblem, ...] = ()  # order, duplicate and framing problems (see protocol/order.py)

    @property
    def healthy(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, object]:
        return {
            "messages": self.messages,
            "by_kind": self.by_kind,
            "transactions": {"committed": self.committed, "streamed": self.streamed, "prepared": self.prepared,
                             "aborted": self.aborted, "subtransaction_aborts": self.subtransaction_aborts},
            "relations": [{"oid": oid, "name": name} for oid, name in sorted(self.relations.items())],
            "lsn_range": None if self.first_lsn is None else
            {"first": format_lsn(self.first_lsn), "last": format_lsn(self.last_lsn or 0)},
            "problems": [{"problem": p.message, "kind": p.kind, "lsn": format_lsn(p.lsn), "row": p.row,
                          "xid": p.xid} for p in self.problems],
        }


def inspect_messages(messages: Iterable[RawMessage], *, progress: Callable[[int, int], None] | None = None,
                     progress_every: int = 100_000) -> InspectReport:
    """Decode every message (raising DecodeError with LSN and offset on the first bad one), count,
    and collect every order, duplicate and framing problem (a Commit without its Begin, a change
    outside a transaction, transactions or changes out of LSN order, a message seen twice).
    ``progress(count, lsn)`` is called every ``progress_every`` messages."""
    decoder = MessageDecoder()
    checker = OrderChecker(structure=True)
    problems: list[OrderProblem] = []
    counts = dict.fromkeys(KIND_NAMES, 0)
    streamed: set[int] = set()
    relations: dict[int, str] = {}
    aborted = sub_aborts = 0
    first = last = None
    n = 0
    for raw in messages:
        problems += checker.check(raw.lsn, raw.data)
        msg = decoder.decode(raw.data, lsn=raw.lsn)
        kind = chr(raw.data[0])
        counts[kind] += 1
        n += 1
        first = raw.lsn if first is None or raw.lsn < first else first
        last = raw.lsn if last is None or raw.lsn > last else last
        if kind == "R":
            assert isinstance(msg, Relation)
            relations[msg.oid] = f"{msg.namespace or 'pg_catalog'}.{msg.name}"
        elif kind == "S":
            assert isinstance(msg, StreamStart)
            streamed.add(msg.xid)
        elif kind == "A":
            assert isinstance(msg, StreamAbort)
            if msg.xid == msg.subxid:
                aborted += 1
            else:
                sub_aborts += 1
        if progress is not None and n % progress_every == 0:
            progress(n, raw.lsn)
    return InspectReport(
        messages=n,
        by_kind={k: v for k, v in counts.items() if v},
        committed=sum(counts[k] for k in _COMMITTED),
        streamed=len(streamed),
        prepared=sum(counts[k] for k in _PREPARED),
        aborted=aborted + counts[_ROLLED_BACK_PREPARED],
        subtransaction_aborts=sub_aborts,
        relations=relations,
        first_lsn=first,
        last_lsn=last,
        problems=tuple(problems),
    )


def format_report(report: InspectReport) -> str:
    lines = [f"messages: {report.messages}"]
    if report.first_lsn is not None:
        lines.append(f"lsn range: {format_lsn(report.first_lsn)} .. {format_lsn(report.last_lsn or 0)}")
    lines.append("by kind:")
    for kind, count in report.by_kind.items():
        lines.append(f"  {kind}  {KIND_NAMES[kind]:<18} {count}")
    lines.append(f"transactions: committed {report.committed}, streamed {report.streamed}, "
                 f"prepared {report.prepared}, aborted {report.aborted} "
                 f"(+{report.subtransaction_aborts} subtransaction aborts)")
    lines.append(f"relations: {len(report.relations)}")
    for oid, name in sorted(report.relations.items()):
        lines.append(f"  {name} (oid {oid})")
    if report.problems:
        lines.append(f"problems: {len(report.problems)} (replay stops at each of them)")
        for p in report.problems[:50]:
            xid = f", xid {p.xid}" if p.xid is not None else ""
            lines.append(f"  row {p.row}, {p.kind} at {format_lsn(p.lsn)}{xid}: {p.message}")
    else:
        lines.append("problems: none (in order, nothing seen twice)")
    return "\n".join(lines)
