"""The simulated training side: the ready pool, stream packing and micro-step claims.

The packer takes ready groups oldest policy version first, then earliest ready (the
paper's "pulls one ready group ... preferring the oldest policy version", and the live
packer's ``select_oldest``): a group still running holds no ready group back.
With streaming, any training cell claims micro-steps of the open batch as soon as a
group is ready; without it, a batch starts only with all B groups ready, on the cells
training at that moment, and the first batch of a burst waits for the whole burst's
mu B ready groups (the global shuffle that non-streaming training exists for needs them
all). Returns what to schedule; it never touches a clock itself.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from gyre_sched.config import SchedConfig
from gyre_sched.decision import BatchClosed, BatchStarted, GroupClaimed, Input, WeightsPublished
from gyre_sched.sim.cluster import ClusterConfig


@dataclass(frozen=True)
class MicrostepDone:
    """Internal: a cell finished its micro-step."""

    cell: int


@dataclass(frozen=True)
class UpdateDone:
    """Internal: the optimizer update finished."""


@dataclass(frozen=True)
class BroadcastDone:
    """Internal: parameters reached the satellites after a non-final update."""


@dataclass(frozen=True)
class PublishDone:
    """Internal: the rollout engines hold the new weights."""


TrainerEvent = MicrostepDone | UpdateDone | BroadcastDone | PublishDone
SimEvent = Input | TrainerEvent
Scheduled = tuple[float, SimEvent]


class EventQueue:
    """Timed events in time order; events at the same time come out in the order pushed."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, SimEvent]] = []
        self._seq = 0

    def push(self, items: Iterable[Scheduled]) -> None:
        for at, event in items:
            heapq.heappush(self._heap, (at, self._seq, event))
            self._seq += 1

    def pop(self) -> Scheduled:
        at, _, event = heapq.heappop(self._heap)
        return at, event

    def __bool__(self) -> bool:
        return bool(self._heap)


class ReadyPool:
    """Dispatched groups and the ready ones among them, handed out oldest version first."""

    def __init__(self) -> None:
        self._version: dict[int, int] = {}  # dispatched, unclaimed group -> its policy version
        self._ready: list[tuple[int, int, int]] = []  # a heap of (version, ready order, group)
        self._order = 0

    def add_wave(self, first: int, groups: int, version: int) -> None:
        for group in range(first, first + groups):
            self._version[group] = version

    def mark_ready(self, group: int) -> None:
        heapq.heappush(self._ready, (self._version[group], self._order, group))
        self._order += 1

    def eligible(self) -> int:
        """Ready, unclaimed groups."""
        return len(self._ready)

    def batch_ready(self, need: int) -> bool:
        """Whether ``need`` groups are ready and unclaimed."""
        return len(self._ready) >= need

    def claim(self) -> tuple[int, int]:
        """Take the ready group of the oldest version, earliest ready first: (group, version)."""
        version, _, group = heapq.heappop(self._ready)
        del self._version[group]
        return group, version


class Phase(enum.Enum):
    """Where the trainer is in its batch cycle."""

    IDLE = "idle"
    OPEN = "open"
    UPDATING = "updating"
    BETWEEN = "between"  # broadcasting or publishing


@dataclass(frozen=True)
class TrainerView:
    """What the trainer is doing now, for the time account (``gyre_sched.sim.time_use``)."""

    phase: Phase
    publishing: bool  # in BETWEEN: publishing after a burst's last update, else broadcasting
    members: int  # cells holding the training role in the trainer
    busy: int  # cells computing a micro-step
    queue: int  # claimed micro-steps no cell has taken yet
    claimed: int  # groups the open batch has claimed
    step: int  # the open (or last) batch
    batch_started: bool  # non-streaming: the batch has its groups and its cells


