"""``gyre ablate``: admission ablations offline, on executions already in the store (no GPU).

Reads each execution's trajectory tree, runs admission under every requested J_max and role
priority with the same per-execution seed, and reports what a trainer would process, beside the
paper's trajectory budget ablation (forward-backward time at cap 1 and 5: 41.4% and 74.8%).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from rich.table import Table

from gyre_store import ConfigError, PostgresEventLog, PostgresProjectionStore, catch_up
from gyre_store.trees import TreeView
from gyre_tools.cli import add_env_argument
from gyre_tools.common import add_store_arguments, all_projections, console, open_store

if TYPE_CHECKING:
    from gyre_train import AblationReport, AblationSetting, LeafPriority


def register(subparsers: Any) -> None:
    ab = subparsers.add_parser("ablate", help="run admission ablations on stored executions")
    add_store_arguments(ab)
    add_env_argument(
        ab,
        "--jmax",
        "GYRE_ABLATE_JMAX",
        default="1,5,all",
        help="comma-separated J_max values; all = uncapped",
    )
    add_env_argument(
        ab,
        "--priority",
        "GYRE_ABLATE_PRIORITY",
        default="class",
        help="comma-separated priorities: class (eq. 4), flat, or an order such as main>sub_agent",
    )
    add_env_argument(
        ab,
        "--executions",
        "GYRE_ABLATE_EXECUTIONS",
        help="comma-separated execution ids, or a SELECT whose first column is execution ids (default: all)",
    )
    add_env_argument(ab, "--seed", "GYRE_ABLATE_SEED", default="0", type=int, help="admission seed")
    add_env_argument(ab, "--json", "GYRE_ABLATE_JSON", help="write the full report as JSON to this file")
    add_env_argument(ab, "--plot", "GYRE_ABLATE_PLOT", help="write a PNG plot of the fractions to this file")
    ab.set_defaults(func=run)


def parse_caps(text: str) -> list[int | None]:
    caps: list[int | None] = []
    for part in (p.strip() for p in text.split(",")):
        if part in ("all", "none", "uncapped"):
            caps.append(None)
        elif part.isdigit() and int(part) >= 1:
            caps.append(int(part))
        else:
            raise ConfigError(f"--jmax: {part!r} is neither a positive integer nor 'all'")
    return list(dict.fromkeys(caps))


def parse_priority(text: str) -> LeafPriority:
    # gyre_train (and torch behind it) is imported only when `gyre ablate` runs.
    from gyre_train import CLAUDE_CODE_ORDER, ClassPriority, FlatPriority, LeafClass

    if text == "class":
        return ClassPriority(CLAUDE_CODE_ORDER)
    if text == "flat":
        return FlatPriority()
    try:
        return ClassPriority(tuple(LeafClass(p.strip()) for p in text.split(">")))
    except ValueError:
        known = ", ".join(c.value for c in LeafClass)
        raise ConfigError(f"--priority: {text!r} is not class, flat or an order of {known}") from None


def settings(caps: list[int | None], priorities: list[str]) -> list[AblationSetting]:
    from gyre_train import AblationSetting, AdmissionConfig

    out = []
    for name in priorities:
        priority = parse_priority(name)
        base = f"{name} J_max=all"
        for cap in [*caps, None] if None not in caps else caps:
            label = f"{name} J_max={'all' if cap is None else cap}"
            out.append(AblationSetting(label, AdmissionConfig(max_trajectories=cap, priority=priority), base))
    return out


def select_executions(log: PostgresEventLog, spec: str | None) -> list[str]:
    if spec and spec.lstrip().lower().startswith(("select", "with")):
        with log.pool.connection() as conn, conn.transaction():
            conn.execute("SET TRANSACTION READ ONLY")
            ids = [str(r[0]) for r in conn.execute(spec)]
    elif spec:
        ids = [p.strip() for p in spec.split(",") if p.strip()]
    else:
        with log.pool.connection() as conn:
            ids = [str(r[0]) for r in conn.execute("SELECT execution_id FROM gyre_tree_state ORDER BY 1")]
    if not ids:
        raise ConfigError("no executions selected; record some first (gyre tracegen) or check --executions")
    return ids


def report_table(report: AblationReport) -> Table:
    table = Table(title="admission ablation (fractions relative to the uncapped setting)")
    for column in ("setting", "exec.", "trajectories", "targets", "lost", "covered", "fb tokens",
                   "fb / uncapped", "attention / uncapped", "paper fb time", "repetition avoided",
                   "class shares", "admit ms (mean/max)"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("setting", "class shares") else "right")
    for s in report.summaries:
        shares = " ".join(f"{k}={v:.0%}" for k, v in s.class_shares.items())
        paper = "" if s.paper_fb_fraction is None else f"{s.paper_fb_fraction:.1%}"
        table.add_row(
            s.setting, str(s.executions), str(s.trajectories), str(s.targets), str(s.lost),
            f"{s.covered_fraction:.1%}", str(s.row_tokens), f"{s.fb_token_fraction:.1%}",
            f"{s.fb_attention_fraction:.1%}", paper, str(s.repetition_avoided), shares,
            f"{s.admission_ms_mean:.2f}/{s.admission_ms_max:.2f}",
        )  # fmt: skip
    return table


def plot(report: AblationReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [s.setting for s in report.summaries]
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], [s.fb_token_fraction for s in report.summaries], 0.4, label="stored data")
    ax.bar(
        [i + 0.2 for i in x],
        [s.paper_fb_fraction or 0.0 for s in report.summaries],
        0.4,
        label="paper (fb time)",
    )
    ax.set_xticks(list(x), labels, rotation=20, ha="right")
    ax.set_ylabel("forward-backward / uncapped")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from gyre_train import run_ablation, stored_execution

    caps = parse_caps(args.jmax)
    priorities = [p.strip() for p in args.priority.split(",") if p.strip()]
    configured = settings(caps, priorities)
    with open_store(args) as opened:
        log = opened.log
        projections = all_projections()
        store = PostgresProjectionStore(log.pool, projections.tables())
        catch_up(log, store, projections.get("trees"))
        ids = select_executions(log, args.executions)
        executions = [stored_execution(TreeView.load(store, eid)) for eid in ids]
    report = run_ablation(executions, configured, seed=args.seed)
    console.print(report_table(report))
    for s in report.summaries:
        if s.max_trajectories in (1, 5):
            console.print(
                f"{s.setting}: forward-backward tokens {s.fb_token_fraction:.1%} of uncapped "
                f"(paper: {s.paper_fb_fraction:.1%} of uncapped forward-backward time)"
            )
    slowest = max(s.admission_ms_max for s in report.summaries)
    console.print(f"admission: at most {slowest:.2f} ms per execution over {len(executions)} executions")
    if args.json:
        Path(args.json).write_bytes(msgspec.json.format(msgspec.json.encode(report)))
        console.print(f"report written to {args.json}")
    if args.plot:
        plot(report, Path(args.plot))
        console.print(f"plot written to {args.plot}")
    return 0
