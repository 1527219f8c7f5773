#!/usr/bin/env bash
# One node's share of a gyre run under Slurm; gyre.sbatch runs it once per node with srun.
#
# Node 0 (SLURM_NODEID 0) runs `gyre run`: the proxy, the controller, a launcher and its own
# node agent with the run config's `rollout_engines` engines and its `trainers` cells. Every
# other node waits until the run is configured in the database, then runs `gyre node serve`
# (engines and satellite cells) and `gyre launcher serve`, and stops them when node 0's
# `gyre run` has ended. Nodes other than node 0 need no address of node 0: the proxy's URL and
# the core's rendezvous are in the log.
#
# Read from the environment:
#   GYRE_RUN_CONFIG     the run's TOML file, readable on every node (required)
#   GYRE_RUN_ID         the run id (required)
#   GYRE_DATABASE_URL, GYRE_REDIS_URL   reachable from every node (required)
#   GYRE_DATA_DIR       on a file system every node shares (the run's folder is under it unless
#                       the config sets run_dir; this job's end marker is under it)
#   GYRE_NODE_ADDRESS   this node's address for the others (default: its Slurm node name's
#                       address, else the first of `hostname -I`)
#   GYRE_ENGINES_PER_NODE  engines on each node but node 0 (default: the config's rollout_engines)
#   GYRE_WAIT_S         how long nodes wait for the run to be configured (default 900)
#   GYRE_LAUNCHER_MAX_RUNNING  each launcher's harnesses at once (default: gyre's)
#   SLURM_NODEID, SLURM_NNODES, SLURM_JOB_ID, SLURMD_NODENAME  (set by srun)
# Satellite cells (the config's cells not in its `trainers`) go round-robin over nodes 1..N-1.
set -euo pipefail

die() {
    echo "gyre-node.sh (node ${SLURM_NODEID:-?}): $*" >&2
    exit 2
}

: "${GYRE_RUN_CONFIG:?gyre-node.sh: set GYRE_RUN_CONFIG to the run TOML}"
: "${GYRE_RUN_ID:?gyre-node.sh: set GYRE_RUN_ID}"
: "${GYRE_DATABASE_URL:?gyre-node.sh: set GYRE_DATABASE_URL (every node must reach it)}"
: "${GYRE_REDIS_URL:?gyre-node.sh: set GYRE_REDIS_URL (every node must reach it)}"
: "${GYRE_DATA_DIR:?gyre-node.sh: set GYRE_DATA_DIR to a folder every node shares}"
: "${SLURM_NODEID:?gyre-node.sh: run me with srun (SLURM_NODEID unset)}"
: "${SLURM_NNODES:?gyre-node.sh: run me with srun (SLURM_NNODES unset)}"
: "${SLURM_JOB_ID:?gyre-node.sh: run me with srun (SLURM_JOB_ID unset)}"
export GYRE_RUN_ID GYRE_DATABASE_URL GYRE_REDIS_URL GYRE_DATA_DIR
python=${GYRE_PYTHON:-python3}
node=$SLURM_NODEID
done_file="$GYRE_DATA_DIR/slurm-$SLURM_JOB_ID/run-ended"

node_address() {
    if [[ -n "${GYRE_NODE_ADDRESS:-}" ]]; then
        echo "$GYRE_NODE_ADDRESS"
        return
    fi
    local address=""
    if [[ -n "${SLURMD_NODENAME:-}" ]]; then
        address=$(getent ahostsv4 "$SLURMD_NODENAME" | awk 'NR == 1 { print $1 }')
    fi
    # Debian maps a host's own name to 127.0.1.1, which no other node can reach.
    if [[ -z "$address" || "$address" == 127.* ]]; then
        address=$(hostname -I | awk '{ print $1 }')
    fi
    [[ -n "$address" ]] || die "no address found for this node: set GYRE_NODE_ADDRESS"
    echo "$address"
}

