"""``gyre run``'s steps as they land: the line printed per step off a terminal, the follower
that finds each step once from its ``batch.closed``, and its TensorBoard scalars written (and
readable) before the run ends."""

from __future__ import annotations

import struct
from pathlib import Path

from tensorboardX.proto.event_pb2 import Event as TbEvent

from gyre_store import (
    BatchClosed,
    ExecutionDispatched,
    GroupConsumed,
    GroupDispatched,
    InMemoryEventLog,
    NewEvent,
    RewardAssigned,
    RunStarted,
    StepFigures,
    TrainingUpdate,
    run_report,
)
from gyre_store.log import EventLog
from gyre_tools.run_config import DEMO
from gyre_tools.run_outputs import write_outputs
from gyre_tools.run_steps import StepFollower, TensorBoardSteps, step_line

RUN = "run-1"


def figures(**changes: object) -> StepFigures:
    fields: dict[str, object] = {
        "step": 3, "policy_version": 4, "mean_reward": 0.41666, "groups": 2, "executions": 4,
        "admitted_trajectories": 5, "trainable_tokens": 900, "loss": 0.25, "grad_norm": 1.5,
        "wall_s": 12.34, "staleness_mean": 0.5,
    }  # fmt: skip
    fields.update(changes)
    return StepFigures(**fields)  # type: ignore[arg-type]


def test_a_step_is_one_line() -> None:
    assert step_line(figures()) == "step 3  reward 0.417  staleness 0.50  12.3 s"
    empty = figures(step=0, mean_reward=None, staleness_mean=None, wall_s=None)
    assert step_line(empty) == "step 0  reward -  staleness -  - s"


def close_step(log: EventLog, step: int, rewards: list[float], dispatched_at: int) -> None:
    """One step of run RUN as its writers record it: a group of len(rewards) executions
    dispatched under version ``dispatched_at``, scored, consumed by ``step``, the update, the close."""
    group = f"{RUN}/g{step}"
    events: list[object] = [
        GroupDispatched(
            group_id=group, run_id=RUN, query_id=f"q{step}", size=len(rewards), policy_version=dispatched_at
        )
    ]
    for i, reward in enumerate(rewards):
        execution = f"{group}/e{i}"
        events.append(
            ExecutionDispatched(
                execution_id=execution, run_id=RUN, group_id=group, policy_version=dispatched_at
            )
        )
        events.append(RewardAssigned(execution_id=execution, run_id=RUN, evaluation_id=f"ev-{execution}", reward=reward, artifact_version="a1"))  # fmt: skip
    events.append(GroupConsumed(group_id=group, run_id=RUN, step=step, trajectories=2, target_tokens=40))
    log.append([NewEvent(e) for e in events])  # type: ignore[arg-type]
    update = TrainingUpdate(run_id=RUN, batch=step, policy_version=step + 1, cells=[0], micro_steps=1, loss=0.5, grad_norm=2.0, final=True)  # fmt: skip
    log.append([NewEvent(update), NewEvent(BatchClosed(run_id=RUN, step=step))])


def scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar in the event files under ``folder``: tag -> step -> value (TFRecord frames:
    length, its CRC, the Event, its CRC)."""
    out: dict[str, dict[int, float]] = {}
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = TbEvent.FromString(data[at + 12 : at + 12 + length])
            at += 12 + length + 4
            for value in event.summary.value:
                out.setdefault(value.tag, {})[event.step] = value.simple_value
    return out


def test_each_step_is_found_once_and_written_as_it_lands(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    started = RunStarted(
        run_id=RUN, harness="h", model="m", group_size=2, batch_groups=1, cells=1, cell_capacity=2
    )
    log.append([NewEvent(started)])
    follower = StepFollower(log, RUN, phi=0.5, mu=1)
    assert follower.poll() == []
    with TensorBoardSteps(tmp_path / "tb") as board:
        close_step(log, 0, [1.0, 0.0], dispatched_at=0)
        (step,) = follower.poll()
        assert (step.step, step.mean_reward, step.staleness_mean) == (0, 0.5, 0.0)
        board.write(step)
        # Readable while the writer is still open: the run has not ended.
        assert scalars(tmp_path / "tb")["reward/mean"] == {0: 0.5}
        assert follower.poll() == []  # nothing new closed
        close_step(log, 1, [1.0, 1.0], dispatched_at=0)
        (step,) = follower.poll()
        assert (step.step, step.mean_reward, step.staleness_mean) == (1, 1.0, 1.0)
        board.write(step)
        assert step_line(step).startswith("step 1  reward 1.000  staleness 1.00  ")
        written = scalars(tmp_path / "tb")
        assert written["reward/mean"] == {0: 0.5, 1: 1.0}
        assert written["staleness/mean"] == {0: 0.0, 1: 1.0}
        assert written["train/loss"] == {0: 0.5, 1: 0.5}
        assert written["admission/trajectories"] == {0: 2.0, 1: 2.0}
        assert board.written == {0, 1}


def test_another_runs_steps_are_not_this_runs(tmp_path: Path) -> None:
    log = InMemoryEventLog()
    follower = StepFollower(log, "another-run", phi=0.5, mu=1)
    close_step(log, 0, [1.0], dispatched_at=0)
    assert follower.poll() == []


def test_the_report_phase_writes_only_the_steps_not_written_live(tmp_path: Path) -> None:
    reward = 0.25
    log = InMemoryEventLog()
    started = RunStarted(
        run_id=RUN, harness="h", model="m", group_size=1, batch_groups=1, cells=1, cell_capacity=1
    )
    log.append([NewEvent(started)])
    close_step(log, 0, [reward], dispatched_at=0)
    close_step(log, 1, [reward], dispatched_at=1)
    report = run_report(log, RUN, phi=0.5, mu=1)
    write_outputs(report, DEMO, tmp_path, tensorboard=True, written=frozenset({0}))
    assert scalars(tmp_path / "tensorboard")["reward/mean"] == {1: reward}
