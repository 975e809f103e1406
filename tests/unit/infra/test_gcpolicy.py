"""The apply loops' garbage-collection policy (applier.infra.gcpolicy): off within the block, once per
group by ``after_group()``, and what existed when the block began frozen out of those scans."""

from __future__ import annotations

import gc

from applier.infra.gcpolicy import after_group, collect_between_groups


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_collector_is_off_within_the_block_and_on_after_it() -> None:
    assert gc.isenabled()
    with collect_between_groups():
        assert not gc.isenabled() and gc.get_freeze_count() > 0
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_block_inside_another_keeps_what_the_outer_one_froze() -> None:
    """A follower's catch-up round runs its own block inside the mirror's loop. Its exit unfroze the
    modules and everything else the loop's block had frozen, and every group's collection after it
    scanned the whole heap again (0.1 s or more for each commit of the loop)."""
    with collect_between_groups():
        frozen = gc.get_freeze_count()
        with collect_between_groups():
            assert not gc.isenabled()
            after_group()
        assert gc.get_freeze_count() >= frozen  # not unfrozen by the inner block's end
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_after_group_collects_the_cycles_a_group_left() -> None:
    with collect_between_groups():
        _Cycle()  # unreachable at once, but a cycle: only the collector frees it
        assert any(type(o) is _Cycle for o in gc.get_objects())
        after_group()
        assert not any(type(o) is _Cycle for o in gc.get_objects())


def test_what_survives_a_group_is_frozen_and_swept_again_every_so_often(monkeypatch) -> None:
    """A full collection scans everything the process holds (50-150 ms here): each group's collection
    scans only what the group made, and a cycle that forms among frozen objects waits for the next
    sweep (``SWEEP_SECONDS``), not for the end of the run."""
    import weakref

    from applier.infra import gcpolicy

    with collect_between_groups():
        kept = _Cycle()
        after_group()
        gone = weakref.ref(kept)
        del kept  # garbage now, but frozen: the next collection does not look at it
        after_group()
        assert gone() is not None
        monkeypatch.setattr(gcpolicy._Sweep, "due", 0.0)  # the sweep is due
        after_group()
        assert gone() is None
