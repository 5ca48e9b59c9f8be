"""What one device holds in each phase of a step: the plan's rows (:class:`Item`) and their sums."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from trainer.scale.memory import CUDA_OVERHEAD_BYTES
from trainer.scale.placement import Node

Phase = Literal["always", "rollouts", "update"]


@dataclass(frozen=True)
class Item:
    label: str
    bytes: int
    phase: Phase = "always"


@dataclass
class DevicePlan:
    """What one device holds; ``capacity`` is None when its memory is unknown."""

    device: str
    capacity: int | None
    items: list[Item] = field(default_factory=list)

    def phase_total(self, phase: Phase) -> int:
        return sum(item.bytes for item in self.items if item.phase in ("always", phase))

    @property
    def peak(self) -> tuple[int, Phase]:
        rollouts, update = self.phase_total("rollouts"), self.phase_total("update")
        return (update, "update") if update >= rollouts else (rollouts, "rollouts")

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.peak[0] <= self.capacity


def device_plan(plans: dict[str, DevicePlan], node: Node, device: str) -> DevicePlan:
    """``device``'s entry of ``plans``, made on first use with the device's memory."""
    if device not in plans:
        capacity = host_memory()
        if device.startswith("cuda"):
            index = int(device.partition(":")[2] or 0)
            capacity = node.gpus[index].memory_bytes if index < len(node.gpus) else None
        plans[device] = DevicePlan(device, capacity)
    return plans[device]


def host_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def process_overhead(device: str, owner: str) -> list[Item]:
    """A process's CUDA context on a GPU (nothing on the CPU)."""
    return (
        [Item(f"{owner} CUDA context + allocator slack", CUDA_OVERHEAD_BYTES)]
        if device.startswith("cuda")
        else []
    )
