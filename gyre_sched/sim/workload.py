"""Execution-duration models: what a group of N executions costs in rollout time.

``WorkloadModel`` is the seam: a fitted parametric model, a file of measured
durations, or (later) executions read back from the event store all plug in. Models
draw from the numpy Generator they are given and hold no random state of their own.
"""

from __future__ import annotations

import math
from typing import Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from gyre_sched.decision import Outcome
from gyre_sched.exceptions import WorkloadError

HOUR = 3600.0
# The paper's "queries exceed four hours": a query counts when its longest execution ran this
# long or longer (see workload_stats).
QUERY_OVER_H = 4.0
OUTCOME_CODES = (Outcome.COMPLETED, Outcome.HARNESS_TIMEOUT, Outcome.OVERALL_TIMEOUT)

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class GroupSample(msgspec.Struct, frozen=True):
    """Durations (seconds) and outcomes of the N executions of one group."""

    durations_s: tuple[float, ...]
    outcomes: tuple[Outcome, ...]


class WorkloadModel(Protocol):
    """Anything that can draw the executions of one rollout group."""

    @property
    def name(self) -> str:
        """A short label for reports."""
        ...

    def sample_group(self, rng: np.random.Generator, size: int) -> GroupSample:
        """Draw ``size`` executions of one query."""
        ...


class CeilingLogNormal(msgspec.Struct, frozen=True, kw_only=True):
    """Log-normal durations with a shared per-query difficulty and two timeout ceilings.

    latent x = median * k_q * exp(sigma_query * eta_q + sigma_exec * eps), where k_q is
    ``hard_factor`` for the ``hard_share`` of queries that are hard and 1 for the others
    (the paper's "heavy tail coexisting with clustered terminations": a few queries whose
    executions mostly run into the ceiling, beside many that end well before it). x below
    the harness timeout completes at x; between it and ``overall_latent_h`` the harness
    times out at its ceiling (still scored); beyond, the execution hangs until the overall
    budget (discarded). Apart from its query's difficulty, an execution ends in overall
    timeout with probability ``stall_rate``: a hung harness, or an evaluation retried until
    the budget runs out (the paper's evaluator failures); it holds its engine until the
    budget, like any other.
    """

    label: str
    median_h: float
    sigma_query: float
    sigma_exec: float
    harness_timeout_h: float
    overall_latent_h: float
    overall_budget_h: float
    stall_rate: float = 0.0
    hard_share: float = 0.0
    hard_factor: float = 1.0

    @property
    def name(self) -> str:
        return self.label

    def validate(self) -> CeilingLogNormal:
        """Return self if usable, else raise WorkloadError naming the constraint."""
        if self.median_h <= 0 or self.sigma_query < 0 or self.sigma_exec < 0:
            raise WorkloadError(f"{self.label}: median must be > 0 and sigmas >= 0")
        if not 0 < self.harness_timeout_h <= self.overall_budget_h:
            raise WorkloadError(f"{self.label}: need 0 < harness timeout <= overall budget")
        if self.overall_latent_h < self.harness_timeout_h:
            raise WorkloadError(f"{self.label}: overall_latent_h must be >= the harness timeout")
        if not 0.0 <= self.stall_rate < 1.0:
            raise WorkloadError(f"{self.label}: stall_rate={self.stall_rate} must lie in [0, 1)")
        if not 0.0 <= self.hard_share < 1.0 or self.hard_factor < 1.0:
            raise WorkloadError(
                f"{self.label}: hard_share={self.hard_share} must lie in [0, 1) "
                f"and hard_factor={self.hard_factor} be >= 1"
            )
        return self

    def end(
        self, eta: FloatArray, eps: FloatArray, u: FloatArray, v: FloatArray
    ) -> tuple[FloatArray, IntArray]:
        """Hours and outcome codes (``OUTCOME_CODES``) from standard draws of any shape.

        eta: per-query normals, broadcast against eps (per-execution normals); u: per-execution
        uniforms, compared with ``stall_rate``; v: per-query uniforms (broadcast like eta),
        compared with ``hard_share``. ``sample_group`` and the profile fit share it.
        """
        scale = np.where(v < self.hard_share, self.median_h * self.hard_factor, self.median_h)
        latent = scale * np.exp(self.sigma_query * eta + self.sigma_exec * eps)
        overall = (latent >= self.overall_latent_h) | (u < self.stall_rate)
        harness = ~overall & (latent >= self.harness_timeout_h)
        hours = np.where(overall, self.overall_budget_h, np.where(harness, self.harness_timeout_h, latent))
        codes = np.where(overall, 2, np.where(harness, 1, 0))
        return hours, codes

    def sample_group(self, rng: np.random.Generator, size: int) -> GroupSample:
        eta = rng.standard_normal()
        eps = rng.standard_normal(size)
        # draw the stall uniforms only when stalls exist, so a model without them keeps
        # the random stream (and results) it always had
        u = rng.random(size) if self.stall_rate > 0 else np.ones(size)
        # likewise the query's hardness
        v = rng.random() if self.hard_share > 0 else 1.0
        hours, codes = self.end(np.full(size, eta), eps, u, np.full(size, v))
        return GroupSample(tuple((hours * HOUR).tolist()), tuple(OUTCOME_CODES[c] for c in codes.tolist()))


