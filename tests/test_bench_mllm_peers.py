"""``bench mllm-peers``: its summary and its images (the servers themselves run in the bench)."""

from __future__ import annotations

from vllm_mlx_trio.bench.mllm.peers import image_url, summarize
from vllm_mlx_trio.bench.peers import peer_server


def test_images_differ_by_seed_and_mlx_vlm_is_a_peer():
    assert image_url(1) != image_url(2) and image_url(1).startswith("data:image/png;base64,")
    peer = peer_server("mlx-vlm", "/m", 9100)
    assert peer.argv[1:5] == ("-m", "mlx_vlm.server", "--model", "/m") and peer.model == "/m"


def test_summary_gives_medians_and_our_ratios_to_mlx_vlm():
    def measured(c4: float, c1: float, repeat: float) -> dict:
        return {"c4_tok_s": c4, "c1_tok_s": c1, "repeat_ttft_ms": repeat, "c1_ttft_ms": 1.0}

    rows = summarize(
        {
            "ours": [measured(100, 50, 10), measured(120, 60, 12), measured(110, 55, 30)],
            "mlx-vlm": [measured(100, 50, 40), measured(100, 50, 40), measured(100, 50, 40)],
        }
    )
    ours = rows[0]
    assert ours["c4_tok_s"] == "110.0 (100.0-120.0)" and ours["c4_tok_s_vs"] == "1.10x"
    assert ours["c1_tok_s_vs"] == "1.10x" and ours["repeat_ttft_vs"] == "0.30x"
    assert "c4_tok_s_vs" not in rows[1]
