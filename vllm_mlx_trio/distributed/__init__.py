"""Past one machine: KV events for routers in front of replicas, and the pieces of sharded
serving that are not MLX (the MLX part lives under ``worker/``)."""
