"""``distributed``: decoding and folding on Spark's executors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from applier.config.base import SettingsModel


class DistributedSettings(SettingsModel):
    """Decoding and folding on Spark's executors (applier.drivers.executors): for ``replay``, the driver
    surveys the log; for ``mirror``, a large backlog of the slot is read by the driver (applier.drivers.backlog).
    Executors decode and fold ranges of it, the driver combines and commits."""

    mode: Literal["auto", "on", "off"] = Field(
        "auto", description="auto: on executors when the log has at least min_messages messages (mirror: the "
        "backlog at least min_backlog_mb) and Spark has more than one core (spark.default.parallelism); on: "
        "whenever the log allows it; off: the driver path. A log that needs the driver path (history or "
        "change-feed tables, grouping 'transaction', prepared transactions staged by an earlier run, files not in "
        "log order; a mirror reading with read_mode 'sql') takes it, with a log line")
    min_messages: int = Field(2_000_000, ge=1, description="replay, auto: the smallest log replayed on executors")
    min_backlog_mb: int = Field(
        64, ge=0, description="mirror, auto: the smallest backlog (WAL between the slot's confirmed position and "
        "the server's flush position, in MiB) caught up on executors; the mirror then follows the stream on the "
        "driver")
    follow_backlog_mb: float = Field(
        0.0625, ge=0, description="mirror, following (the default is 64 kB): when messages have kept arriving "
        "for 0.25 s without the stream running dry, the server's flush position is asked (at most every "
        "0.25 s); when it is this many MiB of WAL ahead of what the mirror has read, further ahead than at the "
        "last question of the same busy spell (or closer by so little that at that pace the loop would need "
        "over 0.5 s to catch up), and no transaction is open, the backlog is caught up in ranges, as at the "
        "start, round after round while the load lasts (a round reads the stream as it comes for "
        "apply.max_group_seconds, or until no message came for 20 ms, then commits; the next at once after a round "
        "that ran its time, else once 64 kB more arrived); with folds on the driver at any size, on executors "
        "only from min_backlog_mb (auto). 0: never")
    backlog_folds: Literal["auto", "executors", "driver"] = Field(
        "auto", description="mirror: where the ranges of a backlog caught up in ranges are folded: executors (one "
        "Spark task per range), driver (in the mirror's own process while a thread reads on; no Spark needed for "
        "it), or auto, the default: executors when Spark's master is a cluster, the driver when it is local. On one "
        "machine the driver is cheaper: shipping a range to a Spark Python worker and its fold back costs more CPU "
        "than folding it column by column (bench/RESULTS.md)")
    backlog_reader: Literal["auto", "walsender"] = Field(
        "auto", description="mirror: how a backlog caught up in ranges when the mirror starts is read. auto, the "
        "default: through SQL, from two temporary copies of the slot (pg_copy_logical_replication_slot, then "
        "pg_logical_slot_get_binary_changes in pieces cut at WAL positions, one copy decoding the next piece "
        "while this process takes the last apart, without streaming), which costs the server a "
        "fraction of a walsender's CPU per message (the 1M and 10M catch-ups read in about 0.7 of the time: "
        "bench/RESULTS.md); the slot is advanced after the commits, and the walsender follows on from there. It "
        "needs one free replication slot (max_replication_slots) while it reads, two to read pieces at once; "
        "without one, for a slot with "
        "two_phase, and for a slot another process reads, the walsender reads it, with a log line. walsender: "
        "the walsender always (as PostgreSQL's own subscription). A mirror that "
        "falls behind while following reads its rounds from its walsender either way")
    partition_messages: int = Field(
        250_000, ge=1, description="messages per range given to one executor task (cut where no transaction "
        "is open, so a range may be longer). A range holds at most apply.max_group_rows messages too, and ends "
        "after apply.max_group_transactions transactions or apply.max_group_bytes_mb of messages (a range that "
        "reaches its size inside a transaction ends before it when it can): each group of ranges keeps the "
        "apply.max_group_* limits")

