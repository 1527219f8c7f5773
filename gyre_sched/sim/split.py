"""Which of the paper's figures the calibration fits, and what the others may be called.

A figure outside the fit is *held out* (a prediction) only if no simulator change made
after its residual was seen moved it; otherwise it is *changed after seen*. The split
is fixed (``fit`` fits exactly the training figures); which figures were changed after
seen is history, recorded here and argued row by row in docs/scheduler.md ("Which
figures are predictions").
"""

from __future__ import annotations

from enum import Enum

from gyre_sched.exceptions import UnknownPresetError
from gyre_sched.sim.paper import PAPER_ABLATION, PAPER_SPEEDUP


class Role(Enum):
    """What a figure in the simulated tables is, as printed in their role column."""

    FIT = "fit"  # in the training-cost fit's loss
    HELD_OUT = "held out"  # outside the fit, unmoved by any change made after it was seen
    CHANGED_AFTER_SEEN = "changed after seen"  # outside the fit, moved by such a change
    DENOMINATOR = "denominator"  # E0: every ablation ratio divides by it


DENOMINATOR_ROW = "E0"
# Ablation rows (ratio to E0) that the 122B training cost is fitted on.
TRAINING_ROWS: tuple[str, ...] = ("C0", "C1", "C2", "C3")
# Ablation rows the fit never sees; E0 is the denominator of every ratio.
OUT_OF_FIT_ROWS: tuple[str, ...] = ("A0", "A1", "A2", "A3", "E1", "E2")
# The 2.4T training cost is fitted on the one 2.4T Colocate figure: (setting, baseline).
TRAINING_SPEEDUPS: tuple[tuple[str, str], ...] = (("nl2repo-2.4t", "colocate"),)

# Figures outside the fit that a simulator change made after their residual was printed
# moved by a point or more, or across the MET line (docs/scheduler.md gives each one's
# before and after): issue 12's packing rule and stalls, its burst-end rule (through the
# 2.4T refit), and the hard-query workload with the reading that counts the ceiling.
CHANGED_AFTER_SEEN_ROWS: tuple[str, ...] = ("A0", "A1", "A2", "A3", "E1", "E2")
CHANGED_AFTER_SEEN_SPEEDUPS: tuple[tuple[str, str], ...] = (
    ("nl2repo-122b-ed1", "async"),
    ("nl2repo-122b-ed1", "colocate"),
    ("nl2repo-122b-ed1.5", "async"),
    ("nl2repo-122b-ed1.5", "colocate"),
    ("nl2repo-2.4t", "async"),
)


def ablation_role(row: str) -> Role:
    """The role of ablation row ``row`` (``A0`` ... ``E2``); UnknownPresetError for another name."""
    if row not in PAPER_ABLATION:
        raise UnknownPresetError(f"no ablation row {row!r}; the rows are {', '.join(PAPER_ABLATION)}")
    if row == DENOMINATOR_ROW:
        return Role.DENOMINATOR
    if row in TRAINING_ROWS:
        return Role.FIT
    if row in CHANGED_AFTER_SEEN_ROWS:
        return Role.CHANGED_AFTER_SEEN
    return Role.HELD_OUT


def speedup_role(setting: str, baseline: str) -> Role:
    """The role of the speedup of ``setting`` over ``baseline`` (``async`` or ``colocate``);
    UnknownPresetError for another setting or baseline."""
    if setting not in PAPER_SPEEDUP or baseline not in ("async", "colocate"):
        raise UnknownPresetError(f"no simulated speedup of {setting!r} over {baseline!r}")
    if (setting, baseline) in TRAINING_SPEEDUPS:
        return Role.FIT
    if (setting, baseline) in CHANGED_AFTER_SEEN_SPEEDUPS:
        return Role.CHANGED_AFTER_SEEN
    return Role.HELD_OUT


ROLE_NOTE = (
    "Role: fit = in the training-cost fit; changed after seen = outside the fit, but moved "
    "by a simulator change made after its residual was seen, so not a prediction; held out "
    "= outside the fit and unmoved by any such change."
)
