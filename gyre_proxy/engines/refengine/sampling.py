"""Choosing the next token and the logprob reported for it, SGLang's way.

Reported logprob (``meta_info.output_token_logprobs``), matching SGLang's sampler:
- greedy (``temperature`` ~ 0 or ``top_k == 1``): log-softmax of the raw logits;
- sampled: the log of the temperature-scaled softmax, taken *before* top-k/top-p
  truncation and renormalisation (SGLang's default);
- with ``return_original_logprob`` (SGLang's ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``): always
  the log-softmax of the raw logits, i.e. the unmodified model distribution.
At ``temperature == 1`` all three agree, which is how RL rollouts are normally run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre_proxy.engines.types import SamplingConfig

GREEDY_EPS = 1e-6


@dataclass(frozen=True)
class Choice:
    token: int
    logprob: float


def is_greedy(sampling: SamplingConfig) -> bool:
    return sampling.temperature < GREEDY_EPS or sampling.top_k == 1


def reported_logprobs(
    logits: torch.Tensor, sampling: SamplingConfig, *, return_original_logprob: bool
) -> torch.Tensor:
    """The distribution (``[vocab]`` log-probabilities) whose value at the chosen token is reported."""
    logits = logits.float()
    if return_original_logprob or is_greedy(sampling) or sampling.temperature == 1.0:
        return torch.log_softmax(logits, dim=-1)
    return torch.log_softmax(logits / sampling.temperature, dim=-1)


def _truncate(probs: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Zero all but the top-k tokens and the smallest nucleus holding ``top_p``."""
    if 0 < top_k < probs.numel():
        kth = torch.topk(probs, top_k).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep a token when the mass before it is still below top_p (the first is always kept).
        keep_sorted = (cumulative - sorted_probs) < top_p * cumulative[-1]
        keep = torch.zeros_like(keep_sorted)
        keep[order] = keep_sorted
        probs = torch.where(keep, probs, torch.zeros_like(probs))
    return probs


DRAW_CHUNK = 1024  # words per block of the two-level cumulative distribution in ``draw``


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn with probability ``probs[i] / probs.sum()``, by inverting the cumulative
    distribution at a uniform draw: one pass over the vocabulary, where ``torch.multinomial``
    draws an exponential variate per word (``benchmarks/bench_engine_decode.py`` times both).

    The cumulative sums are taken in float64 in two levels (block sums, then the words of the
    chosen block), so a word's mass is not lost to rounding against a float32 running total of
    248K words. A word of probability zero is never drawn: the first index whose cumulative mass
    exceeds the draw has mass of its own."""
    flat = probs.reshape(-1)
    n = flat.numel()
    padded = torch.nn.functional.pad(flat, (0, (-n) % DRAW_CHUNK))
    blocks = padded.view(-1, DRAW_CHUNK)
    cumulative = torch.cumsum(blocks.sum(dim=1, dtype=torch.float64), dim=0)  # [blocks]
    total = float(cumulative[-1])
    if not total > 0.0:
        raise ValueError("cannot draw from a distribution with no mass")
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * total
    block = _first_above(cumulative, u)
    if block is None:  # u rounded up to the total: the last block with mass
        block = int(torch.nonzero(blocks.sum(dim=1, dtype=torch.float64) > 0)[-1, 0])
    before = float(cumulative[block - 1]) if block > 0 else 0.0
    within = torch.cumsum(blocks[block].double(), dim=0)  # [DRAW_CHUNK]
    index = _first_above(within, u - before)
    if index is None:  # the block's sum and its running sum rounded apart: its last word with mass
        index = int(torch.nonzero(blocks[block])[-1, 0])
    return block * DRAW_CHUNK + index


def _first_above(cumulative: torch.Tensor, value: float) -> int | None:
    """The first index whose cumulative value exceeds ``value``, or None past the end."""
    index = int(torch.searchsorted(cumulative, torch.tensor([value], dtype=cumulative.dtype), right=True)[0])
    return index if index < cumulative.numel() else None


def choose(
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator,
    *,
    return_original_logprob: bool,
    forced: int | None = None,
) -> Choice:
    """Pick the next token from ``logits`` (``[vocab]``), or take ``forced``, with its logprob."""
    logprobs = reported_logprobs(logits, sampling, return_original_logprob=return_original_logprob)
    if forced is not None:
        token = forced
    elif is_greedy(sampling):
        token = int(torch.argmax(logits))
    else:
        probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
        probs = _truncate(probs, sampling.top_k, sampling.top_p)
        token = draw(probs, generator)
    return Choice(token=token, logprob=float(logprobs[token]))
