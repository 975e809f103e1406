"""Decode speed: our pgoutput decoder vs. pypgoutput (PyPI) on the same stored messages.

Both decoders get the same messages, already in memory (reading Parquet is not measured). Ours
produces the full dataclasses, TupleData split into per-column raw values (no type conversion; a
value of 16 kB or more, a TOAST value, is a read-only ``memoryview`` of its message rather than a
copy: ``protocol.tupledata.VIEW_FROM_BYTES``); pypgoutput produces its message objects (it also
decodes text values to ``str``). What the conversion of such a value costs (the copy included) is
in ``ours_with_conversion_msgs_per_s``. pypgoutput
only knows the protocol-1 kinds B, C, R, I, U, D, T; messages of other kinds are left out of BOTH
runs so that the rates compare the same work. The decoders run ``--repeat`` times each,
interleaved; the median rates and the median of the per-repetition ratios are reported.
The LAST line printed is one JSON object::

    {"messages": ..., "ours_msgs_per_s": ..., "pypgoutput_msgs_per_s": ..., "ratio": ...,
     "ours_with_conversion_msgs_per_s": ...}

``--no-baseline`` leaves pypgoutput out (it is in the optional ``bench`` extra, which ``make setup`` does
not install): the pypgoutput rate and the ratio are then null. The test suite's smoke run of this
script (tests/scenario/test_bench_smoke.py) uses it where pypgoutput is missing.

``ours_with_conversion_msgs_per_s`` is our rate when every Insert/Update/Delete row is also
converted to typed Python values (``RowConverter`` of applier.values: ints, Decimals with the
column's scale, timezone-aware datetimes, ...), with Relation messages kept in a
``RelationCache``: what the applier itself does before building Spark rows.

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

from applier.catalog import RelationCache  # noqa: E402
from applier.protocol import MessageDecoder  # noqa: E402
from applier.protocol.messages import Delete, Insert, Relation, Update  # noqa: E402
from applier.sources.rawlog import read_raw_log  # noqa: E402
from applier.values import SpecialValuePolicy  # noqa: E402
from applier.values.convert import RowConverter  # noqa: E402

PYPGOUTPUT_KINDS = frozenset(b"BCRIUDT")


def ours(messages: list[bytes]) -> None:
    decode = MessageDecoder().decode
    for data in messages:
        decode(data)


def ours_with_conversion(messages: list[bytes], policy: SpecialValuePolicy = "clamp") -> None:
    """Decode, keep the catalog, and convert every row image to typed values. Values Spark cannot
    hold (``timestamptz 'infinity'``, BC dates) are clamped by default, as ``apply.special_values:
    clamp`` does: the benchmark measures conversion, it must not stop on them (``--special-values``)."""
    decode = MessageDecoder().decode
    relations = RelationCache()
    converters: dict[int, RowConverter] = {}
    for data in messages:
        msg = decode(data)
        if isinstance(msg, Insert):
            converters[msg.relation_oid].convert(msg.new)
        elif isinstance(msg, Update):
            converters[msg.relation_oid].convert(msg.new)
            if msg.old is not None:
                converters[msg.relation_oid].convert(msg.old)
        elif isinstance(msg, Delete):
            converters[msg.relation_oid].convert(msg.old)
        elif isinstance(msg, Relation):
            converters[msg.oid] = RowConverter(relations.update(msg), relations.types, policy)


def pypgoutput_decoder() -> Callable[[list[bytes]], None]:
    from pypgoutput import decoders as d

    table = {ord("B"): d.Begin, ord("C"): d.Commit, ord("R"): d.Relation, ord("I"): d.Insert,
             ord("U"): d.Update, ord("D"): d.Delete, ord("T"): d.Truncate}

    def run(messages: list[bytes]) -> None:
        for data in messages:
            table[data[0]](data)

    return run


def seconds(fn: Callable[[list[bytes]], None], messages: list[bytes]) -> float:
    t0 = time.perf_counter()
    fn(messages)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", help="raw log (Parquet file or directory, or Delta table)")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--no-baseline", action="store_true",
                        help="leave pypgoutput out (not installed): our rates only, no ratio")
    parser.add_argument("--special-values", choices=["clamp", "null", "error"], default="clamp",
                        help="policy for values Spark cannot hold in the conversion pass (default: clamp)")
    args = parser.parse_args(argv)
    everything = [m.data for m in read_raw_log(args.path)]
    messages = [d for d in everything if d[0] in PYPGOUTPUT_KINDS]
    n = len(messages)
    print(f"{n} messages ({len(everything) - n} of kinds pypgoutput lacks left out)", file=sys.stderr)
    theirs_fn = None if args.no_baseline else pypgoutput_decoder()
    # Interleaved repetitions: a slow spell of a shared machine hits both decoders of the same
    # repetition, so the ratio is taken per repetition and its median reported.
    runs: dict[str, list[float]] = {"ours": [], "pypgoutput": [], "converted": []}
    ratios = []
    for i in range(args.repeat):
        t_ours = seconds(ours, messages)
        against = ""
        if theirs_fn is not None:
            t_theirs = seconds(theirs_fn, messages)
            runs["pypgoutput"].append(n / t_theirs)
            ratios.append(t_theirs / t_ours)
            against = f", pypgoutput {n / t_theirs:,.0f} msgs/s, ratio {t_theirs / t_ours:.2f}"
        t_conv = seconds(lambda m: ours_with_conversion(m, args.special_values), messages)
        runs["ours"].append(n / t_ours)
        runs["converted"].append(n / t_conv)
        print(f"repetition {i + 1}/{args.repeat}: ours {n / t_ours:,.0f} msgs/s{against}; ours with conversion "
              f"{n / t_conv:,.0f} msgs/s", file=sys.stderr)
    median = {name: statistics.median(rates) for name, rates in runs.items() if rates}
    print(json.dumps({"messages": n, "repeat": args.repeat, "ours_msgs_per_s": round(median["ours"]),
                      "pypgoutput_msgs_per_s": round(median["pypgoutput"]) if ratios else None,
                      "ratio": round(statistics.median(ratios), 2) if ratios else None,
                      "ours_with_conversion_msgs_per_s": round(median["converted"])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
