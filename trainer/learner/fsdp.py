"""The learner's model sharded with torch FSDP2 (``fully_shard``) over the learner's process group.

Each decoder layer of the text model is one FSDP unit: its frozen base weights and its LoRA weights
are split across the ranks and gathered for that layer's forward (and again for its backward, or
its recomputation under gradient checkpointing), then freed. Everything else (embeddings, the final
norm, the output head, a vision tower) is the root unit, gathered once per forward: a vision tower
runs only for the micro-batches that carry pictures, so its blocks as units of their own would have
ranks gather different layers and the collectives would stop matching.

The root unit wraps :class:`Scorer`, the module whose forward is the learner's token-logprob pass:
FSDP gathers the root's weights at the root's forward, and the learner calls the decoder and the
output head separately, neither of which is the peft model's forward.

Gradients are reduce-scattered as a **sum** (divide factor 1): every micro-batch's loss is already
scaled by the whole batch's counts (:func:`trainer.learner.steps.micro_batch_loss`), so the sum over
ranks is the one-process gradient. Ranks whose passes leave a parameter unused (pictures on one rank
only, with LoRA on the vision tower) still send zeros for it, so the reduce-scatters match.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

_LORA = "lora_"  # peft's marker in every LoRA weight's name (lora_A, lora_B, lora_embedding_*)
# The optimizer's DCP state: the trained LoRA weights and AdamW's moments, sharded as they are.
_SHARDED_STATE_KEYS = ("model", "optimizer")


class Scorer(nn.Module):
    """The FSDP root: holds the peft model and runs ``score`` (the learner's token-logprob pass)."""

    def __init__(self, model: nn.Module, score: Callable[..., Any]) -> None:
        super().__init__()
        self.model = model
        self._score = score

    def forward(self, *args: Any) -> Any:
        return self._score(*args)


def decoder_layers(model: Any) -> list[nn.Module]:
    """The text decoder's layers of a peft model (one FSDP unit each)."""
    decoder = model.get_base_model().get_decoder()
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        raise ValueError(
            f"learner.shard: fsdp shards a model by its decoder layers, and {type(decoder).__name__} has "
            "no `layers` list: set learner.shard: off"
        )
    return list(layers)


def shard_model(model: Any, score: Callable[..., Any], device: torch.device) -> Scorer:
    """Shard ``model`` (a peft model, on the CPU or on ``device``) over the default process group in
    place, each shard moved to ``device`` (this rank's) as its unit is sharded; the returned root
    module runs ``score`` with the root's weights gathered."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # Named, not torch's default (the machine's accelerator): a CPU learner on a GPU machine.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    units = []
    for layer in decoder_layers(model):
        units.append(fully_shard(layer, mesh=mesh))
    root = Scorer(model, score)
    units.append(fully_shard(root, mesh=mesh))
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        # A plain sum: gloo has no pre-multiplied sum (NCCL's PreMulSum), and a factor of 1 needs none.
        unit.set_force_sum_reduction_for_comms(True)
        unit.set_reduce_scatter_unused_params(True, recurse=False)
    return root


def full_adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every LoRA weight of ``model`` (both adapters where a reference adapter is loaded) whole, on
    the CPU, by state-dict name. A collective: every rank calls it, in the same order."""
    from torch.distributed.tensor import DTensor

    full = {}
    for name, value in model.state_dict().items():
        if _LORA not in name:
            continue
        whole = value.full_tensor() if isinstance(value, DTensor) else value
        full[name] = whole.detach().cpu()
    return full


def _state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    # The frozen base (and a frozen reference adapter) are what the model directory and
    # init_adapter already hold: only the trained weights and their optimizer state are saved.
    model_state, optimizer_state = get_state_dict(
        model, optimizer, options=StateDictOptions(ignore_frozen_params=True)
    )
    return dict(zip(_SHARDED_STATE_KEYS, (model_state, optimizer_state), strict=True))


def save_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Each rank writes its shard of the LoRA weights and AdamW's state to ``directory`` (torch's
    distributed checkpoint; every rank of the node sees the same filesystem)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_state_dicts(model, optimizer), checkpoint_id=str(directory))


def load_sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Read :func:`save_sharded_state`'s ``directory`` into this rank's shards: the number of ranks
    may differ from the writer's (torch's distributed checkpoint reshards by global offsets)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    state = _state_dicts(model, optimizer)
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(ignore_frozen_params=True, strict=False),
    )
