#!/usr/bin/env bash
# The GPU checks in one command, on a machine with a CUDA device (tests/gpu, `-m gpu`): a PyTorch
# cell training on the GPU against the same cell on the CPU (losses, gradient norms, weights
# after unclipped SGD), bfloat16 on the device with float32 master weights, two cells sharing
# one GPU over gloo (reduce onto the core, broadcast back), the reference engine decoding on the
# GPU against the CPU, and a GPU core publishing to a GPU engine by tensor and by broadcast.
#
# It runs on the machine's own python3 (PYTHON=... to choose), which must hold torch with CUDA,
# transformers and pytest. gyre's other dependencies come from that Python, or from wheels in
# ./.whl (for a machine that reaches no package index), installed under /tmp for this run only.
# Extra arguments go to pytest; GYRE_GPU_CHECK_TESTS=0 skips the tests, GYRE_GPU_CHECK_LIVE=0 the live run. Exits non-zero when a check fails or no CUDA device is seen.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/gyre-gpu-site .whl/*.whl
  export PYTHONPATH=/tmp/gyre-gpu-site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi
"$PY" - <<'PY'
import sys
import torch
if not torch.cuda.is_available():
    sys.exit("gpu-check: torch sees no CUDA device here")
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name(0)}, "
      f"{torch.cuda.device_count()} device(s)")
PY
if [ "${GYRE_GPU_CHECK_TESTS:-1}" != 0 ]; then
start=$(date +%s)
# -W default: the suite turns warnings into errors for the pinned versions it is developed
# against; a GPU machine's own torch and transformers may warn about other things.
"$PY" -m pytest tests/gpu -m gpu -q -p no:cacheprovider -W default --durations=0 -rA "$@"
echo "gpu-check: the GPU tests passed in $(($(date +%s) - start)) s"
fi
[ "${GYRE_GPU_CHECK_LIVE:-1}" = 0 ] && exit 0

# gyre itself, installed for the live run: tools/ becomes gyre_tools and migrations/ becomes
# gyre_store.migrations only in an installed copy (the tests import the tree)
rm -rf /tmp/gyre-gpu-pkg
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/gyre-gpu-pkg .

live=${GYRE_GPU_CHECK_DIR:-/tmp/gyre-gpu-check}
rm -rf "$live" && mkdir -p "$live"
cat > "$live/run.toml" <<'TOML'
seed = 7
steps = 4
policy = "elastic"
mu = 2
B = 4
N = 2
cells = 3
rollout_engines = 1
engine_capacity = 4
engine_device = "cuda"
tau_s = 0.0
[model]
init = "random"
max_tokens = 32
max_context = 2048
[train]
device = "cuda"
micro_step_tokens = 2048
skip_zero_advantage = false
[tasks]
train = 8
heldout = 2
budget_s = 150
[eval]
heldout = false
TOML
# the run's summary and its processes' logs come back with a device call's $OUT, pass or fail
[ -n "${OUT:-}" ] && trap 'cp "$live/run.json" "$OUT/gpu-run.json" 2>/dev/null; cp -r "$live"/data/runs/*/logs "$OUT/" 2>/dev/null; tail -n 200 "$live"/data/runs/*/logs/proxy.log > "$OUT/proxy-tail.txt" 2>/dev/null; cp "$(ls "$live"/data/runs/*/workspaces/*/harness.log | head -n1)" "$OUT/harness-first.txt" 2>/dev/null' EXIT
start=$(date +%s)
# from the run's folder, so that python -m does not put the tree ahead of the installed copy
(cd "$live" && PYTHONPATH=/tmp/gyre-gpu-pkg:/tmp/gyre-gpu-site "$PY" -m gyre_tools.cli run --config "$live/run.toml" --json "$live/run.json" --data-dir "$live/data" \
  --metrics none --quiet)
"$PY" - "$live/run.json" <<'PY'
import json, statistics, sys
run = json.load(open(sys.argv[1]))
steps = run["steps"]
print(f"gyre run on the GPU: {len(steps)} steps, {run['transitions']} transitions, {run['run_wall_s']:.1f} s")
paper = {"to_training": 8.52, "to_rollout": 3.46}
for direction in sorted({t["direction"] for t in run["transition_times"]}):
    mine = [t for t in run["transition_times"] if t["direction"] == direction]
    times = [t["total_s"] for t in mine if t["total_s"] is not None]
    unfinished = len(mine) - len(times)
    phases = sorted({k for t in mine for k in t} - {"direction", "cell", "total_s"})
    medians = ", ".join(
        f"{p} {statistics.median([t[p] for t in mine if t.get(p) is not None]):.2f}"
        for p in phases
        if any(t.get(p) is not None for t in mine)
    )
    print(f"  {direction}: median {statistics.median(times):.2f} s over {len(times)} "
          f"[{min(times):.2f}-{max(times):.2f}] (paper: {paper.get(direction, 'n/a')} s), {unfinished} unfinished; "
          f"phase medians {medians}")
generated = sum(c.get("generating", 0) for c in run["cell_time"]["cells"])
print(f"  engines generating {generated:.1f} s; trainable tokens {sum(s['trainable_tokens'] for s in steps)}; "
      f"trainers' forward-backward {sum(c.get('forward-backward', 0) for c in run['cell_time']['cells']):.2f} s")
if len(steps) != 4 or run["transitions"] == 0:
    sys.exit("gpu-check: the live run did not train every step with cells moving")
if generated <= 0:
    sys.exit("gpu-check: no engine generated a token in the live run (see the run's logs/)")
PY
echo "gpu-check: the live run passed in $(($(date +%s) - start)) s"
