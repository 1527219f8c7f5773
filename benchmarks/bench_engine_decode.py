"""The reference engine's decode cost over the Qwen vocabulary, against baselines in the same run.

The model is the demo's policy shape (a tiny Qwen3 over the Qwen vocabulary), freshly built.

Three figures, each a ratio to a baseline measured in the same process, on one torch thread
(as the engine runs):

1. sampling one token from a 248K-word distribution: ``draw`` (the engine's inverse of the
   cumulative distribution) against ``torch.multinomial``;
2. the output projection: one [n, H] x [H, V] product for n requests against n products of
   one row each;
3. decoding: ``--requests`` concurrent requests of ``--tokens`` tokens each through the
   engine's ``DecodeLoop`` with its output projection shared by every request of a pass,
   against the same loop running the whole model per request (the path it takes for models
   whose logits are not a plain projection). Tokens per second, both ways.

There is no target for these; they explain where the engine's time goes (README, "The live
run"). Run: .venv/bin/python benchmarks/bench_engine_decode.py [--requests 8] [--tokens 48]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import torch
from rich.console import Console
from rich.progress import track
from rich.table import Table

from gyre_proxy.engines import SamplingConfig
from gyre_proxy.engines.refengine.decode_loop import DecodeLoop, StepEvent
from gyre_proxy.engines.refengine.model import ModelSource, load_model
from gyre_proxy.engines.refengine.sampling import draw
from gyre_train.backends import TINY_POLICY

console = Console(width=160)


def per_call_ms(call: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """Median, lowest and highest milliseconds of ``call`` over ``repeats`` timed blocks of 10."""
    call()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(10):
            call()
        times.append((time.perf_counter() - began) / 10 * 1e3)
    return statistics.median(times), min(times), max(times)


def decode_rate(loop: DecodeLoop, requests: int, tokens: int, prompt: list[int]) -> float:
    """Tokens per second of ``requests`` concurrent requests of ``tokens`` tokens each."""
    done = threading.Event()
    left = [requests]
    produced = [0]
    lock = threading.Lock()

    def sink(event: StepEvent) -> None:
        with lock:
            if event.token is not None:
                produced[0] += 1
            if event.finish is not None:
                left[0] -= 1
                if left[0] == 0:
                    done.set()

    sampling = SamplingConfig(max_new_tokens=tokens, temperature=1.0, ignore_eos=True)
    began = time.perf_counter()
    for i in range(requests):
        loop.submit(f"r{i}-{time.monotonic_ns()}", prompt, sampling, sink, seed=i)
    done.wait(600)
    return produced[0] / (time.perf_counter() - began)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--prompt", type=int, default=400, help="prompt tokens of each request")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)

    loaded = load_model(ModelSource(config=TINY_POLICY, tokenizer="qwen", seed=0))  # the demo's policy
    head = loaded.model.lm_head
    vocab, hidden = head.weight.shape
    table = Table(title=f"reference engine, Qwen vocabulary ({vocab:,} words, hidden {hidden}), one thread")
    for column in ("figure", "ours", "baseline (same run)", "baseline / ours"):
        table.add_column(column)

    generator = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(vocab, generator=generator), dim=-1)
    ours = per_call_ms(lambda: draw(probs, generator), args.repeats)
    base = per_call_ms(lambda: torch.multinomial(probs, 1, generator=generator), args.repeats)
    table.add_row("sample one token (ms)", f"{ours[0]:.2f} ({ours[1]:.2f}-{ours[2]:.2f}) draw",
                  f"{base[0]:.2f} ({base[1]:.2f}-{base[2]:.2f}) torch.multinomial", f"{base[0] / ours[0]:.1f}x")  # fmt: skip

    n = args.requests
    rows = torch.randn(n, hidden)
    with torch.inference_mode():
        ours = per_call_ms(lambda: head(rows), args.repeats)
        base = per_call_ms(lambda: [head(rows[i : i + 1]) for i in range(n)], args.repeats)
    table.add_row(f"output projection of {n} rows (ms)", f"{ours[0]:.2f} ({ours[1]:.2f}-{ours[2]:.2f}) at once",
                  f"{base[0]:.2f} ({base[1]:.2f}-{base[2]:.2f}) one row at a time", f"{base[0] / ours[0]:.1f}x")  # fmt: skip

    prompt = list(range(1000, 1000 + args.prompt))
    rates: dict[str, list[float]] = {"shared": [], "per request": []}
    loop = DecodeLoop(loaded, context_length=65_536, weight_version="0")
    split = loop._split
    loop.start()
    try:
        for _ in track(range(args.repeats), description="decoding both ways", console=console):
            for name, path in (("shared", split), ("per request", None)):
                loop._split = path
                rates[name].append(decode_rate(loop, n, args.tokens, prompt))
    finally:
        loop._split = split
        loop.stop()
    ours_rate = statistics.median(rates["shared"])
    base_rate = statistics.median(rates["per request"])
    table.add_row(
        f"decode, {n} concurrent requests of {args.tokens} tokens after {args.prompt} (tokens/s)",
        f"{ours_rate:.0f} ({min(rates['shared']):.0f}-{max(rates['shared']):.0f}) projection shared",
        f"{base_rate:.0f} ({min(rates['per request']):.0f}-{max(rates['per request']):.0f}) whole model per request",
        f"{ours_rate / base_rate:.1f}x",
    )
    console.print(table)
    console.print("no target: these figures explain where the engine's time goes (README, 'The live run')")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
