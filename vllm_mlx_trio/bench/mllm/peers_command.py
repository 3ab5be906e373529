"""``vllm-mlx-trio bench mllm-peers``: start the servers once, alternate them over the rounds."""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import subprocess
import tempfile
from collections.abc import Iterator


def run_mllm_peers_command(cfg, args: argparse.Namespace) -> int:
    import trio

    from ..machine import format_machine, machine_info
    from ..peers import peer_server, port_free, stop, wait_ready
    from ..report import format_table, write_json
    from ..suite import resolve_model_dir
    from .peers import CONCURRENCY, IMAGE_SIDE, measure_server, summarize

    model_dir = resolve_model_dir(args.model_dir, cfg)
    names = [n.strip() for n in args.peers.split(",") if n.strip()]
    per_peer: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench-mllm-peers-") as tmp, contextlib.ExitStack() as stack:
        urls = {}
        for offset, name in enumerate(names):
            port = args.port + offset
            if not port_free(port):
                raise SystemExit(f"port {port} is in use")
            peer = peer_server(name, model_dir, port, scratch=tmp)
            proc = stack.enter_context(_started(peer.argv, {**os.environ, **peer.env}, pathlib.Path(tmp) / name, stop))
            wait_ready(proc, f"http://127.0.0.1:{port}", args.startup_timeout)
            urls[name] = (f"http://127.0.0.1:{port}", peer.model or model_dir)
        for round_index in range(args.runs):
            order = names if round_index % 2 == 0 else list(reversed(names))
            for name in order:
                url, model = urls[name]
                per_peer[name].append(trio.run(measure_server, url, model, round_index, args.max_tokens))
    rows = summarize(per_peer)
    print(
        "\n".join(
            [
                "== image requests: ours vs mlx-vlm's server",
                format_machine(machine_info()),
                format_table(rows, list(rows[0]) + [k for k in rows[-1] if k not in rows[0]]),
                f"note: model {model_dir}; each request one {IMAGE_SIDE}x{IMAGE_SIDE} PNG (data URL) + a question, "
                f"greedy, max_tokens {args.max_tokens}, streamed; c1: one at a time, new images; c4: "
                f"{CONCURRENCY} at once, new images, all tokens over the wall time; repeat: the same image and "
                "text three more times right after (their median TTFT); "
                f"median (min-max) of {args.runs} rounds, servers alternating; "
                "*_vs: ours over mlx-vlm (tok/s: higher is better; TTFT: lower is better)",
            ]
        ),
        flush=True,
    )
    if args.json_path:
        write_json(args.json_path, {"model_dir": model_dir, "rounds": per_peer, "rows": rows})
    return 0


@contextlib.contextmanager
def _started(argv, env, log_path: pathlib.Path, stop) -> Iterator[subprocess.Popen]:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        yield proc
    finally:
        stop(proc)


def add_mllm_peers_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model-dir", default="demo:vlm-tiny", help="model directory or demo:<name>")
    parser.add_argument("--peers", default="ours,mlx-vlm", help="servers, in order (default ours,mlx-vlm)")
    parser.add_argument("--runs", type=int, default=3, help="rounds, servers alternating (default 3)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per reply (default 32)")
    parser.add_argument("--port", type=int, default=8741, help="first port; each server takes the next")
    parser.add_argument("--startup-timeout", type=float, default=180.0, help="seconds to wait for a server")
    parser.add_argument("--json", dest="json_path", default=None, help="also write the rounds here")