class EmpiricalWorkload(msgspec.Struct, frozen=True):
    """Measured executions, resampled: whole queries when the file names them, else singly."""

    label: str
    groups: tuple[GroupSample, ...]  # one per query; a single group when queries are unknown
    by_query: bool

    @property
    def name(self) -> str:
        return self.label

    def sample_group(self, rng: np.random.Generator, size: int) -> GroupSample:
        if self.by_query:
            source = self.groups[int(rng.integers(len(self.groups)))]
            picks = rng.integers(len(source.durations_s), size=size)
        else:
            source = self.groups[0]
            picks = rng.integers(len(source.durations_s), size=size)
        return GroupSample(
            tuple(source.durations_s[i] for i in picks.tolist()),
            tuple(source.outcomes[i] for i in picks.tolist()),
        )


class WorkloadStats(msgspec.Struct, frozen=True):
    """The profile figures the paper reports, measured on a model."""

    mean_execution_h: float
    mean_query_h: float
    queries_over_4h: float
    harness_timeout_rate: float
    overall_timeout_rate: float
    overall_share_at_ceiling: float


def workload_stats(model: WorkloadModel, rng: np.random.Generator, queries: int, size: int) -> WorkloadStats:
    """Draw ``queries`` groups of ``size`` and measure the paper's profile figures.

    The query duration is the longest of its executions; "over 4 h" counts a query whose
    longest execution ran four hours or more (one stopped at a 4.0 h harness ceiling has run
    its four hours and is evaluated after them); "at the ceiling" means an execution that
    ended in either timeout.
    """
    if queries < 1 or size < 1:
        raise WorkloadError("workload_stats needs at least one query of at least one execution")
    total = 0.0
    query_total = 0.0
    over = harness = overall = 0
    for _ in range(queries):
        group = model.sample_group(rng, size)
        total += sum(group.durations_s)
        longest = max(group.durations_s)
        query_total += longest
        over += longest >= QUERY_OVER_H * HOUR
        harness += sum(o is Outcome.HARNESS_TIMEOUT for o in group.outcomes)
        overall += sum(o is Outcome.OVERALL_TIMEOUT for o in group.outcomes)
    n = queries * size
    ceiling = harness + overall
    return WorkloadStats(
        mean_execution_h=total / n / HOUR,
        mean_query_h=query_total / queries / HOUR,
        queries_over_4h=over / queries,
        harness_timeout_rate=harness / n,
        overall_timeout_rate=overall / n,
        overall_share_at_ceiling=overall / ceiling if ceiling else math.nan,
    )
