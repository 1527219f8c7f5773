"""What a live run's acceptance tests read back and check, whatever trains its cells.

``run_live`` runs ``gyre run`` on a config in a database made from the acceptance template and
returns the run's summary and events; ``assert_every_step_trains_once`` checks that every step
made one update from micro-steps each counted once, computed by a cell's leader, and published.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from tests.acceptance.processes import gyre_run, live_run_env, run_events

Events = list[tuple[str, dict[str, Any]]]

# A short live run for CI, whatever trains its cells (append the [train] table under test): a
# random policy, two steps of B = 2 groups of N = 2, one trainer cell and one engine.
SHORT_RUN = """
seed = 3
steps = 2
policy = "async"
B = 2
N = 2
cells = 1
rollout_engines = 1
engine_capacity = 4
[model]
init = "random"
max_tokens = 32
[tasks]
train = 8
heldout = 3
budget_s = 150
[eval]
heldout = false
"""


def run_live(folder: Path, acceptance_template: str, config: str) -> tuple[dict[str, Any], Events]:
    """`gyre run` on ``config`` in ``folder``: the run's run.json and its events."""
    from tests import pg

    (folder / "run.toml").write_text(config)
    with pg.database_from(acceptance_template) as url:
        gyre_run(folder, live_run_env(url, folder / "data"), timeout=1700)
        summary: dict[str, Any] = json.loads((folder / "run.json").read_text())
        events = run_events(url, str(summary["run_id"]))
    return summary, events


def assert_every_step_trains_once(summary: dict[str, Any], events: Events) -> None:
    steps = summary["steps"]
    count = len(steps)
    assert count >= 2
    assert [s["step"] for s in steps] == list(range(count))
    assert [s["policy_version"] for s in steps] == list(range(1, count + 1))
    updates = [b for t, b in events if t == "train.update"]
    assert [u["policy_version"] for u in updates] == list(range(1, count + 1))  # one update a step
    contributions = Counter((b["batch"], b["micro_step"]) for t, b in events if t == "train.contribution")
    assert contributions and set(contributions.values()) == {1}  # each micro-step counted once
    for update in updates:
        assert update["micro_steps"] == sum(1 for b, _ in contributions if b == update["batch"]) > 0
    computed = Counter(
        (b["batch"], b["micro_step"]) for t, b in events if t == "train.computed" and b["phase"] == 2
    )
    claims = [
        (b["batch"], b["micro_step"], b["phase"], b["deliveries"]) for t, b in events if t == "train.claimed"
    ]
    assert computed == contributions, (
        claims,
        [(t, b.get("batch")) for t, b in events if t.startswith("train.")],
    )
    assert sum(t == "policy.published" for t, _ in events) == count


def reward_gain(summary: dict[str, Any]) -> tuple[float, float]:
    """The mean reward of the first and of the last third of the run's steps."""
    rewards = [s["mean_reward"] for s in summary["steps"] if s["mean_reward"] is not None]
    third = max(1, len(rewards) // 3)
    return sum(rewards[:third]) / third, sum(rewards[-third:]) / third
