"""Streaming training on Megatron-core cells: each cell is a tensor-parallel group of two
processes, with real Redis and real PostgreSQL; the updates equal one process training each whole
batch with the same GPT at TP=1. Needs megatron-core (skipped loudly without it)."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
import torch
import torch.multiprocessing as mp

from gyre_proxy.engines.refengine import ModelSource, ReferenceEngineConfig, ReferenceEngineServer, free_port
from gyre_store import PostgresEventLog, iterate
from gyre_store.catalog import (
    CellRole,
    CellRoleChanged,
    ContributionAccepted,
    MicroStepClaimed,
    TrainingUpdate,
)
from gyre_train import InvalidConfigError
from gyre_train.backends import MegatronModelSpec, ModelSpec, OptimizerConfig, gpt2_config, to_gpt2
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    CellCluster,
    EnginePublisherConfig,
    MegatronCells,
    QueueConfig,
    RankLayout,
    RedisBatchBoard,
    RedisMicroStepQueue,
    SyntheticBatchConfig,
    cell_configs,
    enqueue_batch,
    synthetic_batch,
)
from gyre_train.objective import LossConfig
from tests.integration.train_stream.conftest import wait_for_members
from tests.integration.train_stream.gloo import gloo_world
from tests.real_servers import megatron_missing, require

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _megatron() -> None:
    require("megatron", megatron_missing())


SPEC_TORCH = ModelSpec(TINY_QWEN3)
PROMPT = [72, 101, 108, 108, 111, 44, 32]
DATA = SyntheticBatchConfig(groups=2, executions=3, max_rows=2, vocab_size=128)
# The vocabulary covers the reference engine's byte tokenizer, so an engine can serve it.
SPEC = MegatronModelSpec(vocab_size=320, hidden_size=32, seed=5)
# Unclipped SGD moves every weight by lr * g, so the weights after each update see the magnitude
# of every gradient applied so far (a clipped step would only see its direction).
OPTIMIZER = OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.0)  # lr 1: see the step check
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)


def _reference(
    rank: int, data: SyntheticBatchConfig, seed: int, batch_count: int, port: int, output: str
) -> None:
    """One process, TP=1: train each whole batch in turn; save the weights after each update and
    each update's batch gradient, loss and gradient norm."""
    from gyre_train.backends import MegatronBackend
    from gyre_train.cells import gradient_share, merge_shares, ratio_share

    with gloo_world(rank, 1, port), MegatronBackend(SPEC, OPTIMIZER) as backend:
        states, gradients, losses, norms = [backend.full_named_tensors()], [], [], []
        for b in range(batch_count):
            steps, executions = synthetic_batch(seed, b, data)
            # train_batch_locally, with the batch gradient kept before it is applied
            clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
            backend.zero_gradients()
            losses.append(sum(gradient_share(backend, s, clip, LOSS) for s in steps))
            gradients.append(backend.full_named_gradients())
            norms.append(backend.apply_update(backend.flat_gradients()))
            states.append(backend.full_named_tensors())
        torch.save({"states": states, "gradients": gradients, "losses": losses, "norms": norms}, output)


def _start_reference(data: SyntheticBatchConfig, seed: int, count: int, output: Path) -> mp.ProcessContext:
    context = mp.start_processes(
        _reference,
        args=(data, seed, count, free_port(), str(output)),
        nprocs=1,
        join=False,
        start_method="spawn",
    )
    assert context is not None
    return context


def _assert_updates_equal(
    reference: mp.ProcessContext, output: Path, updates: list[TrainingUpdate], count: int
) -> None:
    """Each update the core applied (grads-v<k>.pt), recorded (loss, grad_norm) and left behind
    (params-v<k>.pt) equals the TP=1 reference's.

    TP=2 splits each matmul's sums over two ranks and PP=2 sends activations between stages, so
    gradients differ from TP=1 by float32 rounding inside the model, not by summation order
    alone: the tolerances are measured. Worst seen (gradients up to 3.6e-3): gradients 1.4e-9
    apart, loss 1.6e-7 and norm 7e-8 relative, weights one float32 ulp apart (3.7e-9) after three
    updates; any wrong scale of a gradient moves values by a fraction of the gradient itself.
    """
    while not reference.join(timeout=240):
        pass
    saved = torch.load(output / "reference.pt")
    states = saved["states"]
    assert [u.policy_version for u in updates] == list(range(1, count + 1))
    for version, update in enumerate(updates, start=1):
        applied = torch.load(output / f"grads-v{version}.pt")
        expected_gradient = saved["gradients"][version - 1]
        assert applied.keys() == expected_gradient.keys()
        for name, gradient in expected_gradient.items():
            torch.testing.assert_close(
                applied[name], gradient, rtol=1e-4, atol=1e-8, msg=f"v{version} {name}"
            )
        assert update.loss == pytest.approx(saved["losses"][version - 1], rel=1e-6)
        assert update.grad_norm == pytest.approx(saved["norms"][version - 1], rel=1e-6)

        got = torch.load(output / f"params-v{version}.pt")
        expected = states[version]
        before = torch.load(output / f"params-v{version - 1}.pt") if version > 1 else states[0]
        assert got.keys() == expected.keys()
        moved = max(float((expected[n] - states[version - 1][n]).abs().max()) for n in expected)
        assert moved > 1e-4  # the update is not trivially zero (5,000x the tolerance)
        for name, tensor in expected.items():
            # The core stepped on what it applied: with lr 1, p - lr g is one float32 subtraction.
            assert torch.equal(got[name], before[name] - applied[name]), f"v{version} {name} step"
            torch.testing.assert_close(got[name], tensor, rtol=1e-6, atol=2e-8, msg=f"v{version} {name}")


