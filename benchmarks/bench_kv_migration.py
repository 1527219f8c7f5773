"""Rerouting a decoding request: KV migration over HTTP, over Mooncake, and re-prefill, from the abort to the first new token.

Two reference engines on loopback HTTP (A the source, B the destination), the tiny byte-vocab
Qwen3 of the tests (2 layers, 2 KV heads of 16 dims, float32: 512 bytes of KV per token) with
a 65,536-position limit. For each context length a request streams on A (A prefills it for
real every trial) until it has produced ``--decoded`` tokens; then the clock starts and the
request moves to B, which continues it from the context plus the produced tokens, as the
proxy's retry does:

* (a) migration over HTTP: ``pin_and_abort`` on A, ``export_kv`` from A, ``import_kv`` into
  B, then a streamed ``/generate`` on B until its first token (B prefills one position); A's
  pin is released after that, outside the clock.
* (b) re-prefill: ``abort`` on A, then the streamed ``/generate`` on B, which prefills the
  whole context.
* (c) migration over Mooncake Transfer Engine (TCP on loopback here): ``pin_and_abort`` on A,
  ``expose_kv`` on A (pack, register), ``pull_kv`` on B (B reads A's memory, unpacks and
  checks), then the same ``/generate``; released outside the clock. Both Transfer Engines
  start, and B first meets A's segment, in one untimed move before the trials; that cost is
  printed apart.

The three paths are interleaved, ``--repeats`` times each per length. The table shows each
one's median and range, the ratios, and the phases of (a) and (c). In (a) the payload crosses
loopback twice, A to this process and this process to B, as it would through the proxy.
"transfer" is export + import minus packing and unpacking. In (c) the payload crosses once, A
to B. A's registration and B's read (registering its buffer, reading, copying the bytes out for
safetensors) are timed inside the clock, by wrapping each engine's ``KvTransfer``; every phase
of (c) is measured on the move itself. (a)'s packing and unpacking are timed outside the
clock, in this process (the engines run in it), on the same cache. Fresh allocations there
make them slower than inside the engines' threads (an expose, which packs, took less than an
outside pack), so (a)'s "transfer" is a lower bound. Asserts nothing.

    .venv/bin/python benchmarks/bench_kv_migration.py [--contexts 4096 32768 --repeats 5 --decoded 16]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import msgspec
import numpy as np

from gyre_proxy.engines import EngineClient, EngineClientConfig, SamplingConfig
from gyre_proxy.engines.refengine import (
    DEFAULT_MODEL_CONFIG,
    ModelSource,
    ReferenceEngineConfig,
    ReferenceEngineServer,
)
from gyre_proxy.engines.refengine.kvmooncake import KvTransfer
from gyre_proxy.engines.refengine.kvpayload import pack, unpack

MAX_POSITIONS = 65_536


@dataclass
class Trial:
    """One rerouted request; every time in seconds from the abort on."""

    first_token: float
    cached_tokens: int
    phases: dict[str, float] = field(default_factory=dict)


async def stream_until(
    client: EngineClient, prompt: list[int], rid: str, produced: int
) -> asyncio.Task[list[int]]:
    """Start a long greedy stream of ``prompt`` on ``client``'s engine and return once it has
    produced ``produced`` tokens; the task goes on until the stream ends (it is aborted) and
    then holds every token the stream delivered, which is what the proxy's retry continues."""
    tokens: list[int] = []
    ready = asyncio.Event()

    async def consume() -> list[int]:
        sampling = SamplingConfig(max_new_tokens=4096, temperature=0.0, ignore_eos=True)
        try:
            async for delta in client.generate_stream(prompt, sampling, rid=rid):
                tokens.extend(delta.output_ids.tolist())
                if len(tokens) >= produced:
                    ready.set()
        finally:
            ready.set()
        return tokens

    task = asyncio.create_task(consume())
    await ready.wait()
    return task


