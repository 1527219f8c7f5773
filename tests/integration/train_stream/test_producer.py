"""Cells trained from the trajectory database: recorded executions become evaluated groups, the
stream packing buffer feeds them to the claim queue as they become ready (the cells pause while
the second group is still being evaluated), and the update equals one process training the same
micro-steps. Real PostgreSQL, real Redis, real cell processes."""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from gyre_proxy.engines.refengine import free_port
from gyre_store import PostgresEventLog, PostgresProjectionStore, iterate
from gyre_store.catalog import (
    GroupConsumed,
    ModelCallRecorded,
    Provenance,
    TitoArrays,
    TrainingUpdate,
    new_record,
)
from gyre_train import (
    AdmissionConfig,
    CallableEvaluator,
    EvaluationConfig,
    EvaluationRunner,
    GroupSourceConfig,
    PackingConfig,
    PreservedState,
    ProducerTimeoutError,
    StoreGroupSource,
)
from gyre_train.backends import ModelSpec, OptimizerConfig
from gyre_train.cells import (
    TINY_QWEN3,
    BurstPlan,
    CellCluster,
    ProducerConfig,
    RedisMicroStepQueue,
    cell_configs,
    stream_batch,
)
from gyre_train.trajectories import MicroStep
from tests.integration.train_stream.magnitudes import check_updates
from tests.unit.train.runs import dispatch_group, finish, projections, start

RUN = "producer-run"
SPEC = ModelSpec(TINY_QWEN3, seed=4)
# Unclipped (the batch gradient norm is about 1.1): the first AdamW step is then g / (|g| + eps)
# per weight, whose sensitivity to summation order magnitudes.py bounds.
OPTIMIZER = OptimizerConfig(lr=1e-2, max_grad_norm=0.0)
SCORES = {"p-a": 1.0, "p-b": 0.0, "p-c": 0.2, "p-d": 0.9}
GROUPS = {"p-g0": ("p-a", "p-b"), "p-g1": ("p-c", "p-d")}
PACKING = PackingConfig(token_budget=48, groups_per_batch=2, executions_per_group=2)


def _arrays(rng: np.random.Generator, prov: Provenance, n_in: int, n_out: int) -> TitoArrays:
    out = rng.integers(3, TINY_QWEN3["vocab_size"], size=n_out)
    return TitoArrays(
        input_ids=rng.integers(3, TINY_QWEN3["vocab_size"], size=n_in).astype("<i4"),
        input_prov=np.full(n_in, prov, "|u1"), msg_ends=np.zeros(0, "<i4"), msg_hashes=np.zeros(0, "<u4"),
        output_ids=out.astype("<i4"), output_logprobs=rng.uniform(-6.5, -5.5, n_out).astype("<f4"),
        output_prov=np.full(n_out, Provenance.SAMPLED, "|u1"), output_trainable=np.ones(n_out, np.bool_),
        output_hash=np.zeros(0, "<u4"),
    )  # fmt: skip


def _record_execution(log: PostgresEventLog, execution_id: str, seed: int) -> None:
    """Two model calls: a prompt and its answer, then a tool result and a second answer."""
    rng = np.random.default_rng(seed)
    first = _arrays(rng, Provenance.USER, int(rng.integers(4, 9)), int(rng.integers(3, 7)))
    log.append([new_record(ModelCallRecorded(execution_id=execution_id, run_id=RUN, request_id="r1"), first)])
    second = ModelCallRecorded(
        execution_id=execution_id, run_id=RUN, request_id="r2", prefix_of="r1",
        prefix_len=len(first.input_ids) + len(first.output_ids),
    )  # fmt: skip
    log.append([new_record(second, _arrays(rng, Provenance.TOOL_RESULT, 5, int(rng.integers(3, 7))))])


def _judge(state: PreservedState) -> float:
    return SCORES[state.execution_id]


def _finish_group(log: PostgresEventLog, runner: EvaluationRunner, group_id: str) -> None:
    for execution_id in GROUPS[group_id]:
        finish(log, execution_id, RUN)
        runner.preserve(execution_id, "w1")
        runner.settle(execution_id, deadline=float("inf"))


def _source(log: PostgresEventLog) -> tuple[StoreGroupSource, EvaluationRunner]:
    for k, (group_id, executions) in enumerate(GROUPS.items()):
        dispatch_group(log, RUN, group_id, list(executions), policy_version=k)
        for j, execution_id in enumerate(executions):
            start(log, execution_id, RUN)
            _record_execution(log, execution_id, seed=10 * k + j)
    store = PostgresProjectionStore(log.pool, projections().tables())
    source = StoreGroupSource(log, store, GroupSourceConfig(AdmissionConfig(max_trajectories=2)), step=1)
    runner = EvaluationRunner(log, CallableEvaluator(_judge, name="judge"), EvaluationConfig(retry_delay_s=0))
    return source, runner


def test_cells_train_on_groups_streamed_from_the_store(
    redis_client: redis.Redis, prefix: str, redis_url: str, pg_log: PostgresEventLog, database_url: str
) -> None:
    source, runner = _source(pg_log)
    _finish_group(pg_log, runner, "p-g0")  # the second group closes only after streaming began
    put: list[MicroStep] = []
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp)
        configs = cell_configs(
            cells=2, redis_url=redis_url, port=free_port(), model=SPEC, prefix=prefix,
            optimizer=OPTIMIZER, output_dir=output, database_url=database_url,
        )  # fmt: skip
        late = threading.Timer(1.5, _finish_group, args=(pg_log, runner, "p-g1"))
        with CellCluster(configs, [BurstPlan(batches=(0,), joins={1: (0, 1)})]) as cluster:
            started = time.monotonic()
            late.start()
            queue = RedisMicroStepQueue(redis_client, configs[0].queue, 0)
            manifest = stream_batch(queue, source, ProducerConfig(PACKING, poll_s=0.05), put.append)
            waited = time.monotonic() - started
            late.join()
            cluster.wait(timeout_s=120)
        updates = [e.event for e in iterate(pg_log) if isinstance(e.event, TrainingUpdate)]
        # The gradient, loss, norm and parameters of the update equal one process training the
        # micro-steps that were streamed (tolerances derived in magnitudes.py).
        check_updates(output, SPEC, OPTIMIZER, [(put, manifest.summaries())], updates)

    assert waited >= 1.5  # the stream stayed open until the second group was ready
    assert manifest.micro_steps == len(put) >= 2
    assert [s.index for s in put] == list(range(len(put)))
    assert {e for s in put for e in s.execution_ids} == set(SCORES)
    assert len(manifest.executions) == PACKING.raw_executions  # B N executions weigh the loss
    consumed = [e.event for e in iterate(pg_log) if isinstance(e.event, GroupConsumed)]
    assert sorted((c.group_id, c.step) for c in consumed) == [("p-g0", 1), ("p-g1", 1)]


def test_a_batch_short_of_groups_times_out_with_its_stream_open(
    redis_client: redis.Redis, prefix: str, pg_log: PostgresEventLog
) -> None:
    source, runner = _source(pg_log)
    _finish_group(pg_log, runner, "p-g0")
    from gyre_train.cells import QueueConfig

    queue = RedisMicroStepQueue(redis_client, QueueConfig(prefix), 0)
    with pytest.raises(ProducerTimeoutError, match="1 of 2 groups"):
        stream_batch(queue, source, ProducerConfig(PACKING, poll_s=0.02, timeout_s=0.3))
    assert queue.manifest() is None  # not closed: the cells keep waiting for the rest
