"""Flax NNX model definitions: the Qwen3 target (and, later, drafters)."""

from .config import PRESETS, ConfigError, Qwen3Config
from .kv_cache import KVCache
from .qwen3 import Qwen3, Qwen3Output

__all__ = ["PRESETS", "ConfigError", "KVCache", "Qwen3", "Qwen3Config", "Qwen3Output"]

from .eagle3 import Eagle3, Eagle3Config, Eagle3Output  # noqa: E402

__all__ += ["Eagle3", "Eagle3Config", "Eagle3Output"]

from .dflash import DFlash, DFlashConfig, DFlashOutput, default_target_layer_ids  # noqa: E402

__all__ += ["DFlash", "DFlashConfig", "DFlashOutput", "default_target_layer_ids"]

from .dspark import DSpark, DSparkConfig  # noqa: E402

__all__ += ["DSpark", "DSparkConfig"]
