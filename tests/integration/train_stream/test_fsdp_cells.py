"""FSDP cells: a cell of two gloo processes, each holding half of a Qwen3's weights, gradients and
optimizer state, trains like one unsharded process on the same checkpoint and batches.

Unclipped SGD with lr 1 moves every weight by the whole gradient, so the weights after several
updates see the magnitude of every gradient applied (a wrong scale, such as dividing by the
world size twice, moves them by half a gradient). Also: bfloat16 compute against float32, and
FSDP cells with a satellite that joins a batch in flight, with real Redis and PostgreSQL.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import redis
import torch
import torch.multiprocessing as mp

from gyre_proxy.engines.refengine import free_port
from gyre_store import PostgresEventLog, iterate
from gyre_store.catalog import ContributionAccepted, MicroStepClaimed, TrainingUpdate
from gyre_train import InvalidConfigError
from gyre_train.backends import FsdpBackend, ModelSpec, OptimizerConfig, TorchBackend, TorchTraining
from gyre_train.backends.pytorch import build_model
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    CellCluster,
    RedisMicroStepQueue,
    SyntheticBatchConfig,
    TorchCells,
    cell_configs,
    enqueue_batch,
    gradient_share,
    merge_shares,
    ratio_share,
    synthetic_batch,
)
from gyre_train.objective import LossConfig
from tests.integration.train_stream.gloo import gloo_world, leave_together

pytestmark = pytest.mark.timeout(300)

SPEC = ModelSpec(TINY_QWEN3, seed=7)
DATA = SyntheticBatchConfig(groups=2, executions=3, max_rows=2, vocab_size=512)
OPTIMIZER = OptimizerConfig(kind="sgd", lr=1.0, max_grad_norm=0.0)  # unclipped: see the docstring
LOSS = LossConfig(clip_low=0.01, clip_high=100.0)
SEED, BATCHES = 11, 3
FSDP = TorchTraining(shard="fsdp", ranks=2)


def _train(backend: TorchBackend, batches: int) -> dict[str, list[object]]:
    """Train each whole batch in turn as one cell: losses, gradient norms, the applied batch
    gradients and the weights after each update, all whole (gathered for FSDP)."""
    gather = isinstance(backend, FsdpBackend)

    def weights() -> dict[str, torch.Tensor]:  # copies: the unsharded ones are the live tensors
        return (
            backend.full_named_tensors()
            if gather
            else {n: t.clone() for n, t in backend.named_tensors().items()}
        )

    states: list[object] = [weights()]
    losses: list[object] = []
    norms: list[object] = []
    gradients: list[object] = []
    for b in range(batches):
        steps, executions = synthetic_batch(SEED, b, DATA)
        clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
        backend.zero_gradients()
        losses.append(sum(gradient_share(backend, s, clip, LOSS) for s in steps))
        flat = backend.flat_gradients()
        if gather:
            gradients.append(backend.full_named_of(flat))
        else:
            named = [(n, p) for n, p in backend.model.named_parameters() if p.requires_grad]
            pieces = flat.split([p.numel() for _, p in named])
            gradients.append({n: g.view_as(p).clone() for (n, p), g in zip(named, pieces, strict=True)})
        norms.append(backend.apply_update(flat))
        states.append(weights())
    return {"states": states, "losses": losses, "norms": norms, "gradients": gradients}


def _fsdp_rank(rank: int, training: TorchTraining, port: int, output: str, spec: ModelSpec = SPEC) -> None:
    with gloo_world(rank, 2, port):
        if spec.model_dir is None:
            backend = FsdpBackend(spec, OPTIMIZER, training, group=torch.distributed.group.WORLD)
        else:  # loaded shard by shard: the model is never built whole
            with mock.patch(
                "gyre_train.backends.fsdp.build_model", side_effect=AssertionError("built whole")
            ):
                backend = FsdpBackend(spec, OPTIMIZER, training, group=torch.distributed.group.WORLD)
            held = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in backend._locals()}
            whole = sum(p.numel() * 4 for p in backend.model.parameters())  # a DTensor's numel is global
            assert sum(held.values()) <= whole // 2 + 4096, (sum(held.values()), whole)  # padding
        assert backend.numel < sum(t.numel() for t in backend.named_tensors().values())  # a shard
        result = _train(backend, BATCHES)
        if rank == 0:
            torch.save(result, output)
        leave_together()  # see its docstring


def _fsdp(training: TorchTraining, output: Path, spec: ModelSpec = SPEC) -> dict[str, list[object]]:
    mp.start_processes(
        _fsdp_rank, args=(training, free_port(), str(output), spec), nprocs=2, start_method="spawn"
    )
    saved: dict[str, list[object]] = torch.load(output)
    return saved


@pytest.fixture(scope="module")
def unsharded() -> dict[str, list[object]]:
    torch.set_num_threads(1)
    return _train(TorchBackend(SPEC, OPTIMIZER), BATCHES)


def _close(got: object, expected: object, rtol: float, atol: float, what: str) -> None:
    assert isinstance(got, dict) and isinstance(expected, dict)
    assert got.keys() == expected.keys(), what
    for name, tensor in expected.items():
        torch.testing.assert_close(got[name], tensor, rtol=rtol, atol=atol, msg=f"{what} {name}")


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_an_fsdp_cell_of_two_ranks_equals_the_unsharded_update(
    checkpointing: bool, unsharded: dict[str, list[object]], tmp_path: Path
) -> None:
    """Both ranks compute each micro-step on the same weights with the same kernels and the
    reduce-scatter averages two identical float32 gradients (exact for a power of two); the
    embeddings and the head are split by vocabulary rows, so the head's log partition and the
    hidden states' gradient are summed over the ranks in another order than whole. Measured over
    three steps: losses 1e-7 relative apart, gradients at most 7e-10 apart (they reach 1.3e-3),
    weights at most 3.7e-9 (steps reach 1.3e-3); the norm, summed in float64 over the shards
    and in float32 whole, 1.7e-6 relative. A wrong scale is off by a fraction of the gradient,
    far outside these bounds."""
    got = _fsdp(_fsdp_training(checkpointing), tmp_path / "fsdp.pt")
    for b in range(BATCHES):
        assert got["losses"][b] == pytest.approx(unsharded["losses"][b], rel=1e-6)
        assert got["norms"][b] == pytest.approx(unsharded["norms"][b], rel=1e-5)
        _close(got["gradients"][b], unsharded["gradients"][b], 1e-6, 1e-10, f"gradient {b}")
        _close(got["states"][b + 1], unsharded["states"][b + 1], 1e-6, 1e-10, f"weights after {b + 1}")
    moved = max(
        float((unsharded["states"][BATCHES][n] - unsharded["states"][0][n]).abs().max())  # type: ignore[index]
        for n in unsharded["states"][0]  # type: ignore[attr-defined]
    )
    assert moved > 1e-3  # the updates are not trivially zero


def test_an_fsdp_cell_loads_a_checkpoint_shard_by_shard(
    unsharded: dict[str, list[object]], tmp_path: Path
) -> None:
    """A safetensors checkpoint is read a tensor at a time into each rank's shard (the model
    built on the meta device, never whole: `build_model` fails if called, and each rank's
    parameter storage is half the model). The checkpoint is SPEC's seeded model, so the cell
    trains like the unsharded process built from SPEC: its weights before the first update and
    after each, its losses and its gradients (the rotary table, a buffer computed
    rather than read, enters every logprob): the weights as loaded bitwise, then within the
    bounds of the test above."""
    folder = tmp_path / "checkpoint"
    build_model(SPEC).save_pretrained(str(folder))
    got = _fsdp(FSDP, tmp_path / "loaded.pt", dataclasses.replace(SPEC, config={}, model_dir=folder))
    _close(got["states"][0], unsharded["states"][0], 0.0, 0.0, "weights as loaded")
    for b in range(BATCHES):
        assert got["losses"][b] == pytest.approx(unsharded["losses"][b], rel=1e-6)
        _close(got["gradients"][b], unsharded["gradients"][b], 1e-6, 1e-10, f"gradient {b}")
        _close(got["states"][b + 1], unsharded["states"][b + 1], 1e-6, 1e-10, f"weights after {b + 1}")


def test_a_checkpoint_missing_a_weight_is_refused_by_name(tmp_path: Path) -> None:
    """A folder whose safetensors lack a parameter its config asks for: a one-line error naming
    it, raised on every rank before anything trains."""
    folder = tmp_path / "checkpoint"
    model = build_model(SPEC)
    state = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}
    model.save_pretrained(str(folder), state_dict=state)
    spec = dataclasses.replace(SPEC, config={}, model_dir=folder)
    mp.start_processes(_refused_rank, args=(spec, free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    for r in range(2):
        assert (
            (tmp_path / f"refused.{r}")
            .read_text()
            .endswith(": the checkpoint holds no lm_head.weight (1 missing)")
        )


def _refused_rank(rank: int, spec: ModelSpec, port: int, folder: str) -> None:
    with gloo_world(rank, 2, port):
        try:
            FsdpBackend(spec, OPTIMIZER, FSDP, group=torch.distributed.group.WORLD)
        except InvalidConfigError as exc:
            Path(folder, f"refused.{rank}").write_text(str(exc))
        leave_together()


def _fsdp_training(checkpointing: bool, dtype: str = "float32") -> TorchTraining:
    return TorchTraining(shard="fsdp", ranks=2, dtype=dtype, activation_checkpointing=checkpointing)


def test_bfloat16_fsdp_tracks_float32_within_bfloat16_rounding(
    unsharded: dict[str, list[object]], tmp_path: Path
) -> None:
    """bfloat16 keeps 8 significant bits (rounding up to 2^-9 = 0.2% relative per op); the loss
    is a mean over many tokens, so its roundings mostly cancel, while each gradient element
    carries them. Measured over three steps: loss 1.7e-4 and gradient norm 1.1e-3 relative,
    weights 0.85% of the total step apart. The bounds are about ten times those. The weights
    stay float32 masters: they differ by a fraction of the step, never by bfloat16's rounding
    of a weight itself (2^-9 of it, which would be far larger than a step of 1e-3)."""
    got = _fsdp(_fsdp_training(False, "bfloat16"), tmp_path / "bf16.pt")
    for b in range(BATCHES):
        assert got["losses"][b] == pytest.approx(unsharded["losses"][b], rel=2e-3)
        assert got["norms"][b] == pytest.approx(unsharded["norms"][b], rel=1e-2)
    final, start = got["states"][BATCHES], unsharded["states"][0]
    expected = unsharded["states"][BATCHES]
    assert isinstance(final, dict) and isinstance(start, dict) and isinstance(expected, dict)
    step = max(float((tensor - start[name]).abs().max()) for name, tensor in expected.items())
    for name, tensor in expected.items():
        assert float((final[name] - tensor).abs().max()) <= 0.08 * step, name


def test_fsdp_config_errors_are_one_line() -> None:
    with pytest.raises(InvalidConfigError, match="at least 2 ranks"):
        TorchTraining(shard="fsdp", ranks=1)
    with pytest.raises(InvalidConfigError, match="dtype must be one of"):
        TorchTraining(dtype="float16")
    with pytest.raises(InvalidConfigError, match="shard must be one of"):
        TorchTraining(shard="zero3")
    with pytest.raises(InvalidConfigError, match="needs its cell's process group"):
        FsdpBackend(SPEC, OPTIMIZER, FSDP)


def test_fsdp_cells_with_a_joining_satellite_equal_one_process(
    unsharded: dict[str, list[object]], redis_client: redis.Redis, prefix: str, redis_url: str,
    pg_log: PostgresEventLog, database_url: str,
) -> None:  # fmt: skip
    """Two FSDP cells of two ranks each: the satellite joins batch 0 at a random claim and stays
    for batch 1 (the broadcast of shards), then rejoins for batch 2 (the snapshot pull)."""
    rng = np.random.default_rng(3)
    sizes = {b: len(synthetic_batch(SEED, b, DATA)[0]) for b in range(BATCHES)}
    bursts = [
        BurstPlan(batches=(0, 1), joins={1: (0, int(rng.integers(0, sizes[0])))}),
        BurstPlan(batches=(2,), joins={1: (0, int(rng.integers(0, sizes[2])))}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        configs = cell_configs(
            cells=2, redis_url=redis_url, port=free_port(), model=TorchCells(SPEC, FSDP), prefix=prefix,
            optimizer=OPTIMIZER, loss=LOSS, output_dir=output, database_url=database_url,
        )  # fmt: skip
        assert [(c.cell, c.position) for c in configs] == [(0, 0), (1, 0), (0, 1), (1, 1)]
        with CellCluster(configs, bursts) as cluster:
            for b in range(BATCHES):
                steps, executions = synthetic_batch(SEED, b, DATA)
                enqueue_batch(RedisMicroStepQueue(redis_client, configs[0].queue, b), steps, executions, 0.02)
            cluster.wait(timeout_s=240)
        events = [e.event for e in iterate(pg_log)]
        updates = [e for e in events if isinstance(e, TrainingUpdate)]
        assert [u.policy_version for u in updates] == [1, 2, 3]
        for b, update in enumerate(updates):
            # Summed in another order over cells than in one process: float32 rounding only.
            assert update.loss == pytest.approx(unsharded["losses"][b], rel=1e-5)
            assert update.grad_norm == pytest.approx(unsharded["norms"][b], rel=1e-5)
            _close(torch.load(output / f"grads-v{b + 1}.pt"), unsharded["gradients"][b], 1e-4, 1e-8, f"g{b}")
            _close(
                torch.load(output / f"params-v{b + 1}.pt"), unsharded["states"][b + 1], 1e-5, 1e-7, f"w{b}"
            )
    contributions = [e for e in events if isinstance(e, ContributionAccepted)]
    assert Counter((e.batch, e.micro_step) for e in contributions) == Counter(
        {(b, m): 1 for b, n in sizes.items() for m in range(n)}
    )  # each micro-step counted once
    assert {e.cell for e in contributions} == {0, 1}  # the satellite's gradients entered updates
    assert set(Counter(e.cell for e in events if isinstance(e, MicroStepClaimed))) == {0, 1}  # leaders claim


ADAMW = OptimizerConfig(kind="adamw", lr=1e-2, max_grad_norm=0.0)


def _one_batch(backend: TorchBackend, b: int) -> None:
    steps, executions = synthetic_batch(SEED, b, DATA)
    clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
    backend.zero_gradients()
    for s in steps:
        gradient_share(backend, s, clip, LOSS)
    backend.apply_update(backend.flat_gradients())


def _resume_rank(rank: int, port: int, folder: str) -> None:
    state = Path(folder) / "adamw.pt"
    with gloo_world(rank, 2, port):
        first = FsdpBackend(SPEC, ADAMW, FSDP, group=torch.distributed.group.WORLD)
        _one_batch(first, 0)
        first.save_training_state(state)  # gathered whole, written by rank 0
        weights = Path(folder) / "after-0"
        first.save(weights)
        torch.distributed.barrier()
        spec = ModelSpec({}, model_dir=weights)
        resumed = FsdpBackend(spec, dataclasses.replace(ADAMW, state_path=state), FSDP, group=first.group)
        _one_batch(resumed, 1)
        final = resumed.full_named_tensors()
        if rank == 0:
            torch.save(final, Path(folder) / "final.pt")
        leave_together()


def test_a_resumed_fsdp_core_goes_on_from_its_gathered_adamw_state(tmp_path: Path) -> None:
    """The moments an FSDP core keeps are gathered whole, in the unsharded optimizer's layout;
    a resumed FSDP core shards them again. One batch, a restart from the saved weights and
    state, a second batch: the weights equal one unsharded AdamW that never stopped, up to
    float32 rounding. AdamW divides each gradient by its own root mean square plus 1e-8, so a
    gradient near 0 carries a rounding of 1e-12 (the vocabulary-parallel head sums over the
    ranks in another order) into its step magnified a million times: measured, 6.2e-6 at most
    (lr 1e-2). Without the state, AdamW's first step after the restart would move every weight
    by about lr, 200 times the bound."""
    reference = TorchBackend(SPEC, ADAMW)
    _one_batch(reference, 0)
    _one_batch(reference, 1)
    mp.start_processes(_resume_rank, args=(free_port(), str(tmp_path)), nprocs=2, start_method="spawn")
    final = torch.load(tmp_path / "final.pt")
    _close(final, reference.named_tensors(), 1e-5, 5e-5, "after the resumed batch")
    # The kept state is the unsharded layout: an unsharded core resumes from it too.
    assert (
        torch.load(tmp_path / "adamw.pt")["state"][0]["exp_avg"].shape
        == next(reference.model.parameters()).shape
    )


def _vocabulary_rank(rank: int, port: int, output: str) -> None:
    """Rank `rank`'s vocabulary-parallel embeddings and head on its rows of a 37-word table (19
    and 18 rows: uneven), against the same lookups and head on the whole table."""
    from torch.distributed.device_mesh import DeviceMesh

    from gyre_train.backends.fsdp import _ShardedEmbeddingModule, _ShardedHead, _vocabulary_parallel

    with gloo_world(rank, 2, port):
        group = torch.distributed.group.WORLD
        mesh = DeviceMesh.from_group(group, device_type="cpu")
        torch.manual_seed(5)
        whole_embeddings = torch.nn.Embedding(37, 8, padding_idx=3)
        whole_head = torch.nn.Linear(8, 37, bias=False)
        ids = torch.tensor([3, 0, 36, 18, 19, 3, 7, 30])  # the padding id, both ends of each half
        targets = torch.tensor([36, 0, 18, 19, 3, 12, 25, 1])
        downstream = torch.randn(8, 8)  # a loss that reads every hidden value: sum(h * d)

        def run(embeddings: torch.nn.Module, head: torch.nn.Module) -> dict[str, torch.Tensor]:
            hidden = embeddings(ids)
            mixed = torch.tanh(hidden @ downstream)  # the "body": every position's gradient differs
            picked = head(mixed, targets) if isinstance(head, _ShardedHead) else _whole_head(head, mixed)
            (picked * torch.arange(1.0, 9.0)).sum().backward()
            return {"hidden": hidden.detach(), "picked": picked.detach()}

        expected = run(whole_embeddings, whole_head)
        expected |= {"embeddings": whole_embeddings.weight.grad, "head": whole_head.weight.grad}  # type: ignore[dict-item]
        embeddings, head = torch.nn.Embedding(37, 8, padding_idx=3), torch.nn.Linear(8, 37, bias=False)
        embeddings.load_state_dict(whole_embeddings.state_dict())
        head.load_state_dict(whole_head.state_dict())
        e = _vocabulary_parallel(embeddings, _ShardedEmbeddingModule, mesh, group, torch.float32)
        h = _vocabulary_parallel(head, _ShardedHead, mesh, group, torch.float32)
        got = run(embeddings, head)
        rows = slice(0, 19) if rank == 0 else slice(19, 37)
        for name, param in (("embeddings", e), ("head", h)):
            local = param.to_local()  # type: ignore[attr-defined]
            assert local.shape[0] == rows.stop - rows.start
            got[name] = param.grad.to_local()  # type: ignore[union-attr]
            expected[name] = expected[name][rows]
        torch.save({"got": got, "expected": expected}, f"{output}.{rank}")
        leave_together()


def _whole_head(head: torch.nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    from gyre_train.objective.logprobs import target_logprobs

    return target_logprobs(hidden, head.weight, torch.tensor([36, 0, 18, 19, 3, 12, 25, 1]))


def test_vocabulary_parallel_embeddings_and_head_equal_the_whole_table(tmp_path: Path) -> None:
    """The embeddings and the head of an FSDP cell are split by vocabulary rows and never
    gathered. On two ranks of an uneven 37-word table with a padding id: the looked-up hidden
    states, the head's logprobs and both tables' gradients (each rank its own rows) equal the
    whole table's, the padding row's gradient included (none)."""
    out = tmp_path / "vocabulary"
    mp.start_processes(_vocabulary_rank, args=(free_port(), str(out)), nprocs=2, start_method="spawn")
    for rank in range(2):
        saved = torch.load(f"{out}.{rank}")
        got, expected = saved["got"], saved["expected"]
        for name in ("hidden", "picked", "embeddings", "head"):
            torch.testing.assert_close(got[name], expected[name], rtol=1e-6, atol=1e-7, msg=name)
            assert float(expected[name].abs().max()) > 1e-2, name  # not trivially zero
    padding_rows = torch.load(f"{out}.0")["got"]["embeddings"][3]
    assert float(padding_rows.abs().max()) == 0.0  # id 3 is rank 0's, and padding


def _rows_rank(rank: int, port: int, output: str) -> None:
    with gloo_world(rank, 2, port):
        backend = FsdpBackend(SPEC, OPTIMIZER, FSDP, group=torch.distributed.group.WORLD)
        steps, executions = synthetic_batch(SEED, 0, DATA)
        step = max(steps, key=lambda s: len(s.row_starts))
        clip = merge_shares((ratio_share(backend, s) for s in steps), executions, LOSS)
        calls: list[tuple[bool, int]] = []
        logprobs = backend.logprobs

        def counted(s: object, *, grad: bool) -> torch.Tensor:
            calls.append((grad, len(s.row_starts) - 1))  # type: ignore[attr-defined]
            return logprobs(s, grad=grad)  # type: ignore[arg-type]

        backend.logprobs = counted  # type: ignore[method-assign]
        loss = gradient_share(backend, step, clip, LOSS)
        rows_with_targets = sum(
            bool((step.target_mask[a:b] & (step.position_ids[a:b] > 0)).any())
            for a, b in zip(step.row_starts[:-1], step.row_starts[1:], strict=True)
        )
        accumulated = torch.cat([p.grad.to_local().reshape(-1) for p in backend._params])  # type: ignore[union-attr]
        flat = backend.flat_gradients()
        start, end = flat.data_ptr(), flat.data_ptr() + flat.numel() * flat.element_size()
        inside = [start <= p.grad.to_local().data_ptr() < end for p in backend._params]  # type: ignore[union-attr]
        if rank == 0:
            torch.save({"calls": calls, "rows": len(step.row_starts) - 1, "targets": rows_with_targets,
                        "loss": loss, "equal": torch.equal(flat, accumulated), "inside": inside,
                        "nonzero": int((flat != 0).sum())}, output)  # fmt: skip
        leave_together()


@pytest.fixture(scope="module")
def one_micro_step(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Two FSDP ranks run the micro-step of batch 0 with the most rows, then take its flat
    gradient; rank 0's record of what happened."""
    out = tmp_path_factory.mktemp("rows") / "rows.pt"
    mp.start_processes(_rows_rank, args=(free_port(), str(out)), nprocs=2, start_method="spawn")
    saved: dict[str, object] = torch.load(out)
    return saved


