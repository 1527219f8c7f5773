"""Whether ``presets.py`` holds what ``gyre simulate --fit`` gives, checked in seconds.

The whole fit takes minutes (a grid and Nelder-Mead per workload, then two cost scans
of hundreds of simulations). This checks what the fit's answer must satisfy locally, on
the fit's own losses, draws and seeds: every fitted workload field is rounded as the fit
rounds it and no move along it of 1 to 100 rounding units lowers the profile loss (a
ladder, since counts make the loss flat over a few units); no step of the scan either way
lowers a training cost's loss; the 2.4T workload carries the 122B shape. It does not redo
the global search: a constant moved by hand onto another local minimum (the 2.4T cost's
other branch, about 6.7) passes here and fails ``--fit``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import msgspec

from gyre_sched.sim.fit import (
    COST_STEP_2_4T,
    COST_STEP_122B,
    FREE_2_4T,
    FREE_122B,
    SHAPE,
    WORKLOAD_2_4T,
    WORKLOAD_122B,
    Draws,
    ablation_loss,
    profile_draws,
    profile_loss,
    rounding_digits,
    speedup_loss,
)
from gyre_sched.sim.paper import PAPER_PROFILE_2_4T, PAPER_PROFILE_122B
from gyre_sched.sim.presets import TRAIN_NODE_HOURS_PER_GROUP_2_4T, TRAIN_NODE_HOURS_PER_GROUP_122B, WORKLOADS
from gyre_sched.sim.workload import CeilingLogNormal, WorkloadModel

# How far a neighbour's profile loss may fall below the preset's: the fit rounds its
# Nelder-Mead answer, which is not exactly the minimum on the rounding grid (the 2.4T
# median's next unit is 2.2e-7 lower). A hand edit of a constant the profile pins
# (median, sigmas, hard share and factor) moves the loss by 1e-5 or more per unit.
PROFILE_SLACK = 1e-6
LADDER = (1, 2, 5, 10, 20, 50, 100)  # rounding units either way probed along each workload field
FIT_SEEDS = (0, 1, 2)  # the seeds ``gyre simulate --fit`` fits the training costs on

CostLoss = Callable[[float, Mapping[str, WorkloadModel], Sequence[int]], float]


class Departure(msgspec.Struct, frozen=True):
    """A preset constant that is not what the fit would give, and why."""

    constant: str
    detail: str


def _profile_departures(
    workload: str, free: Mapping[str, tuple[float, float]], targets: Mapping[str, float], draws: Draws
) -> list[Departure]:
    model = WORKLOADS[workload]
    loss = profile_loss(model, targets, draws)
    found = []
    for name, (lo, hi) in free.items():
        value, digits = getattr(model, name), rounding_digits(name)
        label = f"WORKLOADS[{workload!r}].{name}"
        if round(value, digits) != value or not lo <= value <= hi:
            found.append(Departure(label, f"{value} is not rounded to {digits} decimals inside {lo}-{hi}"))
            continue
        for units in (sign * n for n in LADDER for sign in (-1, 1)):
            neighbour = round(value + units * 10.0**-digits, digits)
            if not lo <= neighbour <= hi:
                continue
            there = profile_loss(_with(model, name, neighbour), targets, draws)
            if there < loss - PROFILE_SLACK:
                found.append(
                    Departure(label, f"profile loss {loss:.3g} at {value}, {there:.3g} at {neighbour}")
                )
    return found


def _with(model: CeilingLogNormal, name: str, value: float) -> CeilingLogNormal:
    return msgspec.structs.replace(model, **{name: value})


def _cost_departures(label: str, value: float, step: float, loss_of: CostLoss) -> list[Departure]:
    loss = loss_of(value, WORKLOADS, FIT_SEEDS)
    below, above = round(value - step, 6), round(value + step, 6)
    found = []
    # the scan keeps the smaller value on a tie, so the one below must be strictly worse
    if below > 0 and (there := loss_of(below, WORKLOADS, FIT_SEEDS)) <= loss:
        found.append(Departure(label, f"training loss {loss:.4g} at {value}, {there:.4g} at {below}"))
    if (there := loss_of(above, WORKLOADS, FIT_SEEDS)) < loss:
        found.append(Departure(label, f"training loss {loss:.4g} at {value}, {there:.4g} at {above}"))
    return found


def check_presets(*, costs: bool = True) -> list[Departure]:
    """Every constant of ``presets.py`` the fit sets and a local check finds off; [] if none.

    ``costs=False`` skips the training costs (about 30 simulations; the workload part is
    under a second).
    """
    draws = profile_draws()
    found = _profile_departures(WORKLOAD_122B, FREE_122B, PAPER_PROFILE_122B, draws)
    found += _profile_departures(WORKLOAD_2_4T, FREE_2_4T, PAPER_PROFILE_2_4T, draws)
    for name in SHAPE:  # the 2.4T fit starts from the 122B fit's shape and keeps it
        big, small = getattr(WORKLOADS[WORKLOAD_2_4T], name), getattr(WORKLOADS[WORKLOAD_122B], name)
        if big != small:
            found.append(
                Departure(f"WORKLOADS[{WORKLOAD_2_4T!r}].{name}", f"{big}, the 122B fit's shape is {small}")
            )
    if costs:
        found += _cost_departures(
            "TRAIN_NODE_HOURS_PER_GROUP_122B", TRAIN_NODE_HOURS_PER_GROUP_122B, COST_STEP_122B, ablation_loss
        )
        found += _cost_departures(
            "TRAIN_NODE_HOURS_PER_GROUP_2_4T", TRAIN_NODE_HOURS_PER_GROUP_2_4T, COST_STEP_2_4T, speedup_loss
        )
    return found
