"""A shared prefix stored once inside the running batch (cascade attention)."""
