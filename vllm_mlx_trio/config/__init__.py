"""Server configuration: its sections (``sections``), their field kinds (``fields``), and loading
from TOML, the environment and ``--set`` and dumping back to TOML (``load``).

Import the public names from here: ``from vllm_mlx_trio.config import EngineConfig, load_config``.
"""

from vllm_mlx_trio.config.fields import DEMO_SIZES
from vllm_mlx_trio.config.load import (
    API_KEYS_ENV,
    ENV_PREFIX,
    NONE_LITERAL,
    RESERVED_ENV_VARS,
    SECTIONS,
    config_from_dict,
    config_to_dict,
    config_to_toml,
    load_config,
)
from vllm_mlx_trio.config.sections import (
    ENGINE_MODES,
    LOG_FORMATS,
    LOG_LEVELS,
    CacheConfig,
    DistributedConfig,
    EngineConfig,
    EngineSection,
    LimitsConfig,
    LoggingConfig,
    MetricsConfig,
    ModelConfig,
    ModelEntry,
    ServerConfig,
)

__all__ = [
    "API_KEYS_ENV",
    "DEMO_SIZES",
    "ENGINE_MODES",
    "ENV_PREFIX",
    "LOG_FORMATS",
    "LOG_LEVELS",
    "NONE_LITERAL",
    "RESERVED_ENV_VARS",
    "SECTIONS",
    "CacheConfig",
    "DistributedConfig",
    "EngineConfig",
    "EngineSection",
    "LimitsConfig",
    "LoggingConfig",
    "MetricsConfig",
    "ModelConfig",
    "ModelEntry",
    "ServerConfig",
    "config_from_dict",
    "config_to_dict",
    "config_to_toml",
    "load_config",
]
