"""Token choice and the reported logprob (SGLang's rules)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gyre_proxy.engines import SamplingConfig
from gyre_proxy.engines.refengine.sampling import choose

LOGITS = torch.tensor([2.0, 1.0, 0.5, -1.0, 3.0])


def test_greedy_takes_argmax_with_raw_logprob() -> None:
    choice = choose(LOGITS, SamplingConfig(temperature=0.0), torch.Generator(), return_original_logprob=False)
    assert choice.token == 4
    assert math.isclose(choice.logprob, float(torch.log_softmax(LOGITS, -1)[4]), rel_tol=1e-6)


def test_sampled_logprob_is_temperature_scaled_unless_original_requested() -> None:
    sampling = SamplingConfig(temperature=0.5, top_k=2)
    scaled = choose(LOGITS, sampling, torch.Generator().manual_seed(0), return_original_logprob=False)
    original = choose(LOGITS, sampling, torch.Generator().manual_seed(0), return_original_logprob=True)
    assert scaled.token == original.token
    # Before top-k renormalisation: the full temperature-scaled softmax.
    assert math.isclose(
        scaled.logprob, float(torch.log_softmax(LOGITS / 0.5, -1)[scaled.token]), rel_tol=1e-6
    )
    assert math.isclose(original.logprob, float(torch.log_softmax(LOGITS, -1)[original.token]), rel_tol=1e-6)


def test_forced_token_reports_its_model_logprob() -> None:
    choice = choose(LOGITS, SamplingConfig(), torch.Generator(), return_original_logprob=False, forced=3)
    assert choice.token == 3
    assert math.isclose(choice.logprob, float(torch.log_softmax(LOGITS, -1)[3]), rel_tol=1e-6)


def test_same_seed_same_samples() -> None:
    def draw(seed: int) -> list[int]:
        generator = torch.Generator().manual_seed(seed)
        return [
            choose(LOGITS, SamplingConfig(), generator, return_original_logprob=False).token
            for _ in range(30)
        ]

    assert draw(5) == draw(5)
    assert len(set(draw(5))) > 1


@settings(max_examples=50)
@given(seed=st.integers(0, 2**31), top_k=st.integers(1, 4), top_p=st.floats(0.05, 1.0))
def test_top_k_and_top_p_never_sample_outside_the_nucleus(seed: int, top_k: int, top_p: float) -> None:
    sampling = SamplingConfig(temperature=1.0, top_k=top_k, top_p=top_p)
    token = choose(LOGITS, sampling, torch.Generator().manual_seed(seed), return_original_logprob=False).token
    order = torch.argsort(LOGITS, descending=True).tolist()
    assert order.index(token) < top_k
    probs = torch.softmax(LOGITS, -1)
    mass_before = sum(float(probs[t]) for t in order[: order.index(token)])
    assert mass_before < top_p


def test_draw_follows_the_distribution_and_never_draws_a_word_without_mass() -> None:
    from gyre_proxy.engines.refengine.sampling import draw

    probs = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(5)
    n = 20_000
    for _ in range(n):
        counts[draw(probs, generator)] += 1
    # Three standard deviations of a binomial proportion at n = 20,000 are below 0.011.
    assert torch.allclose(counts / n, probs, atol=0.011), counts / n
    assert counts[1] == 0 and counts[4] == 0
    # Unnormalized weights are a distribution too, and a seed gives the same draws.
    first = [draw(probs * 7, torch.Generator().manual_seed(3)) for _ in range(1)]
    again = [draw(probs * 7, torch.Generator().manual_seed(3)) for _ in range(1)]
    assert first == again


def test_draw_reaches_words_too_light_for_a_float32_running_total() -> None:
    # Each tail word's mass is below half an ulp of 1.0 in float32: a float32 cumulative sum
    # never rises over them, so a one-level float32 inversion could never draw one, though the
    # tail holds about 1% of the mass.
    from gyre_proxy.engines.refengine.sampling import draw

    probs = torch.full((248_320,), 4e-8)
    probs[0] = 1.0
    tail = float(probs[1:].double().sum() / probs.double().sum())
    generator = torch.Generator().manual_seed(2)
    n = 6_000
    drawn = [draw(probs, generator) for _ in range(n)]
    hits = sum(i > 0 for i in drawn)
    # About 59 expected; four standard deviations are 31 (0.0051 of n).
    assert abs(hits / n - tail) < 0.0051, (hits / n, tail)
    # Words at which a float32 running total does not rise get no interval of their own there;
    # most tail words are such words, and a fair draw lands on them about as often as on others.
    running = torch.cumsum(probs.float(), dim=0)
    flat = set(torch.nonzero(running[1:] == running[:-1])[:, 0].add(1).tolist())
    assert len(flat) > len(probs) // 2
    assert sum(i in flat for i in drawn) > hits // 4, (hits, sum(i in flat for i in drawn))


def test_draw_refuses_a_distribution_without_mass() -> None:
    import pytest

    from gyre_proxy.engines.refengine.sampling import draw

    with pytest.raises(ValueError, match="no mass"):
        draw(torch.zeros(4), torch.Generator())
