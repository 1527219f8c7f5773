"""The simulator: measured staleness, policy comparisons, presets and tables."""

from __future__ import annotations

import math

import pytest

from gyre_sched import (
    CapacityBelowBatchError,
    PolicyKind,
    UnknownPresetError,
    get_preset,
    simulate,
)
from gyre_sched.sim import ABLATION, SPEEDUP, WORKLOADS, ablation_table, with_policy
from tests.unit.sched.helpers import small_cluster, tiny

SETTINGS = [
    (PolicyKind.ELASTIC, 0.0, 1),
    (PolicyKind.ELASTIC, 0.5, 1),
    (PolicyKind.ELASTIC, 0.5, 2),
    (PolicyKind.ELASTIC, 0.5, 3),
    (PolicyKind.ELASTIC, 1.5, 2),
    (PolicyKind.ASYNC, 1.0, 1),
    (PolicyKind.ASYNC, 1.5, 1),
    (PolicyKind.ASYNC, 0.5, 3),
    (PolicyKind.COLOCATE, 0.0, 3),
    (PolicyKind.COLOCATE, 0.0, 4),
    (PolicyKind.COLOCATE, 0.5, 3),
]


@pytest.mark.parametrize(("policy", "phi", "mu"), SETTINGS)
def test_measured_staleness_matches_boundary_dispatch(policy: PolicyKind, phi: float, mu: int) -> None:
    steps = 240
    cfg = tiny(policy, phi=phi, mu=mu)
    result = simulate(cfg, small_cluster(), WORKLOADS["nl2repo-122b"], steps=steps, seed=5).result
    assert len(result.staleness) == steps * cfg.batch_groups
    # the first wave is all version 0, a start-up deficit of at most (phi + mu)^2 / 2 steps
    assert result.mean_staleness == pytest.approx(phi + (mu - 1) / 2, abs=(phi + mu) ** 2 / 2 / steps + 1e-9)
    assert min(result.staleness) >= 0


def test_elastic_beats_both_baselines_on_the_calibrated_cluster() -> None:
    preset = get_preset("ablation-E0")
    totals = {}
    for policy in PolicyKind:
        p = with_policy(preset, policy) if policy is not PolicyKind.ELASTIC else preset
        totals[policy] = simulate(p.sched, p.cluster, WORKLOADS[p.workload], steps=6, seed=2).result.total_h
    assert totals[PolicyKind.ELASTIC] < totals[PolicyKind.ASYNC]
    assert totals[PolicyKind.ELASTIC] < totals[PolicyKind.COLOCATE]


def test_result_shape() -> None:
    preset = get_preset("smoke")
    result = simulate(preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=4, seed=1).result
    assert len(result.step_durations_h) == 4
    assert math.isclose(sum(result.step_durations_h), result.total_h)
    assert all(t.c_e == preset.sched.cell_capacity for t in result.transitions)
    assert all(t.done_s is None or t.done_s > t.at_s for t in result.transitions)
    assert result.transitions[0].cell == 0 and result.transitions[0].direction.value == "rollout_to_train"


def test_presets_cover_the_tables() -> None:
    assert sorted(ABLATION) == ["A0", "A1", "A2", "A3", "C0", "C1", "C2", "C3", "E0", "E1", "E2"]
    assert all(p.steps == 12 for p in ABLATION.values())
    nodes = {
        row: p.sched.cells * p.cluster.cell_nodes + p.sched.pool_capacity // 36 for row, p in ABLATION.items()
    }
    assert set(nodes.values()) == {32}
    assert {p.steps for p in SPEEDUP.values()} == {48}
    for preset in (*ABLATION.values(), *SPEEDUP.values()):
        preset.sched.validate()
        preset.cluster.validate()
    with pytest.raises(UnknownPresetError, match="known"):
        get_preset("nope")


def test_ablation_table_has_a_shared_calibration() -> None:
    rows = ablation_table([0])
    assert [r.row for r in rows] == list(ABLATION)
    e0 = next(r for r in rows if r.row == "E0")
    assert e0.sim_vs_e0 == 1.0 and e0.residual == 0.0
    assert len({p.cluster.train_node_hours_per_group for p in ABLATION.values()}) == 1
    assert all(r.sim_total_h > 0 for r in rows)


def test_steps_must_be_positive_and_capacity_must_hold_a_batch() -> None:
    with pytest.raises(CapacityBelowBatchError, match="below one batch"):
        simulate(tiny(cell_capacity=1), small_cluster(), WORKLOADS["nl2repo-122b"], steps=1, seed=0)
