"""``spark.readStream.format("pgoutput")``: a logical replication slot as a Spark streaming source.

    register_pgoutput_source(spark)
    raw = (spark.readStream.format("pgoutput").option("dsn", dsn).option("slot", "s")
           .option("publication", "p").load())            # columns lsn, xid, data, seq

Offsets are LSNs (``{"lsn": "0/16B3748"}``). A micro-batch (start, end] holds the whole
transactions whose commit record starts in [start, end): the slot is peeked (which confirms
nothing), and transactions outside that range are dropped, so a batch re-read after a restart has
exactly the same rows. Relation and Type messages are always kept (they only describe tables). The
slot is advanced to ``end`` only in ``commit(end)``, which Spark calls once the batch's output is
committed. Streaming of in-progress transactions and two-phase decoding are refused here: both
make a transaction's rows depend on the decoding session (use ``applier mirror`` for those).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from applier.errors import ConfigError
from applier.lsn import format_lsn, parse_lsn
from applier.protocol.decoder import MessageDecoder
from applier.protocol.messages import Begin, LogicalMessage, Relation, Type
from applier.sources.slots import slot_info
from applier.sources.sql_slot import advance, create_slot, current_flush_lsn, peek, pgoutput_options

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

SCHEMA = "lsn STRING, xid BIGINT, data BINARY, seq BIGINT"


def register_pgoutput_source(spark: SparkSession) -> None:
    spark.dataSource.register(PgOutputDataSource)


class PgOutputDataSource(DataSource):
    """Options: dsn (or dsn_env, default APPLIER_DSN), slot, publication, proto_version (1|2),
    binary, messages, origin. The slot is created at the first offset when it does not exist."""

    @classmethod
    def name(cls) -> str:
        return "pgoutput"

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema: StructType) -> SlotStreamReader:
        return SlotStreamReader(dict(self.options))


class SlotStreamReader(SimpleDataSourceStreamReader):
    def __init__(self, options: dict[str, str]) -> None:
        import os


        self.options = options
        dsn = options.get("dsn") or os.environ.get(options.get("dsn_env", "APPLIER_DSN"), "")
        if not dsn:
            raise ConfigError("pgoutput source: set option dsn, or the variable named by dsn_env (APPLIER_DSN)")
        for refused in ("streaming", "two_phase"):
            if options.get(refused, "false").lower() not in ("false", "off"):
                raise ConfigError(f"pgoutput source: option {refused} is not supported (use applier mirror)")
        self.dsn = dsn
        self.slot = options.get("slot", "applier")
        self.publication = options.get("publication", "applier")

    def _pg_options(self) -> dict[str, str]:
        opts = self.options
        return pgoutput_options(self.publication, proto_version=int(opts.get("proto_version", "1")),
                                binary=opts.get("binary", "false").lower() == "true",
                                messages=opts.get("messages", "false").lower() == "true",
                                origin=opts.get("origin"))

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(self.dsn, autocommit=True)

    def initialOffset(self) -> dict[str, str]:
        with self._connect() as conn:
            return {"lsn": format_lsn(create_slot(conn, self.slot))}

    def read(self, start: dict[str, str]) -> tuple[Iterator[tuple[Any, ...]], dict[str, str]]:
        # Spark plans a batch from ``start`` only after every batch ending there is committed (its
        # foreachBatch done, its commit log written), so the slot can be confirmed up to ``start``
        # here. commit() alone leaves the slot one batch behind: Spark calls it only when it
        # constructs the next batch, which never happens after the last one of --once.
        self._advance(parse_lsn(start["lsn"]))
        with self._connect() as conn:
            flush = current_flush_lsn(conn)
        end = max(flush, parse_lsn(start["lsn"]))
        return self.readBetweenOffsets(start, {"lsn": format_lsn(end)}), {"lsn": format_lsn(end)}

    def readBetweenOffsets(self, start: dict[str, str], end: dict[str, str]) -> Iterator[tuple[Any, ...]]:
        lo, hi = parse_lsn(start["lsn"]), parse_lsn(end["lsn"])
        if hi <= lo:
            return iter(())
        decoder = MessageDecoder()
        rows: list[tuple[Any, ...]] = []
        keep = False  # inside a transaction of this batch
        with self._connect() as conn:
            for m in peek(conn, self.slot, self._pg_options(), upto_lsn=hi):
                msg = decoder.decode(m.data, m.lsn)
                if isinstance(msg, Begin):
                    keep = lo <= msg.final_lsn < hi
                elif isinstance(msg, LogicalMessage) and not msg.transactional:
                    if not lo <= m.lsn < hi:
                        continue
                    rows.append((format_lsn(m.lsn), m.xid, m.data, len(rows)))
                    continue
                if keep or isinstance(msg, Relation | Type):
                    rows.append((format_lsn(m.lsn), m.xid, m.data, len(rows)))
        return iter(rows)

    def commit(self, end: dict[str, str]) -> None:
        self._advance(parse_lsn(end["lsn"]))

    def _advance(self, lsn: int) -> None:
        with self._connect() as conn:
            info = slot_info(conn, self.slot)
            if info is not None and info.confirmed_flush_lsn is not None and lsn > info.confirmed_flush_lsn:
                advance(conn, self.slot, lsn)
