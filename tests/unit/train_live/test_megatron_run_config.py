"""`train.backend = "megatron"` in a run's config: its keys, its one-line refusals, and the
trainer cells node_plan builds from it (Megatron-core's GPTModel of model.init, TP x PP ranks)."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre_store import InMemoryEventLog
from gyre_tools.node_plan import node_plan
from gyre_tools.run_config import DEMO, ConfigFileError, parse_config
from gyre_train.cells import MegatronCells, TorchCells
from tests.integration.train_stream.test_megatron_qwen3 import write_tiny
from tests.unit.train_live.config_keys import assert_documented_and_round_trips, assert_refused_in_one_line


def test_the_written_config_documents_and_round_trips_the_megatron_keys() -> None:
    config = msgspec.structs.replace(
        DEMO, policy="async", train=msgspec.structs.replace(DEMO.train, backend="megatron", tp=2, pp=1)
    )
    assert_documented_and_round_trips(config, ("backend", "tp", "pp"))


@pytest.mark.parametrize(
    ("train", "why"),
    [
        ('backend = "jax"', "train.backend must be one of"),
        ("tp = 2", 'apply to train.backend = "megatron" only'),
        ('backend = "megatron"\nshard = "fsdp"\nshard_ranks = 2', "are the PyTorch backend's"),
        ('backend = "megatron"\ndtype = "bfloat16"', "are the PyTorch backend's"),
    ],
)
def test_a_bad_backend_setting_is_refused_in_one_line(train: str, why: str) -> None:
    assert_refused_in_one_line(f'policy = "async"\n[train]\n{train}\n', why)


def test_megatron_needs_cells_that_stay_trainers() -> None:
    with pytest.raises(ConfigFileError, match='needs policy "async"'):
        parse_config('policy = "elastic"\ncells = 2\nrollout_engines = 0\n[train]\nbackend = "megatron"\n')


def _cells(tmp_path: Path, train: str) -> list[object]:
    folder = write_tiny(tmp_path / "qwen3", tied=True)
    text = (
        f'policy = "async"\ncells = 2\nrun_dir = "{tmp_path}"\n[model]\ninit = "{folder}"\n[train]\n{train}\n'
    )
    plan = node_plan(
        InMemoryEventLog(), parse_config(text), run_id="r", database_url="", redis_url="redis://x",
        engines="none", engine_offset=0, trainers="all", dist_port=29555,
    )  # fmt: skip
    assert plan.trainers is not None
    return list(plan.trainers.cells)


def test_node_plan_builds_megatron_cells_of_tp_ranks_from_the_checkpoint(tmp_path: Path) -> None:
    cells = _cells(tmp_path, 'backend = "megatron"\ntp = 2')
    places = sorted((c.cell, c.position) for c in cells)  # type: ignore[attr-defined]
    assert places == [(0, 0), (0, 1), (1, 0), (1, 1)]  # two cells of two tensor-parallel ranks
    model = cells[0].model  # type: ignore[attr-defined]
    assert isinstance(model, MegatronCells)
    assert (model.tensor_parallel_size, model.pipeline_parallel_size) == (2, 1)
    spec = model.spec
    assert (spec.architecture, spec.num_query_groups, spec.kv_channels, spec.tie_embeddings) == (
        "qwen3",
        2,
        8,
        True,
    )
    assert spec.checkpoint == tmp_path / "qwen3"
    plain = _cells(tmp_path / "plain", "")
    assert len(plain) == 2 and isinstance(plain[0].model, TorchCells)  # type: ignore[attr-defined]
