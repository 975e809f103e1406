"""Job configuration: pydantic models, read from YAML by applier.config.files.

One module per section (``source``, ``target``, ``tables``, ``apply``, ``snapshot``, ``spark``,
``distributed``, ``metrics``, ``maintenance``, ``catalog``) and one for the jobs made of them; this package
re-exports their public names, so ``from applier.config import MirrorConfig`` is the way in.

Every model forbids unknown keys (a typo must not silently fall back to a default), every field says
what it is for (docs/config.md is generated from these descriptions: ``python -m applier.config.docs``),
and the DSN is a secret that never prints. Fields marked ``config_path`` hold paths, which a config
file resolves from its own folder.
"""

from __future__ import annotations

from applier.config.apply import ApplySettings, EngineSettings, FilterSettings, GroupingSettings, PolicySettings
from applier.config.catalog import CatalogSettings
from applier.config.distributed import DistributedSettings
from applier.config.files import load_config
from applier.config.jobs import CaptureConfig, MirrorConfig, ReplayConfig
from applier.config.maintenance import MaintenanceSettings
from applier.config.metrics import MetricsSettings
from applier.config.snapshot import SnapshotSettings
from applier.config.source import SourceSettings, libpq_env_given
from applier.config.spark import SparkConfig
from applier.config.tables import MetadataNames, TableRule, TablesSettings
from applier.config.target import TargetSettings

__all__ = ["ApplySettings", "CaptureConfig", "CatalogSettings", "DistributedSettings", "EngineSettings",
           "FilterSettings", "GroupingSettings", "MaintenanceSettings", "MetadataNames", "MetricsSettings",
           "MirrorConfig", "PolicySettings", "ReplayConfig", "SnapshotSettings", "SourceSettings", "SparkConfig",
           "TableRule", "TablesSettings", "TargetSettings", "libpq_env_given", "load_config"]
