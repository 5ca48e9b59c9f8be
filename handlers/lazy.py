"""``lazy_attributes``: the one way a package's ``__init__`` offers names that load on first use.

A package's ``__init__`` is its public surface. Eager imports there would make ``import trainer`` pull
in torch, or ``import handlers`` bedrock-agentcore; so each surface lists where its names live and
sets ``__getattr__ = lazy_attributes(__name__, {...})``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(package: str, table: Mapping[str, str | tuple[str, str]]) -> Callable[[str], Any]:
    """The module-level ``__getattr__`` of ``package``: ``name`` is imported from ``table[name]``, a
    module (the attribute of the same name) or a ``(module, attribute)`` pair, then cached."""

    def __getattr__(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute = (where, name) if isinstance(where, str) else where
        value = getattr(importlib.import_module(module), attribute)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
