"""Cells in threads of one process: the real core and satellite loops on the in-memory queue and
board, with fake replicas whose gradients are counts of micro-step indices.

`FakeCollective` stands in for torch.distributed: a reduction completes once every member of the
plan's prefix is in, and fails for all of them when a member dies inside it (gloo's "connection
closed by peer"). A fake replica dies by raising `CellKilled` at a chosen point; its thread ends
without cleanup, so its claims stay pending, and the run is shown at once what it would show a
claim timeout later (`InMemoryClaims.expire`): its heartbeat out, its claims idle. The timeout
itself is longer than a test, so a live cell slowed down by a loaded machine never looks dead.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np

from gyre_store import InMemoryEventLog, iterate
from gyre_store.log import Event
from gyre_train.backends import ModelSpec
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    Cell,
    ExecutionTotals,
    InMemoryClaims,
    QueueConfig,
    RatioShare,
    WeightPublisher,
    cell_configs,
    enqueue_batch,
    run_core,
    run_satellite,
)
from gyre_train.cells.membership import CORE, ReducePlan
from gyre_train.objective import ExecutionClip
from gyre_train.trajectories import MicroStep

WAIT_S = 20.0  # how long a fake collective (and a cell) waits before the test fails
# No live cell goes this long without renewing, however loaded the machine; a dead one is expired
# when it dies instead of waited out.
CLAIM_TIMEOUT_S = 600.0
Batch = tuple[list[MicroStep], tuple[ExecutionTotals, ...]]
E = TypeVar("E", bound=Event)


class CellKilled(Exception):
    """The fake cell died here."""


class FakeCollective:
    """The reductions, broadcasts and snapshot of one run's fake replicas."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._parts: dict[tuple[int, int], dict[int, tuple[Counter[int], float]]] = {}
        self._failed: set[tuple[int, int]] = set()
        self._broadcasts: dict[tuple[int, int], int] = {}
        self.exposed: int | None = None
        self.updates: list[Counter[int]] = []  # the reduced gradient of each update, in order

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        if not self._cond.wait_for(ready, timeout=WAIT_S):
            raise AssertionError(f"the fake collective waited {WAIT_S} s for {what}")

    def reduce(
        self, plan: ReducePlan, cell: int, gradients: Counter[int], loss: float
    ) -> tuple[Counter[int], float] | None:
        key = (plan.batch, plan.attempt)
        with self._cond:
            parts = self._parts.setdefault(key, {})
            parts[cell] = (Counter(gradients), loss)
            self._cond.notify_all()
            self._wait(f"reduction {key}", lambda: key in self._failed or set(parts) >= set(plan.cells))
            if key in self._failed:
                return None
            total: Counter[int] = Counter()
            for counts, _ in parts.values():
                total.update(counts)
            return total, sum(share for _, share in parts.values())

    def fail(self, plan: ReducePlan) -> None:
        with self._cond:
            self._failed.add((plan.batch, plan.attempt))
            self._cond.notify_all()

    def expose(self, version: int) -> None:
        with self._cond:
            self.exposed = version
            self._cond.notify_all()

    def snapshot(self, version: int) -> None:
        with self._cond:
            self._wait(f"snapshot {version}", lambda: self.exposed == version)

    def broadcast(self, plan: ReducePlan, cell: int, version: int) -> int:
        key = (plan.batch, plan.attempt)
        with self._cond:
            if cell == CORE:
                self._broadcasts[key] = version
                self._cond.notify_all()
            self._wait(f"broadcast {key}", lambda: key in self._broadcasts)
            return self._broadcasts[key]


@dataclass
class FakeReplica:
    """A `CellReplica`: `gradients` counts the micro-steps accumulated since the last zeroing.

    `holds` is the policy version of its weights; `computed` records (batch, holds) of every
    gradient. It dies at its `dies_at_gradient`-th gradient, or inside its first reduction.
    """

    cell: int
    collective: FakeCollective
    dies_at_gradient: int | None = None
    dies_in_reduce: bool = False
    holds: int = 0
    gradients: Counter[int] = field(default_factory=Counter)
    computed: list[tuple[int, int]] = field(default_factory=list)
    reductions: list[int] = field(default_factory=list)  # the attempts it took part in
    pulls: list[int] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    _reduced: Counter[int] | None = None

    def ratio(self, step: MicroStep) -> RatioShare:
        # Logprobs equal to the behaviour's: every log rho is 0, so nothing is clipped.
        counts = np.bincount(step.slots[step.target_mask], minlength=len(step.execution_ids))
        return RatioShare(step.index, list(step.execution_ids), [0.0] * len(counts), counts.tolist())

    def gradient(self, step: MicroStep, clip: ExecutionClip) -> float:
        if self.dies_at_gradient is not None and len(self.computed) + 1 >= self.dies_at_gradient:
            raise CellKilled(f"cell {self.cell} at its gradient {self.dies_at_gradient}")
        self.gradients[step.index] += 1
        self.computed.append((step.batch, self.holds))
        return 1.0

    def zero_gradients(self) -> None:
        self.gradients.clear()

    def reduce(self, plan: ReducePlan, loss: float) -> float | None:
        self.reductions.append(plan.attempt)
        if self.dies_in_reduce:
            self.collective.fail(plan)
            raise CellKilled(f"cell {self.cell} inside the reduction of plan {plan.attempt}")
        result = self.collective.reduce(plan, self.cell, self.gradients, loss)
        if result is None:
            return None
        self._reduced = result[0]
        return result[1]

    def update(self) -> float:
        assert self._reduced is not None
        self.collective.updates.append(self._reduced)
        self._reduced = None
        self.holds += 1
        return 0.5

    def expose(self, policy_version: int) -> None:
        assert policy_version == self.holds
        self.collective.expose(policy_version)

    def broadcast(self, plan: ReducePlan) -> None:
        self.holds = self.collective.broadcast(plan, self.cell, self.holds)

    def serve(self) -> None:
        pass

    def pull(self, policy_version: int, timeout_s: float) -> None:
        self.collective.snapshot(policy_version)
        self.pulls.append(policy_version)
        self.holds = policy_version

    def save(self, directory: Path, policy_version: int) -> None:
        raise AssertionError("fake cells have no output directory")

    def save_gradient(self, directory: Path, policy_version: int) -> None:
        raise AssertionError("fake cells have no output directory")

    def publish(self, publisher: WeightPublisher, policy_version: int) -> None:
        self.published.append(policy_version)