class Trainer:
    """Batches of B groups processed by whichever cells hold the training role."""

    def __init__(
        self, sched: SchedConfig, cluster: ClusterConfig, pool: ReadyPool, members: Iterable[int]
    ) -> None:
        self._sched = sched
        self._cluster = cluster
        self._pool = pool
        self._members: set[int] = set(members)
        self._participants: set[int] | None = None
        self._busy: set[int] = set()
        self._warmed: set[int] = set()
        self._queue = 0
        self._claimed = 0
        self.step = -1
        self.phase = Phase.IDLE
        self._microstep_s = cluster.microstep_s()

    def view(self) -> TrainerView:
        """A snapshot of the batch cycle."""
        return TrainerView(
            phase=self.phase,
            publishing=self.phase is Phase.BETWEEN and (self.step + 1) % self._sched.mu == 0,
            members=len(self._members),
            busy=len(self._busy),
            queue=self._queue,
            claimed=self._claimed,
            step=self.step,
            batch_started=self._participants is not None,
        )

    def add_member(self, cell: int, now: float) -> list[Scheduled]:
        self._members.add(cell)
        return self.pump(now)

    def remove_member(self, cell: int) -> None:
        self._members.discard(cell)
        if self._participants is not None:
            self._participants.discard(cell)

    def open_batch(self, now: float) -> list[Scheduled]:
        self.step += 1
        self.phase = Phase.OPEN
        self._claimed, self._queue = 0, 0
        self._participants = None
        self._warmed.clear()
        return [(now, BatchStarted(now, self.step)), *self.pump(now)]

    def pump(self, now: float) -> list[Scheduled]:
        """Claim groups and hand micro-steps to idle cells; schedule the update when done."""
        if self.phase is not Phase.OPEN:
            return []
        out: list[Scheduled] = []
        b, m = self._sched.batch_groups, self._cluster.microsteps_per_group
        if self._cluster.streaming:
            workers = sorted(self._members - self._busy)
            for cell in workers:
                if self._queue == 0 and self._claimed < b and self._pool.eligible() > 0:
                    out.append(self._claim(now))
                    self._queue += m
                if self._queue > 0:
                    out.append(self._work(cell, now))
        else:
            # The rest of the burst must be ready: mu B groups for its first batch.
            need = b * (self._sched.mu - self.step % self._sched.mu)
            if self._participants is None and self._members and self._pool.batch_ready(need):
                out.extend(self._claim(now) for _ in range(b))
                self._queue = b * m
                self._participants = set(self._members)
            for cell in sorted((self._participants or set()) - self._busy):
                if self._queue > 0:
                    out.append(self._work(cell, now))
        if self._claimed == b and self._queue == 0 and not self._busy:
            self.phase = Phase.UPDATING
            out.append((now + self._cluster.update_s, UpdateDone()))
        return out

    def _claim(self, now: float) -> Scheduled:
        group, _ = self._pool.claim()
        self._claimed += 1
        return (now, GroupClaimed(now, group, self.step))

    def _work(self, cell: int, now: float) -> Scheduled:
        self._queue -= 1
        self._busy.add(cell)
        cost = self._microstep_s
        if cell not in self._warmed:  # each cell pays one warmup and drain per batch
            self._warmed.add(cell)
            cost += self._cluster.pipeline_s
        return (now + cost, MicrostepDone(cell))

    def microstep_done(self, cell: int, now: float) -> list[Scheduled]:
        self._busy.discard(cell)
        return self.pump(now)

    def update_done(self, now: float) -> list[Scheduled]:
        """The batch closes; a burst end publishes, otherwise satellites get parameters."""
        self.phase = Phase.BETWEEN
        closed: Scheduled = (now, BatchClosed(now, self.step))
        if (self.step + 1) % self._sched.mu == 0:
            return [closed, (now + self._cluster.publish_s, PublishDone())]
        return [closed, (now + self._cluster.broadcast_s, BroadcastDone())]

    def publish_done(self, now: float) -> list[Scheduled]:
        """The rollout engines hold the new policy. The next batch opens only after the
        scheduler has decided about the core (the simulator calls ``open_batch`` once the
        decision core has seen ``WeightsPublished``): a core returning to rollout takes no
        micro-step of the next batch on its way out."""
        return [(now, WeightsPublished(now, self.step + 1))]

    def broadcast_done(self, now: float) -> list[Scheduled]:
        return self.open_batch(now)
