"""A missing real part (Postgres, Java, Delta jars) skips locally but fails in CI."""

from __future__ import annotations

import pytest

INNER = """
from conftest import unavailable

def test_needs_a_server():
    unavailable("no PostgreSQL here")
"""


@pytest.mark.parametrize(("ci", "outcome"), [("true", {"failed": 1}), ("", {"skipped": 1})])
def test_unavailable_fails_in_ci_and_skips_locally(pytester, monkeypatch, ci, outcome):
    import conftest

    monkeypatch.setenv("CI", ci)
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(conftest.__file__).parent))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(**outcome)
