"""The paper's reported figures, kept apart so they are only ever printed beside ours.

Nothing in the simulator reads this module; the tables module puts these numbers in
the "paper" column and the simulated ones in the "simulated" column.
"""

from __future__ import annotations

import msgspec


class PaperAblationRow(msgspec.Struct, frozen=True):
    """One row of the scheduling ablation (paper Table 1; Table 2 of paper.md)."""

    total_h: float
    vs_e0: float


PAPER_ABLATION: dict[str, PaperAblationRow] = {
    "A0": PaperAblationRow(25.08, 1.556),
    "A1": PaperAblationRow(27.01, 1.676),
    "A2": PaperAblationRow(32.58, 2.021),
    "A3": PaperAblationRow(22.18, 1.376),
    "C0": PaperAblationRow(23.23, 1.442),
    "C1": PaperAblationRow(22.56, 1.400),
    "C2": PaperAblationRow(19.23, 1.193),
    "C3": PaperAblationRow(20.69, 1.284),
    "E0": PaperAblationRow(16.12, 1.000),
    "E1": PaperAblationRow(17.87, 1.109),
    "E2": PaperAblationRow(16.47, 1.022),
}


class PaperSpeedup(msgspec.Struct, frozen=True):
    """Reported cumulative speedups of QwenGyre; a range when the paper gives one."""

    vs_async: tuple[float, float]
    vs_colocate: tuple[float, float]
    totals_h: tuple[float, float, float] | None = None  # (QwenGyre, Async, Colocate)


PAPER_SPEEDUP: dict[str, PaperSpeedup] = {
    # "1.42-1.53x over Async and 1.36-1.47x over Colocate at both staleness targets"
    "nl2repo-122b-ed1": PaperSpeedup((1.42, 1.53), (1.36, 1.47)),
    "nl2repo-122b-ed1.5": PaperSpeedup((1.42, 1.53), (1.36, 1.47)),
    "nl2repo-2.4t": PaperSpeedup((1.78, 1.78), (1.21, 1.21), (75.42, 134.55, 91.47)),
}
