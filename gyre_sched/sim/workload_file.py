"""Load a user's measured execution durations from CSV or JSON into an EmpiricalWorkload.

CSV: a header with ``duration_s`` or ``duration_h`` and optionally ``query`` and
``outcome``. JSON: a list of numbers (seconds), or of objects with the same keys, or
an object ``{"executions": [...]}``. Every bad row is refused with its row number.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gyre_sched.decision import Outcome
from gyre_sched.exceptions import WorkloadFileError
from gyre_sched.sim.workload import HOUR, EmpiricalWorkload, GroupSample

_OUTCOMES = {o.value: o for o in Outcome}


def _duration(row: Mapping[str, Any], where: str) -> float:
    if "duration_s" in row and row["duration_s"] not in (None, ""):
        raw, scale = row["duration_s"], 1.0
    elif "duration_h" in row and row["duration_h"] not in (None, ""):
        raw, scale = row["duration_h"], HOUR
    else:
        raise WorkloadFileError(f"{where}: no duration_s or duration_h value")
    try:
        value = float(raw) * scale
    except (TypeError, ValueError) as exc:
        raise WorkloadFileError(f"{where}: duration {raw!r} is not a number") from exc
    if not math.isfinite(value) or value <= 0:
        raise WorkloadFileError(f"{where}: duration {raw!r} must be a finite number > 0")
    return value


def _outcome(row: Mapping[str, Any], where: str) -> Outcome:
    raw = row.get("outcome") or Outcome.COMPLETED.value
    if raw not in _OUTCOMES:
        raise WorkloadFileError(f"{where}: outcome {raw!r} is not one of {sorted(_OUTCOMES)}")
    return _OUTCOMES[raw]


def workload_from_rows(rows: Sequence[Mapping[str, Any]], label: str) -> EmpiricalWorkload:
    """Build a workload from parsed rows; raises WorkloadFileError on any bad row."""
    if not rows:
        raise WorkloadFileError(f"{label}: no executions")
    queries: dict[str, list[tuple[float, Outcome]]] = {}
    has_query = all(row.get("query") not in (None, "") for row in rows)
    for index, row in enumerate(rows, start=1):
        where = f"{label} row {index}"
        key = str(row["query"]) if has_query else ""
        queries.setdefault(key, []).append((_duration(row, where), _outcome(row, where)))
    groups = tuple(
        GroupSample(tuple(d for d, _ in items), tuple(o for _, o in items))
        for _, items in sorted(queries.items())
    )
    return EmpiricalWorkload(label=label, groups=groups, by_query=has_query)


def parse_workload(text: str, fmt: str, label: str) -> EmpiricalWorkload:
    """Parse ``text`` as ``fmt`` ("csv" or "json")."""
    rows: list[Mapping[str, Any]]
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text))
        if reader.fieldnames is None:
            raise WorkloadFileError(f"{label}: empty CSV, expected a header with duration_s or duration_h")
        rows = list(reader)
    elif fmt == "json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise WorkloadFileError(f"{label}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        if isinstance(data, dict):
            data = data.get("executions")
        if not isinstance(data, list):
            raise WorkloadFileError(f"{label}: expected a list of executions or {{'executions': [...]}}")
        rows = []
        for index, item in enumerate(data, start=1):
            if isinstance(item, bool) or not isinstance(item, int | float | dict):
                raise WorkloadFileError(f"{label} row {index}: expected a number or an object, got {item!r}")
            rows.append(item if isinstance(item, dict) else {"duration_s": item})
    else:
        raise WorkloadFileError(f"{label}: unknown format {fmt!r}, expected csv or json")
    return workload_from_rows(rows, label)


def load_workload(path: Path) -> EmpiricalWorkload:
    """Load ``path`` (format from its suffix: .csv or .json)."""
    fmt = path.suffix.lower().lstrip(".")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkloadFileError(f"cannot read workload file {path}: {exc.strerror}") from exc
    return parse_workload(text, fmt, path.name)
