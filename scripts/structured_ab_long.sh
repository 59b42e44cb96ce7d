#!/usr/bin/env bash
# Diagnostic beside scripts/structured_ab.sh: one 256-token request per client, so requests are
# admitted only at the start and the steps measure decoding alone; PAIRS back-to-back pairs of
# C=8 all plain and C=8 with 4 of 8 clients under a JSON schema on one daemon, order alternating.
# Summarize with scripts/structured_ab.py OUTDIR (its "long" section).
# Usage: scripts/structured_ab_long.sh [PROFILE] [OUTDIR] [PAIRS]   (no daemon is left running)
set -u
PROFILE=${1:-cpu-bf16}; OUT=${2:-/tmp/structured_ab_long}; PAIRS=${3:-6}; mkdir -p "$OUT"
NEW=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-/work/main/.venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/llmd/ab-small}
PORT=${PORT:-18590}
export HF_HUB_OFFLINE=1
cd "$NEW"
(exec "$PY" -m llmd.cli serve --model "$MODEL" --served-model-name m --profile "$PROFILE" --port "$PORT" \
  > "$OUT/serve.log" 2>&1) &
DAEMON=$!
for _ in $(seq 1 900); do curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && break; sleep 0.2; done
bench() { "$PY" -m llmd.cli bench --base-url "http://127.0.0.1:$PORT/v1" --json "$@"; }
bench -c 8 -n 1 --max-tokens 16 --constrained 8 > "$OUT/warm.json" 2>&1  # every grammar compiled
for p in $(seq 1 "$PAIRS"); do
  order="plain mixed"; [ $((p % 2)) -eq 0 ] && order="mixed plain"
  for kind in $order; do
    extra=(); [ "$kind" = mixed ] && extra=(--constrained 4)
    bench -c 8 -n 1 --max-tokens 256 "${extra[@]}" > "$OUT/long$kind-$p.json" 2> "$OUT/long$kind-$p.err"
  done
done
kill -TERM "$DAEMON"; wait "$DAEMON"
echo finished
