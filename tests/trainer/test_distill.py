"""On-policy distillation: the reverse-KL advantage by hand, the teacher's scores, the tokenizer
refusal, groups without reward signal, and one `rft train` step with a teacher over real HTTP."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from trainer.algo.distill import distillation_advantages, reverse_kl
from trainer.algo.grpo import grpo_loss, token_logprobs
from trainer.algo.sequences import TrainingSequence, pad_batch
from trainer.batch import Group, Member, StepBatch, assign_advantages
from trainer.config import ConfigError, DistillationConfig, TrainConfig, load_config
from trainer.distill import Teacher, TokenizerMismatch
from trainer.loop import train


def test_reverse_kl_and_advantages_by_hand() -> None:
    student = torch.tensor([[0.0, -0.5, -1.0, 0.0], [0.0, -2.0, -0.1, -3.0]])
    teacher = torch.tensor([[0.0, -0.2, -3.0, -9.0], [0.0, -0.5, -0.1, -1.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
    # log pi_student - log pi_teacher on each sampled token, 0 elsewhere (the -9.0 is padding).
    expected_kl = torch.tensor([[0.0, -0.3, 2.0, 0.0], [0.0, -1.5, 0.0, -2.0]])
    assert torch.allclose(reverse_kl(student, teacher, mask), expected_kl)

    outcome = torch.tensor([1.5, -0.5])
    advantages = distillation_advantages(outcome, student, teacher, mask, weight=0.5, reward_weight=2.0)
    # 2 * A_grpo - 0.5 * kl on sampled tokens: row 0 = 3 - 0.5 * kl, row 1 = -1 - 0.5 * kl.
    expected = torch.tensor([[0.0, 3.15, 2.0, 0.0], [0.0, -0.25, -1.0, 0.0]])
    assert torch.allclose(advantages, expected)
    pure = distillation_advantages(outcome, student, teacher, mask, weight=1.0, reward_weight=0.0)
    assert torch.allclose(pure, -expected_kl)
    with pytest.raises(ValueError, match="weights must be >= 0"):
        distillation_advantages(outcome, student, teacher, mask, weight=-1.0)


def test_the_loss_on_distillation_advantages_has_the_gradient_of_the_reverse_kl() -> None:
    # One position, vocabulary of 4: the student's logits z, a fixed teacher q. Every token is one
    # sequence, weighted by its probability under the student: the expectation the sampler estimates.
    torch.manual_seed(0)
    logits = torch.randn(4, requires_grad=True)
    teacher = torch.log_softmax(torch.tensor([2.0, -1.0, 0.5, 0.0]), dim=-1)
    student = torch.log_softmax(logits, dim=-1)
    exact = (student.exp() * (student - teacher)).sum()  # KL(pi_student || pi_teacher) by hand
    (exact_grad,) = torch.autograd.grad(exact, logits)

    tokens = torch.arange(4)
    ids = torch.stack([torch.zeros(4, dtype=torch.long), tokens], dim=1)  # [4, 2]: a prompt token, then x
    logprobs = token_logprobs(logits.expand(4, 2, 4), ids)  # column 1: log pi_student(x)
    mask = torch.tensor([[0.0, 1.0]] * 4)
    teacher_lp = torch.stack([torch.zeros(4), teacher[tokens]], dim=1)
    advantages = distillation_advantages(
        torch.zeros(4), logprobs.detach(), teacher_lp, mask, weight=1.0, reward_weight=0.0
    )
    # dr_grpo with a constant 1 sums the per-token losses; weighting each sequence by p(x) makes
    # the sum the expectation over the student's samples.
    weight = student.detach().exp()
    loss, _ = grpo_loss(
        logprobs,
        logprobs.detach(),
        advantages * weight.unsqueeze(-1),
        mask,
        loss_type="dr_grpo",
        max_completion_length=1,
        total_episodes=1,
    )
    (loss_grad,) = torch.autograd.grad(loss, logits)
    assert torch.allclose(loss_grad, exact_grad, atol=1e-6)
    # At ratio 1 the loss's value is the same expectation: the reverse KL itself.
    assert math.isclose(float(loss.detach()), float(exact.detach()), rel_tol=1e-6)


def test_per_token_advantages_pad_with_the_sequence_advantage() -> None:
    plain = TrainingSequence("a", [1, 2, 3], [0, 1, 1], [0.0, -0.1, -0.2], advantage=0.5)
    distilled = TrainingSequence("b", [1, 2], [0, 1], [0.0, -0.3], advantage=1.0, token_advantages=[0.0, 0.7])
    assert pad_batch([plain], 0).advantages.tolist() == [0.5]
    batch = pad_batch([plain, distilled], 0)
    assert batch.advantages.tolist() == [[0.0, 0.5, 0.5], [0.0, pytest.approx(0.7), 0.0]]


def _member(reward: float, rollout_id: str) -> Member:
    outcome = SimpleNamespace(ok=True, reward=reward, status="ok", cause=None)
    rollout = SimpleNamespace(outcome=outcome, trace=rollout_id)
    return Member(rollout, [TrainingSequence(rollout_id, [1, 2], [0, 1], [0.0, -0.5])])  # type: ignore[arg-type]


def _batch() -> StepBatch:
    flat = Group(members=[_member(1.0, "a"), _member(1.0, "b")])  # no reward variance
    varied = Group(members=[_member(1.0, "c"), _member(0.0, "d")])
    return StepBatch(groups=[flat, varied])


def test_groups_without_reward_signal_train_only_when_distilling(tmp_path: Path) -> None:
    grpo = TrainConfig(output_dir=tmp_path)
    batch = _batch()
    assign_advantages(grpo, batch)
    assert batch.dropped_groups == 1 and [s.rollout_id for s in batch.sequences] == ["c", "d"]

    distilling = TrainConfig(output_dir=tmp_path, distillation={"teacher": str(tmp_path)})
    batch = _batch()
    assign_advantages(distilling, batch)
    assert batch.dropped_groups == 0
    assert [(s.rollout_id, s.advantage) for s in batch.sequences][:2] == [("a", 0.0), ("b", 0.0)]
    off = TrainConfig(output_dir=tmp_path, distillation={"teacher": str(tmp_path), "weight": 0.0})
    batch = _batch()
    assign_advantages(off, batch)
    assert batch.dropped_groups == 1


def test_a_teacher_with_another_tokenizer_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    from policy_server.models.tiny import build_tiny_model

    other = build_tiny_model(tmp_path / "other", seed=0, vocab_size=600)
    settings = DistillationConfig(teacher=other)
    with pytest.raises(TokenizerMismatch, match="has another tokenizer than the policy") as refused:
        Teacher(
            settings, tiny_model_dir, device=torch.device("cpu"), dtype=torch.float32, micro_batch_tokens=64
        )
    assert "token(s) differ" in str(refused.value) and "`rft collect`" in str(refused.value)
    assert isinstance(refused.value, ConfigError)


def test_the_teacher_scores_the_student_tokens_as_the_merged_model_does(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Any
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = random_adapter(tmp_path / "adapter", seed=5)
    settings = DistillationConfig(teacher=tiny_model_dir, teacher_adapter=adapter)
    # A budget of 16 tokens: the two sequences score in separate micro-batches.
    teacher = Teacher(
        settings, tiny_model_dir, device=torch.device("cpu"), dtype=torch.float32, micro_batch_tokens=16
    )
    sequences = [
        TrainingSequence("a", [5, 9, 14, 3, 7, 8], [0, 0, 1, 1, 0, 1], [0.0] * 6),
        TrainingSequence("b", [4, 4, 11, 12], [0, 1, 1, 1], [0.0] * 4),
    ]
    scored = teacher.score(sequences)

    model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(adapter)
    ).eval()
    for sequence, scores in zip(sequences, scored, strict=True):
        ids = torch.tensor([sequence.token_ids])
        with torch.no_grad():
            expected = token_logprobs(model(ids).logits, ids)[0] * torch.tensor(sequence.loss_mask)
        assert torch.allclose(scores, expected, atol=1e-5)
        assert scores[0] == 0.0 and bool((scores[torch.tensor(sequence.loss_mask) > 0] < 0).all())


def test_a_distillation_step_scores_every_sequence_and_counts_the_teacher_as_prefill(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Any
) -> None:
    adapter = random_adapter(tmp_path / "teacher-adapter", seed=7, std=1.0)
    fields = {
        "max_steps": 1,
        "eval_on_start": False,
        "eval_on_end": False,
        "distillation": {
            "teacher": str(tiny_model_dir),
            "teacher_adapter": str(adapter),
            "reward_weight": 0.0,
        },
    }
    with serving(app) as agent_url:
        config = load_config(write_run_files(tmp_path, tiny_model_dir, agent_url, **fields))
        train(config)
    (record,) = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    distillation = record["distillation"]
    # The teacher read every token of every trained sequence (its prefill) and scored the sampled ones.
    assert distillation["teacher_tokens"] == record["update"]["train_tokens"] > 0
    assert distillation["sampled_tokens"] == record["update"]["completion_tokens"]
    assert record["tokens"]["teacher_prefill"] == distillation["teacher_tokens"]
    assert (
        record["tokens"]["prefill"] >= distillation["teacher_tokens"] + record["tokens"]["train_per_call"] / 2
    )
    # The teacher (a random adapter) differs from the student: KL(student || teacher) > 0, estimated
    # from the step's sampled tokens.
    assert distillation["reverse_kl"] > 0.0 and distillation["teacher_logprob"] < 0
    assert record["groups"]["dropped"] == 0 and record["update"]["applied"] is True
