#!/usr/bin/env bash
# llmd on the vLLM engine side by side with vLLM's own OpenAI server (issue 18's acceptance): what
# llmd's HTTP/SSE layer costs in front of the same engine. Both run at once from the vLLM environment
# on the same model and profile (vllm-cpu: TP 1), with the same engine arguments (scripts/vllm_serve.py
# builds vLLM's from llmd's own mapping), and are idle while the other is measured. Per round, for
# C=1 and then C=8, one `llmd bench --json` run against each, which server goes first alternating by
# round, after one unmeasured pass of both loads on both (scripts/ab_rounds.sh); --ignore-eos (both
# honour it) makes every stream generate max tokens. At the end scripts/peer_ab.py prints per round
# the llmd/vllm ratios of out tok/s, TTFT p50, gap p50 and gap max, and their medians; each report's
# chunks per token is in its JSON (`chunks_per_token`).
#
#   scripts/vllm_ab.sh VLLM_ENV [ROUNDS] [OUTDIR]
#     VLLM_ENV   the environment scripts/vllm-env built (llmd is installed in it)
#     MODEL      the model directory (default ~/.cache/llmd/demo-model-small); PROFILE (vllm-cpu)
# Check that nothing else is eating the CPU first (`uptime`): the figures are wall-clock ratios.
set -u
ENV=${1:?usage: vllm_ab.sh VLLM_ENV [ROUNDS] [OUTDIR]}; ROUNDS=${2:-3}; OUT=${3:-/tmp/vllm_ab}; mkdir -p "$OUT"
TREE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$TREE/.venv/bin/python}   # the bench client
MODEL=${MODEL:-$HOME/.cache/llmd/demo-model-small}
PROFILE=${PROFILE:-vllm-cpu}; LLMD_PORT=${LLMD_PORT:-18630}; PEER_PORT=${PEER_PORT:-18631}
export HF_HUB_OFFLINE=1 LLMD_HOME="$OUT/home" VLLM_NO_USAGE_STATS=1
. "$TREE/scripts/ab_servers.sh"

[ -d "$MODEL" ] || (cd "$TREE" && "$PY" -m llmd.cli demo-model "$MODEL" --size small) || exit 1
(cd "$TREE" && exec "$ENV/bin/python" -m llmd.cli serve --model "$MODEL" --served-model-name m \
  --profile "$PROFILE" --port "$LLMD_PORT" > "$OUT/llmd.log" 2>&1) &
PIDS+=($!)
wait_ready "http://127.0.0.1:$LLMD_PORT/ready" "$OUT/llmd.log" || exit 1
(cd "$TREE" && exec "$ENV/bin/python" scripts/vllm_serve.py "$MODEL" "$PROFILE" "$PEER_PORT" \
  > "$OUT/vllm.log" 2>&1) &
PIDS+=($!)
wait_ready "http://127.0.0.1:$PEER_PORT/health" "$OUT/vllm.log" || exit 1

. "$TREE/scripts/ab_rounds.sh"
ab_rounds "$ROUNDS" llmd peer
stop
echo "llmd (engine: vllm) and vLLM's own server: $MODEL, profile $PROFILE"
"$PY" "$TREE/scripts/peer_ab.py" "$OUT"
