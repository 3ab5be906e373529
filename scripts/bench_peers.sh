#!/usr/bin/env bash
# Benchmark our server, mlx_lm.server and vllm-mlx on the same model, one after another, each in
# its own process and port, with `vllm-mlx-trio bench peers` (docs/benchmarks.md).
#
#   scripts/bench_peers.sh [--install] [bench peers options...]
#   scripts/bench_peers.sh --model-dir demo:small --max-tokens 128 --concurrency 1,5,16 --json peers.json
#
# --install   create the separate vllm-mlx venv ($PEERS_VENV) first; it never touches ours.
# Environment:
#   PYTHON      the interpreter with vllm-mlx-trio and mlx-lm (default: python3)
#   PEERS_VENV  the vllm-mlx venv (default: /work/peers-venv)
#   BLAS        "openblas" preloads Debian's OpenBLAS into every server (apt-get install
#               libopenblas0-pthread); the tables' BLAS line shows what each server used.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
PEERS_VENV=${PEERS_VENV:-/work/peers-venv}

if [[ "${1:-}" == "--install" ]]; then
    shift
    python3 -m venv "$PEERS_VENV"
    "$PEERS_VENV/bin/pip" install vllm-mlx "mlx[cpu]"
fi
if [[ "${BLAS:-}" == "openblas" ]]; then
    export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
fi
exec "$PYTHON" -m vllm_mlx_trio.cli bench peers --vllm-mlx "$PEERS_VENV/bin/vllm-mlx" "$@"
