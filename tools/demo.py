"""``gyre demo``: a small run end to end on the embedded services (or yours).

Reads top to bottom: open the store, record a run's lifecycle as events (groups
dispatched, executions started and finished, cells changing roles, a publication), catch
the projections up, then show the log, the waterlevel and a replay as of mid-run. Then a
rollout group of two synthetic Claude Code executions is evaluated (one after a timeout),
and its rewards, admitted trajectories and the execution-level loss on a tiny Qwen3 are shown.
"""

from __future__ import annotations

import argparse
import random
import uuid
from typing import TYPE_CHECKING, Any

from rich.progress import track

from gyre_store import (
    CellRole,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStarted,
    FinishReason,
    GroupDispatched,
    InMemoryProjectionStore,
    NewEvent,
    PostgresEventLog,
    PostgresProjectionStore,
    RunStarted,
    WeightsPublished,
    catch_up,
    rebuild,
)
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, all_projections, console, open_store
from gyre_tools.events import _line
from gyre_tools.projections import print_rows

if TYPE_CHECKING:
    import torch
    from transformers import Qwen3ForCausalLM

    from gyre_train import MicroStep


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser("demo", help="record and show a small run on the embedded default")
    add_store_arguments(demo)
    add_env_argument(demo, "--seed", "GYRE_DEMO_SEED", default="0", type=int, help="random seed")
    add_env_argument(
        demo, "--groups", "GYRE_DEMO_GROUPS", default="4", type=int, help="rollout groups (B * bursts)"
    )
    add_env_argument(
        demo, "--group-size", "GYRE_DEMO_GROUP_SIZE", default="4", type=int, help="executions per group N"
    )
    demo.add_argument(
        "--no-training",
        dest="training",
        action="store_false",
        help="skip the evaluation, admission and tiny-model loss part",
    )
    demo.add_argument(
        "--no-serving",
        dest="serving",
        action="store_false",
        help="skip the executions through the proxy and the streaming-training part",
    )
    demo.set_defaults(func=run)


def lifecycle_events(run_id: str, groups: int, n: int, rng: random.Random) -> list[NewEvent]:
    """A plausible event sequence of a short run with K=2 cells and C_e=8."""
    out = [
        NewEvent(
            RunStarted(
                run_id=run_id,
                harness="claude-code",
                model="tiny-qwen3",
                group_size=n,
                batch_groups=2,
                cells=2,
                cell_capacity=8,
                phi=0.5,
                mu=1,
            ),
            expected_version=0,
        )
    ]
    executions = []
    for g in range(groups):
        gid = f"{run_id}-g{g}"
        out.append(
            NewEvent(GroupDispatched(group_id=gid, run_id=run_id, query_id=f"q{g}", size=n, policy_version=0))
        )
        for k in range(n):
            eid = f"{gid}-e{k}"
            executions.append(eid)
            out.append(
                NewEvent(ExecutionDispatched(execution_id=eid, run_id=run_id, group_id=gid, policy_version=0))
            )
    running: list[str] = []
    for eid in executions:
        out.append(
            NewEvent(ExecutionStarted(execution_id=eid, run_id=run_id, engine=f"cell{rng.randrange(2)}"))
        )
        running.append(eid)
        if len(running) > 6:
            done = running.pop(rng.randrange(len(running)))
            reason = FinishReason.COMPLETED if rng.random() > 0.1 else FinishReason.HARNESS_TIMEOUT
            out.append(NewEvent(ExecutionFinished(execution_id=done, run_id=run_id, reason=reason)))
    out.append(
        NewEvent(
            CellRoleChanged(run_id=run_id, cell_index=0, role=CellRole.TRAINING, previous=CellRole.ROLLOUT)
        )
    )
    for done in running:
        out.append(
            NewEvent(ExecutionFinished(execution_id=done, run_id=run_id, reason=FinishReason.COMPLETED))
        )
    out.append(NewEvent(WeightsPublished(run_id=run_id, policy_version=1, step=1)))
    out.append(
        NewEvent(
            CellRoleChanged(run_id=run_id, cell_index=0, role=CellRole.ROLLOUT, previous=CellRole.TRAINING)
        )
    )
    return out


