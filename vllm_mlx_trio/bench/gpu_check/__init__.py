"""The GPU check (``make bench-gpu``, ``scripts/bench_gpu.sh``): our engine and server against
mlx-lm's own loops on a Qwen3-0.6B-shaped and a Qwen3-8B-shaped model, on MLX's default device.

The models are built by worker/demo/shaped.py (random bfloat16 weights; tiny stand-ins for a
dry run on the CPU); ``summary.py`` reads the JSON that ``bench all`` wrote for each and prints
the ratios. The steps' commands: ``python -m vllm_mlx_trio.bench.gpu_check {device,build,summary}``.
The measuring itself is ``vllm-mlx-trio bench all``, unchanged.
"""
