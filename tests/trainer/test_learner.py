"""The learner on a real tiny Llama with a real peft LoRA adapter."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import TrainingSequence
from trainer.config import TrainConfig
from trainer.learner.learner import Learner
from trainer.learner.model import REFERENCE_ADAPTER


def _sequences(
    learner: Learner, advantages: list[float], seed: int = 0, episodes: list[str] | None = None
) -> list[TrainingSequence]:
    """Random prompts + completions; behavior logprobs are the model's own (an on-policy sample).

    ``episodes`` names each sequence's rollout (default: one rollout per sequence)."""
    rng = random.Random(seed)
    vocab = learner.model.config.vocab_size
    sequences = []
    for index, advantage in enumerate(advantages):
        prompt = [rng.randrange(vocab) for _ in range(6 + index)]
        completion = [rng.randrange(vocab) for _ in range(5 + 2 * index)]
        ids = prompt + completion
        with torch.no_grad():
            logits = learner.model(input_ids=torch.tensor([ids])).logits
        logprobs = token_logprobs(logits, torch.tensor([ids]))[0].tolist()
        mask = [0] * len(prompt) + [1] * len(completion)
        sequences.append(
            TrainingSequence(
                rollout_id=episodes[index] if episodes else f"r{index}",
                token_ids=ids,
                loss_mask=mask,
                behavior_logprobs=[lp if m else 0.0 for lp, m in zip(logprobs, mask, strict=True)],
                advantage=advantage,
                num_calls=1,
            )
        )
    return sequences


def _config(**fields: object) -> TrainConfig:
    """The settings these tests train with: a large learning rate, GRPO's per-episode mean."""
    return TrainConfig.model_validate({"learning_rate": 1e-2, "max_steps": 10, "loss_type": "grpo", **fields})


def _learner(model_dir: Path, **fields: object) -> Learner:
    return Learner(model_dir, _config(**fields))


def test_a_step_changes_only_the_lora_weights(tiny_model_dir: Path) -> None:
    learner = _learner(tiny_model_dir)
    before = {name: param.detach().clone() for name, param in learner.model.named_parameters()}
    result = learner.train_step(_sequences(learner, [1.0, -1.0, 0.5, -0.5]), seed=1)

    assert not result.skipped
    assert math.isfinite(result.metrics["loss"]) and result.metrics["grad_norm"] > 0
    assert result.metrics["mismatch_kl"] == pytest.approx(0.0, abs=1e-6)  # on-policy sample
    changed = {
        name for name, param in learner.model.named_parameters() if not torch.equal(param, before[name])
    }
    assert changed, "the update changed nothing"
    assert all("lora_" in name for name in changed), sorted(changed)
    assert any("lora_B" in name for name in changed)


def test_non_finite_loss_skips_the_update(tiny_model_dir: Path) -> None:
    learner = _learner(tiny_model_dir)
    before = learner.adapter_state()
    result = learner.train_step(_sequences(learner, [1.0, float("nan")]))

    assert result.skipped and result.metrics["skipped"] == 1.0
    assert learner.steps_skipped == 1
    after = learner.adapter_state()
    assert all(torch.equal(after[name], before[name]) for name in before)
    assert all(param.grad is None for param in learner.trainable)
    # The learner keeps working: the next, finite batch updates the adapter.
    assert not learner.train_step(_sequences(learner, [1.0, -1.0])).skipped
    assert any(not torch.equal(learner.adapter_state()[name], before[name]) for name in before)


def test_kl_to_the_base_model_is_zero_at_init_and_grows_with_training(tiny_model_dir: Path) -> None:
    learner = _learner(tiny_model_dir, beta=0.1)
    sequences = _sequences(learner, [1.0, -1.0, 0.5, -0.5])
    first = learner.train_step(sequences, seed=0)
    assert first.metrics["kl"] == 0.0  # LoRA's B starts at zero: adapter on == adapter off
    for step in range(3):
        last = learner.train_step(sequences, seed=step)
    assert last.metrics["kl"] > 1e-6


