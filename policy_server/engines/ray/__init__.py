"""Inference replicas as Ray actors behind the gateway, as one engine: sticky routing, adapters
published to every replica, failover and restarts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers import lazy_attributes

# name -> (module, attribute): imported on first use, so importing this package stays light.
_LAZY: dict[str, tuple[str, str]] = {
    "MissingAdapter": ("policy_server.engines.ray.replica", "MissingAdapter"),
    "NoLiveReplica": ("policy_server.engines.ray.routing", "NoLiveReplica"),
    "RayEngine": ("policy_server.engines.ray.engine", "RayEngine"),
    "Replica": ("policy_server.engines.ray.replica", "Replica"),
    "StickyRouter": ("policy_server.engines.ray.routing", "StickyRouter"),
    "asked_and_had": ("policy_server.engines.ray.resources", "asked_and_had"),
}

if TYPE_CHECKING:
    from policy_server.engines.ray.engine import RayEngine
    from policy_server.engines.ray.replica import MissingAdapter, Replica
    from policy_server.engines.ray.resources import asked_and_had
    from policy_server.engines.ray.routing import NoLiveReplica, StickyRouter

__all__ = [
    "MissingAdapter",
    "NoLiveReplica",
    "RayEngine",
    "Replica",
    "StickyRouter",
    "asked_and_had",
]

__getattr__ = lazy_attributes(__name__, _LAZY)
