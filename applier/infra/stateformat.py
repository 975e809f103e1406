"""The state directory's format version (``<state>/format.json``) and the migrations between versions.

Why: a target outlives the release that made it. Its state directory (applier/state.py: the catalog, the
slot's phase, the tables' bindings and versions, ...) is read by whatever release runs next, and a file
laid out by another release is misread silently: a newer release must know what it was given, and an
older one must refuse what it cannot read instead of overwriting it. So the state carries one number
for the whole directory, the *format*:

- a directory without ``format.json`` was written by a release before formats were recorded (up to
  commit 5593802); its layout is format 1 (:data:`UNVERSIONED`);
- a writer (``mirror``, ``replay``, ``resync``, the streaming sink: whatever opens ``target_writer``)
  brings the state to :data:`CURRENT` under its lock before it writes anything else
  (:func:`upgrade`): the migrations of :data:`MIGRATIONS` from the format found, in order, each one
  recorded when it is done (a run killed half-way goes on from the one it was in), then the stamp;
- a format above :data:`CURRENT` (a newer release ran here) is refused, by writers and readers
  (``status``) alike, before anything is touched (:class:`StateFormatError`, exit 2).

The next change to the layout adds a :class:`Migration` at the end of :data:`MIGRATIONS`, raises
:data:`CURRENT`, and adds a fixture made by the release before it (tests/fixtures/upgrade/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from applier.errors import InputError
from applier.state import StateDir

__all__ = ["CURRENT", "FORMAT_FILE", "MIGRATIONS", "Migration", "StateFormatError", "UNVERSIONED",
           "check_readable", "found_format", "refuse_newer", "upgrade"]

log = logging.getLogger(__name__)

#: ``<state>/format.json``: ``{"format": N, "written_by": "applier X.Y.Z"}``
FORMAT_FILE = "format"
#: the format this release writes
CURRENT = 2
#: what a state directory without ``format.json`` is: the layout of every release before formats were
#: recorded (tests/fixtures/upgrade/v1-5593802 is one)
UNVERSIONED = 1


@dataclass(frozen=True)
class Migration:
    """One step of the layout, from ``to_format - 1`` to ``to_format``.

    ``apply`` rewrites the files of a state directory of the format before it, and must accept an empty or
    partly written one (a first run has no files yet) and being run again after a kill half-way.
    ``readers_need_it``: ``status`` and other read-only commands cannot read the state before this step has
    run (they never migrate: a running mirror may hold the lock); they then ask for a writer's run first."""

    to_format: int
    what: str
    apply: Callable[[StateDir], None]
    readers_need_it: bool = False


#: the files of format 1 that hold table paths (absolute then): the relation bindings (applier.sink.identity:
#: ``tables.<oid>.path``, ``moving.from``/``to``), the target registry (applier.sink.registry: keyed by path)
#: and the tables' versions (applier.sink.tableversions: ``tables`` keyed by path)
_RELATIONS, _REGISTRY, _VERSIONS = "relations", "tables", "table_versions"
#: the target root the paths are relative to (applier.sink.registry.ROOT_FILE)
_ROOT = "target"


def _layout_root(path: str, name: str, retired: bool = False) -> str | None:
    """The target root ``path`` lies in when it is where the target's layout puts table ``name`` (schema.table):
    ``ROOT/<schema>/<table>``, or ``ROOT/_retired/<schema>/<table>@<oid>`` for a retired one; None otherwise
    (a ``tables.rules`` target elsewhere, a catalog's location)."""
    from applier.storage.layout import RETIRED_DIR, source_name_of
    from applier.storage.paths import location

    table = location(path)
    if retired:
        parent = table.parent.parent
        if parent.name != RETIRED_DIR or ".".join(source_name_of(table)).rpartition("@")[0] != name:
            return None
        return str(parent.parent)
    if ".".join(source_name_of(table)) != name:
        return None
    return str(table.parent.parent)


def _old_root(state: StateDir) -> str | None:
    """The root a format 1 state's absolute paths were written under: recorded by a run killed in this
    migration; else the root the tables' own paths point at (every table in the layout, ``ROOT/<schema>/
    <table>``, names it), the target's root now when it is one of those (an upgrade in place), else the one
    most tables name (a state restored or moved elsewhere before this release ran); else the target's root
    now (no table in the layout: nothing to make relative but a rule's own paths, which stay absolute)."""
    from collections import Counter

    from applier.state import same_location

    recorded = state.load(_ROOT)
    if isinstance(recorded, dict) and recorded.get("path"):
        return str(recorded["path"])
    named: Counter[str] = Counter()
    for bound in ((state.load(_RELATIONS) or {}).get("tables") or {}).values():
        named[_layout_root(str(bound.get("path")), str(bound.get("name")), bool(bound.get("retired"))) or ""] += 1
    for path, entry in (state.load(_REGISTRY) or {}).items():
        named[_layout_root(path, str(entry.get("table"))) or ""] += 1
    for path, entry in ((state.load(_VERSIONS) or {}).get("tables") or {}).items():
        named[_layout_root(path, str(entry.get("table"))) or ""] += 1
    roots = [root for root, _ in named.most_common() if root not in ("", ".")]  # (".": a path made relative)
    if state.target is not None and any(same_location(root, state.target) for root in roots):
        return state.target
    return roots[0] if roots else state.target