def test_kl_reference_is_the_warm_start_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = _learner(tiny_model_dir)
    trained.train_step(_sequences(trained, [1.0, -1.0]))
    saved = trained.save_adapter(tmp_path / "sft")
    warm = _learner(tiny_model_dir, init_adapter=saved, beta=0.1)
    trainable_names = {name for name, param in warm.model.named_parameters() if param.requires_grad}
    sequences = _sequences(warm, [1.0, -1.0, 0.5, -0.5])
    # The warm start differs from the base model, yet the KL starts at zero: it is measured against it.
    assert warm.train_step(sequences, seed=0).metrics["kl"] == 0.0
    for step in range(3):
        last = warm.train_step(sequences, seed=step)
    assert last.metrics["kl"] > 1e-6
    # The reference pass leaves the trained adapter trainable and the reference frozen.
    assert {name for name, param in warm.model.named_parameters() if param.requires_grad} == trainable_names
    assert all(REFERENCE_ADAPTER not in name for name in trainable_names)
    # Only the trained adapter is saved, at the top of the directory.
    out = warm.save_adapter(tmp_path / "trained")
    assert sorted(path.name for path in out.iterdir() if path.is_dir()) == []
    fresh = _learner(tiny_model_dir, init_adapter=out)
    a, b = warm.adapter_state(), fresh.adapter_state()
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)


