"""Whether a log, or a mirror's settings and state, may be folded on executors at all.
"""

from __future__ import annotations

from applier.config import GroupingSettings, ReplayConfig, TablesSettings
from applier.sources.rawlog import file_order_is_log_order
from applier.state import StateDir


def eligibility(config: ReplayConfig, state: StateDir) -> str | None:
    """None when the log may be replayed on executors; otherwise the reason it takes the driver path."""
    return (folds_unfit(config.apply, config.tables, state) or file_order_is_log_order(config.source_log)
            or recorded_schema_changes(config.source_log, state))


def recorded_schema_changes(path: str, state: StateDir) -> str | None:
    """Why a log whose catalog notes (``applier capture``) show a change the sink may ask the catalog
    about takes the driver path, or None: a relation renamed or dropped, a name another relation had,
    its columns changed (from the state's catalog on). The driver path reads the notes in log order
    (applier.drivers.replay); the survey and the executors do not. Only the notes column is read."""
    from applier.sources.catalog_lookup import CatalogNote
    from applier.sources.rawlog import catalog_notes

    texts = catalog_notes(path)
    if not texts:
        return None
    shapes: dict[int, tuple[tuple[str, str], tuple[str, ...]]] = {}
    holders: dict[tuple[str, str], int] = {}
    for v in (state.load("catalog") or {}).get("relations", []):
        name = (v["namespace"] or "pg_catalog", v["name"])
        shapes[int(v["oid"])] = (name, tuple(str(c[1]) for c in v["columns"]))
        holders[name] = int(v["oid"])
    why = "the log's catalog notes record a table renamed, dropped or taken over, or columns changed"
    for text in texts:
        note = CatalogNote.from_json(text)
        if note is None:
            continue
        if note.others or note.now != note.name or holders.get(note.name, note.oid) != note.oid \
                or shapes.get(note.oid, (note.name, note.columns)) != (note.name, note.columns):
            return why + " (replayed with them on the driver, in log order)"
        shapes[note.oid] = (note.name, note.columns)
        holders[note.name] = note.oid
    return None


def folds_unfit(apply: GroupingSettings, tables: TablesSettings, state: StateDir) -> str | None:
    """Why folds made on executors cannot stand for these settings and this state (replay and the
    mirror's catch-up alike), or None."""
    if apply.grouping == "transaction":
        return "apply.grouping is 'transaction' (one commit per source transaction)"
    if any(rule.history or rule.changes for rule in tables.rules):
        return "history or change-feed tables need every change, not a fold"
    from applier.assembly.staging import PreparedStore

    if PreparedStore(state.staging_dir).gids():
        return "prepared transactions staged by an earlier run wait for their Commit Prepared"
    from applier.loop import PIECES_KEY

    if state.load(PIECES_KEY):  # a fold of the whole transaction would apply its committed pieces again
        return "a large transaction was being applied in pieces when an earlier run stopped"
    return None


def log_messages(path: str) -> int:
    """The number of messages in the log, from the files' footers (no data read)."""
    from applier.sources.rawlog import log_message_count

    return log_message_count(path)
