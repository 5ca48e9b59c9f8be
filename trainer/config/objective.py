"""The GRPO objective's choices that need more than a line: ``loss_type`` (TRL's names, with GSPO and
CISPO) and ``epsilon_high`` (the upper clip, CISPO's cap), and how they must agree. Torch-free;
``trainer.algo.surrogates`` computes them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

LossType = Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo"]

LossTypeField = Annotated[
    LossType,
    Field(
        description="'grpo': token mean per episode (all of a rollout's calls), then mean over episodes; "
        "'dr_grpo': token sum over a constant (episodes x max_completion_length); 'dapo': mean over all "
        "tokens of the batch; 'gspo' (TRL: loss_type grpo with importance_sampling_level sequence): one "
        "clipped ratio per sequence, exp of the mean of its tokens' log-ratios, averaged as grpo (the "
        "paper clips at epsilon 3e-4, epsilon_high 4e-4); 'cispo': each token's ratio capped at "
        "epsilon_high, gradient stopped, times advantage x logprob, averaged as dapo. docs/losses.md "
        "says when to use which."
    ),
]

EpsilonHighField = Annotated[
    float | None,
    Field(
        gt=0,
        description="Upper clip range; unset: epsilon (DAPO uses 0.28). With loss_type cispo: the cap "
        "of the importance ratio itself (TRL's epsilon_high; ScaleRL uses 5.0), required.",
    ),
]


def check_objective(loss_type: str, epsilon: float, epsilon_high: float | None) -> None:
    """A ``ValueError`` naming what to set where ``loss_type``, ``epsilon`` and ``epsilon_high``
    disagree."""
    if loss_type == "cispo":
        if epsilon_high is None:
            raise ValueError(
                "loss_type cispo caps each token's importance ratio at epsilon_high, an absolute cap "
                "(TRL's default, epsilon, would cap it below 1): set epsilon_high, e.g. 5.0 as ScaleRL"
            )
        return
    if epsilon_high is not None and epsilon_high < epsilon:
        raise ValueError(f"epsilon_high ({epsilon_high}) must be at least epsilon ({epsilon})")
