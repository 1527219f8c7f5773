"""A live run whose trainer cell is an FSDP group: `gyre run` with ``train.shard = "fsdp"`` over
two gloo ranks on the CPU, on the demo's task family.

Short for CI (a random policy, two steps): every step trains once, each micro-step counts once,
the engines are given the whole model gathered from the shards, and the core keeps its AdamW
moments whole with each publication. Whether such a run learns is
measured by the long version (the demo's ten steps from the warm start):

    GYRE_FSDP_LEARNING=1 .venv/bin/python -m pytest tests/acceptance/test_live_fsdp.py -k learns -s

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

pytestmark = pytest.mark.timeout(1800)

SHARDED = """
[train]
shard = "fsdp"
shard_ranks = 2
"""

CI_CONFIG = SHORT_RUN + SHARDED


def test_a_live_run_on_an_fsdp_cell_trains_every_step_once(tmp_path: Path, acceptance_template: str) -> None:
    summary, events = run_live(tmp_path, acceptance_template, CI_CONFIG)
    assert_every_step_trains_once(summary, events)
    # The engines were given the whole model, gathered from the two shards: every weight of the
    # initial checkpoint, in its shape. (A random policy earns no reward, so its updates are zero:
    # weights moving is what the long run and tests/integration/train_stream/test_fsdp_cells.py hold.)
    (published,) = tmp_path.rglob("policies/policy-v2/model.safetensors")
    (initial,) = tmp_path.rglob("policies/random-*/model.safetensors")  # model.init = "random"
    weights, start = load_file(str(published)), load_file(str(initial))
    assert {k: v.shape for k, v in start.items()} == {k: v.shape for k, v in weights.items()}
    assert all(v.dtype == torch.float32 for v in weights.values())
    # The core kept its AdamW moments whole beside the policy, for a resumed core: one per
    # weight, in its whole shape, each having taken both steps' updates.
    (kept,) = tmp_path.rglob("policies/policy-v2.optimizer.pt")
    state = torch.load(kept, weights_only=True)["state"].values()
    assert sorted(m["exp_avg"].shape for m in state) == sorted(v.shape for v in weights.values())
    assert {float(m["step"]) for m in state} == {2.0}
    # The cell was two processes: the node agent started its leader and its second rank.
    (pids,) = tmp_path.rglob("logs/node-0-pids.json")
    assert {"cell-0", "cell-0.1"} <= set(json.loads(pids.read_text()))


@pytest.mark.skipif(not os.environ.get("GYRE_FSDP_LEARNING"), reason="the long run: GYRE_FSDP_LEARNING=1")
def test_a_live_run_on_an_fsdp_cell_learns(tmp_path: Path, acceptance_template: str) -> None:
    summary, events = run_live(tmp_path, acceptance_template, 'seed = 0\nrun_id = ""\n' + SHARDED)
    assert_every_step_trains_once(summary, events)
    first, last = reward_gain(summary)
    print(f"fsdp live run: reward first third {first:.3f}, last third {last:.3f}, gain {last - first:+.3f}")
    assert last - first >= 0.1
