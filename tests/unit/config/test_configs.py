"""Config files: every example in configs/ loads, and mistakes are reported with file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from applier.config import CaptureConfig, MirrorConfig, ReplayConfig, load_config
from applier.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
Model = ReplayConfig | MirrorConfig | CaptureConfig
MODEL_BY_PREFIX: dict[str, type[Model]] = {"replay": ReplayConfig, "mirror": MirrorConfig, "capture": CaptureConfig}


def model_for(path: Path) -> type[Model]:
    return MODEL_BY_PREFIX[path.stem.split("-")[0].split("_")[0]]


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_loads(path):
    cfg = load_config(path, model_for(path))
    assert cfg.log_path if isinstance(cfg, CaptureConfig) else cfg.target.path


def test_examples_exist_for_each_job():
    assert {model_for(p) for p in CONFIGS.glob("*.yaml")} == set(MODEL_BY_PREFIX.values())


def test_unknown_key_names_file_line_and_key(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("source_log: x\ntarget:\n  path: out\napply:\n  grouping: transaction\n  grupo: 5\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, ReplayConfig)
    assert e.value.line == 6 and "apply.grupo" in str(e.value) and str(f) in str(e.value)


def test_invalid_value_and_protocol_rules(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("target: {path: out}\nsource:\n  proto_version: 1\n  streaming: 'on'\n")
    with pytest.raises(ConfigError, match="streaming: on needs proto_version >= 2"):
        load_config(f, MirrorConfig)


def test_dsn_is_secret(tmp_path, monkeypatch):
    f = tmp_path / "m.yaml"
    f.write_text("target: {path: out}\nsource: {dsn: 'host=db password=hunter2'}\n")
    cfg = load_config(f, MirrorConfig)
    assert "hunter2" not in repr(cfg) and "hunter2" not in str(cfg.model_dump())
    assert cfg.source.resolved_dsn() == "host=db password=hunter2"
    for var in ("APPLIER_DSN", "PGHOST", "PGHOSTADDR", "PGSERVICE", "PGDATABASE", "PGPORT"):
        monkeypatch.delenv(var, raising=False)  # libpq's variables would make an empty DSN a complete one
    cfg2 = load_config(CONFIGS / "mirror.yaml", MirrorConfig)
    with pytest.raises(ConfigError, match="APPLIER_DSN"):
        cfg2.source.resolved_dsn()


def test_table_selection_globs():
    cfg = load_config(CONFIGS / "mirror.yaml", MirrorConfig)
    assert cfg.tables.selected("public.orders")
    assert not cfg.tables.selected("public.tmp_x") and not cfg.tables.selected("shop.orders")
