"""`train.shard`, `train.shard_ranks`, `train.dtype` and `train.activation_checkpointing` in a
run's config: documented, refused in one line when wrong, and the FSDP cells node_plan builds."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from gyre_store import InMemoryEventLog
from gyre_tools.node_plan import node_plan
from gyre_tools.run_config import DEMO, ConfigFileError, parse_config
from gyre_train.backends import TorchTraining
from gyre_train.cells import TorchCells
from tests.unit.train_live.config_keys import assert_documented_and_round_trips, assert_refused_in_one_line


def test_the_written_config_documents_and_round_trips_the_sharding_keys() -> None:
    train = msgspec.structs.replace(
        DEMO.train, shard="fsdp", shard_ranks=2, dtype="bfloat16", activation_checkpointing=True
    )
    config = msgspec.structs.replace(DEMO, policy="async", train=train)
    assert_documented_and_round_trips(config, ("shard", "shard_ranks", "dtype", "activation_checkpointing"))


@pytest.mark.parametrize(
    ("train", "why"),
    [
        ('shard = "zero3"', "train.shard must be one of"),
        ('dtype = "float16"', "train.dtype must be one of"),
        ('shard = "fsdp"', "at least 2"),  # a world of one rank
        ("shard_ranks = 2", 'applies to train.shard = "fsdp" only'),
    ],
)
def test_a_bad_sharding_setting_is_refused_in_one_line(train: str, why: str) -> None:
    assert_refused_in_one_line(f'policy = "async"\n[train]\n{train}\n', why)


def test_fsdp_needs_cells_that_stay_trainers() -> None:
    with pytest.raises(ConfigFileError, match='needs policy "async"'):
        parse_config(
            'policy = "elastic"\ncells = 2\nrollout_engines = 0\n[train]\nshard = "fsdp"\nshard_ranks = 2\n'
        )


def test_node_plan_builds_fsdp_cells_of_shard_ranks(tmp_path: Path) -> None:
    text = (
        f'policy = "async"\ncells = 2\nrun_dir = "{tmp_path}"\n[train]\n'
        'shard = "fsdp"\nshard_ranks = 2\ndtype = "bfloat16"\nactivation_checkpointing = true\n'
    )
    plan = node_plan(
        InMemoryEventLog(), parse_config(text), run_id="r", database_url="", redis_url="redis://x",
        engines="none", engine_offset=0, trainers="all", dist_port=29556,
    )  # fmt: skip
    assert plan.trainers is not None
    cells = plan.trainers.cells
    assert sorted((c.cell, c.position) for c in cells) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    model = cells[0].model
    assert isinstance(model, TorchCells)
    assert model.training == TorchTraining(
        shard="fsdp", ranks=2, dtype="bfloat16", activation_checkpointing=True
    )
    assert sorted(c.layout.rank for c in cells) == [0, 1, 2, 3]  # one world, each rank once
