"""The learner on image traces: sequences merge across turns with their images, the learner's logprobs
equal the hf engine's within 1e-3 (pixels and M-RoPE positions rebuilt from the run's image store),
a GRPO step updates the language model's LoRA only, and the engine hot-swaps to the new adapter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from policy_server import PolicyServer, ServerThread
from policy_server.engines.hf import HFEngine
from policy_server.http.images import ImageRef
from policy_server.trace import CallRecord, RolloutTrace
from tests.vision_helpers import picture_episode
from trainer.algo.sequences import TrainingSequence, build_sequences, count_train_tokens
from trainer.config import LoraConfig, TrainConfig
from trainer.learner.learner import Learner
from trainer.learner.vision import lora_targets, stray_placeholders

JOB = "arn:aws:sagemaker:us-west-2:123456789012:training-job/vision-learner"


@pytest.fixture(scope="module")
def served(tiny_vision_dir: Path) -> Iterator[tuple[PolicyServer, ServerThread]]:
    server = PolicyServer(HFEngine(tiny_vision_dir))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=5, auto_open_rollouts=True)
    try:
        yield server, thread
    finally:
        thread.stop()


def _learner(model_dir: Path, server: PolicyServer, **fields: Any) -> Learner:
    config = TrainConfig.model_validate(
        {"learning_rate": 5e-2, "max_steps": 4, "loss_type": "grpo", **fields}
    )
    return Learner(model_dir, config, image_store=server.image_store)


def test_image_episodes_merge_train_and_match_the_sampler(
    served: tuple[PolicyServer, ServerThread], tiny_vision_dir: Path, tmp_path: Path
) -> None:
    server, thread = served
    red, blue, green = (200, 0, 0), (0, 0, 200), (0, 160, 0)
    picture_episode(thread, JOB, "a", [red, blue, blue])
    picture_episode(thread, JOB, "b", [red, green, red])
    traces = [server.take_trace(JOB, rollout) for rollout in ("a", "b")]
    sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
    # Every call extends the one before, images included: one sequence per episode, 3 images each.
    assert [len(sequence.images) for sequence in sequences] == [3, 3]
    assert [sequence.num_calls for sequence in sequences] == [3, 3]
    counts = count_train_tokens(traces)
    assert counts.ratio < 0.6, counts  # the history (images included) is trained once, not per call

    learner = _learner(tiny_vision_dir, server)
    old = learner.old_logprobs(sequences)
    for sequence, logprobs in zip(sequences, old, strict=True):
        mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
        torch.testing.assert_close(
            logprobs[mask], torch.tensor(sequence.behavior_logprobs)[mask], atol=1e-3, rtol=0
        )

    sequences[0].advantage, sequences[1].advantage = 1.0, -1.0
    before = {name: p.detach().clone() for name, p in learner.model.named_parameters()}
    result = learner.train_step(sequences, seed=0)
    assert not result.skipped
    changed = {name for name, p in learner.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name and "language_model" in name for name in changed)
    new = learner.old_logprobs(sequences)
    assert not torch.allclose(new[0], old[0])

    # The engine serves the update (adapter hot-swap), and samples with the learner's numbers.
    version = thread.run(server.load_adapter(learner.save_adapter(tmp_path / "adapter")))
    picture_episode(thread, JOB, "c", [red, blue])
    trace = server.take_trace(JOB, "c")
    assert {call.adapter_version for call in trace.calls} == {version}
    (sequence,) = build_sequences(trace)
    mask = torch.tensor(sequence.loss_mask, dtype=torch.bool)
    torch.testing.assert_close(
        learner.old_logprobs([sequence])[0][mask],
        torch.tensor(sequence.behavior_logprobs)[mask],
        atol=1e-3,
        rtol=0,
    )
    for done in [*traces, trace]:
        server.release_trace(done)
    assert len(server.image_store) == 0


def _call(index: int, prompt: list[int], completion: list[int], images: list[ImageRef]) -> CallRecord:
    return CallRecord(
        index=index,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-1.0] * len(completion),
        adapter_version=0,
        finish_reason="stop",
        started_at=0.0,
        finished_at=0.0,
        images=images,
    )


def test_same_placeholder_ids_with_another_image_start_a_new_sequence() -> None:
    first = ImageRef(sha256="a" * 64, start=1, length=2)
    other = ImageRef(sha256="b" * 64, start=1, length=2)
    later = ImageRef(sha256="c" * 64, start=6, length=2)
    calls = [
        _call(0, [1, 9, 9, 2], [3], [first]),
        _call(1, [1, 9, 9, 2, 3, 4, 9, 9, 5], [6], [first, later]),  # extends: same image in the prefix
        _call(2, [1, 9, 9, 2, 3, 4, 9, 9, 5, 6, 7], [8], [other, later]),  # same ids, another image
    ]
    sequences = build_sequences(RolloutTrace(job_arn="j", rollout_id="r", calls=calls))
    assert [s.num_calls for s in sequences] == [2, 1]
    assert sequences[0].images == [first, later] and sequences[1].images == [other, later]


def test_lora_adapts_the_language_model_unless_told_to_adapt_vision(tiny_vision_dir: Path) -> None:
    from policy_server.models.vision_inputs import load_model

    model = load_model(tiny_vision_dir)
    default = lora_targets(model, LoraConfig())
    assert default and all(name.startswith("model.language_model.") for name in default)
    projector = set(lora_targets(model, LoraConfig(adapt_vision="projector"))) - set(default)
    assert projector and all(name.startswith("model.visual.merger.") for name in projector)
    tower = set(lora_targets(model, LoraConfig(adapt_vision="all"))) - set(default)
    assert any(".blocks." in name for name in tower) and projector < tower
    assert {n.rsplit(".", 1)[1] for n in lora_targets(model, LoraConfig(target_modules=["q_proj"]))} == {
        "q_proj"
    }
    with pytest.raises(ValueError, match="names no linear layer"):
        lora_targets(model, LoraConfig(target_modules=["qkv"]))  # a vision-only name, tower frozen


@pytest.mark.parametrize(
    ("adapt_vision", "trained_vision"),
    [("none", set()), ("projector", {"merger"}), ("all", {"merger", "blocks"})],
)
def test_a_warm_start_keeps_its_vision_layers_outside_adapt_vision_frozen(
    tiny_vision_dir: Path, tmp_path: Path, adapt_vision: str, trained_vision: set[str]
) -> None:
    # `rft sft` on pictures adapts the tower too; RL then trains only the vision layers adapt_vision
    # names, the rest keep the warm start's weights.
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    from policy_server.models.vision_inputs import load_model
    from trainer.learner.model import build_model

    warm = get_peft_model(
        load_model(tiny_vision_dir),
        PeftLoraConfig(r=4, target_modules=["q_proj", "qkv", "fc1", "mlp.0"], task_type="CAUSAL_LM"),
    )
    warm.save_pretrained(tmp_path / "warm")
    config = TrainConfig.model_validate(
        {"init_adapter": str(tmp_path / "warm"), "lora": {"adapt_vision": adapt_vision}, "beta": 0.04}
    )
    model, reference, _ = build_model(tiny_vision_dir, config, torch.device("cpu"), torch.float32)
    trained = [name for name, param in model.named_parameters() if param.requires_grad]
    assert reference == "reference" and all(".default." in name for name in trained)
    assert any(".language_model." in name for name in trained)
    vision = {part for name in trained for part in ("merger", "blocks") if f".visual.{part}." in name}
    assert vision == trained_vision
    # Frozen or not, the tower's LoRA weights are the warm start's.
    params = dict(model.named_parameters())
    warm_vision = {n: p for n, p in warm.named_parameters() if ".visual." in n and ".lora_A." in n}
    assert warm_vision and all(torch.equal(params[n], p) for n, p in warm_vision.items())


def test_a_sampled_image_placeholder_keeps_its_sequence_out_of_the_update() -> None:
    # Found in the full `rft demo --vision` run: the random-init policy sampled <|image_pad|> once, and
    # the model would place image features on it when training (and its M-RoPE positions shifted by one
    # image), so the step failed. Such a sequence cannot be scored as it was sampled.
    pad = 7
    image = ImageRef(sha256="a" * 64, start=2, length=3)
    clean = TrainingSequence("r0", token_ids=[1, 2, pad, pad, pad, 3, 4], images=[image])
    stray = TrainingSequence("r1", token_ids=[1, 2, pad, pad, pad, 3, pad], images=[image])
    text_only = TrainingSequence("r2", token_ids=[1, pad, 3])
    assert not stray_placeholders(clean, pad)
    assert stray_placeholders(stray, pad)
    assert stray_placeholders(text_only, pad)
