"""Watching a run: metrics files and MLflow (``metrics``), Prometheus series (``prometheus``), ``rft
status`` (``status``) and the CPU kernel settings that make a run repeat exactly (``cpu_kernels``).

The public surface, loaded lazily (mlflow, prometheus_client only when used).
"""

from __future__ import annotations

from handlers import lazy_attributes

_LAZY = {
    "MetricsLogger": "trainer.ops.metrics",
    "TokenCost": "trainer.ops.metrics",
    "pin_cpu_kernels": "trainer.ops.cpu_kernels",
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_attributes(__name__, _LAZY)
