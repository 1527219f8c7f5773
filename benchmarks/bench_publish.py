"""Seconds per publication of new policy weights, by method and model size: to one engine, to N
engines at once, and to N engines one after another, every ratio from one run.

For each model size (a Qwen3-family checkpoint from ``write_checkpoint``: 151,936-row tied
embedding, ``LAYERSxHIDDEN``), ``--engines`` engines are started on it (gyre's reference engine
in this process, or real SGLang servers on the CPU with ``--engine sglang``). Then, for each
method (``disk``: ``save_pretrained`` and ``/update_weights_from_disk``; ``tensor``:
``/update_weights_from_tensor``; ``distributed``: ``/init_weights_update_group`` once, then a
gloo broadcast and ``/update_weights_from_distributed``) and each N:

* one engine and N at once: ``LivePublisher``, what a live run uses, to N registered engines
  (gathered). Its record splits the folder save from the send; a publication's seconds are the
  send, plus the save for ``disk`` (for the other methods the save only keeps the policy for a
  resumed core, and is shown apart).
* N one after another: ``EnginePublisher``, whose ``disk`` and ``tensor`` paths load the
  engines in turn; for ``distributed``, N one-engine publishers (one group each) in turn.

Each path publishes ``--warmup`` untimed versions first (group joins, format queries), then
``--repeats`` timed ones; medians are shown. Every publication carries a fresh version number
(and slightly changed weights), and afterwards every engine it went to must report that
version (``/model_info``), so no publication is a no-op. Targets, fixed before measuring:
at once / one engine <= 1.5 for every N and method, and N one after another / N at once > 1.
Each ends MET or MISSED. The plot goes to ``out/bench_publish/publish-<engine>.png`` (not
committed).

    .venv/bin/python benchmarks/bench_publish.py [--engine reference|sglang] [--quick]
        [--sizes 2x64 4x256 4x512] [--engines 3] [--repeats 3] [--warmup 1]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from bars import bar
from rich.console import Console
from rich.table import Table

from gyre_proxy.engines import EngineClient, EngineClientConfig, SGLangServer, SGLangServerConfig
from gyre_proxy.engines.refengine import (
    ModelSource,
    ReferenceEngineConfig,
    ReferenceEngineServer,
    load_model,
    save_model_dir,
)
from gyre_store import EngineRegistered, InMemoryEventLog, NewEvent
from gyre_tools.checkpoint import default_cache_dir
from gyre_tools.run_config import sglang_missing, sglang_serve_command
from gyre_train.cells import EnginePublisher, EnginePublisherConfig, LivePublisher
from gyre_train.checkpoints import write_checkpoint

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("disk", "tensor", "distributed")
AT_ONCE_LIMIT = 1.5  # N at once / one engine, at most (target fixed before measuring)
TIMEOUT_S = 900.0  # one engine call; a large model into CPU SGLang on a busy machine is slow


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int

    @property
    def label(self) -> str:
        return f"{self.layers}x{self.hidden}"


def parse_size(text: str) -> Size:
    try:
        layers, hidden = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a size is LAYERSxHIDDEN (e.g. 4x256), not {text!r}") from None
    return Size(layers, hidden)


class Weights:
    """A ``PublishableModel`` over a Hugging Face model; ``bump`` changes it a little."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._small = min(model.parameters(), key=lambda p: p.numel())  # a norm's weight

    def named_tensors(self) -> dict[str, torch.Tensor]:
        return {n: t.detach() for n, t in self.model.state_dict().items()}

    def save(self, path: Path) -> Path:
        return save_model_dir(self.model, path)

    @torch.no_grad()
    def bump(self) -> None:
        self._small.add_(1e-3)


@dataclass
class Counter:
    """The next weight version: one per publication, across the whole run."""

    value: int = 0

    def next(self) -> int:
        self.value += 1
        return self.value


def versions_served(urls: list[str]) -> list[str | None]:
    async def ask(url: str) -> str | None:
        async with EngineClient(EngineClientConfig(url, timeout_s=120)) as engine:
            return (await engine.model_info()).weight_version

    async def every() -> list[str | None]:
        return list(await asyncio.gather(*(ask(url) for url in urls)))

    return asyncio.run(every())


def check_served(urls: list[str], version: int, what: str) -> None:
    served = versions_served(urls)
    if served != [str(version)] * len(urls):
        raise SystemExit(f"{what}: the engines report versions {served} after publishing {version}")


