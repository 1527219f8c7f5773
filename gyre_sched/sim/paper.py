"""The paper's reported figures, kept apart so they are only ever printed beside ours.

The simulator itself never reads this module: the tables module puts these numbers in
the "paper" column beside the simulated ones, and the fit module fits to some of them.
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

# Table 1 rows the simulator does not run: the paper gives no execution profile for
# DeepSWE or TerminalBench, so there is no workload to simulate them with.
# (workload, target E[d]) -> (vs Async, vs Colocate)
PAPER_SPEEDUP_NOT_SIMULATED: dict[tuple[str, float], tuple[float, float]] = {
    ("DeepSWE (24 steps)", 1.0): (1.569, 1.610),
    ("DeepSWE (24 steps)", 1.5): (1.572, 1.824),
    ("TerminalBench (24 steps)", 1.0): (1.383, 1.809),
    ("TerminalBench (24 steps)", 1.5): (1.430, 1.849),
}

# The execution profiles ("The execution profile of xLong"), as ``WorkloadStats`` fields.
# 122B NL2RepoBench: 1.93 h per execution, 2.96 h per query, 9.51% of queries over 4 h,
# 6.25% harness timeouts (scored), 0.87% overall timeouts (discarded).
PAPER_PROFILE_122B: dict[str, float] = {
    "mean_execution_h": 1.93,
    "mean_query_h": 2.96,
    "queries_over_4h": 0.0951,
    "harness_timeout_rate": 0.0625,
    "overall_timeout_rate": 0.0087,
}
# 2.4T NL2RepoBench: 61.1% of queries over 4 h; 38.2% of the longest executions (those
# at a ceiling) end in overall timeout.
PAPER_PROFILE_2_4T: dict[str, float] = {
    "queries_over_4h": 0.611,
    "overall_share_at_ceiling": 0.382,
}