def test_a_batchs_later_passes_take_its_reference_logprobs_from_the_first(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """num_iterations passes on one batch run the reference pass once per micro-batch (TRL: once per
    generation batch) and step exactly as passes that compute it again (fresh copies of the batch)."""
    trained = _learner(tiny_model_dir)
    trained.train_step(_sequences(trained, [1.0, -1.0]))
    saved = trained.save_adapter(tmp_path / "sft")
    kept, again = (_learner(tiny_model_dir, init_adapter=saved, beta=0.1) for _ in range(2))
    kept.micro_batch_tokens = again.micro_batch_tokens = 40
    passes = {"kept": 0, "again": 0}
    for name, learner in (("kept", kept), ("again", again)):
        compute = learner._reference_logprobs

        def counted(*args: Any, _name: str = name, _compute: Any = compute) -> torch.Tensor:
            passes[_name] += 1
            return _compute(*args)

        learner._reference_logprobs = counted  # type: ignore[method-assign]
    sequences = _sequences(kept, [1.0, -1.0, 0.5, -0.5])
    for seed in range(3):
        ours = kept.train_step(sequences, seed=seed)
        theirs = again.train_step(copy.deepcopy(sequences), seed=seed)
        assert ours.metrics == theirs.metrics
    micro_batches = int(ours.metrics["micro_batches"])
    assert micro_batches > 1 and ours.metrics["kl"] > 1e-6
    assert passes == {"kept": micro_batches, "again": 3 * micro_batches}
    a, b = kept.adapter_state(), again.adapter_state()
    assert all(torch.equal(a[name], b[name]) for name in a)
    # The next batch (other sequence objects) is scored against the reference afresh.
    kept.train_step(_sequences(kept, [1.0, -1.0], seed=1), seed=3)
    assert passes["kept"] > micro_batches


@pytest.mark.parametrize("episodes", [None, ["a", "b", "a", "b"]], ids=["call-per-episode", "split-episodes"])
def test_micro_batches_accumulate_to_the_full_batch_gradient(
    tiny_model_dir: Path, episodes: list[str] | None
) -> None:
    # Split episodes: each rollout's two calls land in different micro-batches, so each micro-batch
    # must be normalised by its episodes' whole token counts.
    advantages = [1.0, -1.0, 1.0, -1.0] if episodes else [1.0, -1.0, 0.5, -0.5]
    sequences = _sequences(_learner(tiny_model_dir), advantages, episodes=episodes)
    whole, split = _learner(tiny_model_dir), _learner(tiny_model_dir)
    split.micro_batch_tokens = 20
    gradients = [_gradients_at_step(whole), _gradients_at_step(split)]
    one, many = whole.train_step(sequences).metrics, split.train_step(sequences).metrics
    assert one["micro_batches"] == 1 and many["micro_batches"] > 1
    # The gradient norm (before clipping) sees any mis-scaled micro-batch; Adam's first step would not.
    assert many["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert many["loss"] == pytest.approx(one["loss"], abs=1e-6)
    # Float sums in another order: every gradient the same to float32 rounding of the largest one.
    # (Not the weights after Adam's first step: it moves each weight by about lr times the sign of
    # its gradient, so a near-zero gradient's rounding shows at full size.)
    full, accumulated = gradients
    scale = max(grad.abs().max().item() for grad in full.values())
    for name, grad in full.items():
        torch.testing.assert_close(accumulated[name], grad, rtol=1e-4, atol=1e-5 * scale)


def _gradients_at_step(learner: Learner) -> dict[str, torch.Tensor]:
    """Filled with the trainable parameters' gradients when ``learner``'s optimizer steps."""
    gradients: dict[str, torch.Tensor] = {}
    step = learner.optimizer.step

    def recording_step(*args: Any, **kwargs: Any) -> Any:
        for name, parameter in learner.model.named_parameters():
            if parameter.grad is not None:
                gradients[name] = parameter.grad.detach().clone()
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step  # type: ignore[method-assign]
    return gradients


def test_old_logprobs_fix_the_clipped_ratio_for_every_pass(tiny_model_dir: Path) -> None:
    correction = {"vllm_importance_sampling_correction": True, "learning_rate": 0.3}
    fixed, own = _learner(tiny_model_dir, **correction), _learner(tiny_model_dir, **correction)
    fixed.micro_batch_tokens = own.micro_batch_tokens = 40  # old logprobs split like the passes
    sequences = _sequences(fixed, [1.0, -1.0, 0.5, -0.5])
    old = fixed.old_logprobs(sequences)
    assert [len(row) for row in old] == [len(sequence) for sequence in sequences]
    # Pass 1: the no-grad old logprobs are this pass's logprobs bit for bit (no dropout), so the step
    # is the one its own detached logprobs give.
    first, own_first = (
        fixed.train_step(sequences, seed=0, old_logprobs=old),
        own.train_step(sequences, seed=0),
    )
    assert first.metrics["micro_batches"] > 1
    assert first.metrics["ratio_mean"] == 1.0 and first.metrics["clip_fraction"] == 0.0
    assert first.metrics == own_first.metrics
    # Pass 2 (a large step later): clipped against the fixed old policy, never against its own.
    second, own_second = (
        fixed.train_step(sequences, seed=1, old_logprobs=old),
        own.train_step(sequences, seed=1),
    )
    assert second.metrics["clip_fraction"] > 0.0 and second.metrics["ratio_mean"] != 1.0
    assert own_second.metrics["clip_fraction"] == 0.0
    # The sampler-to-learner weights are those of the old policy: the same on both passes.
    assert second.metrics["is_weight_mean"] == pytest.approx(first.metrics["is_weight_mean"], rel=1e-6)
    assert second.metrics["is_ratio_max"] == pytest.approx(first.metrics["is_ratio_max"], rel=1e-6)


def test_saved_adapter_restores_into_a_fresh_learner(tiny_model_dir: Path, tmp_path: Path) -> None:
    learner = _learner(tiny_model_dir)
    learner.train_step(_sequences(learner, [1.0, -1.0]))
    saved = learner.save_adapter(tmp_path / "v1")
    assert (saved / "adapter_config.json").is_file() and (saved / "adapter_model.safetensors").is_file()

    fresh = _learner(tiny_model_dir)
    # A copy, as a checkpoint on disk would be: the live state keeps changing with `learner`.
    fresh.restore(saved, copy.deepcopy(learner.training_state()))
    a, b = learner.adapter_state(), fresh.adapter_state()
    assert all(torch.equal(a[name], b[name]) for name in a)
    assert fresh.steps_done == 1
    # Same state, same batch: the same next update, bit for bit.
    batch = _sequences(learner, [0.5, -0.5], seed=3)
    learner.train_step(batch)
    fresh.train_step(batch)
    a, b = learner.adapter_state(), fresh.adapter_state()
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_warm_start_from_an_adapter_directory(tiny_model_dir: Path, tmp_path: Path) -> None:
    trained = _learner(tiny_model_dir)
    trained.train_step(_sequences(trained, [1.0, -1.0]))
    saved = trained.save_adapter(tmp_path / "sft")

    warm = _learner(tiny_model_dir, init_adapter=saved)
    a, b = trained.adapter_state(), warm.adapter_state()
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    assert warm.trainable, "the warm-started adapter must be trainable"
    assert not warm.train_step(_sequences(warm, [1.0, -1.0])).skipped
    assert any(not torch.equal(warm.adapter_state()[name], a[name]) for name in a)


def test_bfloat16_base_keeps_float32_adapter_and_optimizer_state(tiny_model_dir: Path) -> None:
    learner = _learner(tiny_model_dir, learner={"device": "cpu", "dtype": "bfloat16"})
    params = dict(learner.model.named_parameters())
    assert {p.dtype for n, p in params.items() if "lora_" not in n} == {torch.bfloat16}
    assert {p.dtype for n, p in params.items() if "lora_" in n} == {torch.float32}
    result = learner.train_step(_sequences(learner, [1.0, -1.0]), seed=0)
    assert not result.skipped and result.metrics["grad_norm"] > 0
    # Behaviour logprobs were the same bf16 model's: the learner reproduces them (a small mismatch).
    assert result.metrics["mismatch_kl"] < 1e-3
    states = [state for state in learner.optimizer.state.values()]
    assert states and all(state["exp_avg"].dtype == torch.float32 for state in states)


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir: Path) -> None:
    plain = _learner(tiny_model_dir)
    sequences = _sequences(plain, [1.0, -1.0, 0.5, -0.5])
    checkpointed = _learner(tiny_model_dir, learner={"gradient_checkpointing": True})
    one, two = plain.train_step(sequences, seed=0).metrics, checkpointed.train_step(sequences, seed=0).metrics
    # The recomputed forward pass is the same arithmetic: the same loss and gradient.
    assert two["loss"] == pytest.approx(one["loss"], abs=1e-7)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-6)


