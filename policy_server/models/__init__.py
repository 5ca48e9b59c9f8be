"""Models and what renders their prompts: the tiny offline models, SmolLM2 from its PyPI wheel, chat
templates, and the vision inputs the hf engine and the learner share.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers import lazy_attributes

# name -> (module, attribute): imported on first use, so importing this package stays light.
_LAZY: dict[str, tuple[str, str]] = {
    "ChatTemplateError": ("policy_server.models.chat_templates", "ChatTemplateError"),
    "LocalModelError": ("policy_server.models.local", "LocalModelError"),
    "ModelBuildError": ("policy_server.models.smollm2", "ModelBuildError"),
    "SHIPPED": ("policy_server.models.chat_templates", "SHIPPED"),
    "TINY_CHAT_TEMPLATE": ("policy_server.models.tiny", "CHAT_TEMPLATE"),
    "TINY_HEAD_DIM": ("policy_server.models.tiny", "HEAD_DIM"),
    "TINY_VISION_CHAT_TEMPLATE": ("policy_server.models.tiny_vision", "CHAT_TEMPLATE"),
    "VisionInputs": ("policy_server.models.vision_inputs", "VisionInputs"),
    "VisionTower": ("policy_server.models.tiny_vision", "VisionTower"),
    "MRope": ("policy_server.models.tiny_vision", "MRope"),
    "build_smollm2": ("policy_server.models.smollm2", "build_smollm2"),
    "build_tiny_model": ("policy_server.models.tiny", "build_tiny_model"),
    "build_tiny_vision_model": ("policy_server.models.tiny_vision", "build_tiny_vision_model"),
    "cached_smollm2": ("policy_server.models.smollm2", "cached_smollm2"),
    "chat_template_path": ("policy_server.models.chat_templates", "chat_template_path"),
    "chat_template_text": ("policy_server.models.chat_templates", "chat_template_text"),
    "is_vision_model": ("policy_server.models.vision_inputs", "is_vision_model"),
    "local_model_dir": ("policy_server.models.local", "local_model_dir"),
    "load_model": ("policy_server.models.vision_inputs", "load_model"),
    "load_tokenizer": ("policy_server.models.chat_templates", "load_tokenizer"),
    "position_ids": ("policy_server.models.vision_inputs", "position_ids"),
    "register_training_attention": (
        "policy_server.models.chunked_attention",
        "register_training_attention",
    ),
}

if TYPE_CHECKING:
    from policy_server.models.chat_templates import (
        SHIPPED,
        ChatTemplateError,
        chat_template_path,
        chat_template_text,
        load_tokenizer,
    )
    from policy_server.models.chunked_attention import register_training_attention
    from policy_server.models.local import LocalModelError, local_model_dir
    from policy_server.models.smollm2 import ModelBuildError, build_smollm2, cached_smollm2
    from policy_server.models.tiny import (
        CHAT_TEMPLATE as TINY_CHAT_TEMPLATE,
    )
    from policy_server.models.tiny import (
        HEAD_DIM as TINY_HEAD_DIM,
    )
    from policy_server.models.tiny import (
        build_tiny_model,
    )
    from policy_server.models.tiny_vision import (
        CHAT_TEMPLATE as TINY_VISION_CHAT_TEMPLATE,
    )
    from policy_server.models.tiny_vision import (
        MRope,
        VisionTower,
        build_tiny_vision_model,
    )
    from policy_server.models.vision_inputs import VisionInputs, is_vision_model, load_model, position_ids

__all__ = [
    "ChatTemplateError",
    "LocalModelError",
    "MRope",
    "ModelBuildError",
    "SHIPPED",
    "TINY_CHAT_TEMPLATE",
    "TINY_HEAD_DIM",
    "TINY_VISION_CHAT_TEMPLATE",
    "VisionInputs",
    "VisionTower",
    "build_smollm2",
    "build_tiny_model",
    "build_tiny_vision_model",
    "cached_smollm2",
    "chat_template_path",
    "chat_template_text",
    "is_vision_model",
    "load_model",
    "load_tokenizer",
    "local_model_dir",
    "position_ids",
    "register_training_attention",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
