"""The CLI as a new user meets it: clean one-line errors and documented exit codes, before any JVM.

Every test here fails if Spark is started: ``build_spark_session_for`` is replaced by a function
that raises, and an unexpected exception is exit code 5, not the code asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from applier.cli import main
from applier.commands.exitcodes import ExitCode
from applier.sources.rawlog_writer import write_raw_log

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "fixtures" / "pgoutput"
pytestmark = pytest.mark.usefixtures("no_spark")


@pytest.fixture(autouse=True)
def no_dsn_from_the_environment(monkeypatch):
    monkeypatch.delenv("APPLIER_DSN", raising=False)
    for var in ("PGHOST", "PGHOSTADDR", "PGSERVICE", "PGDATABASE", "PGPORT"):
        monkeypatch.delenv(var, raising=False)


def raw_log(tmp_path: Path) -> Path:
    rows = []
    with open(FIXTURES / "pg15_streaming_proto2_streaming.jsonl", encoding="utf-8") as f:
        for o in map(json.loads, f):
            hi, lo = o["lsn"].split("/")
            rows.append(((int(hi, 16) << 32) | int(lo, 16), o["xid"], bytes.fromhex(o["data"])))
    path = tmp_path / "log.parquet"
    write_raw_log(path, rows)
    return path


def test_bad_skip_transaction_flag_is_the_yaml_forms_error_with_exit_2(tmp_path, capsys):
    assert main(["replay", "--source", "x", "--target", "y", "--skip-transaction", "16B3748"]) == ExitCode.USAGE
    flag_err = capsys.readouterr().err
    cfg = tmp_path / "r.yaml"
    cfg.write_text("source_log: x\ntarget: {path: y}\napply:\n  skip_transactions: ['16B3748']\n")
    assert main(["replay", "--config", str(cfg)]) == ExitCode.USAGE
    yaml_err = capsys.readouterr().err
    reason = "not an LSN like 0/16B3748 (two hex numbers separated by a slash): '16B3748'"
    assert reason in flag_err and reason in yaml_err, (flag_err, yaml_err)
    assert "--skip-transaction" in flag_err and f"{cfg}" in yaml_err and "line=4" in yaml_err
    assert "Traceback" not in flag_err + yaml_err and "ValidationError" not in flag_err
    assert len(flag_err.strip().splitlines()) == 1


def test_flags_fill_what_a_config_lacks(tmp_path, capsys, monkeypatch):
    from applier.commands import replay

    cfg = tmp_path / "only-apply.yaml"
    cfg.write_text("apply:\n  max_group_rows: 10\n")
    args = replay_args(["--config", str(cfg), "--source", "log.parquet", "--target", "out"])
    got = replay.config_from_args(args)
    assert got.source_log == "log.parquet" and got.target.path == "out" and got.apply.max_group_rows == 10
    assert main(["replay", "--config", str(cfg)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "source_log: required, and not given: pass --source" in err and "target: required" in err


def replay_args(argv: list[str]):
    from applier.cli import build_parser

    return build_parser().parse_args(["replay", *argv])


def test_missing_arguments_exit_2_for_every_command(capsys):
    for argv in (["mirror"], ["replay"], ["capture"], ["verify"], ["status"], ["inspect"]):
        with pytest.raises(SystemExit) as e:  # argparse's own usage errors are 2 as well
            code = main(argv)
            raise SystemExit(code)
        assert e.value.code == ExitCode.USAGE, (argv, capsys.readouterr().err)
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_mirror_and_capture_without_a_dsn_fail_before_spark(tmp_path, capsys):
    assert main(["mirror", "--target", str(tmp_path / "t")]) == ExitCode.USAGE
    assert main(["capture", "--log", str(tmp_path / "l")]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("no DSN") == 2 and "APPLIER_DSN" in err


@pytest.mark.parametrize("command", ["mirror", "capture", "verify", "status"])
def test_unreachable_server_is_exit_3_at_once_without_retries(tmp_path, capsys, command):
    dsn = "host=127.0.0.1 port=1 user=x password=hunter2secret connect_timeout=5"
    argv = {"mirror": ["--target", str(tmp_path)], "capture": ["--log", str(tmp_path)],
            "verify": ["--target", str(tmp_path)], "status": ["--target", str(tmp_path)]}[command]
    assert main([command, "--dsn", dsn, *argv]) == ExitCode.UNAVAILABLE
    err = capsys.readouterr().err
    assert "cannot connect to PostgreSQL" in err and "reconnecting" not in err and "Traceback" not in err
    assert "hunter2secret" not in err and len(err.strip().splitlines()) == 1, err


def test_libpq_variables_are_a_dsn_too(tmp_path, capsys, monkeypatch):
    """No --dsn, no APPLIER_DSN: PGHOST/PGPORT are used, as psql uses them (here: a closed port, exit 3)."""
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGPORT", "1")
    assert main(["mirror", "--target", str(tmp_path)]) == ExitCode.UNAVAILABLE
    err = capsys.readouterr().err
    assert "cannot connect to PostgreSQL" in err and "Connection refused" in err, err


def test_invalid_sslmode_is_a_config_error_not_an_outage(tmp_path, capsys):
    dsn = "host=127.0.0.1 port=1 password=hunter2secret sslmode=bogus"
    assert main(["mirror", "--dsn", dsn, "--target", str(tmp_path)]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "invalid sslmode" in err and "verify-full" in err and "bogus" not in err and "hunter2" not in err


def test_unparsable_dsn_never_shows_a_secret_even_from_a_subprocess(tmp_path):
    """The DSN of issue 21 row 11, exactly: libpq's own message would quote `2secret`."""
    dsn = "host=127.0.0.1 password=hunter 2secret"
    for argv in (["mirror", "--dsn", dsn, "--target", str(tmp_path), "-v"],
                 ["verify", "--dsn", dsn, "--target", str(tmp_path)],
                 ["capture", "--dsn", dsn, "--log", str(tmp_path / "l"), "--log-format", "json"]):
        proc = subprocess.run([sys.executable, "-m", "applier.cli", *argv], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "APPLIER_DELTA_JARS": "/nonexistent"})
        output = proc.stdout + proc.stderr
        assert proc.returncode == ExitCode.USAGE, output
        assert "2secret" not in output and "hunter" not in output, output
        assert "not a valid libpq connection string" in output and "Traceback" not in output


