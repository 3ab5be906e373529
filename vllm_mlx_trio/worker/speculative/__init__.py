"""Speculative decoding: draft -> verify rounds with a draft model or an MTP head."""
