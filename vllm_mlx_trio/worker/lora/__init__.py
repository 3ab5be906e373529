"""Named LoRA adapters over one loaded base model, several in one batch (each row its own)."""
