"""The stream packing buffer's side of the claim queue: one batch fed from ready groups.

`stream_batch` pulls ready groups (oldest policy version first) from a `ReadyGroupSource` into
a `BatchPacker`, puts every micro-step on the batch's queue as soon as it is packed, and closes
the stream once the batch's B groups are in. When no group is ready it waits and polls again:
cells find nothing to claim meanwhile, pause, and resume with the next micro-step. Given
`consuming` (whether a cell is training now), it pulls the next group only while one is and
every micro-step it put was claimed, as the paper's buffer pulls one "when it runs short of
trajectories": with no cell training, ready groups stay unclaimed in the trajectory buffer,
where the scheduler's supply check counts them. It does not decide which step a group feeds
(the source's `step`) nor start cells.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gyre_train.cells.claims import MicroStepQueue
from gyre_train.cells.wire import BatchManifest
from gyre_train.exceptions import InvalidConfigError, ProducerTimeoutError
from gyre_train.trajectories import BatchPacker, MicroStep, PackingConfig, ReadyGroupSource


@dataclass(frozen=True, slots=True)
class ProducerConfig:
    """How one batch is packed, how often an empty source is polled, and for how long."""

    packing: PackingConfig
    poll_s: float = 0.05
    timeout_s: float = 600.0
    # Pull a group only while this says a cell trains and every micro-step put was claimed
    # (None: pull every ready group at once).
    consuming: Callable[[], bool] | None = None

    def __post_init__(self) -> None:
        if self.poll_s <= 0 or self.timeout_s <= 0:
            raise InvalidConfigError("poll_s and timeout_s must be positive")


def stream_batch(
    queue: MicroStepQueue,
    source: ReadyGroupSource,
    config: ProducerConfig,
    on_step: Callable[[MicroStep], None] | None = None,
) -> BatchManifest:
    """Feed the batch `queue.batch` from `source` and close its stream; returns the manifest.

    Raises ProducerTimeoutError when fewer than B groups became ready within `timeout_s` (the
    micro-steps already put stay on the queue, the stream stays open), and what the packer
    raises for a group it cannot pack (RowTooLongError, InvalidRowsError).
    """
    packer = BatchPacker(config.packing, queue.batch)
    emitted = 0
    deadline = time.monotonic() + config.timeout_s
    while not packer.closed:
        taken = len(packer.groups)
        if config.consuming is not None and (not config.consuming() or emitted > queue.claims_made()):
            # Before the stream closes every task is a first-pass one, claimed once each: the
            # claims made say how many of the micro-steps put are still waiting for a cell.
            deadline = time.monotonic() + config.timeout_s  # waiting for cells, not for groups
            time.sleep(config.poll_s)
            continue
        for step in packer.pull(source):
            queue.put(step)
            emitted += 1
            if on_step is not None:
                on_step(step)
        if packer.closed or len(packer.groups) > taken:
            deadline = time.monotonic() + config.timeout_s
            continue
        if time.monotonic() > deadline:
            raise ProducerTimeoutError(
                f"batch {queue.batch} has {taken} of {config.packing.groups_per_batch} groups "
                f"after waiting {config.timeout_s} s for the next ready group"
            )
        time.sleep(config.poll_s)
    manifest = BatchManifest.of(queue.batch, emitted, packer.executions)
    queue.close(manifest)
    return manifest
