"""The status page the metrics port serves at ``/``: what ``applier status`` shows, in a browser.

Why a page of its own: an operator who is paged opens a URL, not a terminal on the mirror's machine.
The page is one self-contained HTML document (no build step, no CDN: it works on a machine with no
network beyond the mirror) that reads ``/status.json`` (``applier status --json``'s object, made by the
mirror's process) and draws it again every few seconds (``?every=SECONDS``, 5 by default).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: The page: tables, the newest consistent cut, the slot, parked tables and the last stop, redrawn from
#: /status.json. Values are put in with textContent (never as HTML): table names come from Postgres.
PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>applier status</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
table { border-collapse: collapse; } td, th { padding: .2em .7em; border-bottom: 1px solid #ddd; }
th { text-align: left; background: #f4f4f4; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #b00; font-weight: 600; } .ok { color: #070; } .muted { color: #777; }
</style></head>
<body>
<h1>applier status</h1>
<div id="updated" class="muted">loading...</div>
<div id="error" class="bad"></div>
<h2>Tables</h2>
<table id="tables"><thead><tr><th>table</th><th>kind</th><th>applied LSN</th><th>last commit</th>
<th>source commit</th><th>lag</th><th>rows</th><th>files</th><th>size</th><th>catalog name</th></tr></thead>
<tbody></tbody></table>
<h2>Consistent cut</h2><div id="cut"></div>
<h2>Slot</h2><div id="slot"></div>
<h2>Parked tables</h2><div id="parked"></div>
<h2>Last stop</h2><div id="stops"></div>
<script>
"use strict";
const every = Math.max(1, Number(new URLSearchParams(location.search).get("every")) || 5);
function cell(row, text, cls) {
  const td = document.createElement("td"); td.textContent = text == null ? "-" : String(text);
  if (cls) td.className = cls; row.appendChild(td);
}
function size(bytes) {
  if (bytes == null) return "?";
  const units = ["B", "kB", "MB", "GB", "TB"]; let i = 0;
  while (bytes >= 1024 && i < units.length - 1) { bytes /= 1024; i++; }
  return bytes.toFixed(i ? 1 : 0) + " " + units[i];
}
function text(id, value, cls) {
  const el = document.getElementById(id); el.textContent = value; el.className = cls || "";
}
function draw(s) {
  const body = document.querySelector("#tables tbody"); body.replaceChildren();
  for (const t of s.tables) {
    const row = document.createElement("tr"); row.dataset.table = t.table;
    cell(row, t.table); cell(row, t.kind); cell(row, t.applied_lsn);
    cell(row, t.last_commit && t.last_commit.slice(0, 19));
    cell(row, t.source_commit_time && t.source_commit_time.slice(0, 19));
    cell(row, t.lag_seconds == null ? null : t.lag_seconds.toFixed(1) + " s", "n");
    cell(row, t.rows == null ? "?" : t.rows, "n"); cell(row, t.files == null ? "?" : t.files, "n");
    cell(row, size(t.size_bytes), "n"); cell(row, t.catalog_name); body.appendChild(row);
  }
  if (!s.tables.length) {
    const row = document.createElement("tr"); cell(row, "no mirrored tables yet"); body.appendChild(row);
  }
  const c = s.cut;
  text("cut", c ? (c.id ? "cut " + c.id + ": " : "") + "LSN " + c.lsn + ", source commit " +
       (c.commit_time || "unknown") +
       (c.age_seconds == null ? "" : " (" + c.age_seconds.toFixed(1) + " s ago)") + ", " + c.tables + " tables"
       : "none recorded yet", c ? "" : "muted");
  const sl = s.slot;
  if (!sl) text("slot", "not read (the status has no DSN)", "muted");
  else if (!sl.exists) text("slot", "slot " + sl.slot + " does not exist", "bad");
  else text("slot", "slot " + sl.slot + ": " + (sl.active ? "active" : "idle") + ", confirmed " +
            (sl.confirmed_lsn || "-") + ", server at " + (sl.server_lsn || "-") + ", lag " + sl.lag_bytes +
            " bytes, wal_status " + (sl.wal_status || "-") + (sl.risk ? "; AT RISK: " + sl.risk : ""),
            sl.risk || sl.wal_status === "lost" ? "bad" : "ok");
  const parked = Object.entries(s.parked || {});
  const list = document.getElementById("parked"); list.replaceChildren();
  if (!parked.length) text("parked", "none", "muted");
  for (const [name, e] of parked) {
    const p = document.createElement("div"); p.className = "bad"; p.dataset.parked = name;
    p.textContent = name + ": " + ("until" in e ? "set aside" : "PARKED") + " since " + e.since + " (" +
      (e.error || "") + ": " + (e.message || "") + ")";
    list.appendChild(p);
  }
  const st = s.stops || {};
  text("stops", st.error ? (st.count > 1 ? "STALLED: the last " + st.count + " runs stopped" : "the last run stopped") +
       " with " + st.error + (st.table ? " on " + st.table : "") + " (last " + st.last + "): " + st.message
       : "the last run ended well", st.error ? "bad" : "ok");
}
async function refresh() {
  try {
    const answer = await fetch("status.json", {cache: "no-store"});
    if (!answer.ok) throw new Error("status.json: HTTP " + answer.status);
    draw(await answer.json());
    text("error", "");
    text("updated", "updated " + new Date().toISOString().slice(0, 19) + "Z, every " + every + " s", "muted");
  } catch (e) {
    text("error", "cannot read the status: " + e.message, "bad");
  }
  setTimeout(refresh, every * 1000);
}
refresh();
</script>
</body></html>
"""


class CachedStatus:
    """``status`` (the JSON of applier.checks.status.StatusReport) made at most once every ``seconds``:
    every open page asks every few seconds, and a report opens each table's Delta log."""

    def __init__(self, status: Callable[[], str], seconds: float = 2.0) -> None:
        self._status = status
        self._seconds = seconds
        self._lock = threading.Lock()
        self._made = float("-inf")
        self._text = ""

    def __call__(self) -> str:
        with self._lock:
            if time.monotonic() - self._made >= self._seconds:
                self._text = self._status()
                self._made = time.monotonic()
            return self._text