def drop_folders(*folders: Path) -> None:
    """The saved policies (a large model's folder is hundreds of MB; only the last is needed)."""
    for folder in folders:
        for saved in folder.glob("policy-v*"):
            if saved.is_dir():
                shutil.rmtree(saved, ignore_errors=True)
            else:
                saved.unlink(missing_ok=True)


@dataclass
class Timing:
    seconds: list[float]
    save: list[float]  # LivePublisher's folder save, shown apart for tensor and distributed


def live(weights: Weights, urls: list[str], method: str, work: Path, runs: int, warmup: int,
         versions: Counter, tick: Callable[[], None]) -> Timing:  # fmt: skip
    """One engine or N at once: a live run's ``LivePublisher`` to ``urls`` registered."""
    log = InMemoryEventLog()
    log.append([NewEvent(EngineRegistered(engine=f"bench:e{i}", run_id="bench", url=url, capacity=1))
                for i, url in enumerate(urls)])  # fmt: skip
    publish_dir = work / "live"
    publish_dir.mkdir(exist_ok=True)
    publisher = LivePublisher(log, "bench", publish_dir, method=method, timeout_s=TIMEOUT_S)
    timing = Timing([], [])
    try:
        for attempt in range(warmup + runs):
            weights.bump()
            version = versions.next()
            publisher.publish(weights, version)
            record = publisher.publications[-1]
            if record.skipped or record.note:
                raise SystemExit(f"{method} to {len(urls)} at once: skipped {record.skipped} {record.note}")
            check_served(urls, version, f"{method} to {len(urls)} at once")
            if attempt >= warmup:
                timing.seconds.append(record.send_s + (record.save_s if method == "disk" else 0.0))
                timing.save.append(record.save_s)
            drop_folders(publish_dir)
            tick()
    finally:
        publisher.close()
    return timing


def in_turn(weights: Weights, urls: list[str], method: str, work: Path, runs: int, warmup: int,
            versions: Counter, tick: Callable[[], None]) -> Timing:  # fmt: skip
    """N one after another: ``EnginePublisher``'s sequential paths (``distributed``: one
    one-engine publisher, with its own group, per engine, in turn)."""
    workdir = work / "in-turn"
    workdir.mkdir(exist_ok=True)
    configs = (
        [EnginePublisherConfig((url,), method, timeout_s=TIMEOUT_S) for url in urls]
        if method == "distributed"
        else [EnginePublisherConfig(tuple(urls), method, workdir, timeout_s=TIMEOUT_S)]
    )
    timing = Timing([], [])
    with contextlib.ExitStack() as stack:
        publishers = [stack.enter_context(EnginePublisher(config)) for config in configs]
        for attempt in range(warmup + runs):
            weights.bump()
            version = versions.next()
            began = time.perf_counter()
            for publisher in publishers:
                publisher.publish(weights, version)
            took = time.perf_counter() - began
            check_served(urls, version, f"{method} to {len(urls)} one after another")
            if attempt >= warmup:
                timing.seconds.append(took)
            drop_folders(workdir)
            tick()
    return timing


@contextlib.contextmanager
def engines(kind: str, checkpoint: Path, count: int, logs: Path) -> Iterator[list[str]]:
    """``count`` engines serving ``checkpoint`` as version 0; their URLs."""
    with contextlib.ExitStack() as stack:
        if kind == "reference":
            config = ReferenceEngineConfig(source=ModelSource(model_dir=checkpoint), weight_version="0")
            servers = [stack.enter_context(ReferenceEngineServer(config)) for _ in range(count)]
            yield [server.base_url for server in servers]
            return
        configs = [
            SGLangServerConfig(command=sglang_serve_command(), model_dir=checkpoint, weight_version="0",
                               context_length=1024, max_total_tokens=2048,
                               log_path=logs / f"sglang-{checkpoint.name}-{i}.log")
            for i in range(count)
        ]  # fmt: skip
        # They start together, as a node's engines do (SGLangServer forks each from its own
        # long-lived launcher thread, so these threads may end before the servers do).
        started = [SGLangServer(config) for config in configs]
        for server in started:
            stack.callback(server.stop)
        with ThreadPoolExecutor(count) as pool:
            list(pool.map(lambda server: server.__enter__(), started))
        yield [server.base_url for server in started]


