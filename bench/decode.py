"""Decode speed: our pgoutput decoder vs. pypgoutput (PyPI) on the same stored messages.

Both decoders get the same messages, already in memory (reading Parquet is not measured). Ours
produces the full dataclasses, TupleData split into per-column raw values (no type conversion);
pypgoutput produces its message objects (it also decodes text values to ``str``). pypgoutput
only knows the protocol-1 kinds B, C, R, I, U, D, T; messages of other kinds are left out of BOTH
runs so that the rates compare the same work. Each decoder runs ``--repeat`` times; the median is
reported. The LAST line printed is one JSON object::

    {"messages": ..., "ours_msgs_per_s": ..., "pypgoutput_msgs_per_s": ..., "ratio": ...,
     "ours_with_conversion_msgs_per_s": null}

``ours_with_conversion_msgs_per_s`` stays null until the values layer (applier.values) offers a
text/binary-to-Python conversion to time together with decoding.

Make a realistic log with ``bench/make_decode_log.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from applier.protocol import MessageDecoder  # noqa: E402
from applier.sources.rawlog import read_raw_log  # noqa: E402

PYPGOUTPUT_KINDS = frozenset(b"BCRIUDT")


def ours(messages: list[bytes]) -> None:
    decode = MessageDecoder().decode
    for data in messages:
        decode(data)


def pypgoutput_decoder() -> Callable[[list[bytes]], None]:
    from pypgoutput import decoders as d

    table = {ord("B"): d.Begin, ord("C"): d.Commit, ord("R"): d.Relation, ord("I"): d.Insert,
             ord("U"): d.Update, ord("D"): d.Delete, ord("T"): d.Truncate}

    def run(messages: list[bytes]) -> None:
        for data in messages:
            table[data[0]](data)

    return run


def rate(fn: Callable[[list[bytes]], None], messages: list[bytes], repeat: int) -> float:
    rates = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(messages)
        rates.append(len(messages) / (time.perf_counter() - t0))
    return statistics.median(rates)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="raw log (Parquet file or directory, or Delta table)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    everything = [m.data for m in read_raw_log(args.path)]
    messages = [d for d in everything if d[0] in PYPGOUTPUT_KINDS]
    print(f"{len(messages)} messages ({len(everything) - len(messages)} of kinds pypgoutput lacks left out)",
          file=sys.stderr)
    ours_rate = rate(ours, messages, args.repeat)
    print(f"ours:       {ours_rate:12,.0f} msgs/s", file=sys.stderr)
    theirs = rate(pypgoutput_decoder(), messages, args.repeat)
    print(f"pypgoutput: {theirs:12,.0f} msgs/s", file=sys.stderr)
    print(json.dumps({"messages": len(messages), "repeat": args.repeat, "ours_msgs_per_s": round(ours_rate),
                      "pypgoutput_msgs_per_s": round(theirs), "ratio": round(ours_rate / theirs, 2),
                      "ours_with_conversion_msgs_per_s": None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
