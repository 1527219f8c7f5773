"""Offline admission ablations on stored executions (the paper's trajectory budget ablation).

For each setting (J_max and role priority) admission runs on every execution's stored tree with
the same per-execution seed, and the admitted trajectories are materialized into the token rows a
trainer would process. Reported per setting: trajectories, trainable tokens covered and lost,
forward-backward tokens (rows are packed without padding, so this is the sum of row lengths) as
a fraction of the uncapped setting, per-class shares, and the shared-prefix repetition avoided.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from gyre_train.exceptions import InvalidConfigError
from gyre_train.trajectories.admission import AdmissionConfig, admission_rng, admit
from gyre_train.trajectories.rows import materialize_rows
from gyre_train.trajectories.stored import StoredExecution

# The paper's trajectory budget ablation: forward-backward time as a fraction of uncapped.
PAPER_FB_FRACTION: dict[int, float] = {1: 0.414, 5: 0.748}


@dataclass(frozen=True, slots=True)
class AblationSetting:
    """One admission configuration under a label; ``baseline`` is its uncapped counterpart's label."""

    label: str
    config: AdmissionConfig
    baseline: str


class ExecutionResult(msgspec.Struct, frozen=True):
    """One execution under one setting."""

    execution_id: str
    setting: str
    trajectories: int
    targets: int  # L_i
    trainable: int  # trainable tokens on the union of candidate paths
    row_tokens: int  # tokens of the materialized rows (what forward-backward processes)
    row_tokens_squared: int  # sum of squared row lengths (attention cost)
    expanded_targets: int  # targets if every admitted path were trained in full, independently
    trajectories_by_class: dict[str, int]
    targets_by_class: dict[str, int]
    admission_ms: float


class SettingSummary(msgspec.Struct, frozen=True):
    """A setting over all executions; fractions are relative to its uncapped baseline."""

    setting: str
    max_trajectories: int | None
    priority: str
    executions: int
    trajectories: int
    targets: int
    trainable: int
    lost: int
    covered_fraction: float
    row_tokens: int
    fb_token_fraction: float
    fb_attention_fraction: float
    paper_fb_fraction: float | None
    repetition_avoided: int
    class_shares: dict[str, float]
    target_shares: dict[str, float]
    admission_ms_mean: float
    admission_ms_max: float


class AblationReport(msgspec.Struct, frozen=True):
    summaries: list[SettingSummary]
    executions: list[ExecutionResult]


def run_execution(stored: StoredExecution, setting: AblationSetting, seed: int) -> ExecutionResult:
    """Admit one execution under one setting and measure what the trainer would get."""
    rng = admission_rng(seed, stored.execution_id)
    start = time.perf_counter()
    admission = admit(stored.tree, setting.config, rng)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    rows = materialize_rows(stored.execution_id, stored.tree, stored.tokens, admission)
    counts = stored.tree.trainable_counts
    trajectories: Counter[str] = Counter()
    targets: Counter[str] = Counter()
    expanded = 0
    for trajectory in admission.trajectories:
        trajectories[trajectory.leaf_class.value] += 1
        targets[trajectory.leaf_class.value] += trajectory.target_count
        expanded += int(counts[stored.tree.paths[trajectory.leaf_index]].sum())
    return ExecutionResult(
        execution_id=stored.execution_id,
        setting=setting.label,
        trajectories=len(admission.trajectories),
        targets=admission.target_count,
        trainable=stored.trainable_on_candidates(),
        row_tokens=sum(len(r) for r in rows),
        row_tokens_squared=sum(len(r) ** 2 for r in rows),
        expanded_targets=expanded,
        trajectories_by_class=dict(sorted(trajectories.items())),
        targets_by_class=dict(sorted(targets.items())),
        admission_ms=elapsed_ms,
    )


def _shares(counter: Counter[str]) -> dict[str, float]:
    total = sum(counter.values())
    return {k: (v / total if total else 0.0) for k, v in sorted(counter.items())}


def run_ablation(
    executions: Sequence[StoredExecution], settings: Sequence[AblationSetting], *, seed: int = 0
) -> AblationReport:
    """Run every setting on every execution; each setting's baseline must be among ``settings``."""
    labels = {s.label for s in settings}
    if len(labels) != len(settings):
        raise InvalidConfigError("two ablation settings share a label")
    missing = {s.baseline for s in settings} - labels
    if missing:
        raise InvalidConfigError(f"baseline setting(s) {sorted(missing)} are not in the ablation")
    results = [run_execution(e, s, seed) for s in settings for e in executions]
    by_setting: dict[str, list[ExecutionResult]] = {s.label: [] for s in settings}
    for r in results:
        by_setting[r.setting].append(r)
    summaries = []
    for s in settings:
        rs, base = by_setting[s.label], by_setting[s.baseline]
        base_tokens = sum(r.row_tokens for r in base)
        base_attention = sum(r.row_tokens_squared for r in base)
        tokens = sum(r.row_tokens for r in rs)
        targets = sum(r.targets for r in rs)
        trainable = sum(r.trainable for r in rs)
        trajectories: Counter[str] = Counter()
        class_targets: Counter[str] = Counter()
        for r in rs:
            trajectories.update(r.trajectories_by_class)
            class_targets.update(r.targets_by_class)
        cap = s.config.max_trajectories
        times = [r.admission_ms for r in rs] or [0.0]
        summaries.append(
            SettingSummary(
                setting=s.label,
                max_trajectories=cap,
                priority=type(s.config.priority).__name__,
                executions=len(rs),
                trajectories=sum(r.trajectories for r in rs),
                targets=targets,
                trainable=trainable,
                lost=trainable - targets,
                covered_fraction=targets / trainable if trainable else 0.0,
                row_tokens=tokens,
                fb_token_fraction=tokens / base_tokens if base_tokens else 0.0,
                fb_attention_fraction=sum(r.row_tokens_squared for r in rs) / base_attention
                if base_attention
                else 0.0,
                paper_fb_fraction=PAPER_FB_FRACTION.get(cap) if cap is not None else 1.0,
                repetition_avoided=sum(r.expanded_targets - r.targets for r in rs),
                class_shares=_shares(trajectories),
                target_shares=_shares(class_targets),
                admission_ms_mean=sum(times) / len(times),
                admission_ms_max=max(times),
            )
        )
    return AblationReport(summaries, results)
