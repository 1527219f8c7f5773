"""The progress bar the benchmarks show while they measure: a description, a bar, done of
total and the time elapsed, on the benchmark's own console."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


def bar(console: Console) -> Progress:
    """A rich Progress (a context manager) with the benchmarks' columns, printing to ``console``."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
