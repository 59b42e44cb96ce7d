#!/usr/bin/env bash
# llmd side by side with llama.cpp's llama-server, the peer CPU users pick instead (issue 17's
# measurement). Both servers run at once on the same model (llmd on the HF directory, llama-server
# on its GGUF conversion) and are idle while the other is measured. Per round, for C=1 and then
# C=8, one `llmd bench --json` run against each, which server goes first alternating by round, after
# one unmeasured pass of both loads on both. --ignore-eos (both servers honour it) makes every
# stream generate max tokens: the same work on either side of each ratio.
#   C=1: C1_N (8) requests x 128 tokens;  C=8: 8 clients x C8_N (3) requests x 64 tokens;  prompts
#   of 64 tokens, distinct per request (no cached prefix on either side).
# At the end scripts/peer_ab.py OUTDIR prints per round llmd/llama-server ratios of out tok/s,
# TTFT p50, gap p50 and gap max, and their medians.
#
#   scripts/peer_ab.sh GGUF [ROUNDS] [OUTDIR]
#     GGUF        the model for llama-server, e.g. build/gguf/demo-model-medium-q8_0.gguf
#     MODEL       llmd's model directory (default ~/.cache/llmd/demo-model-small); PROFILE (cpu-bf16)
#     LLAMA_SERVER  the binary (default: llama-server on PATH); PEER_ARGS  extra llama-server flags
#                 (on an AMX CPU, llama.cpp 0c1e570's AMX repack crashes on Q8_0 at the first batch:
#                 PEER_ARGS=--no-repack)
#
# llama-server and the GGUF files come from ../shared/bench/build-llamacpp.sh OUT MODEL_DIR...
# (about 25 minutes on 2 cores; it writes f32 and bf16), and a Q8_0 file from the same converter:
#   PYTHONPATH=OUT/src/llama_cpp_python-0.3.36/vendor/llama.cpp/gguf-py:OUT/pydeps python \
#     OUT/src/llama_cpp_python-0.3.36/vendor/llama.cpp/convert_hf_to_gguf.py MODEL_DIR \
#     --outtype q8_0 --outfile OUT/gguf/NAME-q8_0.gguf
# Check that nothing else is eating the CPU first (`uptime`): the figures are wall-clock ratios.
set -u
GGUF=${1:?usage: peer_ab.sh GGUF [ROUNDS] [OUTDIR]}; ROUNDS=${2:-3}; OUT=${3:-/tmp/peer_ab}; mkdir -p "$OUT"
TREE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$TREE/.venv/bin/python}
MODEL=${MODEL:-$HOME/.cache/llmd/demo-model-small}
PROFILE=${PROFILE:-cpu-bf16}; LLMD_PORT=${LLMD_PORT:-18610}; PEER_PORT=${PEER_PORT:-18611}
LLAMA_SERVER=${LLAMA_SERVER:-llama-server}; THREADS=${THREADS:-$(nproc)}
export HF_HUB_OFFLINE=1 LLMD_HOME="$OUT/home"   # the daemon's state (stored responses) stays in OUTDIR
. "$TREE/scripts/ab_servers.sh"

[ -d "$MODEL" ] || (cd "$TREE" && "$PY" -m llmd.cli demo-model "$MODEL" --size small) || exit 1
(cd "$TREE" && exec "$PY" -m llmd.cli serve --model "$MODEL" --served-model-name m --profile "$PROFILE" \
  --port "$LLMD_PORT" > "$OUT/llmd.log" 2>&1) &
PIDS+=($!)
# llmd's start first, alone: `lone_step: max-autotune` times its kernels while loading and keeps the choices
# in inductor's cache, and timed on a busy CPU they come out slower for good (medium cpu-int8 first started
# beside llama-server's start on a noisy host: 71 matmuls on the template, 78 tok/s in-process; on a
# quiet one 85 and 140)
wait_ready "http://127.0.0.1:$LLMD_PORT/ready" "$OUT/llmd.log" "${PIDS[0]}" || exit 1
# shellcheck disable=SC2086  # PEER_ARGS: extra llama-server flags, word-split on purpose
"$LLAMA_SERVER" -m "$GGUF" --port "$PEER_PORT" -c 16384 -np 8 -cb -t "$THREADS" -tb "$THREADS" --no-ui \
  ${PEER_ARGS:-} > "$OUT/llama-server.log" 2>&1 &
PIDS+=($!)
wait_ready "http://127.0.0.1:$PEER_PORT/health" "$OUT/llama-server.log" "${PIDS[1]}" || exit 1

. "$TREE/scripts/ab_rounds.sh"
ab_rounds "$ROUNDS" llmd peer
stop
echo "llmd: $MODEL, profile $PROFILE   llama-server: $GGUF, $THREADS threads"
"$PY" "$TREE/scripts/peer_ab.py" "$OUT"
