"""A live run's figures, read from its event log alone: per step, staleness, held-out evaluation.

Nothing here is counted in process: a step's reward is the mean of the recorded outcomes of
the executions in the groups that step consumed; its admitted trajectories and target tokens
are what the packing buffer recorded when it took each group; its wall time runs from the
previous step's ``batch.closed`` (the run's start for step 0) to its own. The staleness of a
consumed group is ``d = v_t - v_d``: the step that consumed it (the version trained before
that step) minus the version published when it was dispatched. Held-out evaluations are the
side runs ``<run>~<name>``; an instance passes when its reward is 1. A role transition's
time runs from its first ``cell.command`` to its last step done (``join`` into training,
``restore_rollout`` back to rollout), split into the seconds each ``cell.step_done`` records;
a step's roles are the cells' roles (``cell.role_changed``) when the step began.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

import msgspec

from gyre_store.catalog import (
    TO_TRAINING_STEPS,
    BatchClosed,
    CellCommand,
    CellRole,
    CellRoleChanged,
    CellStep,
    CellStepDone,
    ExecutionDispatched,
    ExecutionExcluded,
    GroupConsumed,
    GroupDispatched,
    ModelCallRecorded,
    PlaceholderInserted,
    RewardAssigned,
    RunStarted,
    TrainingUpdate,
)
from gyre_store.log import EventLog, RecordedEvent

REPORT_TYPES = (
    "run.started",
    "group.dispatched",
    "execution.dispatched",
    "group.consumed",
    "reward.assigned",
    "reward.placeholder",
    "reward.excluded",
    "train.update",
    "batch.closed",
    "cell.role_changed",
    "cell.command",
    "cell.step_done",
    "model_call.recorded",
)


__all__ = ["HeldOut", "RoleSpan", "RunReport", "Staleness", "StepFigures", "TransitionTime", "run_report"]


class StepFigures(msgspec.Struct, frozen=True, kw_only=True):
    step: int
    policy_version: int
    mean_reward: float | None
    groups: int
    executions: int
    admitted_trajectories: int
    trainable_tokens: int
    loss: float | None
    grad_norm: float | None
    wall_s: float | None
    roles: dict[str, int] = msgspec.field(default_factory=dict)  # cells per role at the step's start
    staleness_mean: float | None = None  # mean d = v_t - v_d of the groups the step consumed


class TransitionTime(msgspec.Struct, frozen=True, kw_only=True):
    """One role transition of one cell: its direction, its seconds, and each phase's."""

    direction: str  # "to_training" or "to_rollout"
    cell: int
    total_s: float | None  # None while it has not completed
    phases: dict[str, float]


class RoleSpan(msgspec.Struct, frozen=True, kw_only=True):
    """Cell ``cell`` held ``role`` from ``start_s`` to ``end_s`` (seconds since the run started)."""

    cell: int
    role: str
    start_s: float
    end_s: float


class Staleness(msgspec.Struct, frozen=True, kw_only=True):
    """Two readings of staleness. ``measured_mean`` and ``histogram``: per consumed group, the
    step that consumed it minus the version published when it was dispatched (the paper's
    ``d``, what ``expected_mean`` predicts). ``engine_mean`` and ``engine_histogram``: per model
    call of those groups' executions, the consuming step minus the oldest version its engine
    reported for the call's sampled tokens (``meta_info.weight_version``; every recorded
    attempt counts, an aborted one too); ``unreported_calls`` counts calls whose engine
    reported none."""

    measured_mean: float | None
    expected_mean: float
    groups: int
    histogram: dict[str, int]
    engine_mean: float | None = None
    engine_calls: int = 0
    unreported_calls: int = 0
    engine_histogram: dict[str, int] = msgspec.field(default_factory=dict)


