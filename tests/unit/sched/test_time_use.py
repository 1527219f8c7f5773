"""The time account of a simulated run (every second of a step, once, by cause), and who
may compute a batch's micro-steps."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgspec
import numpy as np
import pytest

from gyre_sched import CellRole, DecisionCore, GroupClaimed, Outcome, get_preset, simulate
from gyre_sched.sim import WORKLOADS, CeilingLogNormal, GroupSample, Preset
from gyre_sched.sim.explain import main as explain
from gyre_sched.sim.time_use import (
    StepTimeUse,
    TimeUse,
    burst_readiness,
    format_account,
    format_readiness,
    seconds_by_use,
)

ROWS = ("ablation-E0", "ablation-E1", "ablation-A1", "ablation-A3", "ablation-C0", "ablation-C2")


def _run(preset: Preset, steps: int, seed: int = 3, **cluster: float) -> tuple[float, list[StepTimeUse]]:
    c = msgspec.structs.replace(preset.cluster, **cluster)
    result = simulate(preset.sched, c, WORKLOADS[preset.workload], steps=steps, seed=seed).result
    return result.total_h, list(result.time_use)


@pytest.mark.parametrize("name", ROWS)
def test_every_second_of_every_step_is_accounted_once(name: str) -> None:
    preset = get_preset(name)
    result = simulate(preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=6, seed=3).result
    assert [s.step for s in result.time_use] == list(range(6))
    for step, hours in zip(result.time_use, result.step_durations_h, strict=True):
        assert sum(u.seconds for u in step.uses) == pytest.approx(hours * 3600, rel=1e-9)
        assert all(u.seconds > 0 for u in step.uses)


@pytest.mark.parametrize("name", ROWS)
def test_overheads_are_counted_where_the_trainer_pays_them(name: str) -> None:
    preset = get_preset(name)
    s, c = preset.sched, preset.cluster
    steps = 6
    _, account = _run(preset, steps)
    spent = seconds_by_use(account)
    assert spent[TimeUse.UPDATE] == pytest.approx(steps * c.update_s)
    # the run ends at its last update: a publication follows every burst end before it
    publications = sum(1 for k in range(steps - 1) if (k + 1) % s.mu == 0)
    assert spent[TimeUse.PUBLICATION] == pytest.approx(publications * c.publish_s)
    assert spent[TimeUse.BROADCAST] == pytest.approx((steps - 1 - publications) * c.broadcast_s)


def test_free_training_leaves_a_rollout_bound_run() -> None:
    # with training all but free, the elastic run waits for ready groups or for cells to
    # be allowed into training; it is never bound by training itself
    _, account = _run(get_preset("ablation-E0"), 6, train_node_hours_per_group=0.001, pipeline_s=0.0)
    spent = seconds_by_use(account)
    bound = sum(v for u, v in spent.items() if u.name.startswith("BOUND"))
    waiting = spent[TimeUse.WAIT_IDLE] + spent[TimeUse.WAIT_TRAINING]
    assert bound < 0.01 * sum(spent.values())
    assert waiting > 0.5 * sum(spent.values())


def test_elastic_bursts_start_with_every_cell_held_in_rollout_by_the_waterlevel() -> None:
    # E0 dispatches (phi + mu) N B = 1792 executions onto 1152 slots: eq. 2 keeps the core
    # in rollout at the start of every burst, and only there
    preset = get_preset("ablation-E0")
    _, account = _run(preset, 6)
    mu = preset.sched.mu
    first = seconds_by_use([s for s in account if s.step % mu == 0])
    later = seconds_by_use([s for s in account if s.step % mu != 0])
    assert first[TimeUse.JOIN_WATERLEVEL] > 3600
    assert later[TimeUse.JOIN_WATERLEVEL] == 0


def test_a_small_fixed_partition_is_training_bound() -> None:
    # A1 trains on 8 of 32 nodes: most of its time its two cells compute while groups wait
    _, account = _run(get_preset("ablation-A1"), 6)
    spent = seconds_by_use(account)
    assert spent[TimeUse.BOUND_ALL] > 0.6 * sum(spent.values())
    assert spent[TimeUse.JOIN_WATERLEVEL] == spent[TimeUse.BOUND_WATERLEVEL] == 0


def test_format_account_prints_each_use_and_the_total() -> None:
    preset = get_preset("ablation-E0")
    runs = [_run(preset, 6, seed=seed)[1] for seed in (0, 1)]
    text = format_account("E0", runs, preset.sched.mu)
    lines = text.splitlines()
    assert lines[0].startswith("E0: where the time goes")
    used = [u for u in TimeUse if any(seconds_by_use(r)[u] for r in runs)]
    assert [line.startswith(u.value) for line, u in zip(lines[2:-1], used, strict=True)] == [True] * len(used)
    mean_total = sum(sum(seconds_by_use(r).values()) for r in runs) / 2 / 3600
    assert math.isclose(float(lines[-1].split()[-1]), mean_total, abs_tol=0.006)


def test_explain_prints_the_account_and_the_total(capsys: pytest.CaptureFixture[str]) -> None:
    assert explain(["--preset", "ablation-E1", "--seeds", "1", "--train-cost", "0.3", "--no-overheads"]) == 0
    out = capsys.readouterr().out
    assert "waiting for ready groups" in out
    assert "optimizer update" not in out  # no overheads: none is paid
    assert any(line.startswith("simulated total ") for line in out.splitlines())
    assert "what each burst waited for" in out


@dataclass
class RecordingWorkload:
    """A workload that keeps every group it draws: the simulator draws a wave's groups in
    group order at their dispatch, so ``drawn[g]`` is what group ``g`` was given."""

    model: CeilingLogNormal
    drawn: list[GroupSample] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.model.name

    def sample_group(self, rng: np.random.Generator, size: int) -> GroupSample:
        sample = self.model.sample_group(rng, size)
        self.drawn.append(sample)
        return sample


def test_burst_readiness_names_what_each_burst_waited_for() -> None:
    preset = get_preset("ablation-E0")
    s = preset.sched
    for capacity, queued in ((s.cell_capacity, True), (3 * s.cell_capacity, False)):
        sched = msgspec.structs.replace(s, cell_capacity=capacity)
        workload = RecordingWorkload(WORKLOADS[preset.workload])
        run = simulate(sched, preset.cluster, workload, steps=6, seed=0, keep_log=True)
        bursts = burst_readiness(sched, run.log, run.result.step_end_s)
        assert [b.wave_groups for b in bursts] == [s.initial_groups, s.burst_groups]
        assert bursts[1].start_h * 3600 == pytest.approx(run.result.step_end_s[2] + preset.cluster.publish_s)
        for b in bursts:
            assert b.last_ready_h <= b.end_h
            assert 0 <= b.wave_at_ceiling < b.wave_groups
            assert (b.wave_queued > 0) is queued
            assert (b.last_start_delay_h > 0) is queued or b.last_start_delay_h == 0
            # the last group is ready when its latest-ending execution ends: dispatch, then
            # the wait for a slot, then the execution
            ended_h = b.last_dispatched_h + b.last_start_delay_h + b.last_duration_h
            assert ended_h == pytest.approx(b.last_ready_h, abs=1e-9)
            # that execution ran for a duration the workload drew for this group, and ended
            # as drawn (a reroute moves it with no lost progress)
            drawn = workload.drawn[b.last_group]
            same = [
                o
                for d, o in zip(drawn.durations_s, drawn.outcomes, strict=True)
                if d == pytest.approx(b.last_duration_h * 3600, abs=1e-6)
            ]
            assert b.last_outcome in same, (b, drawn)
            # and its outcome names its end: at a ceiling, or before the harness timeout
            model = workload.model
            ceilings = {
                Outcome.HARNESS_TIMEOUT: model.harness_timeout_h,
                Outcome.OVERALL_TIMEOUT: model.overall_budget_h,
            }
            if b.last_outcome in ceilings:
                assert b.last_duration_h == pytest.approx(ceilings[b.last_outcome])
            else:
                assert b.last_duration_h < model.harness_timeout_h
            if not queued:
                # every execution started at its dispatch, so the latest to end is the group's
                # longest draw
                assert b.last_duration_h * 3600 == pytest.approx(max(drawn.durations_s), abs=1e-6)
    assert "wave: groups, at a ceiling, queued" in format_readiness(bursts).splitlines()[0]


@pytest.mark.parametrize("name", ["ablation-E0", "ablation-E1", "ablation-C2", "smoke"])
def test_only_cells_in_the_training_role_claim_groups(name: str) -> None:
    # A cell returning to rollout at a burst end (eq. 3 failed) takes no micro-step of the
    # next batch: the batch opens only after the scheduler has decided about the core.
    # Before, the core claimed a group and computed a micro-step on its way to rollout.
    preset = get_preset(name)
    run = simulate(preset.sched, preset.cluster, WORKLOADS[preset.workload], steps=6, seed=1, keep_log=True)
    replay = DecisionCore(preset.sched)
    claims = 0
    for entry in run.log:
        if isinstance(entry.input, GroupClaimed):
            claims += 1
            assert CellRole.TRAIN in replay.state().roles, f"claim at t={entry.input.at:.0f} s"
        replay.handle(entry.input)
    assert claims == 6 * preset.sched.batch_groups