def test_cells_on_the_cpu_refuse_nccl(redis_url: str) -> None:
    with pytest.raises(InvalidConfigError, match="cells over nccl train on a GPU"):
        cell_configs(cells=2, redis_url=redis_url, port=free_port(), model=SPEC_TORCH, dist_backend="nccl")


def test_rank_layout_follows_megatrons_order() -> None:
    layout = RankLayout(cells=3, cell=1, position=3, tensor_parallel_size=2, pipeline_parallel_size=2)
    assert layout.world == 12 and layout.size == 4
    # tensor rank fastest, then the cell (data parallel), then the pipeline stage
    assert [layout.rank_of(1, p) for p in range(4)] == [2, 3, 8, 9]
    assert [layout.rank_of(c, 0) for c in range(3)] == [0, 2, 4]
    assert layout.rank == 9 and not layout.leads
    with pytest.raises(InvalidConfigError):
        RankLayout(cells=2, cell=0, position=2, tensor_parallel_size=2)


def _gpt2_engine_folder(path: Path) -> Path:
    """A GPT-2 of SPEC's shape with arbitrary weights: what the engine serves before publication."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = gpt2_config(SPEC)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
    model.save_pretrained(str(path))
    return path


def _engine_logprobs(base_url: str) -> tuple[str, list[int], list[float]]:
    """The engine's weight version, and the tokens it samples greedily after PROMPT with their logprobs."""
    body = {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0.0, "ignore_eos": True}}  # fmt: skip
    meta = httpx.post(f"{base_url}/generate", json=body, timeout=60).json()["meta_info"]
    entries = meta["output_token_logprobs"]
    return str(meta["weight_version"]), [int(e[1]) for e in entries], [float(e[0]) for e in entries]


def _gpt2_logprobs(state: dict[str, torch.Tensor], output: list[int]) -> list[float]:
    """log p(output[i] | PROMPT + output[:i]) under the GPT-2 export of a Megatron state."""
    from transformers import AutoConfig, AutoModelForCausalLM

    exported = to_gpt2(SPEC, state)
    values = dict(exported.config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(values.pop("model_type"), **values))
    model.load_state_dict(exported.state)
    ids = torch.tensor([PROMPT + output])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(logprobs[len(PROMPT) - 1 + i, t]) for i, t in enumerate(output)]