def describe(model: torch.nn.Module) -> tuple[int, int, int]:
    """Parameters (tied ones once), their bytes, and the bytes of the state dict (what the tensor
    and distributed methods send: tied tensors under both names)."""
    params = sum(p.numel() for p in model.parameters())
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    sent = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    return params, param_bytes, sent


def seconds(value: float | None) -> str:
    return "failed" if value is None else f"{value:.3f}"


def ratio(top: float | None, bottom: float | None) -> str:
    return "-" if top is None or bottom is None else f"{top / bottom:.2f}"


def verdict(ok: bool) -> str:
    return "[green]MET[/]" if ok else "[red]MISSED[/]"


def plot(path: Path, kind: str, sizes: list[tuple[Size, int]], ns: list[int],
         medians: dict[tuple[str, str, int, str], float]) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(METHODS), figsize=(5 * len(METHODS), 4), sharey=True)

    def line(ax: Any, method: str, n: int, path: str, style: str, color: str, label: str) -> None:
        points = [(p / 1e6, medians[(s.label, method, n, path)]) for s, p in sizes
                  if (s.label, method, n, path) in medians]  # fmt: skip
        if points:
            ax.plot(*zip(*points, strict=True), style, color=color, label=label)

    for ax, method in zip(axes, METHODS, strict=True):
        line(ax, method, 1, "at once", "o-", "k", "one engine")
        for n, color in zip(ns[1:], ("tab:blue", "tab:orange", "tab:green"), strict=False):
            line(ax, method, n, "at once", "o-", color, f"{n} at once")
            line(ax, method, n, "in turn", "s--", color, f"{n} one after another")
        if not ax.lines:
            ax.text(0.5, 0.5, "every publication failed (see the table)", ha="center", transform=ax.transAxes)
        ax.set_title(method)
        ax.set_xlabel("model parameters (M)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("seconds per publication (median)")
    axes[0].legend(fontsize=8)
    figure.suptitle(f"Publication to {kind} engines")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", choices=("reference", "sglang"), default="reference")
    parser.add_argument("--quick", action="store_true", help="the smallest size only, 2 repeats")
    parser.add_argument(
        "--sizes", type=parse_size, nargs="+", help="LAYERSxHIDDEN (default 2x64 4x256 4x512)"
    )
    parser.add_argument("--engines", type=int, help="the largest N (default: 3 reference, 2 SGLang engines)")
    parser.add_argument("--repeats", type=int, help="timed publications per path (default 3, quick 2)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "bench_publish")
    args = parser.parse_args()
    sizes: list[Size] = args.sizes or (
        [Size(2, 64)] if args.quick else [Size(2, 64), Size(4, 256), Size(4, 512)]
    )
    most = args.engines or (3 if args.engine == "reference" else 2)
    repeats = args.repeats or (2 if args.quick else 3)
    if most < 2 or repeats < 1 or args.warmup < 0:
        parser.error("--engines must be at least 2, --repeats at least 1, --warmup at least 0")
    if args.engine == "sglang" and (problem := sglang_missing()):
        raise SystemExit(problem)
    ns = list(range(1, most + 1))
    console = Console(width=max(Console().width, 150))
    loads_before = os.getloadavg()
    # one engine (N=1 at once), then N at once and N one after another for N >= 2
    paths = [(n, p) for n in ns for p in (("at once",) if n == 1 else ("at once", "in turn"))]
    medians: dict[tuple[str, str, int, str], float] = {}
    saves: dict[tuple[str, str, int], float] = {}
    failures: dict[tuple[str, str, int, str], str] = {}
    described: list[tuple[Size, int, int, int]] = []
    versions = Counter()
    started_s: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="gyre-bench-publish-") as tmp,
        bar(console) as progress,
    ):
        total = len(sizes) * len(METHODS) * len(paths) * (args.warmup + repeats)
        task = progress.add_task("publications", total=total)
        for size in sizes:
            checkpoint = write_checkpoint("qwen3", Path(tmp) / f"ckpt-{size.label}", layers=size.layers,
                                          hidden=size.hidden, cache_dir=default_cache_dir())  # fmt: skip
            weights = Weights(load_model(ModelSource(model_dir=checkpoint)).model)
            params, param_bytes, sent = describe(weights.model)
            described.append((size, params, param_bytes, sent))
            progress.update(task, description=f"{size.label}: starting {most} {args.engine} engines")
            began = time.monotonic()
            with engines(args.engine, checkpoint, most, args.out / "logs") as urls:
                started_s[size.label] = time.monotonic() - began
                for method in METHODS:
                    for n, path in paths:
                        progress.update(task, description=f"{size.label} {method}: {n} {path}")
                        work = Path(tmp) / "work"
                        work.mkdir(exist_ok=True)
                        measure = live if path == "at once" else in_turn
                        before = progress.tasks[task].completed
                        try:
                            timing = measure(weights, urls[:n], method, work, repeats, args.warmup,
                                             versions, lambda: progress.advance(task))  # fmt: skip
                        except Exception as exc:  # a method that fails is a finding: shown, not fatal
                            failures[(size.label, method, n, path)] = f"{type(exc).__name__}: {exc}"
                            progress.update(task, completed=before + args.warmup + repeats)
                            continue
                        finally:
                            shutil.rmtree(work, ignore_errors=True)
                        medians[(size.label, method, n, path)] = statistics.median(timing.seconds)
                        if timing.save:
                            saves[(size.label, method, n)] = statistics.median(timing.save)
            del weights

    sizes_table = Table(title="Models (Qwen3 family, float32, tied 151,936-row embedding)")
    for column in (
        "model",
        "parameters",
        "parameter MB",
        "state dict MB (sent)",
        f"{most} engines healthy in",
    ):
        sizes_table.add_column(column, justify="right")
    for size, params, param_bytes, sent in described:
        sizes_table.add_row(size.label, f"{params / 1e6:.1f} M", f"{param_bytes / 1e6:.0f}", f"{sent / 1e6:.0f}",
                            f"{started_s[size.label]:.1f} s")  # fmt: skip
    console.print(sizes_table)

    table = Table(
        title=f"Seconds per publication to {args.engine} engines (median of {repeats} after {args.warmup} warm-up)",
        caption=f"targets: at once / one engine <= {AT_ONCE_LIMIT}; one after another / at once > 1. "
        "disk includes save_pretrained; the folder save a live run also does for tensor and "
        "distributed (kept for a resumed core) is shown apart",
    )
    for column in ("model", "method", "N", "one engine", "N at once", "N one after another",
                   "at once / one", "target", "after / at once", "target", "save (apart)"):  # fmt: skip
        table.add_column(column, justify="right")
    met = missed = 0
    for size, *_ in described:
        for method in METHODS:
            one = medians.get((size.label, method, 1, "at once"))
            for n in ns[1:]:
                together = medians.get((size.label, method, n, "at once"))
                after = medians.get((size.label, method, n, "in turn"))
                # A path that failed misses both targets it takes part in.
                ok_once = one is not None and together is not None and together / one <= AT_ONCE_LIMIT
                ok_turn = together is not None and after is not None and after / together > 1
                met += ok_once + ok_turn
                missed += (not ok_once) + (not ok_turn)
                save = saves.get((size.label, method, n))
                table.add_row(
                    size.label, method, str(n), seconds(one), seconds(together), seconds(after),
                    ratio(together, one), verdict(ok_once), ratio(after, together), verdict(ok_turn),
                    "-" if method == "disk" or save is None else f"{save:.3f}",
                )  # fmt: skip
    console.print(table)
    causes: dict[str, list[str]] = {}  # one line per cause, naming every path it failed
    for (label, method, n, path), message in failures.items():
        where = "one engine" if n == 1 else f"{n} {'at once' if path == 'at once' else 'one after another'}"
        causes.setdefault(" ".join(message.split())[:200], []).append(f"{label} {method} to {where}")
    for message, paths_failed in causes.items():
        console.print(f"[red]FAILED[/] {'; '.join(paths_failed)}: {message}")
    console.print(f"{met} MET, {missed} MISSED; load average (1, 5, 15 min) "
                  f"{' '.join(f'{x:.2f}' for x in loads_before)} at the start, "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end, {os.cpu_count()} CPUs; "
                  f"{versions.value} publications, each checked on every engine it went to")  # fmt: skip
    figure = args.out / f"publish-{args.engine}{'-quick' if args.quick else ''}.png"
    plot(figure, args.engine, [(s, p) for s, p, _, _ in described], ns, medians)
    console.print(f"plot: {figure}")


if __name__ == "__main__":
    main()