def test_a_cuda_learner_without_a_gpu_says_so(tiny_model_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error path is for machines without one")
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        _learner(tiny_model_dir, learner={"device": "cuda", "dtype": "bfloat16"})


def test_bfloat16_hf_engine_and_learner_agree_on_sampled_logprobs(tiny_model_dir: Path) -> None:
    import asyncio

    from policy_server.engines.base import GenerationRequest
    from policy_server.engines.hf import HFEngine
    from trainer.algo.sequences import pad_batch

    async def sample() -> list:
        engine = HFEngine(tiny_model_dir, dtype=torch.bfloat16, max_batch_size=4)
        await engine.start()
        try:
            requests = [
                GenerationRequest(messages=[{"role": "user", "content": f"maze {i}"}], max_tokens=16, seed=i)
                for i in range(4)
            ]
            return list(await asyncio.gather(*(engine.generate(request) for request in requests)))
        finally:
            await engine.close()

    results = asyncio.run(sample())
    learner = _learner(tiny_model_dir, learner={"device": "cpu", "dtype": "bfloat16"})
    sequences = [
        TrainingSequence(
            rollout_id=f"r{i}",
            token_ids=result.prompt_token_ids + result.completion_token_ids,
            loss_mask=[0] * len(result.prompt_token_ids) + [1] * len(result.completion_token_ids),
            behavior_logprobs=[0.0] * len(result.prompt_token_ids) + result.completion_logprobs,
            advantage=0.0,
        )
        for i, result in enumerate(results)
    ]
    batch = pad_batch(sequences, learner.pad_token_id)
    with torch.no_grad():
        logprobs, _ = learner.token_logprobs(batch)
    gap = (logprobs - batch.behavior_logprobs)[batch.loss_mask.bool()].abs()
    # The same bf16 weights, batched and padded differently (KV cache vs one pass): bf16 rounding,
    # not a different model. Seen here: max 0.0024, mean 0.0006 (float32 on both sides: ~1e-6).
    assert len(gap) > 10 and float(gap.max()) < 0.02
