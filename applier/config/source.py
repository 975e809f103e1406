"""``source``: where the changes come from (the slot, publication, DSN and pgoutput options)."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from applier.config.base import SettingsModel
from applier.errors import ConfigError

#: libpq variables that say which server to use: with one of them set, an empty DSN is a complete one.
LIBPQ_SERVER_ENV = ("PGHOST", "PGHOSTADDR", "PGSERVICE", "PGDATABASE", "PGPORT")


def libpq_env_given() -> bool:
    return any(os.environ.get(v) for v in LIBPQ_SERVER_ENV)


#: PostgreSQL's rule for replication slot names (ReplicationSlotValidateName in slot.c).
_SLOT_NAME = re.compile(r"[a-z0-9_]{1,63}")


def _slot_name(value: str) -> str:
    """Checked here, not by the server: the server refuses a bad name only when the slot is created,
    after Spark has started (20 s), and as an error that looks like an outage (exit 3)."""
    if not _SLOT_NAME.fullmatch(value):
        hint = f" (e.g. {value.lower()!r})" if _SLOT_NAME.fullmatch(value.lower()) else ""
        raise ValueError(f"not a valid replication slot name: {value!r}; PostgreSQL allows only lower-case "
                         f"letters, digits and underscores, at most 63 characters{hint}")
    return value


#: A replication slot name PostgreSQL accepts.
SlotName = Annotated[str, AfterValidator(_slot_name)]


def publication_names(text: str) -> list[str]:
    """The publications of a ``source.publication`` setting, read as pgoutput reads its
    ``publication_names`` option (SplitIdentifierString): comma-separated, blanks around a name ignored,
    unquoted names folded to lower case, "double-quoted" names taken as written ("" is a quote)."""
    names: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i < n and text[i] == '"':
            j, name = i + 1, []
            while True:
                end = text.find('"', j)
                if end < 0:
                    raise ConfigError(f"unterminated quoted name in publication list {text!r}")
                name.append(text[j:end])
                if text.startswith('"', end + 1):  # "" inside quotes
                    name.append('"')
                    j = end + 2
                    continue
                i = end + 1
                break
            value = "".join(name)
        else:
            j = i
            while i < n and text[i] != "," and not text[i].isspace():
                i += 1
            value = text[j:i].lower()
        while i < n and text[i].isspace():
            i += 1
        if not value or (i < n and text[i] != ","):
            raise ConfigError(f"not a comma-separated list of publication names: {text!r}")
        names.append(value)
        if i >= n:
            return names
        i += 1  # the comma


class SourceSettings(SettingsModel):
    """Where the changes come from: a PostgreSQL logical replication slot."""

    dsn: SecretStr | None = Field(
        None, description="libpq connection string (key=value pairs or a postgresql:// URI); prefer dsn_env or "
        "libpq's own PGHOST/PGSERVICE/PGPASSWORD and ~/.pgpass, which keep the password out of the file")
    dsn_env: str = Field("APPLIER_DSN", description="environment variable holding the DSN when dsn is unset")
    slot: SlotName = Field(
        "applier", description="logical replication slot (pgoutput); created when absent; lower-case letters, "
        "digits and underscores only (PostgreSQL's rule), at most 63 characters")
    publication: str = Field(
        "applier", description="publication whose tables are mirrored, or several as a comma-separated list, read "
        "as pgoutput reads publication_names (unquoted names fold to lower case, \"Quoted\" ones do not); a table "
        "in several is filtered as PostgreSQL filters it: their row filters OR-ed, none when one of them has none")
    proto_version: Literal[1, 2, 3, 4] = Field(1, description="pgoutput protocol version")
    streaming: Literal["off", "on", "parallel"] = Field(
        "off", description="stream in-progress transactions (on: proto >= 2, parallel: proto >= 4, PG 16+)")
    two_phase: bool = Field(False, description="decode prepared transactions (proto >= 3, PG 15+)")
    binary: bool = Field(False, description="binary column values (PG 14+)")
    messages: bool = Field(False, description="receive pg_logical_emit_message messages (PG 14+)")
    origin: Literal["any", "none"] | None = Field(
        None, description="pgoutput's origin option (PG 16+), a filter on the server: 'none' sends only changes "
        "made locally on the source (not those a subscription or other replication origin wrote there, "
        "which avoids loops in bidirectional setups); 'any' sends all; unset: the server's default (any)")
    read_mode: Literal["replication", "sql"] = Field(
        "replication", description="streaming replication protocol, or SQL peek/advance")
    failover: bool = Field(
        False, description="PostgreSQL 17+: create the slot with FAILOVER (an existing slot is altered), so that "
        "standbys with sync_replication_slots keep a copy and the mirror can follow the new primary after a "
        "failover; the primary and the standby need the settings in docs/operations.md ('Failover'). Off by "
        "default, also on 17+: a failover slot alone is no protection (a standby keeps a copy only with "
        "sync_replication_slots, hot_standby_feedback, primary_slot_name and a dbname in primary_conninfo), "
        "and with synchronized_standby_slots set the server holds its changes back while that standby is down "
        "(exit 6 on a drain); turn it on where the standby is set up for it. Refused on a standby (only a "
        "primary's slots are synchronized)")
    standby_wait_seconds: float = Field(
        60.0, ge=0, description="mirror --once, capture: how long a drain waits while the server is holding the "
        "slot's changes back for a standby (a failover slot, and a physical slot named in "
        "synchronized_standby_slots missing, with no standby connected, or behind) before it stops with exit 6; "
        "following (without --once) waits as long as it takes, logging which standby slot it waits for")
    wal_warning_bytes: int = Field(
        1 << 30, ge=0, description="mirror: warn (log, applier status) when the slot's safe_wal_size, the WAL the "
        "server may still write before the slot exceeds max_slot_wal_keep_size, falls under this; a slot whose "
        "wal_status is extended or unreserved is always warned about, and a lost slot stops the mirror (exit 2: a "
        "restart cannot mend it)")
    max_retries: int = Field(
        10, ge=0, description="mirror: reconnect attempts after the connection drops or the server restarts "
        "(backoff 1 s doubling to 30 s); counted per outage, then the mirror stops with the last error")

    @field_validator("publication")
    @classmethod
    def _publication_list(cls, value: str) -> str:
        try:
            publication_names(value)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return value

    @model_validator(mode="after")
    def _versions(self) -> SourceSettings:
        if self.streaming == "on" and self.proto_version < 2:
            raise ValueError("streaming: on needs proto_version >= 2")
        if self.streaming == "parallel" and self.proto_version < 4:
            raise ValueError("streaming: parallel needs proto_version 4")
        if self.two_phase and self.proto_version < 3:
            raise ValueError("two_phase needs proto_version >= 3")
        return self

    def resolved_dsn(self) -> str:
        """The DSN from the config or the environment; the error never shows the value.

        With neither, libpq's own variables (PGHOST, PGSERVICE, ...) are a DSN too, as for psql: the
        empty string, which libpq completes from them (and the password from ~/.pgpass)."""
        if self.dsn is not None:
            return self.dsn.get_secret_value()
        value = os.environ.get(self.dsn_env)
        if value:
            return value
        if libpq_env_given():
            return ""
        raise ConfigError(f"no DSN: pass --dsn, set source.dsn, the environment variable {self.dsn_env}, or "
                          "libpq's PGHOST / PGSERVICE variables")

