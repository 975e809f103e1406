"""What the mirror says about a publication setting that does not fit the server (issue 77): a missing
mixed-case publication, and ``tables.include`` globs that match no published table."""

from __future__ import annotations

import pytest

from applier.config import TablesSettings
from applier.sources.publication import PublishedTable, missing_publication_hint, warn_unmatched_includes


def test_an_unquoted_mixed_case_name_points_at_the_quoted_publication_that_exists():
    text = missing_publication_hint("mypub", "MyPub", ["MyPub", "other"])
    assert "publication 'mypub' does not exist" in text
    assert "MyPub is read as mypub" in text
    assert """publication: '"MyPub"'""" in text and "CREATE PUBLICATION" not in text


def test_a_missing_mixed_case_name_prints_sql_that_creates_the_name_meant():
    text = missing_publication_hint("mypub", "MyPub", [])
    assert 'CREATE PUBLICATION "mypub" FOR TABLE' in text
    assert 'CREATE PUBLICATION "MyPub" ...' in text and """publication: '"MyPub"'""" in text


def test_a_quoted_name_is_printed_exactly_and_close_names_are_offered():
    text = missing_publication_hint('We"ird', '"We""ird"', ["weird_pub"])
    assert 'CREATE PUBLICATION "We""ird" FOR TABLE' in text and "is read as" not in text
    assert missing_publication_hint("shop_pub", "shop_pub", ["shop_pubs"]).count('"shop_pubs"') == 1


def _published(*names: str) -> list[PublishedTable]:
    return [PublishedTable(n.partition(".")[0], n.partition(".")[2], None, None) for n in names]


@pytest.mark.parametrize(("pattern", "meant"), [("Shop.*", "shop.orders"), ("orders", "shop.orders"),
                                                ("shop.order", "shop.orders")])
def test_an_include_glob_matching_nothing_is_warned_with_what_it_could_mean(pattern, meant):
    warned: list[str] = []
    tables = TablesSettings(include=[pattern, "shop.*"])
    warn_unmatched_includes(_published("shop.orders", "shop.items"), "pub", tables, warned.append)
    assert len(warned) == 1 and repr(pattern) in warned[0] and meant in warned[0], warned


def test_an_include_glob_with_nothing_close_lists_the_published_tables():
    warned: list[str] = []
    names = [f"s.t{i}" for i in range(7)]
    warn_unmatched_includes(_published(*names), "pub", TablesSettings(include=["zzz.qqq"]), warned.append)
    assert len(warned) == 1 and "s.t0, s.t1, s.t2, s.t3, s.t4 and 2 more" in warned[0], warned
    warned.clear()
    warn_unmatched_includes(_published(*names), "pub", TablesSettings(), warned.append)  # "*": fine
    assert warned == []
