"""The Grafana dashboard under docs/dashboards names only metrics the mirror exports: a renamed metric
would leave a panel empty without a word, which an operator finds out during an incident."""

from __future__ import annotations

import json
import re
from pathlib import Path

from applier.infra.metrics import MirrorMetrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "dashboards" / "applier-grafana.json"
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",)}


def _exported() -> set[str]:
    names: set[str] = set()
    for family in MirrorMetrics().registry.collect():
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def _exprs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [str(node["expr"])] if "expr" in node else []
        found += [str(node["query"])] if isinstance(node.get("query"), str) else []
        return found + [e for v in node.values() for e in _exprs(v)]
    if isinstance(node, list):
        return [e for v in node for e in _exprs(v)]
    return []


def test_every_metric_a_panel_asks_for_is_exported_and_every_panel_asks_for_one():
    dashboard = json.loads(DASHBOARD.read_text())
    exported = _exported()
    assert "applier_transactions_total" in exported and "applier_group_commit_seconds_bucket" in exported
    asked = {name for expr in _exprs(dashboard) for name in re.findall(r"\bapplier_[a-z_]+", expr)}
    assert asked and not asked - exported, sorted(asked - exported)
    for panel in dashboard["panels"]:
        assert panel["targets"] and all(re.search(r"\bapplier_", t["expr"]) for t in panel["targets"]), panel["title"]
    # imported into any Grafana: the data source is an input, not this machine's
    assert dashboard["__inputs"][0]["name"] == "DS_PROMETHEUS"
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"${DS_PROMETHEUS}"}
