#!/usr/bin/env bash
# Rehearse the worker fleet on one machine: a Ray head and N worker nodes, each its own
# `ray start` with its own CPUs, resources, ports and --temp-dir, all on 127.0.0.1.
# A sweep submitted here takes the same path as on the GPU fleet (--address, ray job submit).
#
#   workers/rehearse.sh start     start the head and the worker nodes, print how to submit
#   workers/rehearse.sh join      add one more worker node to the running cluster, as an
#                                 autoscaler would (REHEARSAL_WORKERS=0 start, then join: a
#                                 fleet scaled to zero that grows while a sweep waits)
#   workers/rehearse.sh status    `ray status` of the rehearsal cluster
#   workers/rehearse.sh stop      stop this cluster's nodes (workers first, then the head)
#
# Settings (environment variables, defaults in brackets):
#   REHEARSAL_DIR             node logs, pids and --temp-dirs [/tmp/embedlab-rehearsal]; keep it
#                             short: Ray's socket paths under it must fit in 107 characters
#   REHEARSAL_PORT            the head's GCS port [6390]; the next 2 + REHEARSAL_WORKERS ports
#                             are taken too (Ray client server, each node's dashboard agent),
#                             and one more for each node `join` adds
#   REHEARSAL_DASHBOARD_PORT  the dashboard and job server, on 127.0.0.1 only [8275]
#   REHEARSAL_WORKERS         worker nodes [2]
#   REHEARSAL_HEAD_CPUS       logical CPUs of the head [0: like the fleet's head, it schedules
#                             no training or data task, so the work crosses nodes]
#   REHEARSAL_WORKER_CPUS     logical CPUs of each worker node [2]
#   REHEARSAL_NODE_CACHES     1: each node gets its own EMBEDLAB_CACHE, $REHEARSAL_DIR/<node>-cache,
#                             as on a cluster without a shared disk (use --storage s3://...:
#                             every node then fetches prepared data and checkpoints by hash) [0]
#   RAY                       the ray command [ray]
# The nodes inherit this shell's environment: set EMBEDLAB_CACHE here to share prepared data
# (unless REHEARSAL_NODE_CACHES=1), and the object store's variables (AWS_*) to reach it.
#
# Why not `ray stop`: it stops every Ray process on the machine (it matches process names),
# including other clusters and test sessions. Each node here is a `ray start --block` in its
# own session (setsid); stopping sends that process SIGTERM (Ray's own clean shutdown of the
# node) and waits until no process of the session is left.
set -euo pipefail

DIR="${REHEARSAL_DIR:-/tmp/embedlab-rehearsal}"
PORT="${REHEARSAL_PORT:-6390}"
DASHBOARD_PORT="${REHEARSAL_DASHBOARD_PORT:-8275}"
WORKERS="${REHEARSAL_WORKERS:-2}"
HEAD_CPUS="${REHEARSAL_HEAD_CPUS:-0}"
WORKER_CPUS="${REHEARSAL_WORKER_CPUS:-2}"
NODE_CACHES="${REHEARSAL_NODE_CACHES:-0}"
RAY="${RAY:-ray}"
HOST=127.0.0.1
START_TIMEOUT_S=120
STOP_TIMEOUT_S=60

# Token authentication: `ray start --head` turns it on by itself when ~/.ray/auth_token
# exists, but a joining node (`ray start --address`) and `ray status` only use the token
# with RAY_AUTH_MODE=token; without it the worker node fails after 60 s (InvalidAuthToken).
export RAY_AUTH_MODE=token
# An idle node drains in seconds; do not let a busy one hold `stop` for Ray's default 30 s.
export RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="${RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S:-5}"

die() { echo "rehearse: $*" >&2; exit 1; }

# Start one node as `ray start --block` in a new session (its pid is the session id) and wait
# until it says it is up; on failure show its log.
start_node() {
    local name="$1"; shift
    local log="$DIR/$name.log"
    if [[ "$NODE_CACHES" == 1 ]]; then
        mkdir -p "$DIR/$name-cache"
        export EMBEDLAB_CACHE="$DIR/$name-cache"  # this node's processes only (set per start)
    fi
    setsid "$RAY" start --block --node-ip-address "$HOST" --temp-dir "$DIR/$name" \
        --disable-usage-stats "$@" >"$log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$DIR/$name.pid"
    local waited=0
    until grep -q "block forever" "$log"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$log" >&2
            echo "rehearse: $name did not start; log: $log" >&2
            return 1
        fi
        if ((waited >= START_TIMEOUT_S * 2)); then
            tail -n 30 "$log" >&2
            echo "rehearse: $name not up after ${START_TIMEOUT_S} s; log: $log" >&2
            return 1
        fi
        sleep 0.5
        waited=$((waited + 1))
    done
    echo "rehearse: $name up (pid $pid)"
}

