"""`gyre proxy serve` freezes the start-up heap and collects young objects less often."""

from __future__ import annotations

import gc

from gyre_tools.proxy import tune_gc


def test_tune_gc_freezes_the_heap_and_sets_the_threshold() -> None:
    before = gc.get_threshold()
    try:
        tune_gc(12_345)
        assert gc.get_threshold() == (12_345, 20, 10)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
