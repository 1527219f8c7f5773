"""`gyre run` with `engine = "sglang"`: node agents start real SGLang servers (CPU) on a
checkpoint folder, the run trains every step, every publication reaches every engine, and the
versions the engines report (recorded with each model call) rise with the publications.

The checkpoint is one of ``CHECKPOINTS`` (a name and the function that writes its folder), so
running the same test on another checkpoint is one more entry. Fails, not skips, when SGLang's
environment is not built (``tools/sglang_setup.sh build``), as the contract suite does.
"""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import assert_replay_clean, gyre
from tests.acceptance.processes import gyre_run, live_run_env
from tests.checkpoints import template_ids
from tests.real_servers import require

pytestmark = [pytest.mark.sglang, pytest.mark.timeout(1200)]


def family(name: str) -> Callable[[Path], Path]:
    """A writer of a tiny checkpoint of ``name`` (``gyre checkpoint write``: the family's real
    vocabulary and embedding rows, its tokenizer and chat template), two layers, untrained."""

    def write(folder: Path) -> Path:
        from gyre_tools.checkpoint import default_cache_dir
        from gyre_train.checkpoints import write_checkpoint

        return write_checkpoint(name, folder, cache_dir=default_cache_dir())

    return write


# Each checkpoint with the publication method its run uses, so every method runs in CI once
# with a checkpoint of its own (the tensor method also holds that train.publish reaches the core).
CHECKPOINTS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "qwen3": (family("qwen3"), "disk"),
    "qwen3.6": (family("qwen3.6"), "tensor"),
}

CONFIG = """
seed = 5
steps = 2
policy = "async"
phi = 1.0
mu = 1
B = 2
N = 2
cells = 1
rollout_engines = 2
engine_capacity = 4
engine = "sglang"
harness = "builtin"
[model]
init = "{init}"
max_context = 2048
max_tokens = 16
[train]
micro_step_tokens = 2048
publish = "{publish}"
[tasks]
train = 8
heldout = 1
budget_s = 300  # SGLang on a loaded CPU answers slowly; the machinery is what is held here
[eval]
heldout = false
"""


@dataclass(frozen=True)
class Run:
    database_url: str
    env: dict[str, str]
    summary: dict[str, Any]
    folder: Path
    checkpoint: Path
    publish: str


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def sglang_run(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, acceptance_template: str
) -> Any:
    from gyre_tools.run_config import sglang_missing
    from tests import pg

    require("sglang", sglang_missing())
    folder = tmp_path_factory.mktemp("sglang-run")
    write, publish = CHECKPOINTS[request.param]
    checkpoint = write(folder / "checkpoint")
    (folder / "run.toml").write_text(CONFIG.format(init=checkpoint, publish=publish))
    with pg.database_from(acceptance_template) as url:
        env = live_run_env(url, folder / "data")
        gyre_run(folder, env, timeout=1100)
        summary = json.loads((folder / "run.json").read_text())
        yield Run(url, env, summary, folder, checkpoint, publish)


def _bodies(url: str, run_id: str, *types: str) -> list[tuple[str, dict[str, Any]]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT event_type, body FROM gyre_events WHERE body->>'run_id' = %s AND event_type = ANY(%s) "
            "ORDER BY position",
            (run_id, list(types)),
        ).fetchall()
    return [(str(t), dict(b)) for t, b in rows]


def test_every_step_trains_on_sglang_engines_and_staleness_is_measured(sglang_run: Run) -> None:
    s = sglang_run.summary
    assert [(step["step"], step["policy_version"]) for step in s["steps"]] == [(0, 1), (1, 2)]
    for step in s["steps"]:
        assert step["groups"] == 2 and step["executions"] == 4 and step["trainable_tokens"] > 0
    assert s["staleness"]["groups"] == 4 and s["staleness"]["measured_mean"] is not None
    # ... and from the versions the SGLang servers reported with every sampled token.
    assert s["staleness"]["unreported_calls"] == 0 and s["staleness"]["engine_calls"] > 0
    assert s["staleness"]["engine_mean"] is not None and s["staleness"]["engine_mean"] >= 0
    # The engines were SGLang servers started by the node agent, each logging to the run.
    logs = sorted(p.name for p in (Path(s["plots"]["reward"]).parent / "logs").glob("sglang-*.log"))
    assert logs == ["sglang-pool-0.log", "sglang-pool-1.log"]


