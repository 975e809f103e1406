"""What a server cannot serve is said before any slot is made (exit 2), and a server holding changes back
for a standby is its own exit code (6), said with the standby slot it waits for."""

from __future__ import annotations

import pytest

from applier.commands.exitcodes import ExitCode, for_exception
from applier.config import SourceSettings
from applier.sources.heldback import HeldBack, StandbyWait, standby_slot_names
from applier.sources.serverneeds import unmet_needs


def _source(**settings: object) -> SourceSettings:
    return SourceSettings(dsn="host=x", **settings)


def test_protocol_4_on_15_names_the_version_and_the_protocol_it_can_use():
    found = unmet_needs(_source(proto_version=4, streaming="parallel"), 15, False)
    assert found == ["source.proto_version 4 needs PostgreSQL 16 or later; set source.proto_version to 3",
                     "source.streaming: parallel needs PostgreSQL 16 or later; use streaming: on (proto_version 2 "
                     "or 3)"]
    assert unmet_needs(_source(proto_version=4, streaming="parallel"), 16, False) == []


@pytest.mark.parametrize(("settings", "major", "said"), [
    ({"proto_version": 3, "two_phase": True}, 14, "source.two_phase needs PostgreSQL 15"),
    ({"origin": "none"}, 15, "source.origin: none needs PostgreSQL 16"),
    ({"failover": True}, 16, "source.failover (failover slots) needs PostgreSQL 17 or later"),
    ({"binary": True}, 13, "source.binary needs PostgreSQL 14"),
])
def test_each_option_needs_its_version(settings, major, said):
    assert any(said in line for line in unmet_needs(_source(**settings), major, False))
    assert unmet_needs(_source(**settings), 18, False) == []


def test_a_standby_needs_16_and_holds_no_failover_slot():
    assert unmet_needs(_source(), 15, True) == [
        "a standby as the source (logical decoding on a standby) needs PostgreSQL 16 or later; read from the "
        "primary, or upgrade"]
    assert unmet_needs(_source(), 16, True) == []
    assert "cannot be set for a slot on a standby" in unmet_needs(_source(failover=True), 18, True)[0]


def test_synchronized_standby_slots_names_are_read_as_the_server_reads_them():
    assert standby_slot_names("standby1") == ["standby1"]
    assert standby_slot_names(' standby1 , "sb_2",') == ["standby1", "sb_2"]
    assert standby_slot_names("") == []


def test_held_back_is_exit_6_naming_the_standby_slot_and_never_caught_up():
    held = HeldBack("applier", 0x300C350, 0x300B2E0,
                    (StandbyWait("standby1", "no standby connected, confirmed up to 0/300B2E0, 4208 bytes behind"),))
    error = held.error(60.2)
    assert for_exception(error) == ExitCode.HELD_BACK and int(ExitCode.HELD_BACK) == 6
    text = str(error)
    assert "holding changes of slot applier back" in text and "standby1 (no standby connected" in text
    assert "up to 0/300B2E0 only, short of 0/300C350" in text and "Waited 60s" in text
    assert "caught up" not in text


def test_a_connected_standby_is_a_hold_only_once_it_confirms_nothing_more_and_a_missing_one_at_once(monkeypatch):
    import time

    from applier.errors import HeldBackError
    from applier.sources import heldback

    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    watch = heldback.HoldWatch("host=x", "applier", wait_seconds=5)

    def behind(at: int, connected: bool = True) -> HeldBack:
        return HeldBack("applier", 1000, at, (StandbyWait("standby1", "behind", connected=connected, confirmed=at),))

    assert watch.seen(behind(10)) is None  # a healthy standby a moment behind
    now[0] += 1.5
    assert watch.seen(behind(20)) is None  # it confirms more: not stuck
    now[0] += 1.5
    assert watch.seen(behind(20)) is None  # stuck for 1.5 s only
    now[0] += 1.0
    assert watch.seen(behind(20)) is not None  # stuck for 2.5 s: a hold
    watch.waited_out()  # (2.5 s of 5)
    now[0] += 3.0
    with pytest.raises(HeldBackError):
        watch.waited_out()
    assert watch.seen(None) is None and watch.held is None
    assert watch.seen(behind(20, connected=False)) is not None  # no standby connected: at once
