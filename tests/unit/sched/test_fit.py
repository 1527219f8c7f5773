"""The calibration fit: its profile measure, its searches and its fixed split."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from gyre_sched import Outcome, workload_stats
from gyre_sched.exceptions import UnknownPresetError, WorkloadError
from gyre_sched.sim import (
    ABLATION,
    CHANGED_AFTER_SEEN_ROWS,
    CHANGED_AFTER_SEEN_SPEEDUPS,
    OUT_OF_FIT_ROWS,
    PAPER_SPEEDUP,
    TRAINING_ROWS,
    TRAINING_SPEEDUPS,
    WORKLOADS,
    Role,
    ablation_role,
    fit_profile,
    profile,
    profile_draws,
    speedup_role,
)
from gyre_sched.sim.fit import FREE_122B, scan
from gyre_sched.sim.tables import residual


def test_split_covers_every_row_once_and_keeps_a1_and_e1_out_of_the_fit() -> None:
    assert sorted((*TRAINING_ROWS, *OUT_OF_FIT_ROWS, "E0")) == sorted(ABLATION)
    assert not set(TRAINING_ROWS) & set(OUT_OF_FIT_ROWS)
    assert {"A1", "E1"} <= set(OUT_OF_FIT_ROWS)


def test_only_figures_outside_the_fit_are_held_out_or_changed_after_seen() -> None:
    roles = {row: ablation_role(row) for row in ABLATION}
    assert {r for r, role in roles.items() if role is Role.FIT} == set(TRAINING_ROWS)
    assert roles["E0"] is Role.DENOMINATOR
    assert {r for r, role in roles.items() if role is Role.CHANGED_AFTER_SEEN} == set(CHANGED_AFTER_SEEN_ROWS)
    assert set(CHANGED_AFTER_SEEN_ROWS) <= set(OUT_OF_FIT_ROWS)
    # A1 was the figure the third round's workload was changed for
    assert roles["A1"] is Role.CHANGED_AFTER_SEEN
    speedups = {(s, b): speedup_role(s, b) for s in PAPER_SPEEDUP for b in ("async", "colocate")}
    assert {k for k, role in speedups.items() if role is Role.FIT} == set(TRAINING_SPEEDUPS)
    changed = {k for k, role in speedups.items() if role is Role.CHANGED_AFTER_SEEN}
    assert changed == set(CHANGED_AFTER_SEEN_SPEEDUPS) and not changed & set(TRAINING_SPEEDUPS)
    with pytest.raises(UnknownPresetError):
        ablation_role("A9")
    with pytest.raises(UnknownPresetError):
        speedup_role("nl2repo-2.4t", "sync")


def test_profile_on_fixed_draws_agrees_with_workload_stats() -> None:
    model = WORKLOADS["nl2repo-122b"]
    fixed = profile(model, profile_draws(queries=6000))
    drawn = workload_stats(model, np.random.default_rng(3), 6000, 16)
    assert fixed.mean_execution_h == pytest.approx(drawn.mean_execution_h, rel=0.03)
    assert fixed.mean_query_h == pytest.approx(drawn.mean_query_h, rel=0.03)
    assert fixed.queries_over_4h == pytest.approx(drawn.queries_over_4h, abs=0.012)
    assert fixed.harness_timeout_rate == pytest.approx(drawn.harness_timeout_rate, abs=0.005)
    assert fixed.overall_timeout_rate == pytest.approx(drawn.overall_timeout_rate, abs=0.002)


def test_stalls_end_at_the_budget_whatever_the_difficulty() -> None:
    model = msgspec.structs.replace(WORKLOADS["nl2repo-122b"], stall_rate=0.5)
    group = model.sample_group(np.random.default_rng(0), 400)
    stalled = [
        d for d, o in zip(group.durations_s, group.outcomes, strict=True) if o is Outcome.OVERALL_TIMEOUT
    ]
    assert 150 < len(stalled) < 250
    assert set(stalled) == {model.overall_budget_h * 3600}
    # without stalls or hard queries no uniform is drawn, so the stream (and every result)
    # is what it was before either existed
    never = msgspec.structs.replace(model, stall_rate=0.0, hard_share=0.0)
    rng, manual = np.random.default_rng(0), np.random.default_rng(0)
    never.sample_group(rng, 16)
    manual.standard_normal(), manual.standard_normal(16)
    eta, eps = manual.standard_normal(), manual.standard_normal(16)
    hours, _ = never.end(np.full(16, eta), eps, np.ones(16), np.ones(16))
    assert never.sample_group(rng, 16).durations_s == tuple((hours * 3600).tolist())


def test_a_hard_query_scales_every_execution_of_its_group() -> None:
    model = msgspec.structs.replace(
        WORKLOADS["nl2repo-122b"], median_h=0.5, sigma_query=0.0, hard_share=0.25, hard_factor=3.0
    )
    eta, eps, u = np.zeros(16), np.random.default_rng(1).normal(0.0, 0.3, 16), np.ones(16)
    easy, _ = model.end(eta, eps, u, np.ones(16))
    hard, _ = model.end(eta, eps, u, np.zeros(16))
    assert hard == pytest.approx(3.0 * easy)  # all below the ceiling: the same draws, three times
    # the draw is per query: a group is all hard or all easy, about a quarter of them hard
    groups = [model.sample_group(np.random.default_rng(seed), 16).durations_s for seed in range(400)]
    # an easy group's shortest execution is about 0.30 h, a hard one's about 0.89 h
    hard_groups = sum(min(g) / 3600 > 0.45 for g in groups)
    assert 70 < hard_groups < 130


def test_a_bad_hard_share_is_refused() -> None:
    with pytest.raises(WorkloadError, match="hard_share"):
        msgspec.structs.replace(WORKLOADS["nl2repo-122b"], hard_share=1.0).validate()
    with pytest.raises(WorkloadError, match="hard_factor"):
        msgspec.structs.replace(WORKLOADS["nl2repo-122b"], hard_factor=0.5).validate()


def test_fit_profile_recovers_a_model_from_its_own_figures() -> None:
    truth = WORKLOADS["nl2repo-122b"]
    draws = profile_draws(queries=2000)
    stats = profile(truth, draws)
    targets = {k: getattr(stats, k) for k in ("mean_execution_h", "mean_query_h", "harness_timeout_rate")}
    free = {k: FREE_122B[k] for k in ("median_h", "sigma_query", "sigma_exec")}
    start = msgspec.structs.replace(truth, median_h=1.3, sigma_query=0.8, sigma_exec=0.6)
    fit = fit_profile("nl2repo-122b", start, free, targets, draws, points=3, starts=2, iterations=80)
    assert fit.loss < 1e-3
    assert all(abs(f.residual) < 0.02 for f in fit.figures)
    assert fit.model.median_h == pytest.approx(truth.median_h, rel=0.05)


def test_scan_refines_around_the_grid_minimum() -> None:
    best, loss, points = scan(lambda c: (c - 0.437) ** 2, [0.2, 0.3, 0.4, 0.5, 0.6], 0.01)
    assert best == pytest.approx(0.44) and loss == pytest.approx(0.003**2)
    assert [p.value for p in points] == sorted(p.value for p in points)


def test_residual_is_zero_inside_a_range_and_relative_to_the_nearer_end() -> None:
    assert residual(1.45, (1.42, 1.53)) == 0.0
    assert residual(1.3, (1.42, 1.53)) == pytest.approx(1.3 / 1.42 - 1)
    assert residual(1.6, (1.42, 1.53)) == pytest.approx(1.6 / 1.53 - 1)
    assert math.isclose(residual(1.21, (1.21, 1.21)), 0.0)
