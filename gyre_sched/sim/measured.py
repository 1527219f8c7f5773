"""The simulator fed a live run's own measurements, to compare its prediction with the run.

``measured_cluster`` turns a run's log into the simulator's time costs: the training work per
group is the run's forward and forward-backward seconds (``train.computed``) over the groups
it consumed, in micro-steps as the run packed them; the update is the mean time from a batch's
last computation to its ``train.update``. The live core records a final update together with
its ``policy.published``, once the engines have loaded the policy, so that time includes the
publication, and the simulator's separate publication and broadcast costs are zero (as is its
pipeline warm-up, part of each micro-step on a live run). A run whose cells moved gives its
mean transition times each way (``gyre_store.run_report``: first command to the cell joining
the batch, or to its engine serving again); one that did not keeps the paper's. One node per cell.
With ``workload_from_run`` (the run's execution durations by group) and the run's
``SchedConfig``, ``predict_run`` simulates the same configuration for the same number of steps.
"""

from __future__ import annotations

import msgspec

from gyre_sched.config import SchedConfig
from gyre_sched.exceptions import WorkloadError
from gyre_sched.sim.cluster import TO_ROLLOUT_S, TO_TRAIN_S, ClusterConfig
from gyre_sched.sim.results import SimResult
from gyre_sched.sim.simulator import simulate
from gyre_sched.sim.workload_store import workload_from_run
from gyre_store import catalog, run_report
from gyre_store.log import EventLog

__all__ = ["MeasuredCosts", "measured_cluster", "predict_run"]

_TYPES = ("train.computed", "train.update", "group.consumed")


class MeasuredCosts(msgspec.Struct, frozen=True, kw_only=True):
    """What a run's log says its training cost, and the cluster config made of it."""

    cluster: ClusterConfig
    steps: int
    groups: int
    micro_steps: int
    compute_s: float


def measured_cluster(log: EventLog, run_id: str) -> MeasuredCosts:
    """A ClusterConfig of the run's measured training costs.

    Raises WorkloadError when the run has no consumed group or no update recorded.
    """
    compute_s = 0.0
    last_computed: dict[int, float] = {}
    updates: list[tuple[float, catalog.TrainingUpdate]] = []
    groups = 0
    for recorded in log.read(0, types=_TYPES, limit=10_000_000):
        ev = recorded.event
        if getattr(ev, "run_id", None) != run_id:
            continue
        at = recorded.recorded_at.timestamp()
        match ev:
            case catalog.MicroStepComputed(batch=batch, seconds=seconds):
                compute_s += seconds
                last_computed[batch] = max(last_computed.get(batch, at), at)
            case catalog.TrainingUpdate():
                updates.append((at, ev))
            case catalog.GroupConsumed():
                groups += 1
            case _:
                pass
    if not updates or groups == 0:
        raise WorkloadError(f"run {run_id!r} has no update or no consumed group to measure")
    update_s = [at - last_computed[u.batch] for at, u in updates if u.batch in last_computed]
    micro_steps = sum(u.micro_steps for _, u in updates)
    moves = run_report(log, run_id, phi=0.0, mu=1).transition_times
    to_train = [t.total_s for t in moves if t.direction == "to_training" and t.total_s is not None]
    to_rollout = [t.total_s for t in moves if t.direction == "to_rollout" and t.total_s is not None]
    cluster = ClusterConfig(
        cell_nodes=1,
        train_node_hours_per_group=max(compute_s, 1e-6) / groups / 3600.0,
        microsteps_per_group=max(1, round(micro_steps / groups)),
        update_s=sum(update_s) / len(update_s) if update_s else 0.0,
        broadcast_s=0.0,
        publish_s=0.0,
        pipeline_s=0.0,
        to_train_s=sum(to_train) / len(to_train) if to_train else TO_TRAIN_S,
        to_rollout_s=sum(to_rollout) / len(to_rollout) if to_rollout else TO_ROLLOUT_S,
    ).validate()
    return MeasuredCosts(
        cluster=cluster,
        steps=len(updates),
        groups=groups,
        micro_steps=micro_steps,
        compute_s=compute_s,
    )


def predict_run(
    log: EventLog, run_id: str, sched: SchedConfig, *, seed: int = 0
) -> tuple[MeasuredCosts, SimResult]:
    """The simulator's prediction for run ``run_id`` under ``sched`` (the run's own
    ``SchedConfig``): its measured costs, its executions' durations, the same number of steps."""
    costs = measured_cluster(log, run_id)
    workload = workload_from_run(log, run_id)
    result = simulate(sched, costs.cluster, workload, steps=costs.steps, seed=seed, name=run_id).result
    return costs, result
