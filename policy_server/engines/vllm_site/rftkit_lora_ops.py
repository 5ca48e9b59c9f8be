"""One matrix product per adapter for vLLM's CPU LoRA ops, in place of a weight copy per token.

vLLM's CPU build applies LoRA with the torch ops of ``vllm.lora.ops.torch_ops.lora_ops``: each
``bgmv_*`` gathers the adapter matrices of every token (``weights[indices]``: a tokens x out x rank
copy) and contracts them one token at a time. A prefill of a few thousand tokens then copies
gigabytes per layer, and sampling with an adapter runs several times slower than without one. The
ops here compute the same sums as one matrix product per adapter slot present in the batch (one in
a training run), with the same indexing (a token's slot ``-1`` selects the last slot, as there), the
same dtype casts and the same writes into the output.

``sitecustomize`` puts them in that module (:func:`replace_ops`) at its first import in the vLLM
server processes rftkit starts on a CPU, before the CPU punica wrapper and the package ``__init__``
take their names from it. Where the module lacks the ops it replaces (another vLLM), nothing changes.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the vLLM processes import torch themselves; a helper process need not
    import torch

LORA_OPS_MODULE = "vllm.lora.ops.torch_ops.lora_ops"
REPLACED = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice")


def _per_slot_products(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Row ``t``: ``weights[indices[t]] @ inputs[t]`` (weights: slots x [1 x] out x in), in ``dtype``."""
    if weights.dim() == 4:
        weights = weights.squeeze(dim=1)
    inputs = inputs.to(dtype=dtype)
    slots = indices.unique().tolist()
    if len(slots) == 1:
        return inputs @ weights[slots[0]].to(dtype=dtype).T
    outputs = inputs.new_empty((inputs.shape[0], weights.shape[-2]))
    for slot in slots:
        rows = (indices == slot).nonzero(as_tuple=True)[0]
        outputs[rows] = inputs[rows] @ weights[slot].to(dtype=dtype).T
    return outputs


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink``: ``output[t, :rank] = scaling * A[slot(t)] @ inputs[t]``."""
    outputs = _per_slot_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand``: ``output[t] (+)= B[slot(t)] @ inputs[t]`` over the common width."""
    outputs = _per_slot_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common] += outputs[:limit, :common]
    else:
        output_tensor[:, :common] = outputs[:limit, :common]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice``: the same into ``output[:, offset:offset + size]``."""
    outputs = _per_slot_products(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def replace_ops(module: ModuleType) -> bool:
    """Put these ops in ``module`` (vLLM's ``lora_ops``) if it has all of them; its ``sgmv_*`` call
    them through the module's globals. Returns whether it did."""
    if not all(callable(getattr(module, name, None)) for name in REPLACED):
        return False
    for name in REPLACED:
        setattr(module, name, globals()[name])
    return True
