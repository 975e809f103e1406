"""Catalog registrations (``catalog: {kind: hive}``): every mirrored table, and its history and change feed
tables, registered by name as an external Delta table over its path, and kept in step with the tables.

Why a reconciliation and not one call per event: a table's name and path change in several places (a
copy, a table sync, a rename or a move to another schema followed, a table dropped and its name taken,
a table taken out of the publication), and a run can be killed between a Delta commit and a catalog
call. After each group (and the initial copy) the registrations wanted now are compared with those this
target made, kept in the state directory; only a difference starts Spark and changes the catalog, one
registration at a time, each saved as it is made, so a run killed in between finishes the rest.

A name the catalog holds that this target did not register (another team's table) is never replaced:
the run stops and says so.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from applier.errors import ConfigError, SinkError
from applier.sink.catalogclients import CatalogClient, GlueCatalog, SparkSessionCatalog

if TYPE_CHECKING:
    from applier.config.catalog import CatalogSettings
    from applier.sink.engine import DeltaApplier
    from applier.spark.session import SparkProvider
    from applier.state import StateDir

log = logging.getLogger(__name__)

#: the state file of the registrations this target made: catalog name (database.table) -> Delta path
STATE_KEY = "catalog_registrations"
_NOT_IN_NAMES = re.compile(r"[^a-z0-9_]")


def catalog_part(name: str) -> str:
    """A Postgres name as a Hive database or table name: lower case, any character other than a-z, 0-9 and
    '_' written '_' (the metastore refuses others, and folds case)."""
    return _NOT_IN_NAMES.sub("_", name.lower()) or "_"


def catalog_name(settings: CatalogSettings, source_name: str, kind: str = "mirror") -> str:
    """``database.table`` of the table ``source_name`` (schema.table) of ``kind`` (mirror, history, changes)."""
    schema, _, table = source_name.partition(".")
    suffix = {"history": settings.history_suffix, "changes": settings.changes_suffix}.get(kind, "")
    return f"{catalog_part(settings.database.format(schema=schema))}.{catalog_part(table + suffix)}"


def _same_location(a: str, b: str) -> bool:
    def plain(p: str) -> str:
        p = p.removeprefix("file://").removeprefix("file:")
        return p.rstrip("/")
    return plain(a) == plain(b)


class CatalogRegistrations:
    """The registrations of one target's tables in the catalog ``settings`` names."""

    def __init__(self, spark: SparkProvider, settings: CatalogSettings, state: StateDir, *,
                 followed: Callable[[str], bool] | None = None) -> None:
        self.spark = spark
        self.settings = settings
        self.state = state
        self.followed = followed  # None: every live table (a replay); a mirror: the tables it follows now
        self._registered: dict[str, str] | None = None

    @classmethod
    def for_settings(cls, spark: SparkProvider, settings: CatalogSettings, state: StateDir, *,
                     followed: Callable[[str], bool] | None = None) -> CatalogRegistrations | None:
        """The registrations ``settings`` asks for (None: ``kind: none``, tables found by path only)."""
        return None if settings.kind == "none" else cls(spark, settings, state, followed=followed)

    def registered(self) -> dict[str, str]:
        """catalog name -> path of each registration this target made (and has not dropped)."""
        if self._registered is None:
            self._registered = dict(self.state.load(STATE_KEY) or {})
        return self._registered

    def wanted(self, applier: DeltaApplier) -> dict[str, str]:
        """catalog name -> path of every table that should be registered now: each live relation's Delta
        table that exists (and is followed), and its history and change feed tables that exist."""
        ids = applier.identities
        out: dict[str, str] = {}
        owners: dict[str, str] = {}
        if ids is None:
            return out
        for bound in ids.live():
            if self.followed is not None and not self.followed(bound.name):
                continue
            if applier.applied_lsn(bound.path, bound.name) is None:
                continue  # no Delta table yet
            rule = applier.tables.rule_for(bound.name)
            tables = [("mirror", bound.path)] if rule is None or not rule.table else []  # (a rule's name: its own)
            tables += [(kind, path) for kind, path, done in applier.derived_tables(bound.name) if done is not None]
            for kind, path in tables:
                name = catalog_name(self.settings, bound.name, kind)
                if name in out and out[name] != path:
                    raise ConfigError(
                        f"{owners[name]} and {bound.name} would both be registered as {name} in the catalog "
                        "(names are lower-cased, and characters other than a-z, 0-9 and _ become _); nothing was "
                        "registered for either. Give one a catalog name of its own (tables.rules: table:) or set "
                        "catalog.database", catalog_name=name)
                out[name], owners[name] = path, bound.name
        return out

    def sync(self, applier: DeltaApplier) -> None:
        """Make the catalog hold exactly the registrations wanted now (a no-op, without Spark or a request,
        when it does). A catalog that does not answer is an outage (SinkError: run again; what was made is
        kept)."""
        wanted = self.wanted(applier)
        if wanted == self.registered():
            return
        try:
            self._sync(self._client(), wanted)
        except ConfigError:
            raise
        except Exception as e:  # noqa: BLE001 - the catalog's own error is the useful part
            raise SinkError(f"the catalog refused or did not answer a registration: {str(e).splitlines()[0]}; "
                            "the Delta tables are written, and the next run makes the registrations still "
                            "missing", catalog=f"{self.settings.kind} {self.settings.uri or ''}".strip()) from e

    def _client(self) -> CatalogClient:
        if self.settings.kind == "glue":
            return GlueCatalog(self.settings.uri)
        why = f"registering tables in the catalog (catalog.kind: {self.settings.kind})"
        return SparkSessionCatalog(self.spark.get(why))

    def _sync(self, catalog: CatalogClient, wanted: dict[str, str]) -> None:
        registered = self.registered()
        for name in sorted(set(registered) - set(wanted)):  # renamed, moved, dropped or no longer published
            catalog.drop(name)  # (an external table: its files stay)
            log.info("catalog: %s dropped (no such table follows it now; its Delta table stays at %s)",
                     name, registered[name])
            del registered[name]
            self.state.save(STATE_KEY, registered)
        for name, path in sorted(wanted.items()):
            if registered.get(name) == path:
                continue
            catalog.create_database(name.partition(".")[0])
            there = catalog.location(name)
            if there is not None and not _same_location(there, path):
                if name not in registered:
                    raise ConfigError(
                        f"the catalog name {name} is taken by a table at {there}, which this mirror did not "
                        f"register; nothing was changed. Drop or rename that table in the catalog, or give the "
                        f"table at {path} another name (catalog.database, or tables.rules: table:)",
                        catalog_name=name, path=path, catalog_location=there)
                catalog.drop(name)
                there = None
            if there is None:
                catalog.register(name, path)
                log.info("catalog: %s registered over %s", name, path)
            registered[name] = path
            self.state.save(STATE_KEY, registered)
