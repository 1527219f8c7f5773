"""A live run's SGLang engines, on real SGLang servers (CPU): started on the run's policy in a
process group of their own, registered with their capacity and the version they serve, given
every publication at once by each method, and gone with every process they spawned once
stopped. Fails (does not skip) when SGLang's environment is not built, like the contract suite."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from gyre_proxy.engines import EngineClient, EngineClientConfig, SamplingConfig
from gyre_proxy.engines.refengine import ModelSource, load_model, save_model_dir
from gyre_store import EngineRegistered, InMemoryEventLog, NewEvent
from gyre_tools.run_config import sglang_missing, sglang_serve_command
from gyre_train.cells import LivePublisher
from gyre_train.cells.live import PUBLICATIONS_FILE
from gyre_train.cells.rollout import RolloutEngine, RolloutEngineConfig
from tests.real_servers import require

pytestmark = [pytest.mark.integration, pytest.mark.sglang, pytest.mark.timeout(900)]

PROMPT = [257, 72, 105, 258, 257, 40, 41]


class Weights:
    """A `PublishableModel` over a Hugging Face model."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {n: t.detach() for n, t in self.model.state_dict().items()}

    def save(self, path: Path) -> Path:
        return save_model_dir(self.model, path)


@torch.no_grad()
def perturbed(model: torch.nn.Module, seed: int) -> Weights:
    other = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for parameter in other.parameters():
        parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    return Weights(other)


def served_version(url: str) -> str | None:
    async def ask() -> str | None:
        async with EngineClient(EngineClientConfig(url, timeout_s=120)) as engine:
            result = await engine.generate(PROMPT, SamplingConfig(max_new_tokens=2, temperature=0.0))
            return result.weight_version

    return asyncio.run(ask())


def group_alive(pgid: int) -> list[str]:
    """The processes of group ``pgid`` that are not zombies."""
    out = subprocess.run(["ps", "-o", "stat=,cmd=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip() and not line.strip().startswith("Z")]


def test_sglang_engines_start_register_take_every_publication_at_once_and_stop(tmp_path: Path) -> None:
    require("sglang", sglang_missing())
    model = load_model(ModelSource(seed=0)).model
    initial = save_model_dir(model, tmp_path / "initial")
    log = InMemoryEventLog()
    engines = [
        RolloutEngine(
            RolloutEngineConfig(
                run_id="run", engine=f"run:pool-{i}", cell_index=-1, capacity=3 + i, database_url="",
                initial_model=initial, publish_dir=tmp_path / "policies", max_context=1024,
                kind="sglang", sglang_command=sglang_serve_command(), log_dir=tmp_path / "logs",
            ),
            log,
        )
        for i in range(2)
    ]  # fmt: skip
    try:
        with ThreadPoolExecutor(2) as pool:  # both start together, as a node's engine processes do
            list(pool.map(lambda engine: engine.start(), engines))
        registered = [r.event for r in log.read(0) if isinstance(r.event, EngineRegistered)]
        assert sorted((e.engine, e.capacity) for e in registered) == [("run:pool-0", 3), ("run:pool-1", 4)]
        urls = [engine.base_url for engine in engines]
        assert all(url is not None for url in urls)
        assert [served_version(url) for url in urls if url] == ["0", "0"]  # the run's starting policy

        (tmp_path / "policies").mkdir()
        for version, method in ((1, "disk"), (2, "tensor"), (3, "distributed")):
            publisher = LivePublisher(log, "run", tmp_path / "policies", method=method, timeout_s=300)
            try:
                publisher.publish(perturbed(model, version), version)
                # Recorded as the core records it (what a starting engine reads its version from).
                log.append([NewEvent(publisher.publication_event(version, version - 1))])
            finally:
                publisher.close()
            assert [served_version(url) for url in urls if url] == [str(version)] * 2, method
            assert publisher.publications[0].skipped == [] and publisher.publications[0].note == ""
        lines = [json.loads(x) for x in (tmp_path / "policies" / PUBLICATIONS_FILE).read_text().splitlines()]
        assert [(x["version"], x["method"], sorted(x["engines"])) for x in lines] == [
            (v, m, ["run:pool-0", "run:pool-1"]) for v, m in ((1, "disk"), (2, "tensor"), (3, "distributed"))
        ]

        # A cell's move to training ends its server; its return starts a new one on the newest
        # policy (what elastic and colocate do with an SGLang engine), registered again.
        released = engines[1].server_pid
        engines[1].stop()
        assert not engines[1].alive() and engines[1].base_url is None
        time.sleep(1)
        assert released is not None and group_alive(released) == [], "the released server's processes live on"
        engines[1].start()
        again = [r.event for r in log.read(0) if isinstance(r.event, EngineRegistered)]
        assert [e.engine for e in again].count("run:pool-1") == 2
        assert engines[1].base_url is not None and served_version(engines[1].base_url) == "3"

        # A server that dies is noticed (its rollout process then exits, and the node agent
        # starts it again).
        pgid = engines[0].server_pid
        assert pgid is not None and engines[0].alive()
        os.killpg(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while engines[0].alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not engines[0].alive()
    finally:
        groups = [pid for engine in engines if (pid := engine.server_pid) is not None]
        for engine in engines:
            engine.stop()
    time.sleep(1)
    for pgid in groups:
        assert group_alive(pgid) == [], f"process group {pgid} outlived its engine"
