"""A live run's steps as they land: ``gyre run`` learns of each from its ``batch.closed`` event.

``StepFollower`` reads the run's ``batch.closed`` events from where it stopped; when one of the
run's is new, it reads the run's figures from the log (``run_report``) and hands back the steps
it has not handed back before. ``step_line`` is the one line ``gyre run`` prints per step off a
terminal; ``TensorBoardSteps`` writes a step's scalars as it lands, so a run of days has its
curves while it runs. The report phase writes what the run did not (``run_outputs.py``).
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gyre_store import EventLog, StepFigures, read_to_head, run_report


class StepFollower:
    """The steps of run ``run_id`` as their ``batch.closed`` events land, each once."""

    def __init__(self, log: EventLog, run_id: str, *, phi: float, mu: int) -> None:
        self.log, self.run_id, self.phi, self.mu = log, run_id, phi, mu
        self.after = 0  # the log position read up to
        self.seen: set[int] = set()

    def poll(self) -> list[StepFigures]:
        """The steps closed since the last call, in step order (none: no new ``batch.closed``)."""
        closed, self.after = read_to_head(self.log, self.after, types=["batch.closed"])
        if not any(getattr(r.event, "run_id", None) == self.run_id for r in closed):
            return []
        # A step's figures are final at its batch.closed: the groups it consumed were recorded
        # before it, and its update in the same append.
        report = run_report(self.log, self.run_id, phi=self.phi, mu=self.mu)
        new = [s for s in report.steps if s.step not in self.seen]
        self.seen.update(s.step for s in new)
        return new


def step_line(step: StepFigures) -> str:
    """``step 3  reward 0.417  staleness 0.50  12.3 s``: what a step was, in one line (a dash
    for a figure the log does not have)."""
    reward = "-" if step.mean_reward is None else f"{step.mean_reward:.3f}"
    stale = "-" if step.staleness_mean is None else f"{step.staleness_mean:.2f}"
    wall = "-" if step.wall_s is None else f"{step.wall_s:.1f}"
    return f"step {step.step}  reward {reward}  staleness {stale}  {wall} s"


def step_scalars(writer: Any, step: StepFigures) -> None:
    """Write ``step``'s scalars (the figures it has) with ``writer.add_scalar(tag, value, step)``:
    a tensorboardX ``SummaryWriter``, or ``TensorBoardSteps``."""
    scalars = {
        "reward/mean": step.mean_reward,
        "staleness/mean": step.staleness_mean,
        "train/loss": step.loss,
        "train/grad_norm": step.grad_norm,
        "admission/trajectories": step.admitted_trajectories,
        "admission/trainable_tokens": step.trainable_tokens,
        "time/step_s": step.wall_s,
    }
    for tag, value in scalars.items():
        if value is not None:
            writer.add_scalar(tag, value, step.step)


class TensorBoardSteps:
    """Each step's scalars written to an event file in ``folder`` as it lands.

    Written synchronously, each step flushed before ``write`` returns: tensorboardX's
    ``SummaryWriter`` hands events to a thread and its ``flush`` does not wait for them, so a
    step could sit unwritten for up to its ``flush_secs``. The file's name ends in ``.live``,
    apart from the one the report phase writes into the same folder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.written: set[int] = set()
        self._events: Any = None

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        self._events.write_event(Event(wall_time=time.time(), step=step, summary=scalar(tag, value)))

    def write(self, step: StepFigures) -> None:
        step_scalars(self, step)
        self._events.flush()
        self.written.add(step.step)

    def __enter__(self) -> Self:
        from tensorboardX.event_file_writer import EventsWriter  # the train extra

        self.folder.mkdir(parents=True, exist_ok=True)
        self._events = EventsWriter(str(self.folder / "events"), ".live")
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._events.close()
