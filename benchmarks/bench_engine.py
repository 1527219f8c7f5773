"""Reference engine throughput: 16 concurrent HTTP clients vs direct in-process generation.

Runs the same greedy requests twice in one process: first through a loopback
``ReferenceEngineServer`` with ``EngineClient`` (16 clients at once), then by calling the
model directly with a KV cache, one request after another. Prints requests/s, latency
percentiles and the ratios; asserts nothing.

    .venv/bin/python benchmarks/bench_engine.py [--requests 64] [--new-tokens 32] [--clients 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np
import torch
from transformers import DynamicCache

from gyre_proxy.engines import EngineClient, EngineClientConfig, SamplingConfig
from gyre_proxy.engines.refengine import ReferenceEngineConfig, ReferenceEngineServer


def prompts(count: int, length: int) -> list[list[int]]:
    rng = np.random.default_rng(0)
    return [[int(x) for x in rng.integers(3, 250, size=length)] for _ in range(count)]


async def over_http(base_url: str, work: list[list[int]], new_tokens: int, clients: int) -> list[float]:
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for prompt in work:
        queue.put_nowait(prompt)
    latencies: list[float] = []

    async def worker() -> None:
        async with EngineClient(EngineClientConfig(base_url)) as client:
            while not queue.empty():
                prompt = queue.get_nowait()
                start = time.perf_counter()
                await client.generate(prompt, sampling)
                latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(worker() for _ in range(clients)))
    return latencies


@torch.inference_mode()
def direct(model: torch.nn.Module, work: list[list[int]], new_tokens: int) -> list[float]:
    latencies = []
    for prompt in work:
        start = time.perf_counter()
        cache = DynamicCache(config=model.config)  # type: ignore[arg-type]
        logits = model(input_ids=torch.tensor([prompt]), cache=cache, use_cache=True).logits[0, -1]
        for _ in range(new_tokens):
            token = int(torch.argmax(logits))
            float(torch.log_softmax(logits, -1)[token])
            logits = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1]
        latencies.append(time.perf_counter() - start)
    return latencies


def report(name: str, latencies: list[float], wall: float) -> float:
    rate = len(latencies) / wall
    p50 = statistics.median(latencies) * 1000
    p95 = float(np.percentile(latencies, 95)) * 1000
    print(f"{name:<28} {rate:8.1f} req/s   p50 {p50:8.1f} ms   p95 {p95:8.1f} ms   wall {wall:6.2f} s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--clients", type=int, default=16)
    args = parser.parse_args()
    work = prompts(args.requests, args.prompt_tokens)
    # The engine decodes with one intra-op thread; give the baseline the same.
    torch.set_num_threads(1)
    with ReferenceEngineServer(ReferenceEngineConfig()) as server:
        start = time.perf_counter()
        direct_latencies = direct(server.engine.loaded.model, work, args.new_tokens)
        direct_wall = time.perf_counter() - start
        start = time.perf_counter()
        http_latencies = asyncio.run(over_http(server.base_url, work, args.new_tokens, args.clients))
        http_wall = time.perf_counter() - start
    print(f"{args.requests} requests, {args.prompt_tokens} prompt + {args.new_tokens} new tokens, greedy")
    http_rate = report(f"engine, {args.clients} HTTP clients", http_latencies, http_wall)
    direct_rate = report("direct, sequential", direct_latencies, direct_wall)
    print(f"throughput ratio engine/direct: {http_rate / direct_rate:.2f}")
    print(
        "latency ratio engine/direct (p50): "
        f"{statistics.median(http_latencies) / statistics.median(direct_latencies):.1f}"
    )


if __name__ == "__main__":
    main()
