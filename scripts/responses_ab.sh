#!/usr/bin/env bash
# The Responses API's acceptance figures: /v1/responses streams against /v1/chat/completions ones
# under the same load, on ONE server. Per round, for C=1 and then C=8, one `llmd bench --json` run
# through each API back to back, which API goes first alternating by round (so slow drift of the
# machine's speed cancels in each pair's ratio), every run with this tree's client, after one
# unmeasured pass of both loads through both APIs.
# The plan is issue 15's (scripts/structured_ab.sh): C=8 is 8 clients x 3 requests x 64 tokens,
# C=1 is 8 requests x 128 tokens (C1_N and C8_N set other request counts; a longer run is a
# steadier figure on a noisy host); with --ignore-eos (IGNORE_EOS=0 drops it) so both APIs generate
# max tokens in every stream: the same work on either side of each ratio.
# At the end scripts/responses_ab.py OUTDIR prints per round responses/chat ratios of out tok/s and
# TTFT p50 (and gap p50, stream tok/s), their medians, and whether they are within 5 %.
# Usage: scripts/responses_ab.sh [BASE_URL|serve] [ROUNDS] [OUTDIR]
#   BASE_URL: a running server's /v1 base URL. "serve" (the default) starts this tree's daemon on
#   the demo model (MODEL, written by `llmd demo-model --size small` if absent; PROFILE) on PORT,
#   and stops it at the end (no daemon is left).
set -u
TARGET=${1:-serve}; ROUNDS=${2:-3}; OUT=${3:-/tmp/responses_ab}; mkdir -p "$OUT"
TREE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-/work/main/.venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/llmd/ab-small}
PROFILE=${PROFILE:-cpu-bf16}; PORT=${PORT:-18600}; IGNORE_EOS=${IGNORE_EOS:-1}
export HF_HUB_OFFLINE=1
DAEMON=

serve() {  # start this tree's daemon on the demo model, wait for /ready
  [ -d "$MODEL" ] || (cd "$TREE" && "$PY" -m llmd.cli demo-model "$MODEL" --size small) || return 1
  (cd "$TREE" && exec "$PY" -m llmd.cli serve --model "$MODEL" --served-model-name m \
    --profile "$PROFILE" --port "$PORT" > "$OUT/serve.log" 2>&1) &
  DAEMON=$!
  for _ in $(seq 1 900); do curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && return 0; sleep 0.2; done
  echo "daemon not ready (see $OUT/serve.log)" >&2; return 1
}

stop() { [ -n "$DAEMON" ] && kill -TERM "$DAEMON" 2> /dev/null && wait "$DAEMON"; DAEMON=; }
trap stop EXIT

BASE=$TARGET
if [ "$TARGET" = serve ]; then
  BASE="http://127.0.0.1:$PORT/v1"
  serve || exit 1
fi

bench() {  # NAME ARGS...: one `llmd bench --json` run into $OUT/NAME.json
  local name=$1; shift
  (cd "$TREE" && "$PY" -m llmd.cli bench --base-url "$BASE" --json "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err")
}

EOS=(); [ "$IGNORE_EOS" = 1 ] && EOS=(--ignore-eos)
C1=(-c 1 -n "${C1_N:-8}" --max-tokens 128)
C8=(-c 8 -n "${C8_N:-3}" --max-tokens 64)

# Unmeasured: each load once through each API first, so round 1's first side pays no more of the
# server's one-time costs (compiles per batch size, first use of each route) than the others.
for api in chat responses; do
  bench "warm-c1-$api" -c 1 -n 1 --max-tokens 128 "${EOS[@]}" --api "$api"
  bench "warm-c8-$api" -c 8 -n 1 --max-tokens 64 "${EOS[@]}" --api "$api"
done
for r in $(seq 1 "$ROUNDS"); do
  apis="chat responses"; [ $((r % 2)) -eq 0 ] && apis="responses chat"
  for api in $apis; do bench "c1-$api-$r" "${C1[@]}" "${EOS[@]}" --api "$api"; done
  for api in $apis; do bench "c8-$api-$r" "${C8[@]}" "${EOS[@]}" --api "$api"; done
done
stop
echo "plan: C=1 ${C1_N:-8} requests x 128 tokens, C=8 8 clients x ${C8_N:-3} requests x 64 tokens"
"$PY" "$TREE/scripts/responses_ab.py" "$OUT"
