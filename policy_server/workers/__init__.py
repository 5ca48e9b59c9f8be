"""The gateway's worker processes: the agents' port served by several processes, the job state kept
in one, and the link between them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from handlers import lazy_attributes

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

__getattr__ = lazy_attributes(__name__, _LAZY)
