"""Property test with PostgreSQL as the oracle: random text arrays (quotes, backslashes, braces,
commas, whitespace, 'NULL' strings, NULLs, empty strings, non-ASCII) read back from array_out's text
and from array_send's binary as the same list, and a binary array re-spelled as text equals array_out."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from applier.protocol.messages import COL_BINARY, COL_TEXT
from applier.sources.sql_slot import pin_session
from applier.values import convert_value
from applier.values.arrays import binary_array_as_text
from applier.values.scalars import text_str
from applier.values.special import SpecialValuePolicy

pytestmark = pytest.mark.postgres

ELEMENT = st.one_of(
    st.none(),
    st.sampled_from(["", "NULL", "null", " ", "a b", '"', "\\", "{", "}", ",", "{a,b}", "é€😀", "\t"]),
    st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=8),
)


@pytest.fixture
def conn(pg):
    with pg.connect() as c:
        pin_session(c)
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(ELEMENT, max_size=6), st.integers(min_value=-2, max_value=3))
def test_text_arrays_read_like_postgres_prints_them(conn, elements, lower_bound):
    with conn.cursor() as cur:
        cur.execute("SELECT %s::text[]", (elements,))
        oid, typmod = cur.pgresult.ftype(0), cur.pgresult.fmod(0)
        text = bytes(cur.pgresult.get_value(0, 0))
    with conn.cursor(binary=True) as cur:
        cur.execute("SELECT %s::text[]", (elements,))
        binary = bytes(cur.pgresult.get_value(0, 0))
    assert convert_value(COL_TEXT, text, oid, typmod, None) == elements
    assert convert_value(COL_BINARY, binary, oid, typmod, None) == elements
    assert binary_array_as_text(binary, text_str) == text.decode()
    if elements and lower_bound != 1:  # with another lower bound array_out prints '[lb:ub]=' first
        shifted = f"'[{lower_bound}:{lower_bound + len(elements) - 1}]=' || %s::text[]::text"
        with conn.cursor() as cur:
            cur.execute(f"SELECT ({shifted})::text[]::text", (elements,))
            shifted_text = bytes(cur.pgresult.get_value(0, 0))
        with conn.cursor(binary=True) as cur:
            cur.execute(f"SELECT ({shifted})::text[]", (elements,))
            shifted_binary = bytes(cur.pgresult.get_value(0, 0))
        assert binary_array_as_text(shifted_binary, text_str) == shifted_text.decode()
        assert convert_value(COL_TEXT, shifted_text, oid, typmod, None, "clamp") == elements
        assert convert_value(COL_BINARY, shifted_binary, oid, typmod, None, "clamp") == elements


@pytest.mark.parametrize("binary", [False, True])
def test_an_array_with_an_element_spark_cannot_hold_follows_the_policy_as_an_array(conn, binary):
    """'{2020-01-01, infinity, NULL}'::timestamptz[] as PostgreSQL sends it (text and binary): under clamp
    an array of clamped elements, under null a NULL array, under error a stop; never the element's
    clamp as the whole value."""
    import datetime as dt

    from applier.errors import ValueConversionError

    with conn.cursor(binary=binary) as cur:
        cur.execute("SELECT '{\"2020-01-01 00:00:00+00\",infinity,NULL}'::timestamptz[]")
        oid, typmod = cur.pgresult.ftype(0), cur.pgresult.fmod(0)
        raw = bytes(cur.pgresult.get_value(0, 0))
    kind = COL_BINARY if binary else COL_TEXT

    def convert(policy: SpecialValuePolicy) -> object:
        return convert_value(kind, raw, type_oid=oid, typmod=typmod, types=None, column="c", policy=policy)

    utc = dt.UTC
    assert convert("clamp") == [dt.datetime(2020, 1, 1, tzinfo=utc),
                                dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=utc), None]
    assert convert("null") is None
    with pytest.raises(ValueConversionError, match="infinity"):
        convert("error")