class HeldOut(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    executions: int
    passed: int
    mean_reward: float | None

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.executions if self.executions else None


class RunReport(msgspec.Struct, frozen=True, kw_only=True):
    run_id: str
    steps: list[StepFigures]
    staleness: Staleness
    held_out: list[HeldOut]
    transitions: int
    wall_s: float | None
    transition_times: list[TransitionTime] = msgspec.field(default_factory=list)
    role_timeline: list[RoleSpan] = msgspec.field(default_factory=list)


def _rewards(events: Iterable[RecordedEvent]) -> dict[str, float | None]:
    """Execution -> its reward (a placeholder counts as 0; excluded: None)."""
    out: dict[str, float | None] = {}
    for recorded in events:
        match recorded.event:
            case RewardAssigned(execution_id=eid, reward=reward):
                out[eid] = float(reward)
            case PlaceholderInserted(execution_id=eid):
                out[eid] = 0.0
            case ExecutionExcluded(execution_id=eid):
                out[eid] = None
            case _:
                pass
    return out


def _engine_staleness(
    mine: list[RecordedEvent], consumed: dict[int, list[GroupConsumed]], members: dict[str, list[str]]
) -> tuple[list[int], int]:
    """Per model call of a consumed group's executions: the consuming step minus the oldest
    version the engine reported for its sampled tokens; and how many calls reported none."""
    step_of = {e: g.step for gs in consumed.values() for g in gs for e in members.get(g.group_id, [])}
    stale: list[int] = []
    unreported = 0
    for call in (r.event for r in mine if isinstance(r.event, ModelCallRecorded)):
        step = step_of.get(call.execution_id)
        if step is None:
            continue
        if not call.weight_versions:
            unreported += 1
            continue
        stale.append(step - min(version for _, version in call.weight_versions))
    return stale, unreported


def run_report(log: EventLog, run_id: str, *, phi: float, mu: int) -> RunReport:
    """Every figure of run ``run_id`` as its log records it now."""
    side = run_id + "~"
    events = [
        r
        for r in log.read(0, types=REPORT_TYPES, limit=10_000_000)
        if getattr(r.event, "run_id", None) == run_id or str(getattr(r.event, "run_id", "")).startswith(side)
    ]
    mine = [r for r in events if r.event.run_id == run_id]  # type: ignore[attr-defined]
    started: datetime | None = next((r.recorded_at for r in mine if isinstance(r.event, RunStarted)), None)
    dispatched_version = {
        r.event.group_id: r.event.policy_version for r in mine if isinstance(r.event, GroupDispatched)
    }
    members: dict[str, list[str]] = defaultdict(list)
    for r in mine:
        if isinstance(r.event, ExecutionDispatched):
            members[r.event.group_id].append(r.event.execution_id)
    rewards = _rewards(mine)
    consumed: dict[int, list[GroupConsumed]] = defaultdict(list)
    for r in mine:
        if isinstance(r.event, GroupConsumed):
            consumed[r.event.step].append(r.event)
    updates = {r.event.batch: r.event for r in mine if isinstance(r.event, TrainingUpdate)}
    closed = {r.event.step: r.recorded_at for r in mine if isinstance(r.event, BatchClosed)}
    start = next((r.event for r in mine if isinstance(r.event, RunStarted)), None)
    cells, fixed = (start.cells, start.fixed_training_cells) if start is not None else (0, 0)
    steps: list[StepFigures] = []
    for step in sorted(closed):
        groups = consumed.get(step, [])
        executions = [e for g in groups for e in members.get(g.group_id, [])]
        valid = [v for e in executions if (v := rewards.get(e)) is not None]
        previous = closed.get(step - 1, started)
        update = updates.get(step)
        step_stale = [
            step - dispatched_version[g.group_id] for g in groups if g.group_id in dispatched_version
        ]
        steps.append(
            StepFigures(
                step=step,
                policy_version=update.policy_version if update else step + 1,
                mean_reward=sum(valid) / len(valid) if valid else None,
                groups=len(groups),
                executions=len(executions),
                admitted_trajectories=sum(g.trajectories for g in groups),
                trainable_tokens=sum(g.target_tokens for g in groups),
                loss=update.loss if update else None,
                grad_norm=update.grad_norm if update else None,
                wall_s=(closed[step] - previous).total_seconds() if previous is not None else None,
                roles=_roles_at(mine, cells, fixed, previous),
                staleness_mean=sum(step_stale) / len(step_stale) if step_stale else None,
            )
        )
    stale = [
        g.step - dispatched_version[g.group_id]
        for gs in consumed.values()
        for g in gs
        if g.group_id in dispatched_version
    ]
    histogram: dict[str, int] = defaultdict(int)
    for d in stale:
        histogram[str(d)] += 1
    engine_stale, unreported = _engine_staleness(mine, consumed, members)
    engine_histogram: dict[str, int] = defaultdict(int)
    for d in engine_stale:
        engine_histogram[str(d)] += 1
    side_runs: dict[str, list[str]] = defaultdict(list)
    for r in events:
        if isinstance(r.event, ExecutionDispatched) and r.event.run_id.startswith(side):
            side_runs[r.event.run_id.removeprefix(side)].append(r.event.execution_id)
    side_rewards = _rewards(r for r in events if r.event.run_id.startswith(side))  # type: ignore[attr-defined]
    held_out = []
    for name, executions in sorted(side_runs.items()):
        scored = [v for e in executions if (v := side_rewards.get(e)) is not None]
        held_out.append(
            HeldOut(
                name=name,
                executions=len(scored),
                passed=sum(v >= 1.0 for v in scored),
                mean_reward=sum(scored) / len(scored) if scored else None,
            )
        )
    transitions = sum(
        isinstance(r.event, CellRoleChanged) and r.event.role is CellRole.TRANSITIONING for r in mine
    )
    last = max(closed.values(), default=None)
    return RunReport(
        run_id=run_id,
        steps=steps,
        staleness=Staleness(
            measured_mean=sum(stale) / len(stale) if stale else None,
            expected_mean=phi + (mu - 1) / 2,
            groups=len(stale),
            histogram=dict(sorted(histogram.items(), key=lambda kv: int(kv[0]))),
            engine_mean=sum(engine_stale) / len(engine_stale) if engine_stale else None,
            engine_calls=len(engine_stale),
            unreported_calls=unreported,
            engine_histogram=dict(sorted(engine_histogram.items(), key=lambda kv: int(kv[0]))),
        ),
        held_out=held_out,
        transitions=transitions,
        wall_s=(last - started).total_seconds() if last is not None and started is not None else None,
        transition_times=_transition_times(mine),
        role_timeline=_role_timeline(mine, cells, fixed, started, last),
    )


def _role_timeline(
    events: list[RecordedEvent], cells: int, fixed: int, started: datetime | None, end: datetime | None
) -> list[RoleSpan]:
    """Each cell's roles over the run, from its start to its last update (rollout until a change)."""
    if started is None or end is None:
        return []
    current = {c: ((CellRole.TRAINING if c < fixed else CellRole.ROLLOUT).value, 0.0) for c in range(cells)}
    spans: list[RoleSpan] = []
    for r in events:
        if isinstance(r.event, CellRoleChanged) and r.event.cell_index in current:
            at = max(0.0, (r.recorded_at - started).total_seconds())
            role, since = current[r.event.cell_index]
            if at > since:
                spans.append(RoleSpan(cell=r.event.cell_index, role=role, start_s=since, end_s=at))
            current[r.event.cell_index] = (r.event.role.value, at)
    stop = (end - started).total_seconds()
    for cell, (role, since) in sorted(current.items()):
        spans.append(RoleSpan(cell=cell, role=role, start_s=since, end_s=max(since, stop)))
    return spans


def _roles_at(events: list[RecordedEvent], cells: int, fixed: int, at: datetime | None) -> dict[str, int]:
    """How many of the run's cells held each role at ``at`` (a cell with no change yet holds
    the role it started in: training for a fixed partition's ``fixed`` cells, else rollout)."""
    role = {c: CellRole.TRAINING if c < fixed else CellRole.ROLLOUT for c in range(cells)}
    for r in events:
        if at is not None and r.recorded_at > at:
            break
        if isinstance(r.event, CellRoleChanged):
            role[r.event.cell_index] = r.event.role
    counts: dict[str, int] = defaultdict(int)
    for value in role.values():
        counts[value.value] += 1
    return dict(sorted(counts.items()))


def _transition_times(events: list[RecordedEvent]) -> list[TransitionTime]:
    """Each transition's first command and its steps done, in the order transitions began."""
    began: dict[tuple[int, int], datetime] = {}
    steps: dict[tuple[int, int], dict[CellStep, tuple[datetime, float]]] = defaultdict(dict)
    directions: dict[tuple[int, int], str] = {}
    for r in events:
        match r.event:
            case CellCommand(cell_index=cell, transition=seq, step=step) if step is not CellStep.CORE_STAYS:
                began.setdefault((cell, seq), r.recorded_at)
                directions.setdefault(
                    (cell, seq), "to_training" if step in TO_TRAINING_STEPS else "to_rollout"
                )
            case CellStepDone(cell_index=cell, transition=seq, step=step, seconds=seconds):
                steps[(cell, seq)][step] = (r.recorded_at, seconds)
            case _:
                pass
    out = []
    for key in sorted(began, key=lambda k: began[k]):
        done = steps.get(key, {})
        direction = directions[key]
        last = CellStep.JOIN if direction == "to_training" else CellStep.RESTORE_ROLLOUT
        total = (done[last][0] - began[key]).total_seconds() if last in done else None
        out.append(
            TransitionTime(
                direction=direction,
                cell=key[0],
                total_s=total,
                phases={step.value: round(seconds, 3) for step, (_, seconds) in done.items()},
            )
        )
    return out
