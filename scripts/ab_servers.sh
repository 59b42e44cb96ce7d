# Sourced by scripts/peer_ab.sh and scripts/vllm_ab.sh: two servers run side by side, `llmd` on
# $LLMD_PORT and its `peer` on $PEER_PORT, each started in the background and added to PIDS; both
# are stopped on exit. Needs TREE, PY (the bench's python) and OUT.
PIDS=()

wait_ready() {  # URL LOG [PID]: until URL answers 2xx (10 minutes at most; a start may compile),
  # or PID (the server) has exited
  for _ in $(seq 1 3000); do
    curl -sf "$1" > /dev/null && return 0
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2> /dev/null; then echo "exited: $1 (see $2)" >&2; return 1; fi
    sleep 0.2
  done
  echo "not ready: $1 (see $2)" >&2; return 1
}
stop() { for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null && wait "$pid"; done; PIDS=(); }
trap stop EXIT

bench() {  # NAME SIDE ARGS...: one `llmd bench --json --ignore-eos` run against SIDE (llmd | peer)
  local name=$1 port=$LLMD_PORT; [ "$2" = peer ] && port=$PEER_PORT; shift 2
  (cd "$TREE" && "$PY" -m llmd.cli bench --base-url "http://127.0.0.1:$port/v1" --json --ignore-eos "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err")
}
