"""The soak's short version (``benchmarks/soak.py --quick``): harness processes on the anthropic
and openai SDKs keep executions in flight through ``gyre proxy serve --workers 2`` into
PostgreSQL, histories growing by tool results and compacting, first at a light load, then at
eight times it against an in-flight bound of 4 calls per worker.

24 and then 120 executions, not the paper's 1,152: enough to prove the mechanism (every
answered call in the store exactly once, every refusal in its API's shape and retried until
answered) in CI's time; ``benchmarks/soak.py`` without ``--quick`` is the full soak.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.pg import ADMIN_URL

ROOT = Path(__file__).resolve().parents[2]


def test_every_answered_call_is_recorded_once_and_overload_is_refused_in_each_apis_shape(
    tmp_path: Path,
) -> None:
    out = tmp_path / "soak.json"
    run = subprocess.run(
        [sys.executable, "benchmarks/soak.py", "--quick", "--json", str(out), "--pg", ADMIN_URL],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["errors"] == []  # nothing but refusals went wrong
    assert got["differ"] == 0 and got["exactly_once"]
    # The store holds exactly the answers the harness counted, and no aborted attempt.
    assert got["records"] == got["stored"] == got["answered"] > 0
    assert got["health"]["spool_lost"] == 0 and got["health"]["spool_pending"] == 0
    light, heavy = got["phases"]
    assert light["phase"] == "paper" and heavy["phase"] == "x8"
    assert light["answered_calls_s"] > 0 and heavy["answered_calls_s"] > 0
    # Past the bound: Anthropic's 529 and OpenAI's 429, each retried after its retry-after.
    assert heavy["refused"].get("529", 0) > 0 and heavy["refused"].get("429", 0) > 0
    assert any(p["compactions"] > 0 for p in got["phases"])  # histories compacted and went on
