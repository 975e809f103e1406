"""Benchmark: reading a slot's backlog over the replication protocol the way the catch-up's reader does
(WalSenderStream.read_message and the survey of each message), without and with ``gather``.

    .venv/bin/python bench/stream_read.py [--transactions 10000] [--rows-per-transaction 100] [--runs 3]
                                          [--gather 0.001]

A reader that keeps up with the walsender gets one or two frames per socket read, and the walsender,
finding room in the socket each time, sends every frame on its own. ``gather`` lets frames pile up
when the reader has outrun the walsender. Per run and mode: the reader thread's CPU time, the
walsender process's CPU time (from /proc), the wall time and the socket reads. Each run reads a slot
of its own over the same backlog (the catch-up workload of bench/catchup.py), modes alternating.
Every run must read the same number of messages (tests/integration/test_walsender_reads.py checks that the frames
are the same). The last line is one JSON object with the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from catchup import SCHEMA  # noqa: E402  (bench/catchup.py)

from applier.drivers.executors.survey import Surveyor  # noqa: E402
from applier.protocol.replication import PrimaryKeepalive  # noqa: E402
from applier.sources.walsender import WalSenderStream  # noqa: E402

if TYPE_CHECKING:
    import psycopg


def log(msg: str) -> None:
    print(f"bench/stream_read: {msg}", file=sys.stderr, flush=True)


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text()
    rest = fields[fields.rindex(")") + 2:].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def read_backlog(conn: psycopg.Connection[Any], dsn: str, slot: str, gather: float) -> dict[str, float]:
    stream = WalSenderStream(dsn)
    try:
        stream.start(slot, {"proto_version": "2", "publication_names": "cu_pub", "streaming": "on"})
        (walsender,) = conn.execute(  # type: ignore[misc]  # the slot is active: one row
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
        surveyor = Surveyor(None)
        walsender_before, wall, cpu = process_cpu(walsender), time.monotonic(), time.thread_time()
        messages = 0
        lsns: list[int] = []
        datas: list[bytes] = []
        while (frame := stream.read_message(0.5, gather=gather)) is not None:
            if isinstance(frame, PrimaryKeepalive):
                continue
            lsn, data = frame
            surveyor.add(lsn, data)
            surveyor.may_cut_after(data)
            lsns.append(lsn)
            datas.append(data)
            messages += 1
            if len(lsns) >= 250_000:  # ranges are handed on
                lsns, datas = [], []
        # the last 0.5 s waited for more and found the stream quiet: not reading
        return {"messages": messages, "wall_s": time.monotonic() - wall - 0.5, "reader_cpu_s": time.thread_time() - cpu,
                "walsender_cpu_s": process_cpu(walsender) - walsender_before, "socket_reads": stream.socket_reads}
    finally:
        stream.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--transactions", type=int, default=10_000)
    p.add_argument("--rows-per-transaction", type=int, default=100)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gather", type=float, default=0.001, help="seconds (the catch-up's reader uses 0.001)")
    args = p.parse_args()

    import psycopg

    from applier.devtools.pgcluster import start_cluster

    modes = {"plain": 0.0, "gathered": args.gather}
    results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    with start_cluster() as cluster, psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute(SCHEMA)
        slots = [(f"r{i}_{mode}", mode) for i in range(args.runs) for mode in modes]
        for slot, _ in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        conn.execute("SET synchronous_commit = off")
        conn.execute("CALL cu_run(%s, %s)", (args.transactions, args.rows_per_transaction))
        conn.execute("SET synchronous_commit = on")
        for slot, mode in slots:
            r = read_backlog(conn, cluster.dsn(), slot, modes[mode])
            results[mode].append(r)
            log(f"{mode}: {r['messages']} messages in {r['wall_s']:.1f} s, reader CPU {r['reader_cpu_s']:.2f} s, "
                f"walsender CPU {r['walsender_cpu_s']:.2f} s, {r['socket_reads']} socket reads")
    counts = {r["messages"] for rs in results.values() for r in rs}
    if len(counts) != 1:  # every slot holds the same backlog
        raise SystemExit(f"bench/stream_read: the runs read different numbers of messages: {sorted(counts)}")
    medians = {mode: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for mode, rs in results.items()}
    for mode, m in medians.items():
        log(f"median {mode}: wall {m['wall_s']:.2f} s, reader CPU {m['reader_cpu_s']:.2f} s, walsender CPU "
            f"{m['walsender_cpu_s']:.2f} s, {m['messages'] / max(m['socket_reads'], 1):.0f} frames per socket read")
    print(json.dumps({"transactions": args.transactions, "rows_per_transaction": args.rows_per_transaction,
                      "runs": args.runs, "gather_s": args.gather, **medians}))


if __name__ == "__main__":
    main()
