#!/usr/bin/env bash
# What serving costs: llmd over HTTP against the same model and profile decoded by llmd's runner in
# one process, no HTTP at all (`llmd bench --in-process`), issue 17's item 5. With AGAINST=engine
# the other side is llmd's whole engine in one process instead (`--in-process --method engine`:
# worker thread, scheduler, event loop, the HTTP plan), so HTTP's own share is apart from the
# engine's. One daemon runs throughout (idle while the in-process side runs, in its own process);
# per round, for C=1 and then C=8, one run of each side, which goes first alternating by round,
# after one unmeasured pass of both. The plan is peer_ab.sh's: C=1 C1_N (8) requests x 128 tokens,
# C=8 8 clients x C8_N (3) requests x 64 tokens (the runner: 8 prompts decoded as one batch, C8_N
# times), prompts of 64 tokens, --ignore-eos. scripts/peer_ab.py OUTDIR http SIDE prints the ratios
# and, from the daemon's /metrics read around each HTTP run, what a step cost its worker beyond the
# forward pass: detokenizing, framing and writing the tokens.
# With FRESH=1 the daemon is started afresh before every round (after a warm pass of its own), as
# each in-process run is: on a shared 2-core host one process's speed can sit 10-20 % off
# another's for its whole life, and one daemon throughout puts that one draw into every round.
#   scripts/serving_ab.sh [ROUNDS] [OUTDIR]      MODEL (small demo model), PROFILE (cpu-bf16),
#                                                AGAINST (inproc: the runner | engine), FRESH
set -u
ROUNDS=${1:-3}; OUT=${2:-/tmp/serving_ab}; mkdir -p "$OUT"
TREE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$TREE/.venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/llmd/demo-model-small}
PROFILE=${PROFILE:-cpu-bf16}; PORT=${PORT:-18620}; AGAINST=${AGAINST:-inproc}
case "$AGAINST" in inproc) METHOD=runner ;; engine) METHOD=engine ;; *) echo "AGAINST: inproc or engine" >&2; exit 2 ;; esac
export HF_HUB_OFFLINE=1 LLMD_HOME="$OUT/home"
DAEMON=
stop() { [ -n "$DAEMON" ] && kill -TERM "$DAEMON" 2> /dev/null && wait "$DAEMON"; DAEMON=; }
trap stop EXIT

[ -d "$MODEL" ] || (cd "$TREE" && "$PY" -m llmd.cli demo-model "$MODEL" --size small) || exit 1
start() {
  (cd "$TREE" && exec "$PY" -m llmd.cli serve --model "$MODEL" --served-model-name m --profile "$PROFILE" \
    --port "$PORT" >> "$OUT/serve.log" 2>&1) &
  DAEMON=$!
  for _ in $(seq 1 900); do curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && break; sleep 0.2; done
}
start

metrics() { curl -sf "http://127.0.0.1:$PORT/metrics" | grep '^llmd_engine_' > "$1"; }
bench() {  # NAME SIDE ARGS...: one `llmd bench --json` run, over HTTP or in-process
  local name=$1 side=$2; shift 2
  local target=(--base-url "http://127.0.0.1:$PORT/v1")
  [ "$side" = "$AGAINST" ] && target=(--in-process "$MODEL" --profile "$PROFILE" --method "$METHOD")
  [ "$side" = http ] && metrics "$OUT/$name.metrics-before"
  (cd "$TREE" && "$PY" -m llmd.cli bench "${target[@]}" --json --ignore-eos "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err")
  [ "$side" = http ] && metrics "$OUT/$name.metrics-after"
  return 0
}

round_start() {  # FRESH=1: a new daemon for every round after the first, warmed as the first was
  [ -n "${FRESH:-}" ] && [ "$1" -gt 1 ] || return 0
  stop; start
  bench "warm-c1-http-$1" http -c 1 -n 1 --max-tokens 128
  bench "warm-c8-http-$1" http -c 8 -n 1 --max-tokens 64
}

. "$TREE/scripts/ab_rounds.sh"
ab_rounds "$ROUNDS" http "$AGAINST"
stop
echo "model $MODEL, profile $PROFILE"
"$PY" "$TREE/scripts/peer_ab.py" "$OUT" http "$AGAINST"
