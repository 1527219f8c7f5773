"""The core's reduction decision (pure) and the wire format of micro-steps and plans."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_train import ContributionError
from gyre_train.cells import PendingClaim, decode_micro_step, encode_micro_step, synthetic_batch
from gyre_train.cells.membership import ReducePlan, TakeOver, Wait, live_prefix, plan_reduction


def _pending(*owners: tuple[str, int]) -> list[PendingClaim]:
    return [PendingClaim(m, cell, idle_ms=0, deliveries=1) for m, cell in owners]


def _plan(**overrides: object) -> ReducePlan | Wait | TakeOver:
    args: dict[str, object] = {
        "batch": 3,
        "micro_steps": 3,
        "members": {1, 2},
        "alive": {1, 2},
        "drained": {1: {"m1": 1}, 2: {"m2": 2}},
        "core_held": {"m0": 0},
        "pending": _pending(("m0", 0), ("m1", 1), ("m2", 2)),
        "final": False,
    }
    args.update(overrides)
    return plan_reduction(**args)  # type: ignore[arg-type]


def test_a_full_prefix_reduces_every_micro_step_once() -> None:
    plan = _plan()
    assert isinstance(plan, ReducePlan)
    assert plan.cells == (0, 1, 2) and plan.dropped == ()
    assert plan.held == ((("m0", 0),), (("m1", 1),), (("m2", 2),))
    assert ReducePlan.decode(plan.encode()) == plan


def test_a_computing_cell_or_a_dead_cells_claims_make_the_core_wait() -> None:
    assert isinstance(_plan(drained={1: {"m1": 1}}), Wait)
    assert isinstance(_plan(alive={1}, drained={1: {"m1": 1}}), Wait)


def test_a_dead_cell_without_claims_is_left_out() -> None:
    plan = _plan(
        alive={1}, drained={1: {"m1": 1, "m2": 2}}, pending=_pending(("m0", 0), ("m1", 1), ("m2", 1))
    )
    assert isinstance(plan, ReducePlan) and plan.cells == (0, 1)


def test_claims_of_a_cell_behind_a_gap_are_taken_over() -> None:
    decision = _plan(
        alive={2}, drained={2: {"m1": 1, "m2": 2}}, pending=_pending(("m0", 0), ("m1", 2), ("m2", 2))
    )
    assert decision == TakeOver(("m1", "m2"))
    plan = _plan(
        alive={2},
        drained={2: {"m1": 1, "m2": 2}},
        core_held={"m0": 0, "m1": 1, "m2": 2},
        pending=_pending(("m0", 0), ("m1", 0), ("m2", 0)),
    )
    assert isinstance(plan, ReducePlan) and plan.cells == (0,) and plan.dropped == (2,)


def test_a_report_naming_a_claim_taken_over_would_double_count_and_is_refused() -> None:
    with pytest.raises(ContributionError, match="no longer holds"):
        _plan(
            drained={1: {"m1": 1, "m2": 2}, 2: {"m2": 2}},
            pending=_pending(("m0", 0), ("m1", 1), ("m2", 2)),
        )
    with pytest.raises(ContributionError, match=r"expected 0\.\.3"):
        _plan(micro_steps=4)


def test_live_prefix_stops_at_the_first_gap() -> None:
    assert live_prefix({1, 2, 3}, {1, 3}, {1, 3}) == 2
    assert live_prefix(set(), set(), set()) == 1


def test_micro_steps_survive_the_wire() -> None:
    steps, _ = synthetic_batch(0, 2)
    for step in steps:
        back = decode_micro_step(encode_micro_step(step))
        assert (back.batch, back.index, back.closes_stream, back.rows) == (
            step.batch, step.index, step.closes_stream, step.rows,
        )  # fmt: skip
        for name in ("token_ids", "position_ids", "row_starts", "target_mask", "behaviour_logprobs", "slots",
                     "coefficients", "execution_advantages"):  # fmt: skip
            np.testing.assert_array_equal(getattr(back, name), getattr(step, name))
            assert getattr(back, name).dtype == getattr(step, name).dtype
