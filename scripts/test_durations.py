"""Write tests/durations.json, the seconds each test file took, from a full run's JUnit report.

Why: ``make test`` hands whole test files to two workers (pytest-xdist ``--dist loadfile``). The
suite's wall time is the busier worker's, so the long files (kill matrices, clusters, DDL chaos)
must start first and the short ones fill the gaps at the end; handed out in collection order, a
long scenario file that starts last alone decides when the run ends. ``tests/conftest.py`` orders
the files by these figures, longest first. They only order the run: a stale or missing figure
makes it slower, never wrong. Refresh them after a change that moves a file's time a lot::

    .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --junitxml=/tmp/suite.xml
    .venv/bin/python scripts/test_durations.py /tmp/suite.xml
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "tests" / "durations.json"


def file_of(classname: str) -> str | None:
    """``tests.integration.test_x.TestY`` -> ``tests/integration/test_x.py`` (a class name is dropped)."""
    parts = classname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = Path(*parts[:end]).with_suffix(".py")
        if (REPO / candidate).is_file():
            return candidate.as_posix()
    return None


def file_seconds(report: Path) -> dict[str, float]:
    seconds: Counter[str] = Counter()
    for case in ET.parse(report).getroot().iter("testcase"):
        name = file_of(case.get("classname", ""))
        if name is not None:
            seconds[name] += float(case.get("time", "0"))
    return {name: round(total, 1) for name, total in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", type=Path, help="the JUnit XML of a full run (pytest --junitxml)")
    args = parser.parse_args()
    seconds = file_seconds(args.report)
    OUTPUT.write_text(json.dumps(seconds, indent=1) + "\n")
    print(f"{OUTPUT.relative_to(REPO)}: {len(seconds)} files, {sum(seconds.values()):.0f} s in all")


if __name__ == "__main__":
    main()
