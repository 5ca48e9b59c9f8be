"""``rft export``: a run's adapter (or any adapter directory) written for serving, as a peft adapter in
the base model's dtype or as merged weights, each checked against the trained policy (``verify``),
with a model card (``card``). Where a run keeps what it reads: ``source``.

The public surface, loaded lazily (torch, transformers and peft only when used).
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "ExportError": "trainer.export.source",
    "ExportSource": "trainer.export.source",
    "locate": "trainer.export.source",
    "export": "trainer.export.exporting",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
