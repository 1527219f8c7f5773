"""Offline admission ablations on generated executions: coverage, fractions, shares, repetition."""

from __future__ import annotations

import numpy as np
import pytest

from gyre_store import InMemoryEventLog
from gyre_store.trees import TreeView
from gyre_train import (
    AblationSetting,
    AdmissionConfig,
    FlatPriority,
    InvalidConfigError,
    StoredExecution,
    run_ablation,
    stored_execution,
)
from gyre_train.trajectories.testing import synthetic_execution
from tests.unit.train.runs import catch_all, memory_store, record_trace


@pytest.fixture(scope="module")
def executions() -> list[StoredExecution]:
    log = InMemoryEventLog()
    for seed, e in enumerate(("x0", "x1")):
        record_trace(log, e, "r", seed=5 + seed)
    store = memory_store(log)
    catch_all(log, store)
    return [stored_execution(TreeView.load(store, e)) for e in ("x0", "x1")]


def _settings() -> list[AblationSetting]:
    return [
        AblationSetting("cap1", AdmissionConfig(max_trajectories=1), "all"),
        AblationSetting("cap5", AdmissionConfig(max_trajectories=5), "all"),
        AblationSetting("all", AdmissionConfig(max_trajectories=None), "all"),
        AblationSetting("flat1", AdmissionConfig(max_trajectories=1, priority=FlatPriority()), "flatall"),
        AblationSetting(
            "flatall", AdmissionConfig(max_trajectories=None, priority=FlatPriority()), "flatall"
        ),
    ]


def test_capped_admission_trades_coverage_for_forward_backward_tokens(
    executions: list[StoredExecution],
) -> None:
    report = run_ablation(executions, _settings(), seed=0)
    s = {x.setting: x for x in report.summaries}
    assert s["all"].fb_token_fraction == 1.0 and s["all"].lost == 0 and s["all"].covered_fraction == 1.0
    assert 0 < s["cap1"].fb_token_fraction < s["cap5"].fb_token_fraction <= 1.0
    assert s["cap1"].trajectories == 2 and s["cap1"].class_shares == {"main": 1.0}  # eq. (4): main first
    assert s["cap1"].lost == s["cap1"].trainable - s["cap1"].targets > 0
    assert (s["cap1"].paper_fb_fraction, s["cap5"].paper_fb_fraction) == (0.414, 0.748)
    for summary in report.summaries:
        assert sum(summary.class_shares.values()) == pytest.approx(1.0)
        # Admission time is a benchmark figure (benchmarks/bench_stored_admission.py), never asserted here.
        assert summary.repetition_avoided >= 0
    assert s["flatall"].targets == s["all"].targets  # uncapped covers the same tokens under any priority


def test_bad_settings_are_refused(executions: list[StoredExecution]) -> None:
    with pytest.raises(InvalidConfigError, match="baseline"):
        run_ablation(executions, [AblationSetting("a", AdmissionConfig(max_trajectories=1), "missing")])
    with pytest.raises(InvalidConfigError, match="share a label"):
        run_ablation(executions, [AblationSetting("a", AdmissionConfig(), "a")] * 2)


def test_shared_prefix_targets_are_counted_once() -> None:
    synthetic = synthetic_execution(np.random.default_rng(1), num_nodes=300, num_leaves=8, num_roots=1)
    stored = StoredExecution(
        "syn", synthetic.tree, synthetic.tokens, tuple(range(synthetic.tree.num_nodes)), 0
    )
    report = run_ablation([stored], [AblationSetting("all", AdmissionConfig(max_trajectories=None), "all")])
    [summary] = report.summaries
    counts = synthetic.tree.trainable_counts
    expanded = sum(int(counts[path].sum()) for path in synthetic.tree.paths)
    assert summary.targets == stored.trainable_on_candidates()
    assert summary.repetition_avoided == expanded - summary.targets > 0
