"""The maintenance schedule inside ``mirror``: one table per idle tick, each at most once per period, a
failure logged and retried next period; on real delta-rs tables."""

from __future__ import annotations

import logging

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from applier.config import MaintenanceSettings
from applier.sink.maintenance import MaintenanceSchedule, TableMaintainer


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _table(root, name: str, files: int) -> None:
    for i in range(files):
        write_deltalake(str(root / "public" / name), pa.table({"id": [i], "v": [str(i)]}), mode="append")


def test_each_table_once_per_period_one_per_tick(tmp_path):
    _table(tmp_path, "a", 5)
    _table(tmp_path, "b", 5)
    clock = Clock()
    maintainer = TableMaintainer(MaintenanceSettings(min_small_files=3, vacuum=False), None)
    schedule = MaintenanceSchedule(maintainer, tmp_path, 60.0, clock=clock)
    schedule.tick()
    assert schedule.results == []  # the first period counts from the start of the run
    clock.now = 61
    schedule.tick()
    schedule.tick()
    schedule.tick()  # both done: nothing more this period
    assert [(r.table, r.compacted, r.before.count, r.after.count) for r in schedule.results] == [
        ("public.a", True, 5, 1), ("public.b", True, 5, 1)]
    assert sorted(DeltaTable(str(tmp_path / "public" / "a")).to_pyarrow_table().column("id").to_pylist()) == [
        0, 1, 2, 3, 4]
    clock.now = 122
    schedule.tick()
    assert schedule.results[-1].table == "public.a" and not schedule.results[-1].compacted  # one file left


def test_a_failure_is_logged_and_the_mirror_goes_on(tmp_path, caplog, monkeypatch):
    _table(tmp_path, "a", 2)
    clock = Clock()
    maintainer = TableMaintainer(MaintenanceSettings(), None)

    def fail(path, table, **_options):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(maintainer, "maintain", fail)
    schedule = MaintenanceSchedule(maintainer, tmp_path, 60.0, clock=clock)
    clock.now = 61
    with caplog.at_level(logging.WARNING, logger="applier.maintain"):
        schedule.tick()
    assert "public.a: maintenance failed" in caplog.text and "disk on fire" in caplog.text


def test_z_order_columns_by_glob():
    maintainer = TableMaintainer(MaintenanceSettings(z_order={"shop.*": ["customer_id"], "*": ["id"]}), None)
    assert maintainer.z_order_for("shop.orders") == ["customer_id"]
    assert maintainer.z_order_for("public.t") == ["id"]