def run(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    run_id = f"demo-{uuid.uuid4().hex[:8]}"
    projections = all_projections()
    with open_store(args, with_redis=args.serving) as opened:
        log = opened.log
        start = log.head()
        console.rule(f"[bold]gyre demo: run {run_id}")
        events = lifecycle_events(run_id, args.groups, args.group_size, rng)
        for i in track(range(0, len(events), 8), description="recording events"):
            log.append(events[i : i + 8])
        console.print(f"recorded {len(events)} events at positions {start + 1}..{log.head()}")

        console.rule("the log (last 12 events)")
        for ev in log.read(max(start, log.head() - 12), limit=12):
            console.print(_line(ev, False), markup=False, soft_wrap=True)

        store = PostgresProjectionStore(log.pool, projections.tables())
        for p in projections:
            catch_up(log, store, p)
        console.rule("projections")
        with log.pool.connection() as conn:
            cur = conn.execute("SELECT * FROM gyre_waterlevel_v WHERE run_id = %s", (run_id,))
            cols = [d.name for d in cur.description or []]
            print_rows(
                "gyre_waterlevel_v (d, p, f and w = d - f)", [dict(zip(cols, r, strict=True)) for r in cur]
            )
        print_rows("gyre_cell_roles", [r for r in store.dump("gyre_cell_roles") if r["run_id"] == run_id])

        middle = start + len(events) // 2
        console.rule(f"replay as of position {middle} (live projections untouched)")
        counters = projections.get("counters")
        memory = InMemoryProjectionStore({t.name: t for t in counters.tables})
        rebuild(log, memory, counters, until=middle)
        print_rows(
            "gyre_counters as of mid-run", [r for r in memory.dump("gyre_counters") if r["run_id"] == run_id]
        )
        if args.training:
            try:
                import torch  # noqa: F401 - the loss part needs the train extra
                import transformers  # noqa: F401
            except ModuleNotFoundError as exc:
                console.print(f"[dim]skipping rewards, admission and loss: {exc.name} is missing "
                              "(pip install 'gyre[train]')[/dim]")  # fmt: skip
            else:
                training_demo(log, store, run_id, args.seed)
        if args.serving:
            from gyre_tools.demo_parts import proxy_part, streaming_part

            console.rule("executions through the proxy (reference engine, scripted tool calls)")
            proxy_part(log, console)
            console.rule("streaming training: a core and a satellite, one batch, published to an engine")
            streaming_part(opened.services.redis_url, opened.services.database_url, console)
    return 0


# -- from executions to a loss ------------------------------------------------------------------


def training_demo(log: PostgresEventLog, store: PostgresProjectionStore, run_id: str, seed: int) -> None:
    """Record a group of two executions, evaluate them, admit their trajectories, compute a loss."""
    # Imported here: torch and transformers take seconds to load, and every `gyre` command
    # builds the whole parser.
    import torch

    from gyre_proxy.engines import qwen_tokenizer
    from gyre_proxy.harness import ClaudeCodeHarness
    from gyre_proxy.ingest import Ingestor, Qwen3Template, TraceConfig, TraceGenerator
    from gyre_store.trees import TrajectoryRecorder, TreeView
    from gyre_train import (
        AdmissionConfig,
        AdvantageConfig,
        BatchPacker,
        CallableEvaluator,
        EvaluationConfig,
        EvaluationRunner,
        GroupSourceConfig,
        PackingConfig,
        StoreGroupSource,
        admission_rng,
        admit,
        stored_execution,
    )
    from gyre_train.objective import (
        LossConfig,
        LossCounters,
        SequenceRatioAccumulator,
        accumulate_sequence_ratios,
        micro_step_loss,
        step_log,
    )

    group, reasons = f"{run_id}-tg", (FinishReason.COMPLETED, FinishReason.HARNESS_TIMEOUT)
    executions = [f"{group}-e{k}" for k in range(len(reasons))]
    console.rule(f"from executions to a loss: group {group}")
    log.append([NewEvent(GroupDispatched(group_id=group, run_id=run_id, query_id="repo-task", size=2,
                                         policy_version=1))])  # fmt: skip
    ingestor = Ingestor(TrajectoryRecorder(log), Qwen3Template(qwen_tokenizer()), ClaudeCodeHarness())
    for k, (execution_id, reason) in enumerate(zip(executions, reasons, strict=True)):
        log.append(
            [
                NewEvent(ExecutionDispatched(execution_id=execution_id, run_id=run_id, group_id=group,
                                             policy_version=1)),
                NewEvent(ExecutionStarted(execution_id=execution_id, run_id=run_id, engine="synthetic")),
            ]
        )  # fmt: skip
        trace = TraceConfig(
            seed=seed + k, main_requests=6, compact_at=4_000, subagents=1, subagent_requests=(2, 3),
            subagent_compact_at=1_500, retry_every=7, tool_result_words=(15, 60), interrupt_at=3,
        )  # fmt: skip
        TraceGenerator(ingestor, trace).run(execution_id, run_id)
        log.append([NewEvent(ExecutionFinished(execution_id=execution_id, run_id=run_id, reason=reason))])

    # The evaluator sees only the preserved workspace; the second execution timed out and is
    # scored on what it had done (partial scoring).
    scores = {executions[0]: 0.8, executions[1]: 0.3}
    evaluator = CallableEvaluator(lambda state: scores[state.execution_id], name="demo-tests")
    runner = EvaluationRunner(log, evaluator, EvaluationConfig(max_attempts=2, retry_delay_s=0))
    for k, execution_id in enumerate(executions):
        runner.preserve(execution_id, f"commit-{k}a", branch_refs=["refs/heads/main"], location=f"/ws/{k}")
        runner.settle(execution_id, deadline=float("inf"))
    config = GroupSourceConfig(
        AdmissionConfig(max_trajectories=2), AdvantageConfig(scale_by_std=True), seed=seed
    )
    source = StoreGroupSource(log, store, config, step=1)
    source.ready_groups()
    with log.pool.connection() as conn:
        cur = conn.execute(
            "SELECT execution_id, outcome, reward, evaluator, artifact_version, branch_refs, finish_reason, partial "
            "FROM gyre_reward_provenance_v WHERE group_id = %s ORDER BY execution_id",
            (group,),
        )
        cols = [d.name for d in cur.description or []]
        print_rows("rewards (gyre_reward_provenance_v)", [dict(zip(cols, r, strict=True)) for r in cur])

    admitted = []
    for execution_id in executions:
        stored = stored_execution(TreeView.load(store, execution_id))
        admission = admit(stored.tree, config.admission, admission_rng(seed, execution_id))
        for t in admission.trajectories:
            admitted.append({"execution_id": execution_id, "draw": t.draw, "class": t.leaf_class.value,
                             "targets L_r": t.target_count, "path nodes": len(stored.tree.paths[t.leaf_index])})  # fmt: skip
    print_rows(f"admitted trajectories (J_max = {config.admission.max_trajectories})", admitted)

    packer = BatchPacker(PackingConfig(token_budget=1 << 20, groups_per_batch=1, executions_per_group=2), 0)
    steps = packer.pull(source)
    model = _tiny_qwen3(max(int(s.token_ids.max()) for s in steps if len(s)) + 1)
    loss_config = LossConfig()
    accumulator = SequenceRatioAccumulator()
    with torch.no_grad():
        logprobs = [_target_logprobs(model, step) for step in steps]
        for step, lp in zip(steps, logprobs, strict=True):
            accumulate_sequence_ratios(step, lp, accumulator)
        clip = accumulator.finish(packer.executions, loss_config)
        shares = [
            micro_step_loss(step, lp, clip, loss_config) for step, lp in zip(steps, logprobs, strict=True)
        ]
    total = float(sum(float(s.loss) for s in shares))
    counters = LossCounters()
    for share in shares:
        counters = counters + share.counters
    logged = step_log(total, clip, counters)
    rows = [
        {"execution_id": e, "advantage A_i": round(a.advantage, 3), "targets L_i": n,
         "s_i": f"{ratio:.3e}", "clip m_i": int(m)}
        for a, e, n, ratio, m in zip(packer.executions, clip.execution_ids, clip.target_counts,
                                     clip.sequence_ratios, clip.clip_mask, strict=True)
    ]  # fmt: skip
    print_rows("execution-level objective, pass 1 (eq. 5)", rows)
    console.print(
        f"loss on a tiny Qwen3 with random weights: {total:.4e} over {len(steps)} micro-step(s) and "
        f"{logged.target_tokens} targets (B*N = 2; clip fraction {logged.clip_fraction:.2f}). Random weights "
        "disagree with the recorded behaviour logprobs, so s_i << 1 and the negative-advantage execution is "
        "clipped."
    )
    for projection in all_projections():  # leave every live projection caught up with the log
        catch_up(log, store, projection)


def _tiny_qwen3(vocab_size: int) -> Qwen3ForCausalLM:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=4, max_position_embeddings=1 << 17,
    )  # fmt: skip
    return Qwen3ForCausalLM(config).eval()


