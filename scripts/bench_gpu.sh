#!/usr/bin/env bash
# The GPU check, `make bench-gpu` (docs/benchmarks.md, "GPU check"). On one NVIDIA GPU, from a
# fresh checkout, in under 8 minutes:
#   1. installs the project into a virtual environment with MLX's CUDA backend (the extra
#      cuda13 where the driver reports CUDA 13 or later, else cuda: CUDA 12);
#   2. builds a Qwen3-0.6B-shaped and a Qwen3-8B-shaped model, random bfloat16 weights
#      (python -m vllm_mlx_trio.bench.gpu_check build);
#   3. runs `vllm-mlx-trio bench all --concurrency 1,16` on each: mlx-lm's generate_step at 1 and
#      BatchGenerator at 16, our engine, our HTTP server; then one table of our tok/s over
#      mlx-lm's at each level (python -m vllm_mlx_trio.bench.gpu_check summary).
# Everything it prints also goes to the output directory, with bench all's JSON. It runs from
# the checkout's root: relative paths in its options are from there.
#
# --dry-run runs the same steps on the CPU with tiny stand-in models and 16 tokens, in the
# virtual environment `make install` made (.venv), installing nothing: it proves the plumbing.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    cat <<'EOF'
Options:
  --out DIR         where the tables and JSON go (default: bench-results/gpu)
  --dry-run         on the CPU: tiny models, 16 tokens, no install, --venv .venv
  --venv DIR        the virtual environment (default: .venv-gpu)
  --no-install      use --venv as it is (one prepared from a wheelhouse, say)
  --extra NAME      the extra installed (default: cuda13 on a CUDA 13+ driver, else cuda)
  --models-dir DIR  where the models are built (default: ~/.cache/vllm-mlx-trio/bench-gpu)
  --max-tokens N    tokens per request (default 128; 16 with --dry-run)
  --requests N      each level runs max(concurrency, N) requests (default 2)
  --budget-s N      seconds from the start after which a bench run is cut short (default 470)
An offline install takes pip's own variables: PIP_NO_INDEX=1 PIP_FIND_LINKS=WHEELHOUSE.
EOF
}

OUT=bench-results/gpu
DRY_RUN=0
VENV=""
INSTALL=1
EXTRA=""
MODELS_DIR=""
MAX_TOKENS=""
REQUESTS=2
BUDGET_S=470
PYTHON=${PYTHON:-python3}
LEVELS=1,16

parse_args() {
    while (($#)); do
        case $1 in
            --out) OUT=$2; shift ;;
            --dry-run) DRY_RUN=1 ;;
            --venv) VENV=$2; shift ;;
            --no-install) INSTALL=0 ;;
            --extra) EXTRA=$2; shift ;;
            --models-dir) MODELS_DIR=$2; shift ;;
            --max-tokens) MAX_TOKENS=$2; shift ;;
            --requests) REQUESTS=$2; shift ;;
            --budget-s) BUDGET_S=$2; shift ;;
            -h | --help) usage; exit 0 ;;
            *) echo "bench_gpu.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
        esac
        shift
    done
    if ((DRY_RUN)); then
        INSTALL=0
        VENV=${VENV:-.venv}
        MAX_TOKENS=${MAX_TOKENS:-16}
    fi
    VENV=${VENV:-.venv-gpu}
    MAX_TOKENS=${MAX_TOKENS:-128}
    EXTRA=${EXTRA:-$(default_extra)}
}

# The CUDA version the driver supports (nvidia-smi's header), e.g. 13; empty without a driver.
driver_cuda_major() {
    { nvidia-smi 2>/dev/null || true; } | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1
}

default_extra() {
    local major
    major=$(driver_cuda_major)
    if [[ -n $major && $major -ge 13 ]]; then echo cuda13; else echo cuda; fi
}

log() { echo "[bench-gpu ${SECONDS}s] $*" | tee -a "$OUT/steps.txt" >&2; }

describe_machine() {
    {
        echo "host: $(uname -srm), $(nproc) CPUs"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
            echo "driver's CUDA: $(driver_cuda_major)"
        else
            echo "no nvidia-smi on the PATH"
        fi
    } | tee "$OUT/machine.txt"
}

install() {
    if ((!INSTALL)); then
        log "install: skipped; $VENV as it is (would run: pip install -e \".[$EXTRA]\")"
        return
    fi
    log "install: $VENV with the extra $EXTRA"
    [[ -x $VENV/bin/python ]] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e ".[$EXTRA]"
}

check_device() {
    local expected=gpu
    ((DRY_RUN)) && expected=cpu
    "$VENV/bin/python" -m vllm_mlx_trio.bench.gpu_check device --expect "$expected" | tee -a "$OUT/machine.txt"
}

build_models() {
    local args=()
    ((DRY_RUN)) && args+=(--dry-run)
    [[ -n $MODELS_DIR ]] && args+=(--models-dir "$MODELS_DIR")
    "$VENV/bin/python" -m vllm_mlx_trio.bench.gpu_check build "${args[@]}" 2> >(tee -a "$OUT/steps.txt" >&2)
}

# bench all on one model, cut short at the budget's end; its tables in bench-all-NAME.txt.
bench_model() {
    local model=$1 name left
    name=$(basename "$model")
    left=$((BUDGET_S - SECONDS))
    if ((left < 30)); then
        log "bench all $name: skipped, ${left}s of the budget left"
        return
    fi
    log "bench all $name: up to ${left}s"
    timeout --kill-after=15 "$left" "$VENV/bin/vllm-mlx-trio" bench all --models "$model" \
        --concurrency "$LEVELS" --max-tokens "$MAX_TOKENS" --requests "$REQUESTS" \
        --set logging.level=warning --json "$OUT/bench-all-$name.json" 2>&1 |
        tee "$OUT/bench-all-$name.txt" || log "bench all $name: failed or cut short (status ${PIPESTATUS[0]})"
}

main() {
    cd "$(dirname "$0")/.."
    parse_args "$@"
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    : >"$OUT/steps.txt"
    export PYTHONUNBUFFERED=1
    log "start: out $OUT, venv $VENV, dry run $DRY_RUN, $MAX_TOKENS tokens, levels $LEVELS, budget ${BUDGET_S}s"
    describe_machine
    install
    check_device
    log "build the models"
    local models jsons=()
    models=$(build_models)
    for model in ${models//,/ }; do
        bench_model "$model"
        jsons+=("$OUT/bench-all-$(basename "$model").json")
    done
    log "summary"
    local status=0
    "$VENV/bin/python" -m vllm_mlx_trio.bench.gpu_check summary "${jsons[@]}" | tee "$OUT/summary.txt" || status=1
    log "done (status $status): $OUT"
    return "$status"
}

main "$@"
