#!/usr/bin/env bash
# Issue 15's acceptance figures: what structured output costs, and that plain decode is unchanged.
# Per round, alternating which side starts, one fresh daemon per side on the same model, every
# bench run with this tree's client:
#   old (OLD_TREE, the tree before issue 15): C=8, then C=1;
#   new (this tree): C=8 and C=1 before any schema was sent; --workload schemas (first-use and
#     cached cost of the 12 schemas; `setup` includes the fresh daemon's one-time grammar view);
#     PAIRS pairs of C=8 all plain and C=8 with 4 of 8 clients under a JSON schema, back to back on
#     the same daemon, their order alternating (so slow drift of this machine's speed cancels in
#     each pair's ratio); C=8 plain once more (after the schemas, against the first).
# C=8 runs are 8 clients x 3 requests x 64 tokens; C=1 is 8 requests x 128 tokens.
# Summarize with scripts/structured_ab.py OUTDIR.
# Usage: scripts/structured_ab.sh OLD_TREE [PROFILE] [ROUNDS] [OUTDIR] [PAIRS]   (no daemon is left)
set -u
OLD=${1:?the tree before issue 15, e.g. a worktree of c12841a^1}
PROFILE=${2:-cpu-bf16}; ROUNDS=${3:-3}; OUT=${4:-/tmp/structured_ab}; PAIRS=${5:-3}; mkdir -p "$OUT"
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

C8=(-c 8 -n 3 --max-tokens 64)
C1=(-c 1 -n 8 --max-tokens 128)

run_side() {  # SIDE ROUND
  local side=$1 r=$2
  PORT=$((18500 + 2 * r)); [ "$side" = old ] && PORT=$((PORT + 1))
  serve "$side" "$r" || { stop; return; }
  bench "c8plain-$side-$r" "${C8[@]}"
  bench "c1-$side-$r" "${C1[@]}"
  if [ "$side" = new ]; then
    bench "schemas-$r" --workload schemas
    for p in $(seq 1 "$PAIRS"); do
      local order="plain mixed"; [ $(((r + p) % 2)) -eq 1 ] && order="mixed plain"
      for kind in $order; do
        local extra=(); [ "$kind" = mixed ] && extra=(--constrained 4)
        bench "pair$kind-$r-$p" "${C8[@]}" "${extra[@]}"
      done
    done
    bench "c8after-new-$r" "${C8[@]}"
  fi
  stop
}

for r in $(seq 1 "$ROUNDS"); do
  sides="old new"; [ $((r % 2)) -eq 0 ] && sides="new old"
  for side in $sides; do run_side "$side" "$r"; done
done
echo finished
