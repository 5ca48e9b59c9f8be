"""The error a training run stops with."""

from __future__ import annotations


class TrainingError(RuntimeError):
    """The run cannot go on (bad data, nothing to resume from, an engine that will not start)."""
