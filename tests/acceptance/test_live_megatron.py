"""A live run whose trainer cell is Megatron-core: `gyre run` with ``train.backend = "megatron"``
and ``train.tp = 2`` over gloo on the CPU, on the demo's task family and its tiny Qwen3.

Short for CI (a random policy, two steps): every step trains once, each micro-step counts once,
the engines are given Qwen3 folders exported from the two tensor-parallel shards (the starting
checkpoint exactly, since a random policy's zero rewards make every update zero), and each
publication keeps both shards' optimizer state. Whether such a run learns is measured by the
long version (the demo's configuration: ten steps from the warm start):

    GYRE_MEGATRON_LEARNING=1 .venv/bin/python -m pytest tests/acceptance/test_live_megatron.py -k learns -s

which prints the reward of the first and last third and asserts a gain of at least +0.1.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.acceptance.live_checks import SHORT_RUN, assert_every_step_trains_once, reward_gain, run_live
from tests.real_servers import megatron_missing, require

pytestmark = pytest.mark.timeout(1800)

MEGATRON = """
[train]
backend = "megatron"
tp = 2
"""

CI_CONFIG = SHORT_RUN + MEGATRON


@pytest.fixture(autouse=True)
def _megatron() -> None:
    require("megatron", megatron_missing())


def test_a_live_run_on_a_megatron_tp2_cell_trains_every_step_once(
    tmp_path: Path, acceptance_template: str
) -> None:
    summary, events = run_live(tmp_path, acceptance_template, CI_CONFIG)
    assert_every_step_trains_once(summary, events)
    policies = next(tmp_path.rglob("policy-v2")).parent
    # The engines were given Qwen3 folders exported from both shards. A random policy scores 0 on
    # every execution, so every advantage and update is 0: the published model is the starting
    # checkpoint again, bit for bit, through the conversion, the TP split and the gathered export.
    assert [s["mean_reward"] for s in summary["steps"]] == [0.0, 0.0]
    (start_folder,) = {p.parent for p in (tmp_path / "data").rglob("random-*/config.json")}
    start = load_file(str(next(start_folder.glob("*.safetensors"))))
    published = load_file(str(next((policies / "policy-v2").glob("*.safetensors"))))
    assert json.loads((policies / "policy-v2" / "config.json").read_text())["model_type"] == "qwen3"
    assert published.keys() == start.keys()
    assert all(torch.equal(start[k], published[k]) for k in start)
    # The newest publication keeps each tensor-parallel shard's AdamW moments for a resumed core.
    kept = torch.load(policies / "policy-v2.optimizer.pt", weights_only=True)
    assert sorted(kept["megatron"]) == ["tp0-pp0", "tp1-pp0"] and kept["layout"] == [2, 1]
    assert all(state["state"] for state in kept["megatron"].values())


@pytest.mark.skipif(
    not os.environ.get("GYRE_MEGATRON_LEARNING"), reason="the long run: GYRE_MEGATRON_LEARNING=1"
)
def test_a_live_run_on_a_megatron_tp2_cell_learns(tmp_path: Path, acceptance_template: str) -> None:
    summary, events = run_live(tmp_path, acceptance_template, "seed = 0\n" + MEGATRON)
    assert_every_step_trains_once(summary, events)
    first, last = reward_gain(summary)
    print(
        f"megatron tp=2 live run: reward first third {first:.3f}, last third {last:.3f}, gain {last - first:+.3f}"
    )
    assert last - first >= 0.1
