"""Where a table move a run began is recorded (the relation bindings' state file, applier.sink.identity):
read by the target registry's check (applier.sink.registry), which must let a half-moved table pass,
and written by the bindings, which finish the move in the next run. A leaf, so that neither of the
two imports the other for it.
"""

from __future__ import annotations

from pathlib import Path

from applier.state import StateDir, resolved_path

#: the state file of the relation bindings (applier.sink.identity), which holds a pending move
RELATIONS_FILE = "relations"


def interrupted_move(state: StateDir, target_dir: str | Path | None) -> str | None:
    """The path a table was being moved from when a run stopped (its intent is saved before anything
    moves; the next run's sink finishes the move and records it), under the target ``target_dir`` as it is
    now (the state keeps it relative to the target: applier.state.stored_path); None when no move is
    pending."""
    moving = (state.load(RELATIONS_FILE) or {}).get("moving")
    return resolved_path(target_dir, str(moving["from"])) if moving else None
