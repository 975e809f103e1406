"""/metrics and /healthz over real HTTP: the health check turns 503 when the loop stops moving."""

import time
import urllib.error
import urllib.request

from applier.infra.metrics import MetricsServer, MirrorMetrics


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_healthz_is_200_while_the_loop_moves_and_503_when_it_stalls():
    metrics = MirrorMetrics(stall_seconds=0.5)
    server = MetricsServer(metrics, 0, "127.0.0.1")
    try:
        base = f"http://127.0.0.1:{server.port}"
        metrics.beat()
        assert _get(f"{base}/healthz") == (200, "ok\n")
        time.sleep(0.7)
        status, body = _get(f"{base}/healthz")
        assert status == 503 and "stalled" in body
        metrics.group_applied(1.5, 3, {"public.t": 7})
        metrics.group_applied(0.2, 2, {"public.t": 9})
        assert _get(f"{base}/healthz")[0] == 200
        status, text = _get(f"{base}/metrics")
        assert status == 200
        assert 'applier_rows_total{table="public.t"} 9.0' in text
        assert "applier_transactions_total 5.0" in text and "applier_group_commits_total 2.0" in text
        assert 'applier_group_commit_seconds_bucket{le="2.5"} 2.0' in text
    finally:
        server.close()


def test_the_server_answers_this_machine_only_unless_told_otherwise(tmp_path):
    """/metrics and /healthz have no authentication (and name every table): 127.0.0.1 by default, in the
    config, the server, `applier mirror`/`capture` and jobs/stream.py; --metrics-host (metrics.host) opens it."""
    import importlib.util
    from pathlib import Path

    from applier.cli import build_parser
    from applier.commands import mirror
    from applier.config import MetricsSettings

    assert MetricsSettings().host == "127.0.0.1"
    server = MetricsServer(MirrorMetrics(), 0)
    try:
        assert server._server.server_address[0] == "127.0.0.1"
    finally:
        server.close()

    flags = ["mirror", "--dsn", "host=db", "--publication", "p", "--slot", "s", "--target", str(tmp_path),
             "--metrics-port", "9187"]
    assert mirror.config_from_args(build_parser().parse_args(flags)).metrics.host == "127.0.0.1"
    opened = mirror.config_from_args(build_parser().parse_args([*flags, "--metrics-host", "0.0.0.0"]))
    assert (opened.metrics.port, opened.metrics.host) == (9187, "0.0.0.0")
    assert build_parser().parse_args(["capture", "--metrics-host", "10.0.0.5"]).metrics_host == "10.0.0.5"

    stream_job = Path(__file__).resolve().parents[3] / "jobs" / "stream.py"
    spec = importlib.util.spec_from_file_location("stream_job", stream_job)
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    args = job.parse_args(["--raw-log", "L", "--target", "T", "--checkpoint", "C", "--metrics-port", "0"])
    assert args.metrics_host == "127.0.0.1"
