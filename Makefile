# One command to install and serve, one to install and test. Works on Linux (MLX on the CPU)
# and macOS (MLX on Metal); the virtual environment lives in .venv.
PYTHON ?= python3
VENV ?= .venv
# macOS: plain mlx brings Metal. Linux: the CPU build of mlx, with MKL under it (cpu-fast: on
# x86_64 only; elsewhere the extra adds nothing to cpu).
# vlm: the tests run the demo vision-language model (tests/vlm) through mlx-vlm.
EXTRAS := $(shell if [ "$$(uname -s)" = Darwin ]; then echo metal,test,vlm; else echo cpu-fast,test,vlm; fi)

.PHONY: install serve test lint bench bench-gpu clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

serve: install
	$(VENV)/bin/vllm-mlx-trio serve config/demo.toml

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(VENV)/bin/python -m pytest -q

bench: install
	$(VENV)/bin/vllm-mlx-trio bench all --json bench.json

# On an NVIDIA machine: installs into .venv-gpu with the CUDA extra, builds Qwen3-0.6B- and
# Qwen3-8B-shaped random models, runs bench all on each (docs/benchmarks.md, "GPU check").
# Options: make bench-gpu BENCH_GPU_ARGS="--out DIR" (scripts/bench_gpu.sh --help).
bench-gpu:
	bash scripts/bench_gpu.sh $(BENCH_GPU_ARGS)

clean:
	rm -rf $(VENV)
