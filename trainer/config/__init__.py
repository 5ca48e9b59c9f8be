"""The training configuration: one validated object read from YAML or TOML, with CLI overrides.

One module per section (``lora``, ``engines``, ``learner``, ``fidelity``, ``placement``, ``ray``,
``server``), the whole ``TrainConfig`` in ``train``, reading files in ``loading``, the reference page
in ``docs`` (``python -m trainer.config --markdown`` renders ``docs/config.md`` from the field descriptions).
Torch-free: importing the config pulls pydantic and yaml only.
"""

from __future__ import annotations

from trainer.config.common import BASE_DIR_KEY, ConfigError, ImportanceSamplingMode, RewardAggregation
from trainer.config.distillation import DistillationConfig
from trainer.config.docs import EXAMPLE_COMMAND, render_markdown
from trainer.config.engines import HFEngineConfig, VLLMConfig
from trainer.config.fidelity import FidelityConfig, TranscriptsConfig
from trainer.config.learner import LearnerConfig
from trainer.config.loading import load_config, validate_config
from trainer.config.lora import LoraConfig, vision_lora_refusal
from trainer.config.placement import PlacementConfig
from trainer.config.prices import TokenPrices
from trainer.config.ray import RayConfig
from trainer.config.server import PolicyServerConfig
from trainer.config.train import TrainConfig

__all__ = [
    "BASE_DIR_KEY",
    "EXAMPLE_COMMAND",
    "ConfigError",
    "DistillationConfig",
    "FidelityConfig",
    "HFEngineConfig",
    "ImportanceSamplingMode",
    "LearnerConfig",
    "LoraConfig",
    "PlacementConfig",
    "PolicyServerConfig",
    "RayConfig",
    "RewardAggregation",
    "TokenPrices",
    "TrainConfig",
    "TranscriptsConfig",
    "VLLMConfig",
    "load_config",
    "render_markdown",
    "validate_config",
    "vision_lora_refusal",
]
