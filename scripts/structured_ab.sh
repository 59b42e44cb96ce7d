#!/usr/bin/env bash
# Issue 15's acceptance figures: what structured output costs, and that plain decode is unchanged.
# Per round, alternating which side starts, one fresh daemon per side on the same model:
#   new (this tree):  --workload schemas (first-use and cached cost of the 12 schemas; on a fresh
#                     daemon, so `setup` includes its one-time grammar view), then C=8 plain and
#                     C=8 with 4 of 8 clients under a JSON schema (their order alternating too), C=1;
#   old (OLD_TREE, the tree before issue 15): C=8 and C=1.
# C=8 runs are 8 clients x 3 requests x 64 tokens, 3 repeats each (structured_ab.py takes each
# figure's median over them); C=1 is 8 requests x 128 tokens.
# Every bench run uses this tree's client. Summarize with scripts/structured_ab.py OUTDIR.
# Usage: scripts/structured_ab.sh OLD_TREE [PROFILE] [ROUNDS] [OUTDIR]   (no daemon is left running)
set -u
OLD=${1:?the tree before issue 15, e.g. a worktree of c12841a^1}
PROFILE=${2:-cpu-bf16}; ROUNDS=${3:-3}; OUT=${4:-/tmp/structured_ab}; mkdir -p "$OUT"
NEW=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-/work/main/.venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/llmd/ab-small}
export HF_HUB_OFFLINE=1

bench() {  # NAME ARGS...: one `llmd bench --json` run into $OUT/NAME.json
  local name=$1; shift
  (cd "$NEW" && "$PY" -m llmd.cli bench --base-url "http://127.0.0.1:$PORT/v1" --json "$@" \
    > "$OUT/$name.json" 2> "$OUT/$name.err")
}

serve() {  # SIDE ROUND: start the side's daemon (its own code imported from its tree), wait for /ready
  local dir=$NEW; [ "$1" = old ] && dir=$OLD
  (cd "$dir" && exec "$PY" -m llmd.cli serve --model "$MODEL" --served-model-name m \
    --profile "$PROFILE" --port "$PORT" > "$OUT/serve-$1-$2.log" 2>&1) &
  DAEMON=$!
  for _ in $(seq 1 900); do curl -sf "http://127.0.0.1:$PORT/ready" > /dev/null && return 0; sleep 0.2; done
  echo "daemon $1 round $2 not ready" >&2; return 1
}

stop() { kill -TERM "$DAEMON"; wait "$DAEMON"; }

run_side() {  # SIDE ROUND
  local side=$1 r=$2
  PORT=$((18500 + 2 * r)); [ "$side" = old ] && PORT=$((PORT + 1))
  serve "$side" "$r" || { stop; return; }
  if [ "$side" = new ]; then
    bench "schemas-$r" --workload schemas
    local first=plain second=mixed
    [ $((r % 2)) -eq 0 ] && first=mixed second=plain
    for kind in $first $second; do
      local extra=(); [ "$kind" = mixed ] && extra=(--constrained 4)
      bench "c8$kind-new-$r" -c 8 -n 3 --max-tokens 64 --repeats 3 "${extra[@]}"
    done
  else
    bench "c8plain-old-$r" -c 8 -n 3 --max-tokens 64 --repeats 3
  fi
  bench "c1-$side-$r" -c 1 -n 8 --max-tokens 128
  stop
}

for r in $(seq 1 "$ROUNDS"); do
  sides="old new"; [ $((r % 2)) -eq 0 ] && sides="new old"
  for side in $sides; do run_side "$side" "$r"; done
done
echo finished