def test_every_publication_reaches_every_engine_and_the_reported_version_rises(sglang_run: Run) -> None:
    run_id = sglang_run.summary["run_id"]
    events = _bodies(sglang_run.database_url, run_id, "engine.registered", "model_call.recorded")
    engines = {b["engine"] for t, b in events if t == "engine.registered"}
    assert engines == {f"{run_id}:pool-0", f"{run_id}:pool-1"}
    run_dir = Path(sglang_run.summary["plots"]["reward"]).parent
    publications = [
        json.loads(line) for line in (run_dir / "policies" / "publications.jsonl").read_text().splitlines()
    ]
    assert [p["version"] for p in publications] == [1, 2]
    assert [p["version"] for p in sglang_run.summary["publications"]] == [1, 2]  # in the run's JSON
    # The log holds each publication's figures (policy.published v2), as the report reads them:
    # both engines reached and paused for the update (SGLang's /pause_generation), none skipped.
    from gyre_store import PostgresEventLog, StoreConfig
    from gyre_tools.run_outputs import publications_from_log

    with PostgresEventLog(StoreConfig(sglang_run.database_url)) as log:
        logged = publications_from_log(log, run_id)
    assert [p["version"] for p in logged] == [1, 2]
    for p in logged:
        assert p["method"] == sglang_run.publish and p["skipped"] == []
        assert sorted(p["engines"]) == sorted(p["paused"]) == sorted(engines)
        assert all(n >= 0 for n in p["paused"].values()) and isinstance(p["retried"], int)
        assert p["send_s"] > 0 and p["save_s"] > 0
    # What each engine reported with each model call, in the order the calls were recorded.
    versions: dict[str, list[int]] = defaultdict(list)
    for t, b in events:
        if t == "model_call.recorded" and b["weight_versions"]:
            versions[b["engine"]].extend(v for _, v in b["weight_versions"])
    assert set(versions) == engines  # every engine served, each with a policy version
    assert all(v[0] == 0 for v in versions.values())  # the starting policy, as version 0
    assert max(max(v) for v in versions.values()) >= 1  # and a published one after a publication
    # Calls that began after a publication had reached every engine were answered under it.
    with psycopg.connect(sglang_run.database_url) as conn:
        rows = conn.execute(
            "SELECT (body->>'started_at')::float, body->'weight_versions' FROM gyre_events "
            "WHERE event_type = 'model_call.recorded' AND body->>'run_id' = %s",
            (run_id,),
        ).fetchall()
    for p in publications:  # publications.jsonl: started_at with full precision
        done = p["started_at"] + p["save_s"] + p["send_s"]
        later = [spans[0][1] for started, spans in rows if started > done and spans]
        assert all(v >= p["version"] for v in later), (p["version"], later)


def test_a_recorded_prompt_is_the_checkpoints_own_apply_chat_template(sglang_run: Run) -> None:
    """The first call of a main agent: the checkpoint's tokenizer and template over the built-in
    agent's system prompt, tools and the task's prompt give exactly the recorded ids."""
    from transformers import AutoTokenizer

    from gyre_proxy.harness import SYSTEM_MAIN, TOOL_SPECS
    from gyre_store import PostgresEventLog, StoreConfig
    from gyre_store.catalog import ModelCallRecorded, TitoArrays
    from gyre_store.log import StreamId

    run_id = sglang_run.summary["run_id"]
    hf = AutoTokenizer.from_pretrained(str(sglang_run.checkpoint))
    prompts = [b["prompt"] for _, b in _bodies(sglang_run.database_url, run_id, "task.defined")]
    with psycopg.connect(sglang_run.database_url) as conn:
        row = conn.execute(
            "SELECT body->>'execution_id', body->>'request_id' FROM gyre_events "
            "WHERE event_type = 'model_call.recorded' AND body->>'run_id' = %s "
            "AND (body->>'prefix_len')::int = 0 AND body->>'agent_kind' = 'main' ORDER BY position LIMIT 1",
            (run_id,),
        ).fetchone()
    assert row is not None
    with PostgresEventLog(StoreConfig(sglang_run.database_url)) as log:
        (first,) = [
            r for r in log.read_stream(StreamId("calls", row[0]))
            if isinstance(r.event, ModelCallRecorded) and r.event.request_id == row[1]
        ]  # fmt: skip
        recorded = TitoArrays.from_payload(first.payload).input_ids.tolist()
    text = hf.decode(recorded)
    (prompt,) = {p for p in prompts if f"user\n{p}<|im_end|>" in text}  # the task of this execution
    tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": n, "description": spec["description"],
              "parameters": spec["input_schema"]}} for n, spec in TOOL_SPECS.items()]  # fmt: skip
    expected = template_ids(
        hf, [{"role": "system", "content": SYSTEM_MAIN}, {"role": "user", "content": prompt}], tools
    )
    assert recorded == expected


def test_the_scheduler_replays_the_sglang_run_and_no_server_outlives_it(sglang_run: Run) -> None:
    out = gyre("sched", "replay", "--run", sglang_run.summary["run_id"], env=sglang_run.env)
    assert_replay_clean(out)
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    left = [
        line for line in ps.splitlines() if str(sglang_run.checkpoint) in line and not line.startswith("Z")
    ]
    assert left == [], "SGLang servers outlived gyre run:\n" + "\n".join(left)
