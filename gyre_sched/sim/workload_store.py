"""A workload model from a run's stored executions, for simulating with measured durations.

An execution's duration is the time between the ``recorded_at`` of its first
ExecutionStarted and of its ExecutionFinished; its outcome is the FinishReason.
Executions are grouped by their rollout group when the dispatch is stored, so a
simulated group draws from one real query's executions. Unfinished executions, and
those whose start was never recorded, are left out.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from gyre_sched.decision import Outcome
from gyre_sched.exceptions import WorkloadError
from gyre_sched.sim.workload import EmpiricalWorkload, GroupSample
from gyre_store import catalog, iterate
from gyre_store.log import EventLog

_TYPES = ("execution.dispatched", "execution.started", "execution.finished")


def workload_from_run(log: EventLog, run_id: str, *, label: str | None = None) -> EmpiricalWorkload:
    """An EmpiricalWorkload of ``run_id``'s finished executions.

    Raises WorkloadError when the run has no execution with both a start and a finish
    (and a positive duration) in ``log``.
    """
    group_of: dict[str, str] = {}
    started: dict[str, datetime] = {}
    finished: list[tuple[str, datetime, Outcome]] = []
    for recorded in iterate(log, types=_TYPES):
        ev = recorded.event
        if getattr(ev, "run_id", None) != run_id:
            continue
        if isinstance(ev, catalog.ExecutionDispatched):
            group_of[ev.execution_id] = ev.group_id
        elif isinstance(ev, catalog.ExecutionStarted):
            started.setdefault(ev.execution_id, recorded.recorded_at)  # a reroute is no new start
        elif isinstance(ev, catalog.ExecutionFinished):
            finished.append((ev.execution_id, recorded.recorded_at, Outcome(ev.reason.value)))
    groups: dict[str, list[tuple[float, Outcome]]] = defaultdict(list)
    by_query = True
    for execution, end, outcome in finished:
        start = started.get(execution)
        if start is None:
            continue
        seconds = (end - start).total_seconds()
        if seconds <= 0:
            continue
        group = group_of.get(execution)
        by_query = by_query and group is not None
        groups[group or ""].append((seconds, outcome))
    if not groups:
        raise WorkloadError(
            f"run {run_id!r} has no execution with a recorded start and finish to build a workload from"
        )
    if not by_query:  # some executions have no group: resample them all singly
        groups = {"": [item for items in groups.values() for item in items]}
    samples = tuple(
        GroupSample(tuple(d for d, _ in items), tuple(o for _, o in items))
        for _, items in sorted(groups.items())
    )
    return EmpiricalWorkload(label=label or f"run:{run_id}", groups=samples, by_query=by_query)
