"""``bench latency``: TTFT and ITL, ours against the peers."""
