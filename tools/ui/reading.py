"""What the web view shows, read from the store as of one log position.

Every page is a function of (log, position): ``LogAt`` is the log cut at that position, so a
page at ``?at=N`` is what the same page showed when the head was N. Run figures come from
``run_report`` and ``cell_time`` (the code that writes a run's JSON report); an execution's
tree is folded from its own ``calls`` stream up to the position with the tree projection's
own code, and its lifecycle, evaluations, rewards and judge calls are its streams. Admitted
trajectories are admission replayed with the run's recorded seed and J_max (as ``gyre export``
does), shown only for an execution whose group a training step consumed. Nothing here writes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from gyre_store import (
    AppendResult,
    BatchClosed,
    CellTimeReport,
    ConfigError,
    EventLog,
    EventRegistry,
    ExecutionDispatched,
    ExecutionFinished,
    GroupConsumed,
    GroupDispatched,
    InMemoryProjectionStore,
    ModelCallRecorded,
    NewEvent,
    NoTrajectoryTree,
    PlaceholderInserted,
    ProjectionStore,
    RecordedEvent,
    RewardAssigned,
    RunReport,
    RunStarted,
    StreamId,
    TreeProjection,
    TreeView,
    catch_up,
    cell_time,
    iterate,
    run_report,
)


class ReadOnlyLog(ConfigError):
    """The web view reads the log as of a position and never appends to it."""


class LogAt:
    """``log`` as it stood when its head was ``at``: reads stop there, nothing is appended."""

    def __init__(self, log: EventLog, at: int, *, live: bool = False) -> None:
        self.log = log
        self.at = at
        self.live = live  # the head when the page was asked for, not a position asked for

    @property
    def registry(self) -> EventRegistry:
        return self.log.registry

    def append(self, events: Sequence[NewEvent]) -> list[AppendResult]:
        raise ReadOnlyLog(ReadOnlyLog.__doc__)

    def read(
        self,
        after: int = 0,
        *,
        limit: int = 1000,
        until: int | None = None,
        types: Collection[str] | None = None,
    ) -> list[RecordedEvent]:
        end = self.at if until is None else min(until, self.at)
        if after >= end:
            return []
        return self.log.read(after, limit=limit, until=end, types=types)

    def read_stream(self, stream: StreamId, *, after_version: int = 0) -> list[RecordedEvent]:
        return [r for r in self.log.read_stream(stream, after_version=after_version) if r.position <= self.at]

    def head(self) -> int:
        return self.at

    def wait(self, after: int, timeout: float) -> bool:
        return False  # a past position never moves


def at_position(log: EventLog, at: int | None) -> LogAt:
    """The log as of ``at`` (the head now when None); a position past the head is the head."""
    head = log.head()
    if at is not None and at < 0:
        raise ConfigError(f"?at={at}: a log position is 0 or more")
    return LogAt(log, head if at is None else min(at, head), live=at is None)


# -- the runs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRow:
    started: RunStarted
    position: int
    recorded_at: datetime
    steps: int


def runs(log: LogAt) -> list[RunRow]:
    """Every run the log names with a ``run.started`` (side runs are their run's), newest first."""
    closed: dict[str, int] = defaultdict(int)
    for r in iterate(log, types=["batch.closed"]):
        if isinstance(r.event, BatchClosed):
            closed[r.event.run_id] += 1
    out = [
        RunRow(r.event, r.position, r.recorded_at, closed[r.event.run_id])
        for r in iterate(log, types=["run.started"])
        if isinstance(r.event, RunStarted)
    ]
    return sorted(out, key=lambda row: row.position, reverse=True)


def run_started(log: LogAt, run_id: str) -> RecordedEvent | None:
    return next(
        (r for r in log.read_stream(StreamId("run", run_id)) if isinstance(r.event, RunStarted)), None
    )


# -- one run ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunPage:
    run_id: str
    started: RunStarted | None
    started_at: datetime | None
    report: RunReport
    cells: CellTimeReport
    waterlevel: list[tuple[float, int]]  # (seconds since the run started, w = d - f) at each change


def run_page(log: LogAt, run_id: str) -> RunPage:
    """The run's figures as its JSON report computes them, and its waterlevel over time.

    Raises UnknownRun when the log (up to the position) has no ``run.started`` for it."""
    first = run_started(log, run_id)
    if first is None:
        raise UnknownRun(f"{run_id!r} (as of log position {log.at})")
    assert isinstance(first.event, RunStarted)
    started = first.event
    report = run_report(log, run_id, phi=started.phi, mu=started.mu)
    return RunPage(
        run_id=run_id,
        started=started,
        started_at=first.recorded_at,
        report=report,
        cells=cell_time(log, run_id),
        waterlevel=waterlevel(log, run_id, first.recorded_at),
    )


class UnknownRun(ConfigError):
    """No run of that id in the log."""


class UnknownStep(ConfigError):
    """The run has no closed step of that number."""


def waterlevel(log: LogAt, run_id: str, since: datetime) -> list[tuple[float, int]]:
    """``w = d - f`` of the run after each dispatch and finish (the controller's counters)."""
    w, out = 0, [(0.0, 0)]
    for r in iterate(log, types=["execution.dispatched", "execution.finished"]):
        if getattr(r.event, "run_id", None) != run_id:
            continue
        w += 1 if isinstance(r.event, ExecutionDispatched) else -1
        out.append((max(0.0, (r.recorded_at - since).total_seconds()), w))
    return out


# -- one step -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reward:
    """An execution's reward and the evaluation it came from (None: excluded or not yet)."""

    value: float | None
    evaluation_id: str | None
    kind: str  # "reward", "placeholder", "excluded" or "pending"


@dataclass(frozen=True, slots=True)
class StepGroup:
    consumed: GroupConsumed
    dispatched_version: int | None
    executions: list[tuple[str, Reward]]


@dataclass(frozen=True, slots=True)
class StepPage:
    run_id: str
    step: int
    groups: list[StepGroup]


def reward_of(log: LogAt, execution_id: str) -> Reward:
    """The last reward fact of ``execution_id``'s evaluation stream (the one training used)."""
    out = Reward(None, None, "pending")
    for r in log.read_stream(StreamId("evaluation", execution_id)):
        match r.event:
            case RewardAssigned(reward=reward, evaluation_id=eid):
                out = Reward(float(reward), eid, "reward")
            case PlaceholderInserted(evaluation_id=eid):
                out = Reward(0.0, eid, "placeholder")
            case _ if r.event_type == "reward.excluded":
                out = Reward(None, None, "excluded")
            case _:
                pass
    return out


def step_page(log: LogAt, run_id: str, step: int) -> StepPage:
    """The groups step ``step`` consumed, their executions and the reward of each."""
    if not any(
        isinstance(r.event, BatchClosed) and r.event.run_id == run_id and r.event.step == step
        for r in iterate(log, types=["batch.closed"])
    ):
        raise UnknownStep(f"{run_id!r} has no closed step {step} (as of log position {log.at})")
    groups = []
    for r in iterate(log, types=["group.consumed"]):
        g = r.event
        if not (isinstance(g, GroupConsumed) and g.run_id == run_id and g.step == step):
            continue
        stream = log.read_stream(StreamId("group", g.group_id))
        version = next((e.event.policy_version for e in stream if isinstance(e.event, GroupDispatched)), None)
        members = group_members(log, run_id, g.group_id)
        groups.append(StepGroup(g, version, [(e, reward_of(log, e)) for e in members]))
    return StepPage(run_id, step, groups)


def group_members(log: LogAt, run_id: str, group_id: str) -> list[str]:
    return [
        r.event.execution_id
        for r in iterate(log, types=["execution.dispatched"])
        if isinstance(r.event, ExecutionDispatched)
        and r.event.group_id == group_id
        and r.event.run_id == run_id
    ]


# -- one execution ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExecutionPage:
    execution_id: str
    run_id: str | None
    group_id: str | None
    lifecycle: list[RecordedEvent]
    evaluation: list[RecordedEvent]  # the evaluation stream: requested, recorded, failed, rewards
    artifacts: list[RecordedEvent]
    judge_calls: list[RecordedEvent]
    reward: Reward
    consumed: GroupConsumed | None  # the step that trained on the execution's group
    tree: TreeView | None
    finished: ExecutionFinished | None = None


def tree_at(log: LogAt, execution_id: str, projected: ProjectionStore | None = None) -> TreeView | None:
    """The execution's trajectory tree as of the position (None: no model call recorded yet).

    At the head (a page asked for without ``?at=``), with ``projected`` (the tree projection's
    store), the projection caught up and read as ``gyre trees show`` reads it. Otherwise the
    execution's records up to the position are folded by the tree projection's own ``fold``, in log
    order, into a store of their own: slower (each record's fold is work the projection did once),
    but the tree exactly as it stood there, whatever the projection has applied since."""
    if projected is not None and log.live:
        catch_up(log, projected, TreeProjection())
        try:
            return TreeView.load(projected, execution_id)
        except NoTrajectoryTree:
            return None
    events = log.read_stream(StreamId("calls", execution_id))
    if not events:
        return None
    projection = TreeProjection()
    store = InMemoryProjectionStore({t.name: t for t in projection.tables}, log)
    with store.transaction() as rows:
        projection.fold(rows, events)
    return TreeView.load(store, execution_id)


def model_call(log: LogAt, execution_id: str, request_id: str) -> ModelCallRecorded | None:
    """The ``model_call.recorded`` event of one request, as of the position."""
    return next(
        (
            r.event
            for r in log.read_stream(StreamId("calls", execution_id))
            if isinstance(r.event, ModelCallRecorded) and r.event.request_id == request_id
        ),
        None,
    )


def execution_page(log: LogAt, execution_id: str, projected: ProjectionStore | None = None) -> ExecutionPage:
    """Everything the store holds about one execution as of the position (``projected``: see
    ``tree_at``)."""
    lifecycle = log.read_stream(StreamId("execution", execution_id))
    tree = tree_at(log, execution_id, projected)
    dispatched = next((r.event for r in lifecycle if isinstance(r.event, ExecutionDispatched)), None)
    run_id = (
        dispatched.run_id if dispatched else next((getattr(r.event, "run_id", None) for r in lifecycle), None)
    )
    group_id = dispatched.group_id if dispatched else None
    consumed = None
    if group_id is not None:
        consumed = next(
            (
                r.event
                for r in log.read_stream(StreamId("group", group_id))
                if isinstance(r.event, GroupConsumed)
            ),
            None,
        )
    return ExecutionPage(
        execution_id=execution_id,
        run_id=run_id,
        group_id=group_id,
        lifecycle=lifecycle,
        evaluation=log.read_stream(StreamId("evaluation", execution_id)),
        artifacts=log.read_stream(StreamId("artifact", execution_id)),
        judge_calls=log.read_stream(StreamId("judge", execution_id)),
        reward=reward_of(log, execution_id),
        consumed=consumed,
        tree=tree,
        finished=next((r.event for r in lifecycle if isinstance(r.event, ExecutionFinished)), None),
    )