class NoEngines:
    """A `WeightPublisher` that sends nothing (the fake replica records what it publishes)."""

    def publish(self, model: object, policy_version: int) -> None:
        raise AssertionError("fake replicas publish themselves")


@dataclass
class CellRun:
    """What a run of fake cells leaves behind."""

    claims: InMemoryClaims
    collective: FakeCollective
    replicas: dict[int, FakeReplica]
    log: InMemoryEventLog
    killed: set[int]

    def events(self, kind: type[E]) -> list[E]:
        return [e.event for e in iterate(self.log) if isinstance(e.event, kind)]


def _wait_for_first_claim_joins(claims: InMemoryClaims, bursts: Sequence[BurstPlan], batch: int) -> None:
    """Block until every satellite that joins `batch` before its first claim is a member."""
    joining = {
        cell
        for burst in bursts
        for cell, (position, claims_before) in burst.joins.items()
        if claims_before == 0 and position < len(burst.batches) and burst.batches[position] == batch
    }
    deadline = time.monotonic() + WAIT_S
    while not joining <= claims.board.members(batch):
        assert time.monotonic() < deadline, (
            f"cells {sorted(joining - claims.board.members(batch))} never joined"
        )
        time.sleep(0.001)


def train_in_threads(
    batches: Sequence[Batch],
    bursts: Sequence[BurstPlan],
    *,
    cells: int,
    dies_at_gradient: Mapping[int, int] | None = None,
    dies_in_reduce: Collection[int] = (),
    step_delays: Mapping[int, float] | None = None,
    feed_delay_s: float = 0.0,
) -> CellRun:
    """Run K cells (cell 0 the core) as threads over `bursts` while feeding `batches` in order.

    Cell c dies at its `dies_at_gradient[c]`-th gradient or, if in `dies_in_reduce`, inside its
    first reduction; `step_delays[c]` slows its gradients. Fails the test on any error other than
    a planned death, or when a cell does not finish. A batch that satellites join at its first
    claim is fed once they are in, so they cannot miss its join window.
    """
    claims = InMemoryClaims(QueueConfig("fake", claim_timeout_s=CLAIM_TIMEOUT_S, poll_s=0.002))
    collective = FakeCollective()
    log = InMemoryEventLog()
    configs = cell_configs(
        cells=cells, redis_url="memory://", port=0, model=ModelSpec(TINY_QWEN3), queue=claims.config,
        wait_timeout_s=WAIT_S,
    )  # fmt: skip
    replicas = {
        c.cell: FakeReplica(
            c.cell, collective, (dies_at_gradient or {}).get(c.cell), c.cell in dies_in_reduce
        )
        for c in configs
    }
    killed: set[int] = set()
    errors: list[BaseException] = []

    def run(index: int) -> None:
        config = configs[index]
        delay = (step_delays or {}).get(config.cell, 0.0)
        config = dataclasses.replace(config, step_delay_s=delay)
        cell = Cell(config, log, claims.queue, claims.board, replicas[config.cell])
        try:
            if config.cell == CORE:
                run_core(cell, tuple(bursts), NoEngines())
            else:
                run_satellite(cell, tuple(bursts))
        except CellKilled:
            killed.add(config.cell)
            claims.expire(config.cell)
        except BaseException as exc:  # re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), name=f"fake-cell-{i}") for i in range(cells)]
    for thread in threads:
        thread.start()
    for batch, (steps, executions) in enumerate(batches):
        _wait_for_first_claim_joins(claims, bursts, batch)
        enqueue_batch(claims.queue(batch), steps, executions, feed_delay_s)
    for thread in threads:
        thread.join(timeout=2 * WAIT_S)
    assert not [t.name for t in threads if t.is_alive()], "a fake cell did not finish"
    if errors:
        raise errors[0]
    return CellRun(claims, collective, replicas, log, killed)
