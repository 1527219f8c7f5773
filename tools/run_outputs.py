"""What a finished live run writes: the JSON figures, plots, and TensorBoard events.

Everything comes from ``RunReport`` (the log) and the run's configuration: reward by step,
the staleness histogram against E[d] = phi + (mu - 1)/2, and the role timeline of the cells
(from ``cell.role_changed``) beside the separate pool's engines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gyre_store import CellTimeReport, EventLog, ModelCallRecorded, RunReport, StreamId, WeightsPublished
from gyre_tools.run_config import RunConfig
from gyre_tools.run_steps import step_scalars


def summary_of(report: RunReport, config: RunConfig) -> dict[str, Any]:
    """The run's JSON: the keys the README documents, every figure from the log."""
    before = next((h for h in report.held_out if h.name == "heldout-before"), None)
    after = next((h for h in report.held_out if h.name == "heldout-after"), None)
    rewards = [s.mean_reward for s in report.steps if s.mean_reward is not None]
    third = max(1, len(rewards) // 3)
    first, last = rewards[:third], rewards[-third:]
    gain = (sum(last) / len(last) - sum(first) / len(first)) if rewards else None
    summary: dict[str, Any] = {
        "run_id": report.run_id,
        "policy": config.policy,
        "phi": config.phi,
        "mu": config.mu,
        "B": config.B,
        "N": config.N,
        "cells": config.cells,
        "harness": config.harness,
        "steps": [
            {
                "step": s.step,
                "policy_version": s.policy_version,
                "mean_reward": s.mean_reward,
                "groups": s.groups,
                "executions": s.executions,
                "admitted_trajectories": s.admitted_trajectories,
                "trainable_tokens": s.trainable_tokens,
                "loss": s.loss,
                "grad_norm": s.grad_norm,
                "wall_s": s.wall_s,
                "staleness_mean": s.staleness_mean,
                "roles": s.roles,
            }
            for s in report.steps
        ],
        "reward": {
            "first_third_mean": sum(first) / len(first) if first else None,
            "last_third_mean": sum(last) / len(last) if last else None,
            "gain": gain,
        },
        "eval": {
            "tasks": before.executions if before else (after.executions if after else 0),
            "pass_rate_before": before.pass_rate if before else None,
            "pass_rate_after": after.pass_rate if after else None,
            "mean_reward_before": before.mean_reward if before else None,
            "mean_reward_after": after.mean_reward if after else None,
        },
        "staleness": {
            "measured_mean": report.staleness.measured_mean,
            "expected_mean": report.staleness.expected_mean,
            "groups": report.staleness.groups,
            "histogram": report.staleness.histogram,
            "engine_mean": report.staleness.engine_mean,
            "engine_calls": report.staleness.engine_calls,
            "unreported_calls": report.staleness.unreported_calls,
            "engine_histogram": report.staleness.engine_histogram,
        },
        "transitions": report.transitions,
        "transition_times": [
            {
                "direction": t.direction,
                "cell": t.cell,
                "total_s": t.total_s,
                **{f"{k}_s": v for k, v in t.phases.items()},
            }
            for t in report.transition_times
        ],
        "run_wall_s": report.wall_s,
    }
    summary["verdict"] = _verdict(summary)
    return summary


def publications_from_log(log: EventLog, run_id: str) -> list[dict[str, Any]]:
    """Each publication of run ``run_id`` as the core recorded it (``policy.published``): its
    method, seconds to save the folder and to send it to every engine at once (the pause before
    and the continue after included), each engine reached and its seconds, the engines skipped,
    the requests each engine had in flight when it paused for the update (``paused``; an engine
    absent there could not pause, so its update waited for them), and ``retried``: the model
    calls that replaced an aborted attempt (``retry_of``) whose time overlaps the publication.
    A publication recorded before these figures existed (v1) has ``method`` "" and
    ``retried`` None."""
    published = [
        r.event for r in log.read_stream(StreamId("policy", run_id)) if isinstance(r.event, WeightsPublished)
    ]
    retries = [
        (e.started_at, e.started_at + e.duration_s)
        for r in log.read(0, types=["model_call.recorded"], limit=100_000_000)
        if isinstance(e := r.event, ModelCallRecorded) and e.run_id == run_id and e.retry_of
    ]
    out = []
    for p in published:
        measured = p.started_at > 0
        end = p.started_at + p.save_s + p.send_s
        out.append(
            {
                "version": p.policy_version,
                "step": p.step,
                "method": p.method,
                "save_s": round(p.save_s, 3),
                "send_s": round(p.send_s, 3),
                "engines": {name: round(s, 3) for name, s in sorted(p.engines.items())},
                "skipped": list(p.skipped),
                "paused": dict(sorted(p.paused.items())),
                "retried": sum(begin <= end and p.started_at <= until for begin, until in retries)
                if measured
                else None,
                "note": p.note,
            }
        )
    return out


def cell_time_summary(cells: CellTimeReport) -> dict[str, Any]:
    """Where the cells' time went (``gyre_store.cell_time``): the pooled useful fractions and
    each cell's seconds by part."""
    return {
        "trainer_useful_fraction": cells.trainer_fraction,
        "engine_generating_fraction": cells.engine_fraction,
        "cells": [
            {"name": c.name, "span_s": round(c.span_s, 2), **{k: round(v, 2) for k, v in c.parts.items()}}
            for c in cells.trainers + cells.engines
        ],
    }


def _verdict(summary: dict[str, Any]) -> str:
    reward, ev = summary["reward"], summary["eval"]
    parts = []
    if reward["gain"] is not None:
        parts.append(
            f"reward {reward['first_third_mean']:.3f} (first third) -> {reward['last_third_mean']:.3f} "
            f"(last third), gain {reward['gain']:+.3f}"
        )
    if ev["pass_rate_before"] is not None and ev["pass_rate_after"] is not None:
        parts.append(
            f"held-out pass rate {ev['pass_rate_before']:.3f} -> {ev['pass_rate_after']:.3f} ({ev['tasks']} tasks)"
        )
    st = summary["staleness"]
    if st["measured_mean"] is not None:
        parts.append(f"staleness {st['measured_mean']:.2f} measured vs E[d] = {st['expected_mean']:.2f}")
    if st.get("engine_mean") is not None:
        parts.append(f"{st['engine_mean']:.2f} from the engines' weight_version ({st['engine_calls']} calls)")
    return "; ".join(parts)


def write_outputs(
    report: RunReport,
    config: RunConfig,
    run_dir: Path,
    *,
    tensorboard: bool,
    written: frozenset[int] = frozenset(),
) -> dict[str, Any]:
    """Write the plots (and TensorBoard events when ``tensorboard``, but for the steps in
    ``written``, whose scalars were written as they landed) under ``run_dir``; return the JSON
    summary with the paths written. (W&B is logged while the run runs: ``WandbSteps``.)"""
    run_dir.mkdir(parents=True, exist_ok=True)
    summary = summary_of(report, config)
    summary["plots"] = _plots(report, config, run_dir)
    if tensorboard:
        summary["tensorboard"] = _tensorboard(report, summary, run_dir / "tensorboard", written)
    return summary


def _plots(report: RunReport, config: RunConfig, run_dir: Path) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.patches as patches
    import matplotlib.pyplot as plt

    out: dict[str, str] = {}
    steps = [s.step for s in report.steps if s.mean_reward is not None]
    rewards = [s.mean_reward for s in report.steps if s.mean_reward is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, marker="o", label="mean reward of the step's groups")
    for h, color in zip(report.held_out, ("tab:gray", "tab:green"), strict=False):
        if h.pass_rate is not None:
            ax.axhline(h.pass_rate, color=color, linestyle="--", label=f"held-out pass rate, {h.name}")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"gyre run {report.run_id}")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    out["reward"] = str(run_dir / "reward.png")
    fig.savefig(out["reward"], dpi=120)
    plt.close(fig)

    hist = report.staleness.histogram
    engine_hist = report.staleness.engine_histogram
    fig, ax = plt.subplots(figsize=(5, 3))
    total_groups, total_calls = sum(hist.values()) or 1, sum(engine_hist.values()) or 1
    ax.bar([int(k) - 0.2 for k in hist], [v / total_groups for v in hist.values()], width=0.4,
           color="tab:blue", label="groups, at dispatch")  # fmt: skip
    if engine_hist:
        ax.bar([int(k) + 0.2 for k in engine_hist], [v / total_calls for v in engine_hist.values()], width=0.4,
               color="tab:orange", label="model calls, engine-reported")  # fmt: skip
    ax.axvline(report.staleness.expected_mean, color="tab:red", linestyle="--", label="E[d] = phi + (mu-1)/2")
    if report.staleness.measured_mean is not None:
        ax.axvline(report.staleness.measured_mean, color="tab:green", label="measured mean (dispatch)")
    ax.set_xlabel("staleness d = v_t - v_d (policy versions)")
    ax.set_ylabel("fraction")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out["staleness"] = str(run_dir / "staleness.png")
    fig.savefig(out["staleness"], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 0.8 + 0.35 * (config.cells + config.rollout_engines)))
    end = report.wall_s or 1.0
    colors = {"rollout": "tab:blue", "training": "tab:orange", "transitioning": "tab:gray"}
    for span in report.role_timeline:  # the cells' roles, from cell.role_changed
        ax.barh(
            span.cell,
            span.end_s - span.start_s,
            left=span.start_s,
            color=colors.get(span.role, "k"),
            height=0.6,
        )
    pool = range(config.cells, config.cells + config.rollout_engines)
    for row in pool:  # the separate pool serves rollout throughout
        ax.barh(row, end, left=0, color=colors["rollout"], height=0.6)
    labels = [f"cell {c}" for c in range(config.cells)] + [
        f"pool engine {e}" for e in range(config.rollout_engines)
    ]
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set_xlabel(f"seconds since run start ({report.transitions} transitions)")
    handles = [patches.Patch(color=c, label=r) for r, c in colors.items()]
    ax.legend(handles=handles, fontsize=7, loc="upper right")
    ax.invert_yaxis()
    fig.tight_layout()
    out["roles"] = str(run_dir / "roles.png")
    fig.savefig(out["roles"], dpi=120)
    plt.close(fig)
    return out


def _tensorboard(report: RunReport, summary: dict[str, Any], folder: Path, written: frozenset[int]) -> str:
    from tensorboardX import SummaryWriter

    with SummaryWriter(str(folder)) as writer:
        for s in report.steps:
            if s.step not in written:
                for tag, value in step_scalars(s).items():
                    writer.add_scalar(tag, value, s.step)
        ev = summary["eval"]
        for key in ("pass_rate_before", "pass_rate_after"):
            if ev[key] is not None:
                writer.add_scalar(f"eval/{key}", ev[key], 0)
    return str(folder)
