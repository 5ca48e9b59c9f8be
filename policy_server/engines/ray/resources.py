"""Ray resources in words, for the sentences of actors that did not start: what each asked for and
what the cluster has of those resources (pure: the callers read the cluster from Ray)."""

from __future__ import annotations

from collections.abc import Mapping


def asked_and_had(asked: Mapping[str, float], totals: Mapping[str, float]) -> tuple[str, str]:
    """``asked`` (one actor's resources, zeros left out) and the cluster's ``totals`` of the same
    resources, e.g. ``("1 CPU, 1 GPU", "8 CPU, 0 GPU")``."""
    wanted = {name: amount for name, amount in asked.items() if amount > 0}
    each = ", ".join(f"{amount:g} {name}" for name, amount in wanted.items()) or "nothing"
    has = ", ".join(f"{totals.get(name, 0.0):g} {name}" for name in wanted) or "nothing asked for"
    return each, has
