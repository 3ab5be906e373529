"""An embedding model on the MLX thread (engine.mode = "embed"): the runner and its pooling."""
