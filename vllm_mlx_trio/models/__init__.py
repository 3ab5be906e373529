"""Several models in one server (``[[models]]``): the registry that loads them on demand and
unloads them under a memory budget, their footprints, how their MLX threads share the machine,
and ``serve_models``."""
