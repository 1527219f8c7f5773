"""The proxy's cache of full token sequences: bounded in count and bytes; rebuilt from records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_proxy.answer.sequences import SequenceCache, StoredRecord, rebuild_sequence


def _seq(n: int, fill: int = 1) -> np.ndarray:
    return np.full(n, fill, dtype=np.int32)


def test_an_execution_keeps_at_most_its_share_of_sequences_the_oldest_going_first() -> None:
    cache = SequenceCache(max_bytes=1 << 20, per_execution=2)
    for rid in ("r1", "r2", "r3"):
        cache.put("e", rid, _seq(10))
    assert not cache.holds("e", "r1")
    assert cache.holds("e", "r2") and cache.holds("e", "r3")
    assert cache.nbytes == 2 * 40


def test_the_total_stays_under_its_bytes_the_least_recently_used_going_first() -> None:
    cache = SequenceCache(max_bytes=100, per_execution=8)  # 100 bytes: two sequences of 10 int32
    cache.put("a", "r1", _seq(10))
    cache.put("b", "r1", _seq(10))
    assert cache.get("a", "r1") is not None  # a's is now the more recently used
    cache.put("c", "r1", _seq(10))
    assert cache.holds("a", "r1") and cache.holds("c", "r1")
    assert not cache.holds("b", "r1")
    assert cache.nbytes == 80 and cache.evicted_for_bytes == 1
    assert cache.executions() == 2


def test_one_sequence_larger_than_the_bound_is_held_until_the_next() -> None:
    cache = SequenceCache(max_bytes=16, per_execution=8)
    cache.put("a", "r1", _seq(100))
    assert cache.holds("a", "r1")
    cache.put("a", "r2", _seq(2))
    assert not cache.holds("a", "r1") and cache.holds("a", "r2") and cache.nbytes == 8


def test_putting_a_held_sequence_again_counts_it_once_and_forget_drops_an_execution() -> None:
    cache = SequenceCache(max_bytes=1 << 20, per_execution=4)
    cache.put("a", "r1", _seq(10))
    cache.put("a", "r1", _seq(20))
    cache.put("b", "r1", _seq(5))
    assert cache.nbytes == 100 and len(cache) == 2
    cache.forget("a")
    assert cache.nbytes == 20 and not cache.holds("a", "r1") and cache.executions() == 1


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        SequenceCache(max_bytes=10, per_execution=0)


@st.composite
def _executions(draw: st.DrawFn) -> list[tuple[str, str | None, int, np.ndarray]]:
    """Records in log order, each extending a random earlier one at a random length."""
    records: list[tuple[str, str | None, int, np.ndarray]] = []
    lengths: dict[str, int] = {}
    for i in range(draw(st.integers(1, 12))):
        rid = f"r{i}"
        parent = draw(st.sampled_from([None, *lengths])) if lengths else None
        prefix_len = 0 if parent is None else draw(st.integers(0, lengths[parent]))
        new = np.array(draw(st.lists(st.integers(0, 1000), max_size=6)), dtype=np.int32)
        records.append((rid, parent, prefix_len, new))
        lengths[rid] = prefix_len + new.shape[0]
    return records


@settings(max_examples=200, deadline=None)
@given(_executions())
def test_a_rebuilt_sequence_equals_every_full_sequence_built_in_log_order(
    records: list[tuple[str, str | None, int, np.ndarray]],
) -> None:
    full: dict[str, np.ndarray] = {}
    for rid, parent, prefix_len, new in records:
        prefix = full[parent][:prefix_len] if parent else np.zeros(0, np.int32)
        full[rid] = np.concatenate([prefix, new])
    stored = [StoredRecord(rid, parent, prefix_len, new) for rid, parent, prefix_len, new in records]
    for rid, expected in full.items():
        got = rebuild_sequence(stored, rid)
        assert got is not None and got.dtype == np.int32
        np.testing.assert_array_equal(got, expected)
    assert rebuild_sequence(stored, "absent") is None


def test_a_record_whose_parent_is_not_stored_is_refused() -> None:
    stored = [StoredRecord("r1", "gone", 3, _seq(2))]
    with pytest.raises(ValueError, match="gone"):
        rebuild_sequence(stored, "r1")
