# Sourced by scripts/peer_ab.sh and scripts/serving_ab.sh: the plan both measure, run alternately.
# The caller defines `bench NAME SIDE ARGS...` (one `llmd bench --json` run into $OUT/NAME.json).
#   ab_rounds ROUNDS A B
# runs one unmeasured pass of both loads on both sides, then per round C=1 and C=8 on each side,
# which side goes first alternating by round, into LOAD-SIDE-ROUND reports (scripts/peer_ab.py reads
# them). C=1 is C1_N (8) requests x 128 tokens; C=8 is 8 clients x C8_N (3) requests x 64 tokens,
# started together, or C8_STAGGER_MS apart (`llmd bench --stagger-ms`: the regime of clients that
# arrive apart; not with serving_ab.sh's in-process runner, which decodes the 8 as one batch).
# A caller's `round_start R`, when defined, runs before each round's measurements (serving_ab.sh's
# FRESH=1 starts its daemon afresh there).
ab_rounds() {
  local rounds=$1 first=$2 second=$3 side sides r
  local c1=(-c 1 -n "${C1_N:-8}" --max-tokens 128) c8=(-c 8 -n "${C8_N:-3}" --max-tokens 64)
  [ -n "${C8_STAGGER_MS:-}" ] && c8+=(--stagger-ms "$C8_STAGGER_MS")
  for side in "$first" "$second"; do
    bench "warm-c1-$side" "$side" -c 1 -n 1 --max-tokens 128
    bench "warm-c8-$side" "$side" -c 8 -n 1 --max-tokens 64
  done
  for r in $(seq 1 "$rounds"); do
    sides="$first $second"; [ $((r % 2)) -eq 0 ] && sides="$second $first"
    if declare -F round_start > /dev/null; then round_start "$r"; fi
    for side in $sides; do bench "c1-$side-$r" "$side" "${c1[@]}"; done
    for side in $sides; do bench "c8-$side-$r" "$side" "${c8[@]}"; done
  done
}
