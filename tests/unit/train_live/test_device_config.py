"""`train.device`, `train.collectives` and `engine_device`: documented in the written config,
refused in one line when wrong, carried by node_plan into the cells and the engines; and where
torch sees no CUDA device (this machine), a CUDA device is refused by name, never silently
replaced by the CPU. The GPU path itself is checked by tests/gpu (tools/gpu-check.sh)."""

from __future__ import annotations

import inspect
from pathlib import Path

import msgspec
import pytest
import torch

from gyre_proxy.engines.refengine import ModelSource, load_model
from gyre_proxy.engines.refengine.decode_loop import cache_keyword
from gyre_proxy.exceptions import ModelLoadError
from gyre_store import InMemoryEventLog
from gyre_tools.node_plan import node_plan
from gyre_tools.run_config import DEMO, parse_config
from gyre_train import InvalidConfigError
from gyre_train.backends import ModelSpec, TorchBackend, TorchTraining
from gyre_train.cells import TINY_QWEN3, CellConfig, QueueConfig, TorchCells
from tests.unit.train_live.config_keys import assert_documented_and_round_trips, assert_refused_in_one_line

needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal where no CUDA device is seen"
)


def test_the_written_config_documents_and_round_trips_the_device_keys() -> None:
    train = msgspec.structs.replace(DEMO.train, device="cuda", collectives="nccl")
    config = msgspec.structs.replace(DEMO, train=train, engine_device="cuda:0")
    assert_documented_and_round_trips(config, ("device", "collectives", "engine_device"))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('[train]\ndevice = "gpu"', "train.device must be 'cpu', 'cuda' or 'cuda:N'"),
        ('engine_device = "cuda:x"', "engine_device must be 'cpu', 'cuda' or 'cuda:N'"),
        ('[train]\ncollectives = "mpi"', "train.collectives must be one of"),
        ('[train]\ncollectives = "nccl"', 'set train.device = "cuda"'),
        ('policy = "async"\n[train]\ndevice = "cuda"\nbackend = "megatron"', "unsharded PyTorch cells only"),
        (
            'policy = "async"\n[train]\ndevice = "cuda"\nshard = "fsdp"\nshard_ranks = 2',
            "unsharded PyTorch cells only",
        ),
        ('engine = "sglang"\nengine_device = "cuda"', "takes its device from its own command"),
    ],
)
def test_a_bad_device_setting_is_refused_in_one_line(text: str, why: str) -> None:
    assert_refused_in_one_line(text + "\n", why)


def test_node_plan_carries_the_devices_into_cells_and_engines(tmp_path: Path) -> None:
    text = (
        f'policy = "async"\ncells = 2\nrun_dir = "{tmp_path}"\nengine_device = "cuda:0"\n'
        '[train]\ndevice = "cuda"\ncollectives = "nccl"\n'
    )
    plan = node_plan(
        InMemoryEventLog(), parse_config(text), run_id="r", database_url="", redis_url="redis://x",
        engines="all", engine_offset=0, trainers="all", dist_port=29557,
    )  # fmt: skip
    assert plan.trainers is not None
    for cell in plan.trainers.cells:
        assert isinstance(cell.model, TorchCells)
        assert (cell.model.training.device, cell.device, cell.dist_backend) == ("cuda", "cuda", "nccl")
    assert plan.engines and all(engine.device == "cuda:0" for engine in plan.engines)


def test_nccl_cells_must_train_on_a_gpu() -> None:
    common = dict(run_id="r", cell=0, cells=1, redis_url="redis://x", dist_init="tcp://127.0.0.1:1")
    with pytest.raises(InvalidConfigError, match="cells over nccl train on a GPU"):
        CellConfig(**common, queue=QueueConfig(prefix="q"), model=ModelSpec(TINY_QWEN3), dist_backend="nccl")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="dist_backend must be one of"):
        CellConfig(**common, queue=QueueConfig(prefix="q"), model=ModelSpec(TINY_QWEN3), dist_backend="mpi")  # type: ignore[arg-type]
    on_gpu = TorchCells(ModelSpec(TINY_QWEN3), TorchTraining(device="cuda"))
    config = CellConfig(**common, queue=QueueConfig(prefix="q"), model=on_gpu, dist_backend="nccl")  # type: ignore[arg-type]
    assert config.device == "cuda"


def test_a_bad_device_name_is_refused_and_fsdp_stays_on_the_cpu() -> None:
    with pytest.raises(InvalidConfigError, match="device must be 'cpu', 'cuda' or 'cuda:N'"):
        TorchTraining(device="tpu")
    with pytest.raises(InvalidConfigError, match="fsdp cells train on the CPU only"):
        TorchTraining(shard="fsdp", ranks=2, device="cuda")


@needs_no_cuda
def test_a_cuda_device_is_refused_where_none_is_seen() -> None:
    with pytest.raises(InvalidConfigError, match="torch sees no CUDA device"):
        TorchBackend(ModelSpec(TINY_QWEN3), training=TorchTraining(device="cuda"))
    with pytest.raises(ModelLoadError, match="torch sees no CUDA device"):
        load_model(ModelSource(seed=0, device="cuda:0"))
    with pytest.raises(ModelLoadError, match="engine device must be"):
        load_model(ModelSource(seed=0, device="gpu"))


def test_the_engine_passes_its_cache_by_the_name_the_model_takes() -> None:
    class Renamed(torch.nn.Module):
        def forward(self, input_ids: torch.Tensor, cache: object = None, **kwargs: object) -> None: ...

    class Older(torch.nn.Module):
        def forward(
            self, input_ids: torch.Tensor, past_key_values: object = None, **kwargs: object
        ) -> None: ...

    assert (cache_keyword(Renamed()), cache_keyword(Older())) == ("cache", "past_key_values")
    # The installed transformers' own models: the name must be one its Qwen3 forward declares.
    model = load_model(ModelSource(seed=0)).model
    assert cache_keyword(model) in inspect.signature(model.forward).parameters