def _target_logprobs(model: Qwen3ForCausalLM, step: MicroStep, chunk: int = 512) -> torch.Tensor:
    """[T] logprobs at the micro-step's targets (0 elsewhere), one row at a time with a KV cache.

    Equal to ``packed_token_logprobs`` at the targets, but never materializes a [T, T] mask or
    [T, V] logits, so rows of tens of thousands of tokens fit in a laptop's memory.
    """
    import numpy as np
    import torch
    from transformers import DynamicCache

    out = torch.zeros(len(step), dtype=torch.float32)
    for r in range(len(step.row_starts) - 1):
        lo, hi = int(step.row_starts[r]), int(step.row_starts[r + 1])
        ids = torch.tensor(step.token_ids[lo:hi], dtype=torch.long)[None]  # [1, n]
        cache = DynamicCache()
        hidden = []
        for start in range(0, hi - lo, chunk):
            output = model.model(input_ids=ids[:, start : start + chunk], cache=cache, use_cache=True)
            hidden.append(output.last_hidden_state[0])
        states = torch.cat(hidden)  # [n, H]
        targets = torch.from_numpy(np.flatnonzero(step.target_mask[lo:hi]))  # [U_r] positions >= 1
        for part in torch.split(targets, chunk):
            logits = model.lm_head(states[part - 1]).float()  # [u, V]
            out[lo + part] = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, part, None])[:, 0]
    return out
