"""DSN safety against a real server: a wrong password is one line, exit 3, no retries, no Spark, and
no part of the DSN (not even the user or port libpq quotes); the DSN's sslmode reaches libpq."""

from __future__ import annotations

import pytest
from pgroles import role_with_password

from applier.cli import main
from applier.commands.exitcodes import ExitCode
from applier.sources.dsn import check_connection

PASSWORD = "hunter-2secret-Xy9"
pytestmark = pytest.mark.usefixtures("no_spark")


@pytest.fixture
def password_role(pg):
    with role_with_password(pg, f"pw_{pg.name}", PASSWORD) as role:
        yield role


def test_wrong_password_is_one_line_exit_3_without_retries(pg, password_role, tmp_path, capsys, monkeypatch):
    good = pg.cluster.dsn(pg.name, user=password_role, password=PASSWORD)
    check_connection(good)  # the right password connects
    wrong = pg.cluster.dsn(pg.name, user=password_role, password=PASSWORD + "-wrong")
    monkeypatch.setenv("APPLIER_DSN", wrong)
    for argv in (["mirror", "--target", str(tmp_path / "m"), "--once"], ["capture", "--log", str(tmp_path / "l")],
                 ["verify", "--target", str(tmp_path)]):
        assert main(argv) == ExitCode.UNAVAILABLE
        err = capsys.readouterr().err
        assert "password authentication failed" in err, err
        assert len(err.strip().splitlines()) == 1 and "reconnect" not in err and "Traceback" not in err, err
        assert "hunter" not in err and "2secret" not in err, err
        assert password_role not in err and str(pg.cluster.port) not in err, err  # no part of the DSN at all


def test_the_dsns_sslmode_reaches_libpq(pg, tmp_path, capsys):
    """The throw-away server has no SSL: sslmode=require must make the first connection fail (exit 3),
    which proves the DSN's sslmode is what libpq uses; verify-full without a root certificate too."""
    for extra in ("sslmode=require", "sslmode=verify-full sslrootcert=/nonexistent/ca.crt"):
        assert main(["verify", "--dsn", f"{pg.dsn} {extra}", "--target", str(tmp_path)]) == ExitCode.UNAVAILABLE
        err = capsys.readouterr().err
        assert "SSL" in err or "certificate" in err, err
