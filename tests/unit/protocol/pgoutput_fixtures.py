"""Load the pgoutput messages captured from real servers by scripts/capture_fixtures.py."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pgoutput"


@dataclass(frozen=True, slots=True)
class Captured:
    file: str
    lsn: str
    xid: int
    data: bytes
    in_stream: bool  # between Stream Start and Stream Stop, as the server sent it


@cache
def manifest() -> dict[str, dict[str, Any]]:
    entries = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))["files"]
    return {e["file"]: e for e in entries}


@cache
def load(file: str) -> tuple[Captured, ...]:
    rows = []
    in_stream = False
    with open(FIXTURES / file, encoding="utf-8") as f:
        for line in f:
            obj = json.loads(line)
            data = bytes.fromhex(obj["data"])
            if data[:1] == b"E":
                in_stream = False
            rows.append(Captured(file, obj["lsn"], obj["xid"], data, in_stream))
            if data[:1] == b"S":
                in_stream = True
    return tuple(rows)


def files(scenario: str | None = None, option_set: str | None = None) -> list[str]:
    return sorted(name for name, e in manifest().items()
                  if (scenario is None or e["scenario"] == scenario)
                  and (option_set is None or name.endswith(f"_{option_set}.jsonl")))


def all_messages() -> list[Captured]:
    return [m for name in files() for m in load(name)]
