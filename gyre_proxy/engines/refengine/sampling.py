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


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn with probability ``probs[i] / probs.sum()``, by inverting the cumulative
    distribution at a uniform draw: one pass over the vocabulary, where ``torch.multinomial``
    draws an exponential variate per word (27x slower over the Qwen vocabulary). A word of
    probability zero is never drawn: the first index whose cumulative mass exceeds the draw
    has mass of its own."""
    cumulative = torch.cumsum(probs.float(), dim=-1)
    total = float(cumulative[-1])
    if not total > 0.0:
        raise ValueError("cannot draw from a distribution with no mass")
    u = float(torch.rand((), generator=generator, dtype=torch.float64)) * total
    index = int(torch.searchsorted(cumulative, torch.tensor([u], dtype=cumulative.dtype), right=True)[0])
    if index >= probs.numel():  # u rounded up to the total: the last word with mass
        index = int(torch.nonzero(probs)[-1, 0])
    return index


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
