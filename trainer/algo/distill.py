"""On-policy distillation as pure functions of tensors: the per-token reverse KL to a teacher and the
per-token advantages it makes beside GRPO's outcome advantage.

The student samples a completion; the teacher scores the student's own tokens (teacher logprobs of
given ids, no sampling). For each sampled token x_t the reverse KL's one-sample estimate is

    kl_t = log pi_student(x_t | prefix) - log pi_teacher(x_t | prefix)

whose expectation over the student's samples is KL(pi_student || pi_teacher) at that position. As in
the on-policy distillation literature (Agarwal et al. 2024, GKD with lambda = 1; Thinking Machines'
"On-Policy Distillation", 2025), its negative is a per-token reward, used as an advantage with no
gradient through it:

    A_t = reward_weight * A_grpo - weight * kl_t

and the policy-gradient surrogate ``-ratio_t * A_t`` of :func:`trainer.algo.grpo.grpo_loss` then has
the gradient ``weight * kl_t * grad log pi_student(x_t)`` at ratio 1: the score-function estimate of
``weight * grad KL(pi_student || pi_teacher)``, the mode-seeking direction that pulls the student
toward the teacher on the states the student itself visits. ``log pi_student`` is the sampler's
recorded logprob (the policy that drew the token), as Tinker's recipe takes it.
"""

from __future__ import annotations

from torch import Tensor


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor, loss_mask: Tensor) -> Tensor:
    """Per-token reverse-KL estimate ``student - teacher`` on the sampled tokens, [B, T]; 0 off the mask.

    All three are [B, T], aligned as :func:`trainer.algo.grpo.token_logprobs` aligns them.
    """
    on = loss_mask > 0
    difference = (student_logprobs - teacher_logprobs).detach()
    return difference.where(on, difference.new_zeros(()))


def distillation_advantages(
    advantages: Tensor,
    student_logprobs: Tensor,
    teacher_logprobs: Tensor,
    loss_mask: Tensor,
    *,
    weight: float,
    reward_weight: float = 1.0,
) -> Tensor:
    """Per-token advantages [B, T]: ``reward_weight * advantages - weight * reverse_kl``, 0 off the mask.

    ``advantages``: [B] the outcome (GRPO) advantage of each sequence. ``weight``: the reverse KL's
    coefficient (0: GRPO alone); ``reward_weight``: the outcome advantage's (0: distillation alone).
    """
    if weight < 0 or reward_weight < 0:
        raise ValueError(f"weights must be >= 0, got weight {weight} and reward_weight {reward_weight}")
    kl = reverse_kl(student_logprobs, teacher_logprobs, loss_mask)
    mask = (loss_mask > 0).to(kl.dtype)
    outcome = reward_weight * advantages.to(kl.dtype).unsqueeze(-1) * mask
    return outcome - weight * kl
