"""Multi-token-prediction heads (Qwen3.5, DeepSeek-V3/V4 layouts) used as drafters."""
