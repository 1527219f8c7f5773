"""A live run's steps as they land: ``gyre run`` learns of each from its ``batch.closed`` event.

``StepFollower`` reads the run's ``batch.closed`` events from where it stopped; when one of the
run's is new, it reads the run's figures from the log (``run_report``) and hands back the steps
it has not handed back before. ``step_line`` is the one line ``gyre run`` prints per step off a
terminal; ``TensorBoardSteps`` writes a step's scalars as it lands, so a run of days has its
curves while it runs, and ``WandbSteps`` logs them to Weights & Biases as they land (online
when W&B is configured, offline otherwise). The report phase writes what the run did not
(``run_outputs.py``).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from gyre_store import EventLog, StepFigures, read_to_head, run_report

METRIC_SINKS = ("tensorboard", "wandb")  # gyre run --metrics: a comma-separated choice, or "none"


def metric_sinks(spec: str) -> frozenset[str]:
    """``--metrics`` as a set: ``"tensorboard,wandb"``, ``"wandb"``, ``"none"`` (empty).
    Raises ValueError naming what is allowed."""
    names = {n.strip() for n in spec.split(",") if n.strip()}
    if names == {"none"} or not names:
        return frozenset()
    unknown = names - set(METRIC_SINKS)
    if unknown:
        raise ValueError(
            f"--metrics: unknown {sorted(unknown)}; use none or any of {', '.join(METRIC_SINKS)}"
        )
    return frozenset(names)


def wandb_mode(environ: dict[str, str] | None = None) -> str:
    """Online when W&B is configured (``WANDB_API_KEY``, or ``WANDB_MODE`` itself), else offline."""
    env = os.environ if environ is None else environ
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    return "online" if env.get("WANDB_API_KEY") else "offline"


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of gyre run ``run_id`` (W&B ids take no ``/ \\ # ? % :``): the same in
    every life of the run, so a continued run logs to the same W&B run."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)[:128]


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


def step_scalars(step: StepFigures) -> dict[str, float]:
    """``step``'s scalars by name (``reward/mean``, ``train/loss``, ...), the figures it has
    only: what TensorBoard writes and W&B logs at step ``step.step``."""
    scalars: dict[str, float | None] = {
        "reward/mean": step.mean_reward,
        "staleness/mean": step.staleness_mean,
        "train/loss": step.loss,
        "train/grad_norm": step.grad_norm,
        "admission/trajectories": step.admitted_trajectories,
        "admission/trainable_tokens": step.trainable_tokens,
        "time/step_s": step.wall_s,
    }
    return {tag: value for tag, value in scalars.items() if value is not None}


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

    def write(self, step: StepFigures) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        for tag, value in step_scalars(step).items():
            self._events.write_event(Event(wall_time=time.time(), step=step.step, summary=scalar(tag, value)))
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


class WandbSteps:
    """Each step's scalars logged to Weights & Biases as it lands (``run.log(..., step=N)``),
    in a W&B run of the gyre run's id under ``run_dir/wandb``: online when W&B is configured
    (``WANDB_API_KEY`` or ``WANDB_MODE``), offline otherwise (``wandb sync`` uploads it later).
    The project is ``WANDB_PROJECT`` (default ``gyre``). A step already logged (by an earlier
    life of the run) is not logged again: W&B keeps a run's steps increasing."""

    def __init__(self, run_dir: Path, run_id: str, config: dict[str, Any]) -> None:
        self.run_dir, self.run_id, self.config = run_dir, run_id, config
        self.written: set[int] = set()
        self.mode = wandb_mode()
        self._run: Any = None
        self._last = -1

    def write(self, step: StepFigures) -> None:
        if step.step <= self._last:
            return
        self._run.log(step_scalars(step), step=step.step)
        self._last = step.step
        self.written.add(step.step)

    def summarize(self, values: dict[str, float | None]) -> None:
        """Figures of the whole run (the report phase's held-out pass rates), in the run's summary."""
        for key, value in values.items():
            if value is not None:
                self._run.summary[key] = value

    def __enter__(self) -> Self:
        import wandb  # the wandb extra

        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "gyre"),
            name=self.run_id,
            id=wandb_run_id(self.run_id),
            resume="allow",
            dir=str(self.run_dir),
            mode=self.mode,  # type: ignore[arg-type]
            config=self.config,
        )
        self._last = int(getattr(self._run, "step", 0) or 0) - 1  # a resumed run's next step
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._run.finish(exit_code=0 if et is None else 1)
