"""Sandbox boot time per kind, and the demo's run in ``bwrap`` against ``local``.

Boot: the wall time from asking a sandbox to run ``true`` to its exit, ``--boots`` times (20) per
kind, through ``Sandbox.run`` (a one-shot command, as the evaluator's tests run) and through
``Sandbox.prepare`` (a long-running process, as a harness starts: the prepared command line
started and waited for). Median and p95 of each; a kind that cannot run here (podman not
installed, say) is reported as such, not timed.

Run: ``gyre run`` of the demo's configuration (``--steps`` of it, 2 by default, the same seed)
twice in one invocation, first with ``[sandbox] kind = "local"``, then ``"bwrap"``, nothing else
changed; the figure is bwrap's wall time over local's, each without its "prepare" phase (the
first run also makes the warm-started policy, which the second finds cached).

Targets, fixed before measuring:
- boot median: local and bwrap under ``BOOT_TARGET_S["light"]`` (0.5 s), podman and docker under
  ``BOOT_TARGET_S["container"]`` (3 s);
- run: bwrap / local wall time at most ``RUN_TARGET`` (1.25: sandboxing every harness and test
  may cost a quarter of the run, no more).

Each figure prints MET or MISSED. ``--no-run`` skips the two live runs (boots only). Results go
to ``--out`` (``out/bench_sandbox/``, not committed): ``results.json`` and ``boots.png``.

    .venv/bin/python benchmarks/bench_sandbox.py [--boots 20] [--steps 2] [--no-run]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from databases import fresh_database
from tqdm import tqdm

from gyre_train.sandbox import KINDS, Sandbox, SandboxError, sandbox_for

ROOT = Path(__file__).resolve().parent.parent
BOOT_TARGET_S = {"light": 0.5, "container": 3.0}
RUN_TARGET = 1.25


def _target(kind: str) -> float:
    return BOOT_TARGET_S["light" if kind in ("local", "bwrap") else "container"]


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _boot_run(sandbox: Sandbox, folder: Path) -> float:
    began = time.monotonic()
    done = sandbox.run(["true"], workdir=str(folder) if not sandbox.remaps else "/app",
                       binds=_binds(sandbox, folder), timeout_s=60)  # fmt: skip
    if done.exit_code != 0:
        raise SandboxError(f"true exited {done.exit_code}: {done.stderr.strip()[-200:]}")
    return time.monotonic() - began


def _boot_prepared(sandbox: Sandbox, folder: Path, i: int) -> float:
    began = time.monotonic()
    prepared = sandbox.prepare(["true"], workdir=str(folder) if not sandbox.remaps else "/app",
                               name=f"gyre-bench-{os.getpid()}-{i}", binds=_binds(sandbox, folder))  # fmt: skip
    try:
        done = subprocess.run(list(prepared.argv), env=dict(prepared.env), capture_output=True, timeout=60)
    finally:
        prepared.cleanup()
    if done.returncode != 0:
        raise SandboxError(f"prepared true exited {done.returncode}: {done.stderr.decode()[-200:]}")
    return time.monotonic() - began


def _binds(sandbox: Sandbox, folder: Path) -> list[Any]:
    from gyre_train.sandbox import Bind

    return [Bind(folder, "/app" if sandbox.remaps else str(folder), writable=True)]


def boots(count: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in KINDS:
        try:
            sandbox = sandbox_for(kind)
        except SandboxError as exc:
            out[kind] = {"unavailable": str(exc)}
            print(f"{kind}: not timed: {exc}")
            continue
        figures: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="gyre-bench-sandbox-") as name:
            folder = Path(name)
            folder.chmod(0o755)
            for way in ("run", "prepare"):
                times: list[float] = []
                try:
                    for i in tqdm(range(count), desc=f"{kind} {way}", leave=False):
                        times.append(
                            _boot_run(sandbox, folder) if way == "run" else _boot_prepared(sandbox, folder, i)
                        )
                except SandboxError as exc:
                    figures[way] = {"failed": str(exc)}
                    print(f"{kind} {way}: failed: {exc}")
                    continue
                median, p95 = statistics.median(times), _p95(times)
                verdict = "MET" if median < _target(kind) else "MISSED"
                figures[way] = {
                    "median_s": median,
                    "p95_s": p95,
                    "target_s": _target(kind),
                    "verdict": verdict,
                }
                print(f"{kind:6} {way:7} boot: median {median * 1000:7.1f} ms, p95 {p95 * 1000:7.1f} ms "
                      f"(target median < {_target(kind):g} s): {verdict}")  # fmt: skip
        out[kind] = figures
    return out


def one_run(kind: str, steps: int, seed: int, data: Path) -> float:
    folder = Path(tempfile.mkdtemp(prefix=f"gyre-bench-run-{kind}-", dir=data))
    folder.chmod(0o755)
    (folder / "run.toml").write_text(f'seed = {seed}\nsteps = {steps}\n[sandbox]\nkind = "{kind}"\n')
    env = {
        **os.environ,
        "GYRE_DATABASE_URL": os.environ.get("GYRE_DATABASE_URL") or fresh_database("gyre_bench_sandbox"),
        "GYRE_REDIS_URL": os.environ.get("GYRE_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "GYRE_DATA_DIR": str(data / "gyre-data"),
    }
    command = [sys.executable, "-m", "gyre_tools.cli", "run", "--config", str(folder / "run.toml"),
               "--json", str(folder / "run.json"), "--metrics", "none"]  # fmt: skip
    print(f"running the demo for {steps} steps under {kind}", flush=True)
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"gyre run under {kind} exited {done.returncode}")
    summary = json.loads((folder / "run.json").read_text())
    # Without "prepare": the first run of the two also makes (and caches) the warm-started policy.
    seconds = float(summary["wall_s"]) - float(summary["phases_s"].get("prepare", 0.0))
    print(f"{kind}: {time.monotonic() - began:.0f} s in all, {seconds:.0f} s after prepare", flush=True)
    return seconds


def _plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = [k for k, v in results["boots"].items() if "run" in v and "median_s" in v["run"]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for offset, way in ((-0.2, "run"), (0.2, "prepare")):
        medians = [results["boots"][k].get(way, {}).get("median_s", 0) * 1000 for k in kinds]
        p95s = [results["boots"][k].get(way, {}).get("p95_s", 0) * 1000 for k in kinds]
        xs = [i + offset for i in range(len(kinds))]
        ax.bar(xs, medians, width=0.4, label=f"{way} (median)")
        ax.scatter(xs, p95s, marker="_", s=200, color="black")
    ax.set_xticks(range(len(kinds)), kinds)
    ax.set_ylabel("boot, ms (bar: median, dash: p95)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--boots", type=int, default=20)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-run", action="store_true")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench_sandbox")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"boots": boots(args.boots)}
    if not args.no_run:
        data = Path(tempfile.mkdtemp(prefix="gyre-bench-sandbox-runs-"))
        data.chmod(0o755)
        local = one_run("local", args.steps, args.seed, data)
        bwrap = one_run("bwrap", args.steps, args.seed, data)
        ratio = bwrap / local
        verdict = "MET" if ratio <= RUN_TARGET else "MISSED"
        results["run"] = {"local_s": local, "bwrap_s": bwrap, "ratio": ratio, "target": RUN_TARGET,
                          "verdict": verdict, "steps": args.steps, "seed": args.seed}  # fmt: skip
        print(f"demo run, {args.steps} steps: local {local:.0f} s, bwrap {bwrap:.0f} s: bwrap/local "
              f"{ratio:.2f}x (target <= {RUN_TARGET}x): {verdict}")  # fmt: skip
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    _plot(results, args.out / "boots.png")
    print(f"results: {args.out / 'results.json'}, plot: {args.out / 'boots.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
