"""The ``token_prices`` section: what a run's tokens cost, in the SageMaker service's cost model."""

from __future__ import annotations

from pydantic import Field

from trainer.config.common import _Section


class TokenPrices(_Section):
    """Dollars per million tokens in the SageMaker cost model's three buckets (defaults: its demo)."""

    prefill: float = Field(default=0.12, ge=0, description="Price per million prompt (prefill) tokens.")
    sample: float = Field(default=0.30, ge=0, description="Price per million sampled tokens.")
    train: float = Field(default=0.36, ge=0, description="Price per million trained tokens.")
