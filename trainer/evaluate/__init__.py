"""`rft eval`: the base model and adapters on a config's evaluation rows, with no training: the
policies (:mod:`trainer.evaluate.policies`), their intervals (:mod:`trainer.evaluate.stats`) and the
report (:mod:`trainer.evaluate.report`).

The public surface, loaded lazily.
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "EvalError": "trainer.evaluate.policies",
    "Interval": "trainer.evaluate.stats",
    "paired_difference": "trainer.evaluate.stats",
    "pooled": "trainer.evaluate.stats",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
