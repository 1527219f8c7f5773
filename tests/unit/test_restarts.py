"""A process that dies at every start is given up on; one that made progress is started again."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre_store import InMemoryEventLog
from gyre_tools.restarts import GAVE_UP, RestartPolicy
from gyre_tools.run import LiveRun, RunFailed
from gyre_tools.run_config import RunConfig


def test_a_failure_every_start_repeats_is_given_up_on_even_when_starts_take_long() -> None:
    # Each start runs 20 s before it dies: five restarts span minutes, never one minute.
    policy = RestartPolicy(max_in_a_row=5, healthy_s=120.0)
    pauses = [policy.died(lived_s=20.0) for _ in range(5)]
    assert pauses == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert policy.died(lived_s=20.0) is None


def test_a_process_that_ran_long_enough_starts_the_count_afresh() -> None:
    policy = RestartPolicy(max_in_a_row=2, healthy_s=60.0)
    assert policy.died(lived_s=5.0) == 1.0
    assert policy.died(lived_s=5.0) == 2.0
    assert policy.died(lived_s=600.0) == 1.0  # it made progress: a new fault, not the same one
    assert policy.died(lived_s=5.0) == 2.0
    assert policy.died(lived_s=5.0) is None


def test_pauses_are_capped() -> None:
    policy = RestartPolicy(max_in_a_row=20, max_pause_s=30.0)
    assert max(p for p in (policy.died(1.0) for _ in range(20)) if p is not None) == 30.0


class _DyingWorld:
    """A node's trainer world whose core dies at once, every time it is started."""

    starts = 0

    def __enter__(self) -> _DyingWorld:
        _DyingWorld.starts += 1
        self.failed = ["cell-0 (exit 3)"]
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def step(self) -> None:
        pass


def test_a_trainer_world_whose_core_dies_at_every_start_is_given_up_on() -> None:
    from gyre_tools.serve import Trainers

    _DyingWorld.starts = 0
    trainers = Trainers(
        make=_DyingWorld,  # type: ignore[arg-type]
        policy=RestartPolicy(max_in_a_row=3, max_pause_s=0.0),
    )
    for _ in range(20):
        trainers.step()
        if trainers.gave_up:
            break
    assert trainers.gave_up  # before the fix it restarted the world for as long as it ran
    assert _DyingWorld.starts == 1 + 3  # the first start, then three restarts


class _Exited:
    """A child process of ``gyre run`` that has ended with ``code``."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int:
        return self.code


def _live_run(tmp_path: Path, code: int) -> LiveRun:
    run = LiveRun(log=InMemoryEventLog(), requested=RunConfig(), data_dir=tmp_path, run_id_arg=None)
    run.config = msgspec.structs.replace(RunConfig(), run_dir=str(tmp_path))
    run.children = {"node-0": _Exited(code)}  # type: ignore[dict-item]
    return run


def test_gyre_run_ends_at_once_when_a_node_agent_gave_up(tmp_path: Path) -> None:
    run = _live_run(tmp_path, GAVE_UP)
    with pytest.raises(RunFailed, match="gave up"):
        run._check_children()


def test_any_other_exit_is_started_again_after_its_pause(tmp_path: Path) -> None:
    run = _live_run(tmp_path, 1)
    run._check_children()  # the first death in a row: started again after 1 s, not now
    assert run.failed is None and "node-0" in run._due