async def first_token(http: httpx.AsyncClient, ids: list[int]) -> tuple[float, int]:
    """When (perf_counter) B streamed its first token for ``ids``, and its ``cached_tokens``;
    the short stream is then read to its end, so B is idle when this returns."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "stream": True,
    }
    first: tuple[float, int] | None = None
    async with http.stream("POST", "/generate", json=body) as response:
        async for line in response.aiter_lines():
            if first is not None or not line.startswith("data: {"):
                continue
            chunk = msgspec.json.decode(line[6:])
            if chunk["output_ids"]:
                first = time.perf_counter(), int(chunk["meta_info"]["cached_tokens"])
    if first is None:
        raise RuntimeError("B's stream ended without a token")
    return first


async def trial_migration(
    a: EngineClient,
    b: EngineClient,
    b_http: httpx.AsyncClient,
    src: ReferenceEngineServer,
    prompt: list[int],
    decoded: int,
) -> Trial:
    rid = f"mig-{uuid.uuid4().hex[:8]}"
    stream = await stream_until(a, prompt, rid, decoded)
    start = time.perf_counter()
    pinned = await a.pin_and_abort(rid)
    produced = await stream  # its abort reaches the stream as the pin's answer comes back
    pinned_at = time.perf_counter()
    payload = await a.export_kv(rid)
    exported_at = time.perf_counter()
    await b.import_kv(payload)
    imported_at = time.perf_counter()
    at, cached = await first_token(b_http, payload.token_ids.tolist())
    assert payload.token_ids.tolist() == prompt + produced and pinned.num_tokens == payload.num_tokens

    # Outside the clock: the CPU part of export and import, on the same cache.
    entry = src.engine.loop.pinned.get(rid)
    layout = src.engine.loop.layout
    assert layout is not None
    t0 = time.perf_counter()
    data = pack(entry, layout)
    t1 = time.perf_counter()
    vocab = src.engine.loaded.vocab_size
    unpack(data, layout, weight_version=entry.weight_version, vocab_size=vocab, context_length=MAX_POSITIONS)
    t2 = time.perf_counter()
    await a.release_kv(rid)
    await b.flush_cache()
    export_s, import_s = exported_at - pinned_at, imported_at - exported_at
    return Trial(
        first_token=at - start,
        cached_tokens=cached,
        phases={
            "pin+abort": pinned_at - start,
            "export": export_s,
            "import": import_s,
            "first token": at - imported_at,
            "pack (in export)": t1 - t0,
            "unpack+check (in import)": t2 - t1,
            "transfer (2 loopback hops)": max(export_s + import_s - (t1 - t0) - (t2 - t1), 0.0),
            "bytes": float(payload.nbytes),
        },
    )


class TimedTransfer:
    """An engine's ``KvTransfer`` with the time of its last expose (registration) and read kept,
    so the phases of (c) are measured inside the clock, on the move itself."""

    def __init__(self, inner: KvTransfer) -> None:
        self.inner = inner
        self.expose_s = 0.0
        self.read_s = 0.0

    @property
    def protocol(self) -> str:
        return self.inner.protocol

    def status(self) -> tuple[bool, str]:
        return self.inner.status()

    def expose(self, data: bytes) -> tuple[str, int]:
        t0 = time.perf_counter()
        try:
            return self.inner.expose(data)
        finally:
            self.expose_s = time.perf_counter() - t0

    def withdraw(self, address: int) -> None:
        self.inner.withdraw(address)

    def read(self, segment: str, address: int, nbytes: int) -> bytes:
        t0 = time.perf_counter()
        try:
            return self.inner.read(segment, address, nbytes)
        finally:
            self.read_s = time.perf_counter() - t0

    def close(self) -> None:
        self.inner.close()


async def trial_mooncake(
    a: EngineClient,
    b: EngineClient,
    b_http: httpx.AsyncClient,
    src: ReferenceEngineServer,
    src_transfer: TimedTransfer,
    dst_transfer: TimedTransfer,
    prompt: list[int],
    decoded: int,
) -> Trial:
    rid = f"mc-{uuid.uuid4().hex[:8]}"
    stream = await stream_until(a, prompt, rid, decoded)
    start = time.perf_counter()
    pinned = await a.pin_and_abort(rid)
    produced = await stream
    pinned_at = time.perf_counter()
    exposed = await a.expose_kv(rid)
    exposed_at = time.perf_counter()
    await b.pull_kv(exposed)
    pulled_at = time.perf_counter()
    ids = prompt + produced
    at, cached = await first_token(b_http, ids)
    assert exposed.num_tokens == len(ids) == pinned.num_tokens
    register_s, read_s = src_transfer.expose_s, dst_transfer.read_s
    await a.release_kv(rid)
    await b.flush_cache()
    expose_s, pull_s = exposed_at - pinned_at, pulled_at - exposed_at
    return Trial(
        first_token=at - start,
        cached_tokens=cached,
        phases={
            "pin+abort": pinned_at - start,
            "expose (pack, register, call)": expose_s,
            "  of which register": register_s,
            "pull (read, keep, call)": pull_s,
            "  of which Mooncake read": read_s,
            "  the rest (unpack, checks, call)": pull_s - read_s,
            "first token": at - pulled_at,
            "bytes": float(exposed.nbytes),
        },
    )


async def warm_up_mooncake(a: EngineClient, b: EngineClient, prompt: list[int]) -> tuple[float, float]:
    """One untimed-in-the-table move over Mooncake on a short prompt: both Transfer Engines start
    (they start at their first migration) and B opens A's segment. Returns the expose and pull
    times of that first move."""
    rid = f"warm-{uuid.uuid4().hex[:8]}"
    stream = await stream_until(a, prompt, rid, 2)
    await a.pin_and_abort(rid)
    await stream
    t0 = time.perf_counter()
    exposed = await a.expose_kv(rid)
    t1 = time.perf_counter()
    await b.pull_kv(exposed)
    t2 = time.perf_counter()
    await a.release_kv(rid)
    await b.flush_cache()
    return t1 - t0, t2 - t1


async def trial_reprefill(
    a: EngineClient, b: EngineClient, b_http: httpx.AsyncClient, prompt: list[int], decoded: int
) -> Trial:
    rid = f"pre-{uuid.uuid4().hex[:8]}"
    stream = await stream_until(a, prompt, rid, decoded)
    assert (await b.kv_status()).imported_entries == 0
    start = time.perf_counter()
    await a.abort(rid)
    produced = await stream
    at, cached = await first_token(b_http, prompt + produced)
    return Trial(first_token=at - start, cached_tokens=cached)


def spread(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    med, low, high = (statistics.median(values) * scale, min(values) * scale, max(values) * scale)
    return f"{med:.{digits}f} [{low:.{digits}f}-{high:.{digits}f}]"


def report(
    context: int, migrated: list[Trial], reprefilled: list[Trial], mooncake: list[Trial], decoded: int
) -> None:
    a = [t.first_token for t in migrated]
    b = [t.first_token for t in reprefilled]
    c = [t.first_token for t in mooncake]
    print(f"\ncontext {context} tokens, >= {decoded} decoded on A before the reroute; {len(a)} trials each")
    for label, times, trials in (
        ("(a) migration, HTTP    ", a, migrated),
        ("(b) re-prefill         ", b, reprefilled),
        ("(c) migration, Mooncake", c, mooncake),
    ):
        print(
            f"  {label} abort -> first token on B   {spread(times)} s   cached_tokens {trials[0].cached_tokens}"
        )
    med = statistics.median
    print(
        f"  of the medians: (a)/(b) {med(a) / med(b):.3f}   (c)/(b) {med(c) / med(b):.3f}   "
        f"(c)/(a) {med(c) / med(a):.3f}"
    )
    show: dict[str, Callable[[list[float]], str]] = {
        "bytes": lambda v: f"{statistics.median(v) / 1e6:.2f} MB",
    }
    for label, trials in (("(a)", migrated), ("(c)", mooncake)):
        print(f"  {label} phases, median [min-max]:")
        for name in trials[0].phases:
            values = [t.phases[name] for t in trials]
            text = show[name](values) if name in show else f"{spread(values, 1000.0, 1)} ms"
            print(f"    {name:<34} {text}")


async def run(args: argparse.Namespace) -> None:
    source = ModelSource(config={**DEFAULT_MODEL_CONFIG, "max_position_embeddings": MAX_POSITIONS})
    config = ReferenceEngineConfig(source=source, max_context=MAX_POSITIONS)
    rng = np.random.default_rng(0)
    with ReferenceEngineServer(config) as src, ReferenceEngineServer(config) as dst:
        async with (
            EngineClient(EngineClientConfig(src.base_url, timeout_s=600)) as a,
            EngineClient(EngineClientConfig(dst.base_url, timeout_s=600)) as b,
            httpx.AsyncClient(base_url=dst.base_url, timeout=600) as b_http,
        ):
            # Timed seams on both engines: the registration on A, the read on B.
            src_transfer = TimedTransfer(src.engine.kv_transfer)
            dst_transfer = TimedTransfer(dst.engine.kv_transfer)
            src.engine.kv_transfer, dst.engine.kv_transfer = src_transfer, dst_transfer
            status = await b.kv_status()
            if not status.mooncake:
                raise SystemExit(
                    f"(c) needs Mooncake Transfer Engine on the engines: {status.mooncake_detail}"
                )
            expose_s, pull_s = await warm_up_mooncake(a, b, [int(x) for x in rng.integers(3, 250, size=64)])
            print(
                f"Mooncake's first move (Transfer Engines start, B opens A's segment; 64 tokens): "
                f"expose {expose_s * 1000:.1f} ms, pull {pull_s * 1000:.1f} ms; "
                f"{(await a.kv_status()).mooncake_detail}"
            )
            for context in args.contexts:
                prompt = [int(x) for x in rng.integers(3, 250, size=context)]
                migrated: list[Trial] = []
                reprefilled: list[Trial] = []
                mooncake: list[Trial] = []
                for _ in range(args.repeats):  # interleaved, so drift in the machine's load hits all three
                    migrated.append(await trial_migration(a, b, b_http, src, prompt, args.decoded))
                    reprefilled.append(await trial_reprefill(a, b, b_http, prompt, args.decoded))
                    mooncake.append(
                        await trial_mooncake(
                            a, b, b_http, src, src_transfer, dst_transfer, prompt, args.decoded
                        )
                    )
                report(context, migrated, reprefilled, mooncake, args.decoded)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--decoded", type=int, default=16, help="tokens A produces before the reroute")
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
