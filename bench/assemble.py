"""Benchmark: one transaction of N small rows (default 5 million) through decode + assembly, peak RSS.

    .venv/bin/python bench/assemble.py [--rows 5000000] [--budget-mb 256] [--runs 3]

The message bytes are real: a PostgreSQL server (started by the script) produces one Begin,
Relation, Insert and Commit for a two-column table; the script then writes a raw log of one
transaction with N inserts built on that Insert's layout (only the key and value text differ) and
runs the assembler over it in a fresh subprocess per run, reporting the peak RSS of that process
(getrusage), the time, and how many times it spilled. Target (issue 4): peak RSS under 1 GiB.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def capture_templates() -> dict[str, bytes]:
    import psycopg

    from applier.devtools.pgcluster import start_cluster
    from applier.sources.sql_slot import create_slot, peek, pgoutput_options

    with start_cluster() as cluster, psycopg.connect(cluster.dsn(), autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id bigint PRIMARY KEY, v text)")
        conn.execute("CREATE PUBLICATION p FOR TABLE t")
        create_slot(conn, "s")
        conn.execute("INSERT INTO t VALUES (1, 'value-1')")
        msgs = {m.data[:1].decode(): m.data for m in peek(conn, "s", pgoutput_options("p"))}
    return msgs


def write_log(path: Path, templates: dict[str, bytes], rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from applier.sources.rawlog_writer import RAW_LOG_SCHEMA

    insert = templates["I"]
    head = insert[:5] + b"N" + struct.pack("!h", 2)  # 'I', relation oid, 'N', two columns
    col = struct.Struct("!ci")
    with pq.ParquetWriter(str(path), RAW_LOG_SCHEMA) as w:
        def put(datas: list[bytes]) -> None:
            w.write_table(pa.Table.from_arrays(
                [pa.array(["0/1000000"] * len(datas)), pa.array([1000] * len(datas), pa.int64()),
                 pa.array(datas, pa.binary())], schema=RAW_LOG_SCHEMA))

        put([templates["B"], templates["R"]])
        batch: list[bytes] = []
        for i in range(rows):
            key = str(i).encode()
            value = b"value-%d" % i
            batch.append(head + col.pack(b"t", len(key)) + key + col.pack(b"t", len(value)) + value)
            if len(batch) == 200_000:
                put(batch)
                batch = []
        put(batch + [templates["C"]])


RUNNER = r"""
import json, resource, sys, time
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from applier.assembly import TransactionAssembler
from applier.protocol.decoder import MessageDecoder
from applier.sources.rawlog import read_raw_log
started = time.monotonic()
asm = TransactionAssembler(memory_budget_bytes=int(sys.argv[2]) << 20, spill_dir=Path(sys.argv[4]))
dec = MessageDecoder()
changes = 0
spills = 0
for raw in read_raw_log(sys.argv[1]):
    for txn in asm.feed(raw.lsn, dec.decode(raw.data, raw.lsn)):
        spills = txn.changes._buffer.spill_events
        for _change in txn.changes:
            changes += 1
        asm.finished(txn)
print(json.dumps({"changes": changes, "seconds": time.monotonic() - started, "spills": spills,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--budget-mb", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    repo = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="applier-bench-") as tmp:
        log = Path(tmp) / "one-big-transaction.parquet"
        write_log(log, capture_templates(), args.rows)
        results = []
        for run in range(args.runs):
            out = subprocess.run([sys.executable, "-c", RUNNER, str(log), str(args.budget_mb), repo, tmp],
                                 capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            assert res["changes"] == args.rows, res
            print(f"run {run + 1}: {res}", file=sys.stderr)
            results.append(res)
    print(json.dumps({
        "rows": args.rows, "budget_mb": args.budget_mb, "runs": args.runs,
        "peak_rss_mb_median": round(statistics.median(r["peak_rss_mb"] for r in results), 1),
        "peak_rss_mb_max": round(max(r["peak_rss_mb"] for r in results), 1),
        "seconds_median": round(statistics.median(r["seconds"] for r in results), 1),
        "spills": results[0]["spills"], "target_peak_rss_mb": 1024,
    }))


if __name__ == "__main__":
    main()
