"""Can this server serve what ``source`` asks for? Checked before any slot is made.

Why: the server refuses a pgoutput option it does not know only when decoding starts, in the walsender's
startup callback, after the slot and the initial copy exist, and as an error a supervisor takes for an
outage (exit 3 on every run: "proto_version 4 ... in the startup callback" on PostgreSQL 15). A config the
server cannot serve is a config error (exit 2), said at once with the version it needs. A standby as the
source needs PostgreSQL 16+ (logical decoding on a standby) and cannot hold a failover slot.
"""

from __future__ import annotations

import psycopg

from applier.config import SourceSettings
from applier.errors import ConfigError

#: proto_version -> the first PostgreSQL major that speaks it
PROTO_MAJOR = {1: 10, 2: 14, 3: 15, 4: 16}


def unmet_needs(source: SourceSettings, major: int, in_recovery: bool) -> list[str]:
    """What ``source`` asks that a server of ``major`` (a standby when ``in_recovery``) cannot do, one
    phrase each with its remedy."""
    needs: list[tuple[bool, int, str, str]] = [
        (True, PROTO_MAJOR[source.proto_version], f"proto_version {source.proto_version}",
         f"set source.proto_version to {max((v for v, m in PROTO_MAJOR.items() if m <= major), default=1)}"),
        (source.streaming == "parallel", 16, "streaming: parallel", "use streaming: on (proto_version 2 or 3)"),
        (source.streaming == "on", 14, "streaming: on", "set streaming: off"),
        (source.two_phase, 15, "two_phase", "set two_phase: false"),
        (source.binary, 14, "binary", "set binary: false"),
        (source.messages, 14, "messages", "set messages: false"),
        (source.origin is not None, 16, f"origin: {source.origin}", "remove source.origin"),
        (source.failover, 17, "failover (failover slots)", "remove failover from the config"),
        (in_recovery, 16, "a standby as the source (logical decoding on a standby)",
         "read from the primary, or upgrade"),
    ]
    found = [f"source.{what} needs PostgreSQL {need} or later; {fix}" if not what.startswith("a standby")
             else f"{what} needs PostgreSQL {need} or later; {fix}"
             for asked, need, what, fix in needs if asked and major < need]
    if in_recovery and source.failover and major >= 17:
        found.append("source.failover cannot be set for a slot on a standby: PostgreSQL synchronizes only a "
                     "primary's slots to standbys (sync_replication_slots); remove failover, or read from the "
                     "primary")
    return found


def check_server_serves(conn: psycopg.Connection, source: SourceSettings) -> None:
    """ConfigError (exit 2) naming every setting of ``source`` this server cannot serve."""
    major = conn.info.server_version // 10000
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    in_recovery = bool(row and row[0])
    found = unmet_needs(source, major, in_recovery)
    if found:
        where = "standby" if in_recovery else "server"
        raise ConfigError(f"this {where} (PostgreSQL {major}) cannot serve the source config: {'; '.join(found)}",
                          slot=source.slot)
