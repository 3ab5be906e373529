"""``bench speculative``: tokens/s with speculative decoding on vs off."""
