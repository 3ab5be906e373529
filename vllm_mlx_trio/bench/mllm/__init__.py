"""``bench mllm``: image request phases, and text ITL while a large image prefills."""