@pytest.mark.parametrize(
    "layout", [MegatronCells(SPEC, tensor_parallel_size=2), MegatronCells(SPEC, pipeline_parallel_size=2)],
    ids=["tp2", "pp2"],
)  # fmt: skip
def test_megatron_cells_with_a_joining_satellite_equal_one_process_and_publish(
    layout: MegatronCells, redis_client: redis.Redis, prefix: str, redis_url: str, pg_log: PostgresEventLog,
    database_url: str,
) -> None:  # fmt: skip
    rng = np.random.default_rng(3)
    batches = [synthetic_batch(11, b, DATA) for b in range(3)]
    sizes = {b: len(steps) for b, (steps, _) in enumerate(batches)}
    # Burst 1: the satellite joins batch 0 at a random claim and stays for batch 1 (it receives
    # the broadcast after the non-final update). Burst 2: it rejoins and pulls the snapshot.
    bursts = [
        BurstPlan(batches=(0, 1), joins={1: (0, int(rng.integers(0, sizes[0])))}),
        BurstPlan(batches=(2,), joins={1: (0, int(rng.integers(0, sizes[2])))}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        reference = _start_reference(DATA, 11, len(batches), output / "reference.pt")
        engine_config = ReferenceEngineConfig(source=ModelSource(model_dir=_gpt2_engine_folder(output / "e")))
        with ReferenceEngineServer(engine_config) as engine:
            configs = cell_configs(
                cells=2, redis_url=redis_url, port=free_port(), model=layout, prefix=prefix,
                optimizer=OPTIMIZER, loss=LOSS, output_dir=output, database_url=database_url,
                engines=EnginePublisherConfig((engine.base_url,), "disk", output / "published"),
            )  # fmt: skip
            assert len(configs) == 4 and [c.position for c in configs] == [0, 0, 1, 1]
            with CellCluster(configs, bursts) as cluster:
                for b, (steps, executions) in enumerate(batches):
                    queue = RedisMicroStepQueue(redis_client, configs[0].queue, b)
                    enqueue_batch(queue, steps, executions, 0.02)
                cluster.wait(timeout_s=240)
            version, output_ids, served = _engine_logprobs(engine.base_url)
        events = [e.event for e in iterate(pg_log)]
        updates = [e for e in events if isinstance(e, TrainingUpdate)]
        _assert_updates_equal(reference, output, updates, len(batches))
        final = torch.load(output / "reference.pt")["states"][len(batches)]
    # The engine serves the last publication (version 3) as the GPT-2 export of Megatron's weights.
    assert version == "3" and len(served) == 4
    expected = _gpt2_logprobs(final, output_ids)
    assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-4

    contributions = [e for e in events if isinstance(e, ContributionAccepted)]
    seen = Counter((e.batch, e.micro_step) for e in contributions)
    assert seen == Counter({(b, m): 1 for b, n in sizes.items() for m in range(n)})
    assert {e.cell for e in contributions} == {0, 1}  # the satellite's gradients entered updates
    claimed_by = Counter(e.cell for e in events if isinstance(e, MicroStepClaimed))
    assert claimed_by[0] > 0 and claimed_by[1] > 0  # only leaders claim: two cells, not four ranks
    assert set(claimed_by) == {0, 1}
    assert [(u.policy_version, u.final) for u in updates] == [(1, False), (2, True), (3, True)]
    roles = [(e.cell_index, e.role) for e in events if isinstance(e, CellRoleChanged)]
    assert roles.count((1, CellRole.TRAINING)) == 2  # the satellite joined both bursts


def test_a_megatron_satellite_killed_mid_batch_leaves_the_update_equal(
    redis_client: redis.Redis, prefix: str, redis_url: str, pg_log: PostgresEventLog, database_url: str
) -> None:
    data = dataclasses.replace(DATA, groups=12)
    steps, executions = synthetic_batch(5, 0, data)
    # Longer than a Megatron micro-step on a loaded machine, or live claims would look dead.
    queue_config = QueueConfig(prefix, claim_timeout_s=3.0)
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        reference = _start_reference(data, 5, 1, output / "reference.pt")
        configs = cell_configs(
            cells=3, redis_url=redis_url, port=free_port(), model=MegatronCells(SPEC, tensor_parallel_size=2),
            queue=queue_config, optimizer=OPTIMIZER, loss=LOSS, output_dir=output, database_url=database_url,
        )  # fmt: skip
        # Satellite 2 is slowed down most, so it is caught holding gradient claims.
        configs = [dataclasses.replace(c, step_delay_s=0.3 if c.cell == 2 else 0.1) for c in configs]
        queue = RedisMicroStepQueue(redis_client, queue_config, 0)
        with CellCluster(configs, [BurstPlan(batches=(0,), joins={1: (0, 0), 2: (0, 0)})]) as cluster:
            wait_for_members(RedisBatchBoard(redis_client, queue_config), 0, {1, 2})
            enqueue_batch(queue, steps, executions)
            deadline = time.monotonic() + 150
            while sum(c.cell == 2 for c in queue.pending() if queue.clip() is not None) < 2:
                assert time.monotonic() < deadline, (
                    f"satellite 2 never held two gradient claims: {queue.pending()}"
                )
                time.sleep(0.005)
            cluster.kill(2)  # both of its processes
            cluster.wait(timeout_s=240)
        events = [e.event for e in iterate(pg_log)]
        _assert_updates_equal(reference, output, [e for e in events if isinstance(e, TrainingUpdate)], 1)
    contributions = [e for e in events if isinstance(e, ContributionAccepted)]
    assert Counter(e.micro_step for e in contributions) == Counter(range(len(steps)))
    assert 2 not in {e.cell for e in contributions}  # the dead cell's gradients never entered
    update = next(e for e in events if isinstance(e, TrainingUpdate))
    assert update.cells == [0, 1] and update.micro_steps == len(steps)