def _relative_paths(state: StateDir) -> None:
    """Format 1 -> 2: table paths relative to the target's root (applier.state.stored_path). The root they are
    relative to is recorded first (``target.json``: a run killed half-way goes on with the same one); every
    file is rewritten as a whole (atomically), and a path already relative is kept: running it again is
    harmless. A path outside the root stays absolute."""
    from applier.state import stored_path

    if not any((state.root / f"{name}.json").is_file() for name in (_RELATIONS, _REGISTRY, _VERSIONS)):
        return
    root = _old_root(state)
    if root is None:  # (a state made without its target: its paths are kept absolute, which is still read)
        return
    if state.load(_ROOT) is None:
        state.save(_ROOT, {"path": root})
    relations = state.load(_RELATIONS)
    if relations is not None:
        for bound in (relations.get("tables") or {}).values():
            if bound.get("path"):
                bound["path"] = stored_path(root, str(bound["path"]))
        moving = relations.get("moving")
        if moving:
            for end in ("from", "to"):
                if moving.get(end):
                    moving[end] = stored_path(root, str(moving[end]))
        state.save(_RELATIONS, relations)
    registry = state.load(_REGISTRY)
    if registry is not None:
        state.save(_REGISTRY, {stored_path(root, path): entry for path, entry in registry.items()})
    versions = state.load(_VERSIONS)
    if versions is not None:
        versions["tables"] = {stored_path(root, path): entry for path, entry in (versions.get("tables") or {}).items()}
        state.save(_VERSIONS, versions)


#: in order: ``MIGRATIONS[i]`` brings format ``i + 1`` to ``i + 2`` (format 1 is the layout of the releases
#: before formats were recorded)
MIGRATIONS: tuple[Migration, ...] = (
    Migration(2, "table paths kept relative to the target's root (a target moved or restored elsewhere with its "
              "state goes on there)", _relative_paths),
)


class StateFormatError(InputError):
    """The state directory is of a format this release does not read: written by a newer release (or a
    ``format.json`` that is no format at all). A restart meets the same directory: exit 2, and nothing in it
    was touched."""


def _release() -> str:
    from importlib import metadata

    try:
        return f"applier {metadata.version('applier')}"
    except metadata.PackageNotFoundError:  # a source checkout that was never installed
        return "applier (unknown version)"


def _recorded(state: StateDir) -> dict[str, Any] | None:
    try:
        payload = state.load(FORMAT_FILE)
    except (OSError, ValueError) as e:  # unreadable, or not JSON (a partial copy of the directory)
        raise StateFormatError(f"cannot read the state directory's format file {state.root / 'format.json'}: {e}; "
                               "restore it from where the state was copied, or, if this is a state of this "
                               "release, write {\"format\": " f"{CURRENT}" "} into it",
                               state_dir=str(state.root)) from None
    if payload is None:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("format"), int) or payload["format"] < 1:
        raise StateFormatError(f"{state.root / 'format.json'} holds no state format (a positive number under "
                               "\"format\"); restore it from where the state was copied",
                               state_dir=str(state.root))
    return payload


def found_format(state: StateDir) -> int:
    """The format of ``state`` as it is on disk (:data:`UNVERSIONED` without ``format.json``)."""
    recorded = _recorded(state)
    return UNVERSIONED if recorded is None else int(recorded["format"])


def refuse_newer(state: StateDir, command: str) -> int:
    """The format of ``state``; raise :class:`StateFormatError` when a newer release wrote it. Reads one file
    and writes nothing: call it before the lock, the server, Spark, or any probe of the target."""
    recorded = _recorded(state)
    found = UNVERSIONED if recorded is None else int(recorded["format"])
    if found <= CURRENT:
        return found
    by = str((recorded or {}).get("written_by") or "a newer applier")
    raise StateFormatError(
        f"the state directory {state.root} is of state format {found}, written by {by}; this release "
        f"({_release()}) reads state formats up to {CURRENT} and has changed nothing in it. Run `applier {command}` "
        "of that release or a later one. A state is never converted back: to go on with this release, start "
        "anew with an empty target and state directory (`applier mirror` takes a new snapshot, after the old "
        "slot is dropped; `applier replay` replays the log again)",
        state_dir=str(state.root), state_format=found, known_format=CURRENT, command=command)


def check_readable(state: StateDir, command: str) -> None:
    """For a command that only reads the state (``status``): refuse a newer format, and an older one that a
    pending migration makes unreadable until a writer has run (it never migrates itself)."""
    found = refuse_newer(state, command)
    pending = [m for m in MIGRATIONS[found - 1:] if m.readers_need_it]
    if pending:
        raise StateFormatError(
            f"the state directory {state.root} is of state format {found}, and this release reads it only once "
            f"it is brought to format {CURRENT} ({'; '.join(m.what for m in pending)}): run the mirror (or replay) "
            f"of this release once, which does it under its lock, then `applier {command}` again",
            state_dir=str(state.root), state_format=found, known_format=CURRENT, command=command)


def upgrade(state: StateDir, command: str) -> list[str]:
    """Bring ``state`` to :data:`CURRENT`, for a writer that holds the target's lock: refuse a newer format,
    run the pending migrations in order (each recorded when done), and stamp the format on a state that
    has none yet (a first run, or one of a release before formats were recorded). Returns what was done.
    A first run (a state directory with no file of its own yet) has nothing to migrate: it is stamped."""
    found = refuse_newer(state, command)
    done: list[str] = []
    if found == UNVERSIONED and not any(state.root.glob("*.json")):
        _stamp(state, CURRENT)
        return done
    for step in MIGRATIONS[found - 1:]:
        log.warning("state directory %s: state format %d to %d: %s", state.root, step.to_format - 1,
                    step.to_format, step.what)
        step.apply(state)
        _stamp(state, step.to_format)
        done.append(step.what)
    if _recorded(state) is None:
        _stamp(state, CURRENT)
    return done


def _stamp(state: StateDir, version: int) -> None:
    state.save(FORMAT_FILE, {"format": version, "written_by": _release()})

