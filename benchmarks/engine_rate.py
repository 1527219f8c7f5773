"""Generated tokens per second of a live run's rollout engines, read from its model calls.

``bench_live_run.py --engine`` runs one configuration on the reference engine and on SGLang and
compares the two with ``generation_rate``. Every ``model_call.recorded`` event of the run counts
(training rollouts, summaries, sub-agents, aborted attempts and their retries alike: each
generated its tokens). From each: its output token count (the payload's ``output_ids``), its
start (``started_at``), its time to first token and its duration.

The measured window (the target's figure) is the **rollout phase**: from the first model call's
start to the last model call's end. Two more figures come with it, without a target: the
tokens over the time at least one model call was open (the union of the calls' intervals, so
the gaps where no call was open, waiting on training or a harness, are left out), and the
mean per-call decode rate ((output tokens - 1) / (duration - time to first token)).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gyre_store import ModelCallRecorded, TitoArrays
from gyre_store.log import EventLog, iterate

TARGET = 1.0  # SGLang / reference tokens per second over the rollout phase, at least (fixed before measuring)

# The configuration both engine kinds run (``--config`` replaces it): short, and the same as
# the SGLang acceptance test's but for 64 output tokens a call, so decoding, not prefill
# alone, is what the figure weighs. ``engine`` and ``model.init`` are set per run.
ENGINE_CONFIG = """
seed = 5
steps = 2
policy = "async"
phi = 1.0
mu = 1
B = 2
N = 2
cells = 1
rollout_engines = 2
engine_capacity = 4
harness = "builtin"
[model]
max_context = 2048
max_tokens = 64
[train]
micro_step_tokens = 2048
publish = "disk"
[tasks]
train = 8
heldout = 1
budget_s = 300
[eval]
heldout = false
"""


@dataclass(frozen=True, slots=True)
class GenerationRate:
    """A run's generated tokens and the windows they were generated in."""

    calls: int
    output_tokens: int
    span_s: float  # first call's start -> last call's end (the rollout phase)
    busy_s: float  # the union of the calls' open intervals
    decode_rates: tuple[float, ...]  # per call with >= 2 tokens: (tokens - 1) / (duration - first token)

    @property
    def tokens_per_s(self) -> float:
        """Over the rollout phase: the target's figure."""
        return self.output_tokens / self.span_s if self.span_s > 0 else 0.0

    @property
    def busy_tokens_per_s(self) -> float:
        return self.output_tokens / self.busy_s if self.busy_s > 0 else 0.0

    @property
    def mean_decode_rate(self) -> float:
        return sum(self.decode_rates) / len(self.decode_rates) if self.decode_rates else 0.0


class NoModelCalls(Exception):
    """The run recorded no model call, so there is no rate to measure."""


def generation_rate(log: EventLog, run_id: str) -> GenerationRate:
    """The generation figures of ``run_id``'s recorded model calls. Raises ``NoModelCalls``."""
    intervals: list[tuple[float, float]] = []
    tokens = 0
    decode: list[float] = []
    for record in iterate(log, types=("model_call.recorded",)):
        event = record.event
        if not isinstance(event, ModelCallRecorded) or event.run_id != run_id:
            continue
        n = TitoArrays.from_payload(record.payload).output_len
        tokens += n
        intervals.append((event.started_at, event.started_at + event.duration_s))
        decoding = event.duration_s - event.first_token_s
        if n >= 2 and decoding > 0:
            decode.append((n - 1) / decoding)
    if not intervals:
        raise NoModelCalls(f"run {run_id} recorded no model call")
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    return GenerationRate(len(intervals), tokens, span, _union(intervals), tuple(decode))


def _union(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``intervals``."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


# The checkpoint family written when ``--checkpoint`` is not given. Qwen3.6 (248,320 rows), not
# Qwen3: a live run's reference engine decodes with the bundled Qwen3.6 vocabulary whatever the
# checkpoint (``gyre_train.cells.rollout._ReferenceServing``: ``tokenizer="qwen"``), so it refuses
# a Qwen3 checkpoint (151,936 rows < 248,077 ids) and the run ends with "the rollout engines did
# not register". Both engine kinds serve a Qwen3.6 checkpoint.
FAMILIES = ("qwen3.6", "qwen3")


def write_tiny_checkpoint(folder: Path, family: str = FAMILIES[0]) -> Path:
    """A tiny checkpoint of ``family`` (``gyre checkpoint write``: the family's vocabulary and
    embedding rows, its tokenizer and chat template, two layers, hidden 64, untrained, seed 0):
    one that both engine kinds serve, as the demo's warm-started policy is not (SGLang)."""
    from gyre_tools.checkpoint import default_cache_dir
    from gyre_train.checkpoints import write_checkpoint

    return write_checkpoint(family, folder, cache_dir=default_cache_dir())
