"""A gloo world for one spawned test process (Megatron tests run each world in fresh processes)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import torch
import torch.distributed as dist


@contextmanager
def gloo_world(rank: int, world: int, port: int) -> Iterator[None]:
    """Join a gloo world of `world` processes on 127.0.0.1:`port` as `rank`; leave it on exit."""
    warnings.filterwarnings("ignore")  # Megatron warns about Apex and Transformer Engine.
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def leave_together() -> NoReturn:
    """Wait for every rank of the world, then end this process at once (exit status 0) without
    tearing gloo down. Call it last, inside `gloo_world`, with every result already written.
    A rank that tears its group down has been seen to abort in gloo's threads ("terminate called
    without an active exception"), in CI, even after a barrier that both ranks passed."""
    dist.barrier()
    os._exit(0)
