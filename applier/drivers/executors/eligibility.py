"""Whether a log, or a mirror's settings and state, may be folded on executors at all.
"""

from __future__ import annotations

from applier.config import ApplySettings, ReplayConfig, TablesSettings
from applier.sources.rawlog import file_order_is_log_order
from applier.state import StateDir


def eligibility(config: ReplayConfig, state: StateDir) -> str | None:
    """None when the log may be replayed on executors; otherwise the reason it takes the driver path."""
    return folds_unfit(config.apply, config.tables, state) or file_order_is_log_order(config.source_log)


def folds_unfit(apply: ApplySettings, tables: TablesSettings, state: StateDir) -> str | None:
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
