"""The event types of a gyre run: runs, groups, executions, cells and policy versions.

Each type is one thing that happened, appended by the component that knows it; the
scheduler's counters d, p and f are not stored as numbers but derived from execution
lifecycle events.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

import msgspec

from gyre_store.catalog.registry import REGISTRY, Ident, NonNegative, Positive
from gyre_store.log import Event


class FinishReason(enum.StrEnum):
    """Why an execution terminated; every one of them increments the finished counter f."""

    COMPLETED = "completed"
    FAILED = "failed"
    HARNESS_TIMEOUT = "harness_timeout"
    OVERALL_TIMEOUT = "overall_timeout"
    CANCELLED = "cancelled"
    SURPLUS = "surplus"


class CellRole(enum.StrEnum):
    """The role an elastic cell holds; a cell holds exactly one at a time."""

    ROLLOUT = "rollout"
    TRAINING = "training"
    TRANSITIONING = "transitioning"


@REGISTRY.register("run.started", stream="run", key="run_id")
class RunStarted(Event, frozen=True, kw_only=True):
    run_id: Ident
    harness: str
    model: str
    group_size: Positive  # N executions per rollout group
    batch_groups: Positive  # B groups per training step
    cells: Positive  # K elastic cells
    cell_capacity: NonNegative  # C_e concurrent executions per cell in rollout mode
    separate_capacity: NonNegative = 0  # C_s, the separate rollout pool
    phi: Annotated[float, msgspec.Meta(ge=0)] = 0.5
    mu: Positive = 1
    max_trajectories: Positive = 5  # J_max
    # Cells in the training role from the start, for the run's whole life (a fixed partition,
    # the Async policy: all of them); the others start in rollout.
    fixed_training_cells: NonNegative = 0


@REGISTRY.register("group.dispatched", stream="group", key="group_id")
class GroupDispatched(Event, frozen=True, kw_only=True):
    group_id: Ident
    run_id: Ident
    query_id: Ident
    size: Positive
    policy_version: NonNegative


@REGISTRY.register("execution.dispatched", stream="execution", key="execution_id")
class ExecutionDispatched(Event, frozen=True, kw_only=True):
    execution_id: Ident
    run_id: Ident
    group_id: Ident
    policy_version: NonNegative


@REGISTRY.register("execution.started", stream="execution", key="execution_id")
class ExecutionStarted(Event, frozen=True, kw_only=True):
    execution_id: Ident
    run_id: Ident
    engine: str
    launcher: str = ""  # the launcher that took it (its --name, the host's name by default)
    # Its folder on that launcher's machine (absolute): the workspace, and the snapshots its
    # intermediate evaluations may name (``<folder>/snapshots/<version>``, nothing else).
    folder: str = ""


@REGISTRY.register("execution.finished", stream="execution", key="execution_id")
class ExecutionFinished(Event, frozen=True, kw_only=True):
    execution_id: Ident
    run_id: Ident
    reason: FinishReason
    detail: str = ""


@REGISTRY.register("cell.role_changed", stream="cell", key=("run_id", "cell_index"))
class CellRoleChanged(Event, frozen=True, kw_only=True):
    run_id: Ident
    cell_index: NonNegative  # 0 is the core cell
    role: CellRole
    previous: CellRole
    reason: str = ""


@REGISTRY.register("cell.transition_done", stream="cell", key=("run_id", "cell_index"))
class CellTransitionDone(Event, frozen=True, kw_only=True):
    """The cell runtime finished the role change the scheduler began."""

    run_id: Ident
    cell_index: NonNegative


@REGISTRY.register("group.ready", stream="group", key="group_id")
class GroupReady(Event, frozen=True, kw_only=True):
    """Every execution of the group closed and was evaluated: it can be trained on."""

    group_id: Ident
    run_id: Ident


@REGISTRY.register("policy.published", stream="policy", key="run_id", version=2)
class WeightsPublished(Event, frozen=True, kw_only=True):
    """The core published ``policy_version`` (the update of ``step``) to the run's engines.

    v2 adds what the publication took, as the core measured it: its ``method``, the seconds to
    save the policy folder and to send it to every engine at once, each engine reached and its
    seconds, the engines skipped (unreachable), and the requests each engine had in flight when
    its generation was paused for the update (an engine that could not pause is absent: its
    update waited for them). A v1 body has none of these; it reads with the defaults.
    """

    run_id: Ident
    policy_version: Positive
    step: NonNegative
    method: str = ""  # disk | tensor | distributed ("" in v1)
    started_at: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # time.time() when the publication began
    save_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    send_s: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # pause, send to all at once, continue
    engines: dict[str, Annotated[float, msgspec.Meta(ge=0)]] = msgspec.field(default_factory=dict)
    skipped: tuple[str, ...] = ()
    paused: dict[str, NonNegative] = msgspec.field(default_factory=dict)
    note: str = ""


@REGISTRY.upcaster("policy.published", from_version=1)
def _published_v1(body: dict[str, Any]) -> dict[str, Any]:
    return body  # every field v2 adds has a default


@REGISTRY.register("execution.key_issued", stream="apikey", key="key_hash")
class ApiKeyIssued(Event, frozen=True, kw_only=True):
    """An API key (stored as its SHA-256) that writes into exactly one execution."""

    key_hash: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    execution_id: Ident
    run_id: Ident
    harness: str


@REGISTRY.register("execution.key_revoked", stream="apikey", key="key_hash")
class ApiKeyRevoked(Event, frozen=True, kw_only=True):
    key_hash: Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
    reason: str = ""


@REGISTRY.register("engine.routing_changed", stream="engine", key="engine")
class EngineRoutingChanged(Event, frozen=True, kw_only=True):
    """An engine starts or stops accepting new requests (the scheduler's role transitions)."""

    engine: Ident
    accepting: bool
    reason: str = ""
