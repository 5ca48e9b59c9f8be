"""The gateway's worker processes: the agents' port served by several processes, the job state kept
in one, and the link between them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# name -> (module, attribute): imported on first use, so importing this package stays light.
_LAZY: dict[str, tuple[str, str]] = {
    "GatewayPool": ("policy_server.workers.gateway_pool", "GatewayPool"),
    "RemoteRegistry": ("policy_server.workers.remote_state", "RemoteRegistry"),
    "RemoteVersions": ("policy_server.workers.remote_state", "RemoteVersions"),
    "StateClient": ("policy_server.workers.state_link", "StateClient"),
    "StateLinkError": ("policy_server.workers.state_link", "StateLinkError"),
    "serve_gateway": ("policy_server.workers.gateway_pool", "serve_gateway"),
    "serve_link": ("policy_server.workers.state_link", "serve_link"),
}

if TYPE_CHECKING:
    from policy_server.workers.gateway_pool import GatewayPool, serve_gateway
    from policy_server.workers.remote_state import RemoteRegistry, RemoteVersions
    from policy_server.workers.state_link import StateClient, StateLinkError, serve_link

__all__ = [
    "GatewayPool",
    "RemoteRegistry",
    "RemoteVersions",
    "StateClient",
    "StateLinkError",
    "serve_gateway",
    "serve_link",
]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value