def test_common_flags_after_the_subcommand(tmp_path, capsys):
    log = raw_log(tmp_path)
    assert main(["inspect", "-v", "--source", str(log)]) == 0
    assert main(["inspect", "--source", str(log), "--quiet", "--log-level", "warning"]) == 0
    assert main(["-q", "inspect", "--source", str(log), "--log-format", "json"]) == 0
    assert "messages: " in capsys.readouterr().out


def test_inspect_json_into_a_closed_pipe_is_quiet(tmp_path):
    """`applier inspect --json | head`: stdout's reader is gone before the report is written (the read end
    of the pipe is closed first, so every run hits EPIPE, not only the unlucky ones)."""
    log = raw_log(tmp_path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "applier.cli", "inspect", "--source", str(log), "--json"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.stderr == "", proc.stderr
    assert proc.returncode == ExitCode.BROKEN_PIPE


def test_data_error_is_exit_4(tmp_path, capsys):
    rows = []
    with open(FIXTURES / "pg15_streaming_proto2_streaming.jsonl", encoding="utf-8") as f:
        for o in map(json.loads, f):
            hi, lo = o["lsn"].split("/")
            rows.append(((int(hi, 16) << 32) | int(lo, 16), o["xid"], bytes.fromhex(o["data"])))
    rows[5] = (rows[5][0], rows[5][1], b"\xff" + rows[5][2][1:])  # an unknown message type
    log = tmp_path / "bad.parquet"
    write_raw_log(log, rows)
    assert main(["inspect", "--source", str(log)]) == ExitCode.BAD_DATA
    assert "lsn=" in capsys.readouterr().err


def test_an_unexpected_exception_is_exit_5_with_a_scrubbed_traceback(tmp_path, capsys, monkeypatch):
    from applier.infra.redact import register

    register("host=db password=topsecret-77")

    def boom(_args):
        raise RuntimeError("failed near password=topsecret-77")

    monkeypatch.setattr("applier.commands.inspect.run", boom)
    from applier.cli import build_parser

    parser = build_parser()
    monkeypatch.setattr("applier.cli.build_parser", lambda: parser)
    assert parser._subparsers is not None
    commands = parser._subparsers._group_actions[0].choices
    assert isinstance(commands, dict)
    commands["inspect"].set_defaults(func=boom)
    assert main(["inspect", "--source", "x"]) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError" in err and "topsecret-77" not in err


def test_help_shows_the_exit_code_table(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "exit codes:" in out and "source or target unavailable" in out and "bad data" in out


def test_the_operations_page_shows_the_exit_code_table_of_the_code():
    """docs/operations.md ("Exit codes") holds the table the code makes, word for word."""
    from applier.commands.exitcodes import table_markdown

    assert table_markdown() in (REPO / "docs" / "operations.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(("target", "said"), [
    ("s3://lake/mirror", "the endpoint cannot be reached (AWS_ENDPOINT_URL"),
    ("abfss://c@acct.dfs.core.windows.net/m", "no credentials were found"),
    ("gs://b/m", "no credentials were found")])
def test_an_object_store_that_cannot_be_written_is_exit_2_and_nothing_written(tmp_path, capsys, monkeypatch, target,
                                                                               said):
    """A store that cannot be reached (or no credentials for it) is a usage error said at once, in one line
    naming what is missing: it used to be joined as a local path ('s3:/lake/...'), exit 5 after a directory
    named 's3:' was made here."""
    monkeypatch.chdir(tmp_path)
    for name, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                        "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                        "XDG_STATE_HOME": str(tmp_path / "st")}.items():
        monkeypatch.setenv(name, value)
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT", "AZURE_STORAGE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)
    log = raw_log(tmp_path)
    assert main(["replay", "--source", str(log), "--target", target]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert said in err and target in err and len(err.strip().splitlines()) == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.parquet"]  # no 's3:' directory
