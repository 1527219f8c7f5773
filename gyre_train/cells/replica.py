"""A cell's model replica across its ranks: one process, an FSDP group or a Megatron model-parallel group.

A cell is a process group sharing one training layout (paper, "Topology-aware cell organization").
Its leader (position 0) runs the claim loop (core.py, satellite.py) and talks to the board and the event log; every
operation on the replica is also an operation of each follower rank on its own shard, so the
leader broadcasts the command to its cell and then runs it itself, while followers run `follow()`
until told to stop. Collectives across cells (reducing onto the core, broadcasting new weights,
snapshot pulls) run per position: position p of every cell of a prefix forms one group, so each
shard meets the same shard of the other cells. With one rank per cell there are no commands at
all and the weight transport (torch.distributed or Mooncake) is used as is.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist

from gyre_train.backends import (
    FsdpBackend,
    MegatronBackend,
    MegatronModelSpec,
    ModelSpec,
    OptimizerConfig,
    TorchBackend,
    TorchTraining,
    TrainingBackend,
    export_model,
    megatron_module,
)
from gyre_train.cells.board import SnapshotBoard, SnapshotDescriptor
from gyre_train.cells.local import gradient_share, ratio_share
from gyre_train.cells.membership import CORE, ReducePlan
from gyre_train.cells.publish import PublishableModel, WeightPublisher
from gyre_train.cells.transport import WeightTransport, wait_for_snapshot
from gyre_train.cells.wire import RatioShare
from gyre_train.exceptions import InvalidConfigError
from gyre_train.objective import ExecutionClip, LossConfig
from gyre_train.trajectories import MicroStep


@dataclass(frozen=True, slots=True)
class MegatronCells:
    """Cells that each train a Megatron-core GPT split over TP x PP processes of their own."""

    spec: MegatronModelSpec
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.pipeline_parallel_size < 1:
            raise InvalidConfigError("tensor and pipeline parallel sizes must be at least 1")

    @property
    def ranks_per_cell(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size


@dataclass(frozen=True, slots=True)
class TorchCells:
    """Cells that each train a Hugging Face causal LM as `training` says: unsharded on one
    process, or FSDP-sharded over `training.ranks` processes of their own."""

    spec: ModelSpec
    training: TorchTraining = field(default_factory=TorchTraining)

    @property
    def ranks_per_cell(self) -> int:
        return self.training.ranks


CellModel = ModelSpec | TorchCells | MegatronCells
"""What every cell trains: a Hugging Face causal LM (one process per cell, or `TorchCells`) or
Megatron cells."""


@dataclass(frozen=True, slots=True)
class RankLayout:
    """Where one process sits: its cell (the data-parallel index), its position inside the cell.

    Global ranks follow Megatron-core's default order (tensor fastest, then data, then pipeline),
    so a cell's tensor-parallel ranks are neighbours: rank = t + TP * (cell + K * p) for tensor
    rank t and pipeline stage p; position = p * TP + t (position 0 is the cell's leader).
    """

    cells: int  # K
    cell: int
    position: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.cell < self.cells or not 0 <= self.position < self.size:
            raise InvalidConfigError(f"no position {self.position} of cell {self.cell} in this layout")

    @property
    def size(self) -> int:
        """Ranks per cell."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def world(self) -> int:
        return self.cells * self.size

    @property
    def leads(self) -> bool:
        return self.position == 0

    def rank_of(self, cell: int, position: int) -> int:
        """The global rank of `position` in `cell`."""
        tp = self.tensor_parallel_size
        return position % tp + tp * (cell + self.cells * (position // tp))

    @property
    def rank(self) -> int:
        return self.rank_of(self.cell, self.position)


def layout_of(model: CellModel, cells: int, cell: int, position: int) -> RankLayout:
    if isinstance(model, MegatronCells):
        return RankLayout(cells, cell, position, model.tensor_parallel_size, model.pipeline_parallel_size)
    if isinstance(model, TorchCells):
        # An FSDP cell's ranks are neighbours in the world, like tensor-parallel ranks.
        return RankLayout(cells, cell, position, tensor_parallel_size=model.ranks_per_cell)
    if position:
        raise InvalidConfigError("a Hugging Face model cell has one process (position 0)")
    return RankLayout(cells, cell, 0)


@contextmanager
def open_backend(
    model: CellModel, layout: RankLayout, optimizer: OptimizerConfig
) -> Iterator[TrainingBackend]:
    """This rank's backend; torch.distributed must already span the layout's world."""
    if isinstance(model, ModelSpec):
        yield TorchBackend(model, optimizer)
        return
    if isinstance(model, TorchCells):
        if model.training.shard == "none":
            yield TorchBackend(model.spec, optimizer, model.training)
            return
        group: Any = None
        for c in range(layout.cells):  # collective: every rank makes every cell's group, in order
            made = dist.new_group([layout.rank_of(c, p) for p in range(layout.size)])
            if c == layout.cell:
                group = made
        yield FsdpBackend(model.spec, optimizer, model.training, group=group)
        return
    pp_kwargs: dict[str, Any] = (
        {"pipeline_parallel_size": model.pipeline_parallel_size} if model.pipeline_parallel_size > 1 else {}
    )
    with MegatronBackend(
        model.spec, optimizer, tensor_parallel_size=model.tensor_parallel_size, **pp_kwargs
    ) as backend:
        parallel_state = megatron_module("megatron.core.parallel_state")
        seen = (
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_rank(),
        )
        tp = layout.tensor_parallel_size
        if seen != (layout.cell, layout.position % tp, layout.position // tp):
            raise InvalidConfigError(
                f"rank {layout.rank}: Megatron placed it at (dp, tp, pp) {seen}, not {layout}"
            )
        yield backend


def build_groups(layout: RankLayout) -> tuple[dict[int, Any], Any]:
    """Every prefix group 2..K for this rank's position, and this cell's command group.

    Collective: every rank of the world creates every group, in the same order.
    """
    prefixes: dict[int, Any] = {}
    for k in range(2, layout.cells + 1):
        for position in range(layout.size):
            group = dist.new_group([layout.rank_of(c, position) for c in range(k)])
            if position == layout.position:
                prefixes[k] = group
    command: Any = None
    if layout.size > 1:
        # Followers wait on this group between the leader's commands, which may be far apart
        # while the leader waits for data: its timeout is a day, not the cell's wait timeout.
        for c in range(layout.cells):
            group = dist.new_group(
                [layout.rank_of(c, p) for p in range(layout.size)], timeout=datetime.timedelta(days=1)
            )
            if c == layout.cell:
                command = group
    return prefixes, command


def wire_device() -> torch.device:
    """Where this process's collectives take their tensors: its current CUDA device under NCCL,
    else the CPU (gloo; also when torch.distributed is not initialised)."""
    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class Replica:
    """This rank's share of its cell's replica; the leader's calls are mirrored by the followers."""

    def __init__(
        self,
        backend: TrainingBackend,
        layout: RankLayout,
        loss: LossConfig,
        transport: WeightTransport | None,
        board: SnapshotBoard | None,
    ) -> None:
        if layout.size > 1 and transport is not None and transport.name != "torch":
            raise InvalidConfigError("cells of several processes move snapshots over torch.distributed only")
        self.backend = backend
        self.layout = layout
        self._loss = loss
        self._transport = transport  # the leader's; followers have none
        self._board = board
        self._prefixes, self._command = build_groups(layout)
        # Where the flat vectors meet across processes: NCCL moves CUDA tensors, gloo (and the
        # Mooncake Transfer Engine, and torch.save) host tensors. The backend keeps its own on its device.
        self._wire = wire_device()
        self._snapshot: torch.Tensor | None = None
        self._reduced: torch.Tensor | None = None
        self._ops: dict[str, Callable[..., Any]] = {
            "ratio": self._ratio,
            "gradient": self._gradient,
            "zero": self.backend.zero_gradients,
            "reduce": self._reduce,
            "update": self._update,
            "expose": self._expose,
            "broadcast": self._broadcast,
            "send": self._send_snapshot,
            "receive": self._receive_snapshot,
            "save": self._save,
            "save_gradient": self._save_gradient,
            "publish": self._publish,
            "publish_gathered": self._publish_gathered,
        }
        self._publisher: WeightPublisher | None = None

    # -- the leader's calls ---------------------------------------------------------------------

    def _run(self, op: str, *args: Any) -> Any:
        if self._command is not None:
            dist.broadcast_object_list(
                [(op, args)], src=self.layout.rank_of(self.layout.cell, 0), group=self._command
            )
        return self._ops[op](*args)

    def ratio(self, step: MicroStep) -> RatioShare:
        """Pass 1 of one micro-step."""
        share: RatioShare = self._run("ratio", step)
        return share

    def gradient(self, step: MicroStep, clip: ExecutionClip) -> float:
        """Pass 2 of one micro-step; returns its loss share."""
        loss: float = self._run("gradient", step, clip)
        return loss

    def zero_gradients(self) -> None:
        self._run("zero")

    def reduce(self, plan: ReducePlan, loss: float) -> float | None:
        """Sum the prefix's gradients (and loss shares) onto the core; returns the summed loss,
        or None when a rank of the prefix failed inside the collective (every rank of this cell
        then returns None; the accumulated gradients are untouched, so it can be reduced again)."""
        total: float | None = self._run("reduce", plan.prefix, loss)
        return total

    def update(self) -> float:
        """Core: one optimizer step on the reduced batch gradient; returns the gradient norm."""
        norm: float = self._run("update")
        return norm

    def expose(self, policy_version: int) -> None:
        """Core: the current weights become the snapshot joiners pull and the broadcast sends."""
        self._run("expose", policy_version)

    def broadcast(self, plan: ReducePlan) -> None:
        """The core's snapshot to every member of the plan's prefix (core and satellites call it)."""
        self._run("broadcast", plan.prefix)

    def serve(self) -> None:
        """Core: answer pending snapshot pulls."""
        if self.layout.size == 1:
            assert self._transport is not None
            self._transport.serve()
            return
        assert self._board is not None
        while (cell := self._board.next_pull()) is not None:
            self._run("send", cell)

    def pull(self, policy_version: int, timeout_s: float) -> None:
        """Satellite: load the core's snapshot at `policy_version`."""
        if self.layout.size == 1:
            assert self._transport is not None
            pulled_on = self._wire if self._transport.name == "torch" else torch.device("cpu")
            flat = torch.empty(self.backend.numel, dtype=torch.float32, device=pulled_on)
            self._transport.pull(flat, policy_version, timeout_s)
            self.backend.load_flat_parameters(flat)
            return
        assert self._board is not None
        descriptor = wait_for_snapshot(self._board, policy_version, timeout_s)
        if descriptor.numel != self.backend.numel:
            raise InvalidConfigError(
                f"snapshot has {descriptor.numel} values, this shard {self.backend.numel}"
            )
        self._board.request_pull(self.layout.cell)
        self._run("receive")

    def save(self, directory: Path, policy_version: int) -> None:
        """Core: the weights after an update, as `params-v<version>.pt` (flat, or by name for Megatron and FSDP)."""
        self._run("save", str(directory), policy_version)

    def save_gradient(self, directory: Path, policy_version: int) -> None:
        """Core, between reduce and update: the reduced batch gradient as `grads-v<version>.pt`
        (flat, or by name: in the TP=1, PP=1 layout for Megatron, whole for FSDP)."""
        self._run("save_gradient", str(directory), policy_version)

    def publish(self, publisher: WeightPublisher, policy_version: int) -> None:
        if isinstance(self.backend, FsdpBackend | MegatronBackend):
            # Followers only take part in the gather: the publisher (the leader's, which may not
            # pickle: a live run's holds its engines' clients) stays here.
            self._publisher = publisher
            self._run("publish_gathered", policy_version)
            return
        self._run("publish", publisher, policy_version)

    def stop(self) -> None:
        """Leader: release the followers from `follow()`."""
        if self._command is not None:
            dist.broadcast_object_list([("stop", ())], src=self.layout.rank, group=self._command)

    def follow(self) -> None:
        """Follower: run the leader's commands until it says stop."""
        leader = self.layout.rank_of(self.layout.cell, 0)
        while True:
            box: list[Any] = [None]
            dist.broadcast_object_list(box, src=leader, group=self._command)
            op, args = box[0]
            if op == "stop":
                return
            self._ops[op](*args)

    # -- what every rank does on its shard -------------------------------------------------------

    def _ratio(self, step: MicroStep) -> RatioShare:
        return ratio_share(self.backend, step)

    def _gradient(self, step: MicroStep, clip: ExecutionClip) -> float:
        return gradient_share(self.backend, step, clip, self._loss)

    def _reduce(self, prefix: int, loss: float) -> float | None:
        # Every rank of a cell holds the same loss share, so each position sums the same total.
        # The reduction runs on a copy: a failed one leaves the accumulated gradients as they were.
        flat = torch.cat(
            [
                self.backend.flat_gradients().to(self._wire, torch.float32),
                torch.tensor([loss], dtype=torch.float32, device=self._wire),
            ]
        )
        ok = torch.ones(1, device=self._wire)
        if prefix > 1:
            try:
                dist.reduce(
                    flat, dst=self.layout.rank_of(CORE, self.layout.position), group=self._prefixes[prefix]
                )
            except RuntimeError:  # a peer died mid-collective (gloo: "Connection closed by peer")
                ok.zero_()
        if self._command is not None:
            # One rank's failure is the whole cell's: its shards only make sense together.
            dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._command)
        if not bool(ok.item()):
            self._reduced = None
            return None
        self._reduced = flat[:-1]
        return float(flat[-1])

    def _update(self) -> float:
        assert self._reduced is not None  # the core reduces before it updates
        gradients, self._reduced = self._reduced, None
        return self.backend.apply_update(gradients)

    def _expose(self, policy_version: int) -> None:
        self._snapshot = self.backend.flat_parameters().to(self._wire, torch.float32)
        if self._transport is not None:
            self._transport.expose(self._snapshot, policy_version)
        if self.layout.size > 1 and self.layout.leads:
            assert self._board is not None
            self._board.put_snapshot(SnapshotDescriptor(policy_version, self.backend.numel, "torch"))

    def _broadcast(self, prefix: int) -> None:
        if prefix < 2:
            return
        core = self.layout.rank_of(CORE, self.layout.position)
        if self.layout.cell == CORE:
            assert self._snapshot is not None  # exposed right after the update
            dist.broadcast(self._snapshot, src=core, group=self._prefixes[prefix])
            return
        flat = torch.empty(self.backend.numel, dtype=torch.float32, device=self._wire)
        dist.broadcast(flat, src=core, group=self._prefixes[prefix])
        self.backend.load_flat_parameters(flat)

    def _send_snapshot(self, cell: int) -> None:
        assert self._snapshot is not None  # the leader exposes before it serves
        dist.send(self._snapshot, dst=self.layout.rank_of(cell, self.layout.position))

    def _receive_snapshot(self) -> None:
        flat = torch.empty(self.backend.numel, dtype=torch.float32, device=self._wire)
        dist.recv(flat, src=self.layout.rank_of(CORE, self.layout.position))
        self.backend.load_flat_parameters(flat)

    def _save(self, directory: str, policy_version: int) -> None:
        target = Path(directory) / f"params-v{policy_version}.pt"
        if isinstance(self.backend, MegatronBackend | FsdpBackend):
            named = self.backend.full_named_tensors()  # collective over the cell
            if self.layout.leads:
                torch.save(named, target)
        else:
            torch.save(self.backend.flat_parameters().cpu(), target)

    def _save_gradient(self, directory: str, policy_version: int) -> None:
        assert self._reduced is not None  # the core reduces before it saves what it will apply
        target = Path(directory) / f"grads-v{policy_version}.pt"
        if isinstance(self.backend, MegatronBackend | FsdpBackend):
            named = self.backend.full_named_of(self._reduced)  # collective over the cell
            if self.layout.leads:
                torch.save(named, target)
        else:
            torch.save(self._reduced.to("cpu", copy=True), target)

    def _publish(self, publisher: WeightPublisher, policy_version: int) -> None:
        publisher.publish(self.backend, policy_version)

    def _publish_gathered(self, policy_version: int) -> None:
        gathered: PublishableModel
        if isinstance(self.backend, MegatronBackend):
            # Engines serve Hugging Face models: the whole model, gathered, as the checkpoint's
            # architecture (or a GPT-2), with every shard's optimizer state for a resumed core.
            named = self.backend.full_named_tensors()  # collective over the cell
            kept = self.backend.gathered_training_state()  # collective over the cell
            gathered = dataclasses.replace(export_model(self.backend.spec, named), training_state=kept)
        else:
            gathered = cast(FsdpBackend, self.backend).gathered()  # collective over the cell
        if self.layout.leads:
            assert self._publisher is not None  # set by publish() on the leader
            self._publisher.publish(gathered, policy_version)
