"""Inference engines behind one interface (``base.Engine``): the built-in hf engine (transformers +
peft), vLLM as a separate server process, and inference replicas on Ray (``engines.ray``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers import lazy_attributes

# name -> (module, attribute): imported on first use, so importing this package stays light.
_LAZY: dict[str, tuple[str, str]] = {
    "Engine": ("policy_server.engines.base", "Engine"),
    "EngineOccupancy": ("policy_server.engines.base", "EngineOccupancy"),
    "EngineStats": ("policy_server.engines.hf", "EngineStats"),
    "ForwardEngine": ("policy_server.engines.forward", "ForwardEngine"),
    "GenerationRequest": ("policy_server.engines.base", "GenerationRequest"),
    "GenerationResult": ("policy_server.engines.base", "GenerationResult"),
    "HFEngine": ("policy_server.engines.hf", "HFEngine"),
    "RayEngine": ("policy_server.engines.ray.engine", "RayEngine"),
    "VLLMEngine": ("policy_server.engines.vllm", "VLLMEngine"),
    "VLLMEngineError": ("policy_server.engines.vllm_server", "VLLMEngineError"),
    "free_port": ("policy_server.engines.vllm_server", "free_port"),
    "vllm_family_env": ("policy_server.engines.vllm_command", "family_env"),
    "vllm_serve_arguments": ("policy_server.engines.vllm_command", "serve_arguments"),
    "vllm_shell_command": ("policy_server.engines.vllm_command", "shell_command"),
    "sample_tokens": ("policy_server.engines.hf_batch", "sample_tokens"),
}

if TYPE_CHECKING:
    from policy_server.engines.base import Engine, EngineOccupancy, GenerationRequest, GenerationResult
    from policy_server.engines.forward import ForwardEngine
    from policy_server.engines.hf import EngineStats, HFEngine
    from policy_server.engines.hf_batch import sample_tokens
    from policy_server.engines.ray.engine import RayEngine
    from policy_server.engines.vllm import VLLMEngine
    from policy_server.engines.vllm_command import family_env as vllm_family_env
    from policy_server.engines.vllm_command import serve_arguments as vllm_serve_arguments
    from policy_server.engines.vllm_command import shell_command as vllm_shell_command
    from policy_server.engines.vllm_server import VLLMEngineError, free_port

__all__ = [
    "Engine",
    "EngineOccupancy",
    "EngineStats",
    "ForwardEngine",
    "GenerationRequest",
    "GenerationResult",
    "HFEngine",
    "RayEngine",
    "VLLMEngine",
    "VLLMEngineError",
    "free_port",
    "sample_tokens",
    "vllm_family_env",
    "vllm_serve_arguments",
    "vllm_shell_command",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
