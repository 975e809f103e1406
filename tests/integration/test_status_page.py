"""The status page on the metrics port, in a real headless browser (Debian's ``chromium``): it
loads, shows every mirrored table (one a rule puts outside the target too) with its applied LSN, a
parked table and the slot, redraws itself from ``/status.json`` (each table once however often), and
shows the new LSN after a commit. A screenshot is kept under ``test-artifacts/`` (or
``$APPLIER_TEST_ARTIFACTS``) for a person to see."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import unavailable

from applier.config import MirrorConfig, SourceSettings, TableRule, TablesSettings, TargetSettings
from applier.drivers.mirror import Mirror
from applier.infra.metrics import serve_metrics
from applier.lsn import parse_lsn
from applier.sink.cuts import CutLog
from applier.sink.parking import ParkedTables

pytestmark = [pytest.mark.postgres, pytest.mark.spark]

ARTIFACTS = Path(os.environ.get("APPLIER_TEST_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


def _browser() -> str:
    found = shutil.which("chromium")
    if found is None:
        unavailable("chromium is not installed: scripts/setup-test-servers installs Debian's chromium")
    return str(found)


def _page(url: str, *, screenshot: Path | None = None) -> str:
    """The page's DOM after its script ran (a virtual-time budget lets its fetch and timers finish)."""
    extra = [f"--screenshot={screenshot}", "--window-size=1280,900"] if screenshot else ["--dump-dom"]
    done = subprocess.run([_browser(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--virtual-time-budget=4000", *extra, url], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _applied(url: str, table: str) -> str:
    with urllib.request.urlopen(url + "status.json", timeout=30) as answer:  # noqa: S310 - loopback
        data = json.loads(answer.read())
    return str(next(t["applied_lsn"] for t in data["tables"] if t["table"] == table))


def test_the_status_page_shows_every_table_a_parked_one_and_a_new_lsn_after_a_commit(pg, spark, tmp_path):
    target = tmp_path / "delta"
    # a rule puts one table outside the target, where only the mirror's own bindings find it
    cfg = MirrorConfig(source=SourceSettings(dsn=pg.dsn, slot="sp", publication="sp_pub"),
                       target=TargetSettings(path=str(target)),
                       tables=TablesSettings(rules=[TableRule(match="public.elsewhere",
                                                              target=str(tmp_path / "other" / "elsewhere"))]))
    with pg.connect() as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, note text); CREATE TABLE \"Odd <b>name</b>\" (id int "
                     "PRIMARY KEY); CREATE TABLE elsewhere (id int PRIMARY KEY);"
                     "CREATE PUBLICATION sp_pub FOR TABLE orders, \"Odd <b>name</b>\", elsewhere;"
                     "INSERT INTO orders SELECT i, 'n' || i FROM generate_series(1, 50) i")
        mirror = Mirror(spark, cfg)
        mirror.run(once=True)
        oid = conn.execute("SELECT 'orders'::regclass::oid::int").fetchone()[0]
        ParkedTables(mirror.state).park("public.orders", oid, "ValueConversionError: a test's park")
        server = serve_metrics(0, "127.0.0.1", lambda _: None, status=mirror._status_json)
        try:
            url = f"http://127.0.0.1:{server.port}/"
            first = _applied(url, "public.orders")
            dom = _page(url)
            assert 'data-table="public.orders"' in dom and first in dom, dom
            assert 'data-table="public.elsewhere"' in dom, dom
            # a name is text, never markup: the table named like HTML shows as its name
            assert "public.Odd &lt;b&gt;name&lt;/b&gt;" in dom and "<b>name</b>" not in dom.split("<script>")[0], dom
            assert 'data-parked="public.orders"' in dom and "a test's park" in dom, dom
            assert "slot sp: idle" in dom and "the last run ended well" in dom, dom
            newest = CutLog(str(target)).cuts()[-1]
            assert newest.cut_id and f"cut {newest.cut_id}: LSN " in dom, dom  # the cut, by its id

            conn.execute("INSERT INTO orders VALUES (51, 'new')")
            ParkedTables(mirror.state).release("public.orders", oid)
            Mirror(spark, cfg).run(once=True)
            later = first
            for _ in range(50):  # the page's data is made at most every 2 s
                time.sleep(0.1)
                later = _applied(url, "public.orders")
                if later != first:
                    break
            assert parse_lsn(later) > parse_lsn(first)
            dom = _page(url + "?every=1")  # redrawn about four times in the budget: each table once
            row = '<tr data-table="public.orders"><td>public.orders</td><td>mirror</td><td>'
            assert row + later in dom and row + first not in dom, dom
            assert dom.count('data-table="public.orders"') == 1, dom
            assert 'data-parked="public.orders"' not in dom, dom
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            shot = ARTIFACTS / "status-page.png"
            _page(url, screenshot=shot)
            assert shot.stat().st_size > 10_000
        finally:
            server.close()
