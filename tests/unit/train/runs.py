"""Small recorded runs for evaluation, group and ablation tests: lifecycle events plus tracegen trees."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from gyre_proxy.engines import qwen_tokenizer
from gyre_proxy.harness import ClaudeCodeHarness
from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
from gyre_store import (
    EventLog,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    GroupDispatched,
    InMemoryEventLog,
    InMemoryProjectionStore,
    NewEvent,
    ProjectionSet,
    ProjectionStore,
    catch_up,
    evaluation_projections,
)
from gyre_store.trees import TrajectoryRecorder, TreeProjection

SMALL = TraceConfig(
    seed=5,
    main_requests=24,
    compact_at=6_000,
    subagents=1,
    subagent_requests=(4, 6),
    subagent_compact_at=2_000,
    retry_every=11,
    tool_result_words=(20, 120),
    interrupt_at=4,
)


@functools.cache
def _trace(execution_id: str, run_id: str, seed: int) -> tuple[NewEvent, ...]:
    scratch = InMemoryEventLog()
    ingestor = Ingestor(TrajectoryRecorder(scratch), Qwen3Template(_tokenizer()), ClaudeCodeHarness())
    config = TraceConfig(**{**{f: getattr(SMALL, f) for f in SMALL.__dataclass_fields__}, "seed": seed})
    TraceGenerator(ingestor, config).run(execution_id, run_id)
    return tuple(
        NewEvent(r.event, idempotency_key=r.idempotency_key, payload=r.payload, metadata=r.metadata)
        for r in scratch.read(0, limit=100_000)
    )


@functools.cache
def _tokenizer():  # type: ignore[no-untyped-def]
    return qwen_tokenizer()


def record_trace(log: EventLog, execution_id: str, run_id: str, seed: int = 5) -> None:
    """Append a small synthetic Claude Code execution's TITO records (generated once per id)."""
    events = list(_trace(execution_id, run_id, seed))
    for i in range(0, len(events), 50):
        log.append(events[i : i + 50])


def dispatch_group(
    log: EventLog, run_id: str, group_id: str, executions: Sequence[str], *, size: int | None = None,
    policy_version: int = 0,
) -> None:  # fmt: skip
    events = [
        NewEvent(
            GroupDispatched(
                group_id=group_id,
                run_id=run_id,
                query_id=group_id,
                size=size or len(executions),
                policy_version=policy_version,
            )
        )
    ]
    events += [
        NewEvent(
            ExecutionDispatched(
                execution_id=e, run_id=run_id, group_id=group_id, policy_version=policy_version
            )
        )
        for e in executions
    ]
    log.append(events)


def start(log: EventLog, execution_id: str, run_id: str) -> None:
    log.append([NewEvent(ExecutionStarted(execution_id=execution_id, run_id=run_id, engine="test"))])


def finish(
    log: EventLog, execution_id: str, run_id: str, reason: FinishReason = FinishReason.COMPLETED
) -> None:
    log.append([NewEvent(ExecutionFinished(execution_id=execution_id, run_id=run_id, reason=reason))])


def projections() -> ProjectionSet:
    return ProjectionSet([TreeProjection(), *evaluation_projections()])


def memory_store(log: EventLog) -> InMemoryProjectionStore:
    return InMemoryProjectionStore(projections().tables(), log)


def catch_all(log: EventLog, store: ProjectionStore) -> None:
    for p in projections():
        catch_up(log, store, p)
