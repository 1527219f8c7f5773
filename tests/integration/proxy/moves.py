"""One scenario shared by the reroute tests: the scheduler moves an execution from a cell's engine
to the pool's while its answer streams through a real proxy following an in-memory log.

``scripted_engines`` serves two identical scripted reference engines (same seed, same script),
so an answer can continue on either; ``move_mid_answer`` registers them as a run's ``cell-0``
and ``pool-0``, starts the execution on the cell, streams an answer through the anthropic SDK
and, once 20 characters have arrived, appends what the controller's live sink appends when the
cell leaves rollout. It returns what the harness saw and the proxy's counters.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer
from gyre_proxy.service import ProxyConfig, ProxyService, issue_key
from gyre_store import (
    EngineRegistered,
    EngineRoutingChanged,
    ExecutionRerouted,
    ExecutionStarted,
    InMemoryEventLog,
    NewEvent,
)

LONG = "The files are listed above. " + "Here is a long explanation of every one of them. " * 40


@contextlib.contextmanager
def scripted_engines(tmp_path: Path, *configs: dict[str, Any]) -> Iterator[list[ReferenceEngineServer]]:
    """One scripted engine per ``configs`` entry (extra ReferenceEngineConfig fields each)."""
    with contextlib.ExitStack() as stack:
        servers = []
        for i, extra in enumerate(configs):
            folder = tmp_path / f"e{i}"
            folder.mkdir()
            (folder / "script.json").write_text(json.dumps({"outputs": [LONG, LONG], "rule": "in_order"}))
            cfg = ReferenceEngineConfig(
                source=ModelSource(tokenizer="qwen", seed=0),
                max_context=8192,
                script=folder / "script.json",
                **extra,
            )
            servers.append(stack.enter_context(ReferenceEngineServer(cfg)))
        yield servers


@dataclass(frozen=True)
class Moved:
    text: str  # what the harness received, as one answer
    stop_reason: str | None
    moved: int  # requests the proxy cancelled because their execution moved
    kv_migrated: int  # of those, the ones whose KV cache went with them


def move_mid_answer(
    log: InMemoryEventLog,
    run: str,
    cell: ReferenceEngineServer,
    pool: ReferenceEngineServer,
    *,
    configure: Callable[[ProxyService], None] = lambda proxy: None,
) -> Moved:
    log.append(
        [
            NewEvent(EngineRegistered(engine=f"{run}:cell-0", run_id=run, url=cell.base_url, cell_index=0)),
            NewEvent(EngineRegistered(engine=f"{run}:pool-0", run_id=run, url=pool.base_url, cell_index=-1)),
            NewEvent(ExecutionStarted(execution_id=f"{run}/e0", run_id=run, engine="cell-0")),
        ]
    )
    stop = threading.Event()
    with ProxyService(log, ProxyConfig(engines=[], context_limit=8192, run_id=run)) as proxy:
        configure(proxy)
        follower = threading.Thread(target=proxy.follow, args=(stop,), daemon=True)
        follower.start()
        try:
            deadline = time.monotonic() + 10
            while len(proxy.router.engines()) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            key = issue_key(log, execution_id=f"{run}/e0", run_id=run, harness="claude-code")
            client = anthropic.Anthropic(base_url=proxy.base_url, api_key=key, max_retries=0)
            httpx.post(  # the pool engine's script is one answer ahead otherwise
                pool.base_url + "/generate",
                json={"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}},
            )
            pieces: list[str] = []

            def move_soon() -> None:
                while len("".join(pieces)) < 20:
                    time.sleep(0.005)
                log.append(
                    [
                        NewEvent(EngineRoutingChanged(engine=f"{run}:cell-0", accepting=False)),
                        NewEvent(ExecutionRerouted(execution_id=f"{run}/e0", run_id=run, engine="pool")),
                    ]
                )

            mover = threading.Thread(target=move_soon)
            mover.start()
            with client.messages.stream(
                model="gyre", max_tokens=1000, messages=[{"role": "user", "content": "explain"}]
            ) as stream:
                for piece in stream.text_stream:
                    pieces.append(piece)
                final = stream.get_final_message()
            mover.join(10)
            assert proxy.router.engine_for(f"{run}/e0").name == f"{run}:pool-0"
            assert proxy.spool.flush(30)
            return Moved("".join(pieces), final.stop_reason, proxy.pipeline.moved, proxy.pipeline.kv_migrated)
        finally:
            stop.set()
            follower.join(10)
