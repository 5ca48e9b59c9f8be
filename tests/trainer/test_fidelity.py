"""Per-step fidelity: the learner's logprobs against the sampler's, prefix breaks, unparsed tool
calls, and the ``fidelity`` limits that stop a run (docs/fidelity.md)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from policy_server import CallRecord, RolloutTrace
from policy_server.engines.base import GenerationResult
from policy_server.models.tiny import build_tiny_model
from policy_server.recording import looks_like_unparsed_tool_call
from trainer.algo.fidelity import fidelity_metrics
from trainer.algo.sequences import build_sequences, prefix_breaks
from trainer.config import FidelityConfig, load_config
from trainer.errors import TrainingError
from trainer.fidelity import check_fidelity
from trainer.learner.steps import GradientSums
from trainer.loop import train
from trainer.ops.status import step_table


def test_fidelity_metrics_over_masked_tokens() -> None:
    learner = torch.tensor([[0.0, -1.0, -2.0, 9.0], [0.0, -0.5, 0.0, 0.0]])
    sampler = torch.tensor([[0.0, -1.5, -2.0, 0.0], [0.0, -0.4, 0.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    figures = fidelity_metrics(learner, sampler, mask, epsilon=0.2, epsilon_high=0.2)
    assert figures["fidelity_abs_diff_mean"] == pytest.approx((0.5 + 0.0 + 0.1) / 3)
    assert figures["fidelity_abs_diff_max"] == pytest.approx(0.5)  # the unmasked 9.0 counts for nothing
    assert figures["fidelity_sequence_abs_diff_max"] == pytest.approx(0.25)
    assert figures["fidelity_ratio_min"] == pytest.approx(math.exp(-0.1))
    assert figures["fidelity_ratio_max"] == pytest.approx(math.exp(0.5))
    assert figures["fidelity_ratio_mean"] == pytest.approx((math.exp(0.5) + 1 + math.exp(-0.1)) / 3)
    assert figures["fidelity_outside_clip_fraction"] == pytest.approx(1 / 3)  # exp(0.5) > 1.2


def test_gradient_sums_keep_minima_and_maxima_across_micro_batches() -> None:
    sums = GradientSums()
    sums.add(0.0, {"fidelity_ratio_min": 0.9, "fidelity_ratio_max": 1.1, "fidelity_abs_diff_mean": 0.1}, 1.0)
    other = GradientSums()
    other.add(0.0, {"fidelity_ratio_min": 0.8, "fidelity_ratio_max": 1.0, "fidelity_abs_diff_mean": 0.3}, 3.0)
    sums.merge(other)
    assert sums.minima == {"fidelity_ratio_min": 0.8}
    assert sums.maxima == {"fidelity_ratio_max": 1.1}
    assert sums.weighted["fidelity_abs_diff_mean"] == pytest.approx(1.0)


def _call(index: int, prompt: list[int], completion: list[int]) -> CallRecord:
    return CallRecord(
        index=index,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        adapter_version=0,
        finish_reason="stop",
        started_at=0.0,
        finished_at=0.0,
    )


def test_prefix_breaks_are_the_calls_that_start_a_new_sequence() -> None:
    calls = [_call(0, [1, 2], [3]), _call(1, [1, 2, 3, 4], [5]), _call(2, [1, 9, 3, 4, 5, 6], [7])]
    trace = RolloutTrace(job_arn="job", rollout_id="r", calls=calls)
    assert prefix_breaks(trace) == 1
    assert len(build_sequences(trace)) == 2


def test_a_tool_call_marker_left_in_the_content_is_an_unparsed_tool_call() -> None:
    def result(content: str | None, tool_calls: list[dict[str, str]]) -> GenerationResult:
        return GenerationResult([1], [2], [-0.1], "raw", "stop", content, tool_calls)

    assert looks_like_unparsed_tool_call(result('<tool_call>{"name": oops</tool_call>', []))
    assert not looks_like_unparsed_tool_call(result("Sure.", [{"id": "call_1"}]))
    assert not looks_like_unparsed_tool_call(result(None, []))


def test_limits_stop_the_run_with_the_likely_cause() -> None:
    config = FidelityConfig(max_prefix_break_fraction=0.5)
    check_fidelity(config, 1, {"logprob_abs_diff_mean": 1e-6, "prefix_break_fraction": 0.25})
    with pytest.raises(TrainingError, match="chat template that differs between engine and learner"):
        check_fidelity(config, 1, {"logprob_abs_diff_mean": 0.5})
    with pytest.raises(TrainingError, match="fidelity.max_prefix_break_fraction"):
        check_fidelity(config, 1, {"prefix_break_fraction": 0.75})
    check_fidelity(FidelityConfig(enabled=False), 1, {"logprob_abs_diff_mean": 0.5})
    check_fidelity(FidelityConfig(check_from_step=2), 1, {"logprob_abs_diff_mean": 0.5})


def test_status_shows_the_step_fidelity() -> None:
    record = {"step": 1, "fidelity": {"logprob_abs_diff_mean": 1.5e-7, "logprob_abs_diff_max": 2e-6}}
    table = step_table([{**record, "fidelity": {**record["fidelity"], "prefix_breaks": 2}}])
    assert "Δlogp mean/max" in table and "1.50e-07/2.00e-06 | 2 |" in table


def test_a_learner_on_other_weights_than_the_engine_stops_at_step_1(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine samples from one model while the learner trains another: the run stops at step 1.

    The issue's example is a learner given a different chat template from the engine's. In rftkit the
    learner never renders a template: it trains on the token ids the policy server recorded, so a
    template (or tokenizer) differing on the learner's side alone cannot change what it computes.
    What does reach it is the realistic case behind such reports: the engine serves other weights
    than the learner loads (an engine attached with ``vllm.attach_url`` to a server started on
    another model or revision, a stale checkpoint, another build of "the same" model). Here the engine
    serves the tiny model built from another seed, same tokenizer and template, so every recorded id
    is valid for the learner and only the probabilities differ, as they would.
    """
    import trainer.run

    other = build_tiny_model(tmp_path / "other-model", seed=1)
    build_engine = trainer.run.build_engine
    monkeypatch.setattr(
        trainer.run, "build_engine", lambda config, _model, placement: build_engine(config, other, placement)
    )
    with serving(app) as agent_url:
        config = load_config(write_run_files(tmp_path / "run", tiny_model_dir, agent_url, eval_file=None))
        with pytest.raises(TrainingError) as stopped:
            train(config)
    message = str(stopped.value)
    print(message)  # the sentence docs/fidelity.md quotes
    assert message.startswith("step 1: training does not see what sampling did: fidelity logprob_abs_diff")
    assert "a chat template that differs between engine and learner, or another dtype/precision" in message
    records = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1]
    assert records[0]["fidelity"]["logprob_abs_diff_mean"] > 0.1