def test_an_fsdp_micro_step_back_propagates_row_by_row(one_micro_step: dict[str, object]) -> None:
    """The body runs once per row, so one backward over every row would hold each layer's whole
    gradient until its last row: the FSDP backend takes the loss on logprobs without a graph,
    then runs each row with targets forward and back on its own (each layer's gradient is
    reduce-scattered once per row). Its loss and gradients equal the unsharded process's (the
    equivalence tests above); here, that it does so: one pass without a graph over the whole
    step, then one pass with a graph per row with targets, each of one row."""
    saved = one_micro_step
    assert isinstance(saved["rows"], int) and isinstance(saved["targets"], int)
    assert saved["rows"] >= 2 and saved["targets"] >= 2, saved
    assert saved["calls"] == [(False, saved["rows"])] + [(True, 1)] * saved["targets"]


def test_the_flat_gradient_of_an_fsdp_rank_is_where_its_gradients_live(
    one_micro_step: dict[str, object],
) -> None:
    """`flat_gradients` moves each parameter's accumulated gradient into the vector it returns
    and leaves a view of it in its place, so the shard gradient is never held twice: the vector
    equals the gradients as accumulated, and every gradient afterwards lies inside it."""
    assert one_micro_step["equal"] is True
    inside = one_micro_step["inside"]
    assert isinstance(inside, list) and len(inside) > 2 and all(inside), inside
    assert isinstance(one_micro_step["nonzero"], int) and one_micro_step["nonzero"] > 1000