# The config's engines on node 0, and the satellite cells (those not in its `trainers`), as
# gyre itself reads them (its defaults and its checks).
read -r head_engines satellites < <(
    "$python" - "$GYRE_RUN_CONFIG" <<'PY'
import sys
from pathlib import Path

from gyre_tools.run_config import read_config, trainer_cells

config = read_config(Path(sys.argv[1]))
head = trainer_cells(config.trainers, config.cells, what="trainers")
print(config.rollout_engines, ",".join(str(c) for c in range(config.cells) if c not in head) or "-")
PY
) || die "cannot read $GYRE_RUN_CONFIG"
address=$(node_address)

if [[ "$node" == 0 ]]; then
    mkdir -p "$(dirname "$done_file")"
    rm -f "$done_file"
    echo "node 0 ($address): gyre run, $head_engines engine(s), trainers from the config"
    export GYRE_NODE_HOST=0.0.0.0 GYRE_NODE_ADVERTISE_HOST="$address"
    export GYRE_PROXY_HOST=0.0.0.0 GYRE_PROXY_ADVERTISE_HOST="$address"
    status=0
    gyre run --config "$GYRE_RUN_CONFIG" --run-id "$GYRE_RUN_ID" --quiet &
    run_pid=$!
    # scancel and the job's time limit send TERM: gyre run then stops as on Ctrl-C.
    trap 'kill -TERM "$run_pid" 2>/dev/null || true' TERM INT
    wait "$run_pid" || status=$?
    if kill -0 "$run_pid" 2>/dev/null; then # the wait was cut short by a signal
        wait "$run_pid" || status=$?
    fi
    echo "$status" >"$done_file"
    echo "node 0: gyre run exited $status"
    exit "$status"
fi

# Nodes 1..N-1: engine numbers after node 0's, satellite cells round-robin.
(( SLURM_NNODES > 1 )) || die "SLURM_NNODES is $SLURM_NNODES but this is node $node"
per_node=${GYRE_ENGINES_PER_NODE:-$head_engines}
offset=$(( head_engines + (node - 1) * per_node ))
trainers=""
if [[ "$satellites" != "-" ]]; then
    IFS=, read -r -a cells <<<"$satellites"
    for i in "${!cells[@]}"; do
        if (( i % (SLURM_NNODES - 1) == node - 1 )); then
            trainers+="${trainers:+,}${cells[$i]}"
        fi
    done
fi
trainers=${trainers:-none}
engines=$per_node
(( per_node > 0 )) || engines=none
name=${SLURMD_NODENAME:-$(hostname -s)}

# Wait for `gyre run` on node 0 to record the run's configuration. `gyre db check` only reads;
# `gyre events tail` is run once the schema is at head, so it never migrates beside gyre run.
deadline=$(( SECONDS + ${GYRE_WAIT_S:-900} ))
until gyre db check >/dev/null 2>&1 &&
    gyre events tail --after 0 --type run.configured --json 2>/dev/null |
    grep -qF "\"run_id\":\"$GYRE_RUN_ID\""; do
    [[ -e "$done_file" ]] && die "gyre run on node 0 ended before the run was configured"
    (( SECONDS < deadline )) || die "run $GYRE_RUN_ID not configured within ${GYRE_WAIT_S:-900} s"
    sleep 2
done

echo "node $node ($address): engines $engines from $offset, trainers $trainers, launcher $name"
gyre node serve --run "$GYRE_RUN_ID" --engines "$engines" --engine-offset "$offset" \
    --trainers "$trainers" --host 0.0.0.0 --advertise-host "$address" &
node_pid=$!
gyre launcher serve --run "$GYRE_RUN_ID" --name "$name" &
launcher_pid=$!
stop() {
    kill -TERM "$node_pid" "$launcher_pid" 2>/dev/null || true
    wait "$node_pid" "$launcher_pid" 2>/dev/null || true
}
trap 'stop; exit 143' TERM INT
# Until node 0's gyre run ends (its marker), or one of the two ends on its own.
while [[ ! -e "$done_file" ]]; do
    for pid in "$node_pid" "$launcher_pid"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            status=0
            wait "$pid" || status=$?
            stop
            die "$([[ $pid == "$node_pid" ]] && echo "gyre node serve" || echo "gyre launcher serve") exited $status before the run ended"
        fi
    done
    sleep 2
done
stop
echo "node $node: the run ended; node agent and launcher stopped"
