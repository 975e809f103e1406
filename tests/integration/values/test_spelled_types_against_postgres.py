"""Property tests with PostgreSQL as the oracle for the types whose binary form applier re-spells as
PostgreSQL's text (numeric, interval, time, timetz): random values, binary re-spelled == text output."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from applier.errors import ValueConversionError
from applier.protocol.messages import COL_BINARY, COL_TEXT
from applier.sources.sql_slot import pin_session
from applier.values import convert_value
from applier.values.special import SpecialValuePolicy

pytestmark = pytest.mark.postgres
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def conn(pg):
    with pg.connect() as c:
        pin_session(c)
        yield c


def both_forms(conn, sql: str, params: tuple[object, ...]) -> tuple[object, object, str]:
    forms = []
    for binary in (False, True):
        with conn.cursor(binary=binary) as cur:
            cur.execute(sql, params)
            raw = bytes(cur.pgresult.get_value(0, 0))
            oid, typmod = cur.pgresult.ftype(0), cur.pgresult.fmod(0)
            forms.append(convert_value(COL_BINARY if binary else COL_TEXT, raw, oid, typmod, None))
            if not binary:
                text = raw.decode()
    return forms[0], forms[1], text


@SETTINGS
@given(st.integers(min_value=-(10**60), max_value=10**60), st.integers(min_value=0, max_value=40),
       st.integers(min_value=0, max_value=45))
def test_numeric_binary_spells_numeric_out(conn, digits, point, scale):
    sql = "SELECT round(%s::numeric / 10::numeric ^ %s, %s)"  # unconstrained, display scale = scale
    from_text, from_binary, text = both_forms(conn, sql, (str(digits), point, scale))
    assert from_text == from_binary == text


@SETTINGS
@given(st.integers(min_value=-10**5, max_value=10**5), st.integers(min_value=-10**5, max_value=10**5),
       st.integers(min_value=-(10**15), max_value=10**15))
def test_interval_binary_spells_interval_out(conn, months, days, micros):
    sql = "SELECT make_interval(months => %s, days => %s, secs => %s::numeric / 1000000)"
    from_text, from_binary, text = both_forms(conn, sql, (months, days, micros))
    assert from_text == from_binary == text


@SETTINGS
@given(st.integers(min_value=0, max_value=86_400_000_000),
       st.integers(min_value=-15 * 3600 - 59, max_value=15 * 3600 + 59))
def test_time_and_timetz_binary_spell_their_output(conn, micros, zone_seconds):
    sql = "SELECT (TIME '00:00' + %s * INTERVAL '1 microsecond')"
    if micros == 86_400_000_000:
        sql = "SELECT TIME '24:00:00' + 0 * %s * INTERVAL '1 microsecond'"
    from_text, from_binary, text = both_forms(conn, sql, (micros,))
    assert from_text == from_binary == text
    sign = "-" if zone_seconds < 0 else "+"
    hh, rest = divmod(abs(zone_seconds), 3600)
    zone = f"{sign}{hh:02d}:{rest // 60:02d}:{rest % 60:02d}"
    from_text, from_binary, text = both_forms(conn, "SELECT (%s || %s)::timetz", (text, zone))
    assert from_text == from_binary == text


def outcome(conn, sql: str, params: tuple[object, ...], policy: SpecialValuePolicy) -> tuple[Any, Any]:
    forms = []
    for binary in (False, True):
        with conn.cursor(binary=binary) as cur:
            cur.execute(sql, params)
            raw = bytes(cur.pgresult.get_value(0, 0))
            oid, typmod = cur.pgresult.ftype(0), cur.pgresult.fmod(0)
        try:
            forms.append(convert_value(COL_BINARY if binary else COL_TEXT, raw, oid, typmod, None, policy))
        except ValueConversionError:
            forms.append(ValueConversionError)
    return forms[0], forms[1]


@SETTINGS
@given(st.integers(min_value=-211_813_488_000, max_value=9_223_371_331_199), st.sampled_from(["error", "clamp"]),
       st.sampled_from(["timestamp", "timestamptz", "date"]))
@example(0, "error", "timestamptz")
@example(-63_082_281_600, "error", "timestamp")  # 0001-01-01 00:00:00, the first value Spark holds
@example(-63_082_281_601, "clamp", "timestamp")  # one second before: 0001-12-31 23:59:59 BC
@example(252_455_615_999, "error", "date")  # 9999-12-31
@example(252_455_616_000, "error", "date")  # 10000-01-01
def test_datetimes_from_text_and_binary_agree_inside_and_outside_years_1_to_9999(conn, seconds, policy, pg_type):
    # seconds from 2000-01-01 covering PostgreSQL's whole range, 4714-11-24 BC .. 294276-12-31 AD
    value = f"(TIMESTAMPTZ '2000-01-01+00' + %s * INTERVAL '1 second')::{pg_type}"
    from_text, from_binary = outcome(conn, f"SELECT {value}", (seconds,), policy)
    assert from_text == from_binary
    with conn.cursor() as cur:
        inside = cur.execute(f"SELECT extract(year FROM {value}) BETWEEN 1 AND 9999", (seconds,)).fetchone()[0]
    if inside:
        assert from_text is not ValueConversionError and from_text.year == from_binary.year
    elif policy == "error":
        assert from_text is ValueConversionError
    else:
        assert from_text.year in (1, 9999)