start_worker() {
    local i="$1"
    start_node "worker-$i" --address "$HOST:$PORT" --num-cpus "$WORKER_CPUS" \
        --dashboard-agent-listen-port "$((PORT + 2 + i))" \
        --resources '{"rehearsal_worker": 1}'
}

# SIGTERM the node's `ray start --block` and wait until no process of its session is left
# (some Ray workers make their own process group, none leaves the session); SIGKILL the
# session's processes if they outlive the timeout.
stop_node() {
    local name="$1"
    local pidfile="$DIR/$name.pid"
    [[ -f "$pidfile" ]] || return 0
    local sid
    sid="$(cat "$pidfile")"
    if pgrep -s "$sid" >/dev/null; then
        kill -TERM "$sid" 2>/dev/null || true
        local waited=0
        while pgrep -s "$sid" >/dev/null; do
            if ((waited >= STOP_TIMEOUT_S * 2)); then
                echo "rehearse: $name still running after ${STOP_TIMEOUT_S} s; killing its processes" >&2
                pkill -KILL -s "$sid" || true
                break
            fi
            sleep 0.5
            waited=$((waited + 1))
        done
        echo "rehearse: $name stopped"
    fi
    rm -f "$pidfile"
}

cmd_start() {
    command -v "$RAY" >/dev/null || die "no '$RAY' command: activate the venv or set RAY"
    command -v setsid >/dev/null && command -v pgrep >/dev/null || die "setsid and pgrep (Linux) are required"
    if [[ -f "$DIR/head.pid" ]] && kill -0 "$(cat "$DIR/head.pid")" 2>/dev/null; then
        die "a rehearsal cluster is already running from $DIR; run: $0 stop"
    fi
    if [[ -z "${RAY_AUTH_TOKEN:-}" && -z "${RAY_AUTH_TOKEN_PATH:-}" && ! -f "$HOME/.ray/auth_token" ]]; then
        "$RAY" get-auth-token --generate >/dev/null
    fi
    mkdir -p "$DIR"
    start_node head --head --port "$PORT" --num-cpus "$HEAD_CPUS" \
        --dashboard-host "$HOST" --dashboard-port "$DASHBOARD_PORT" \
        --ray-client-server-port "$((PORT + 1))" --dashboard-agent-listen-port "$((PORT + 2))" \
        --resources '{"rehearsal_head": 1}' || { cmd_stop; exit 1; }
    local i
    for ((i = 1; i <= WORKERS; i++)); do
        start_worker "$i" || { cmd_stop; exit 1; }
    done
    echo "$HOST:$PORT" >"$DIR/address"
    echo "http://$HOST:$DASHBOARD_PORT" >"$DIR/dashboard"
    cat <<EOF

Rehearsal cluster: head $HOST:$PORT ($HEAD_CPUS CPU) + $WORKERS worker node(s) x $WORKER_CPUS CPU.
Dashboard and job server: http://$HOST:$DASHBOARD_PORT
Submit a sweep from this machine (storage and EMBEDLAB_CACHE must be paths every node sees;
here every node is this machine; RAY_AUTH_MODE=token makes the client send the token):
  RAY_AUTH_MODE=token embedlab sweep ablations/masking_ratio.py --profile demo \\
      --address $HOST:$PORT --storage "\$PWD/runs"
or as a Ray job (the working directory is uploaded; the job joins its own cluster):
  RAY_AUTH_MODE=token ray job submit --address http://$HOST:$DASHBOARD_PORT --working-dir . -- \\
      embedlab sweep ablations/masking_ratio.py --profile demo --address auto --storage "\$PWD/runs"
Add a worker node: REHEARSAL_DIR=$DIR $0 join
Stop it: REHEARSAL_DIR=$DIR $0 stop
EOF
}

# The next free worker number; a node that fails to join is left to `stop` (its pid file
# names it), the cluster stays up.
cmd_join() {
    [[ -f "$DIR/address" && -f "$DIR/head.pid" ]] && kill -0 "$(cat "$DIR/head.pid")" 2>/dev/null \
        || die "no rehearsal cluster is running from $DIR; run: $0 start"
    local i=1
    while [[ -e "$DIR/worker-$i.pid" ]]; do i=$((i + 1)); done
    start_worker "$i"
}

cmd_stop() {
    # Every worker node first, whatever REHEARSAL_WORKERS says now (those `join` added, those
    # of a start with a larger count), so none loses its head while it drains.
    local pidfile
    for pidfile in "$DIR"/worker-*.pid; do
        [[ -e "$pidfile" ]] || continue
        stop_node "$(basename "$pidfile" .pid)"
    done
    stop_node head
    rm -f "$DIR/address" "$DIR/dashboard"
}

cmd_status() {
    [[ -f "$DIR/address" ]] || die "no rehearsal cluster in $DIR"
    "$RAY" status --address "$(cat "$DIR/address")"
}

case "${1:-}" in
    start) cmd_start ;;
    join) cmd_join ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 start|status|stop|join   (settings: see the top of this file)" >&2; exit 2 ;;
esac
