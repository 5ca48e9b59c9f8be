"""SmolLM2-135M-Instruct through training: a warm start that teaches the maze tool call, then the real
maze agent plays multi-turn through the gateway; and GRPO steps whose update each engine serves.

Sizes are the smallest that still prove the point: a forward and backward pass of SmolLM2 costs about
25 ms per token on this 2-core machine.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.letters.main import app as letters_app
from agents.letters.run_files import serving, write_run_files
from agents.maze.demonstrations import maze_demonstrations
from agents.maze.main import app as maze_app
from policy_server.engines.hf import HFEngine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer
from trainer.config import load_config
from trainer.loop import train
from trainer.sft.common import PROJECTION_MODULES
from trainer.sft.text import run_sft

pytestmark = pytest.mark.slow

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/smollm2-maze"


def test_warm_start_teaches_the_maze_call_and_the_maze_agent_plays_through_the_gateway(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    demonstrations = maze_demonstrations(2, noise=0.0, seed=0)
    sft = run_sft(
        smollm2_dir,
        demonstrations,
        tmp_path / "sft",
        steps=4,  # the loss falls 0.73 -> 0.09 in three steps here; each costs SmolLM2 ~30 s on 2 cores
        learning_rate=2e-3,
        batch_size=2,
        lora_r=8,
        lora_alpha=16,
        target_modules=PROJECTION_MODULES,
        chat_template="chatml-tools",
    )
    assert sft.losses[-1] < 0.5 * sft.losses[0], f"the warm start did not learn: {sft.losses}"
    server = PolicyServer(HFEngine(smollm2_dir, chat_template="chatml-tools"))
    with ServerThread(server) as policy, serving(maze_app) as agent_url:
        policy.run(server.load_adapter(sft.adapter_dir))
        # Two calls prove the multi-turn path; the third is refused (a 400 ends the episode as played),
        # which keeps SmolLM2's CPU time to two prefill-and-decode rounds.
        server.open_job(JOB, max_tokens=48, max_calls_per_rollout=2)
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        payload = {
            "prompt": json.dumps({"seed": 7, "size": 4}),
            "metadata": {"jobArn": JOB, "rolloutId": rollout_id, "endpoint": policy.url},
            "inferenceParams": {"temperature": 0.0, "maxTokens": 48},
        }
        answer = httpx.post(f"{agent_url}/invocations", json=payload, timeout=300)
        trace = server.take_trace(JOB, rollout_id)
    assert answer.status_code == 200, answer.text
    assert answer.json()["metrics"]["moves"] == 2, answer.json()
    assert len(trace.calls) == 2
    assert all(call.finish_reason == "tool_calls" for call in trace.calls[:2])
    assert trace.calls[0].tools is not None and trace.calls[0].tools[0]["function"]["name"] == "move"


def grpo_steps_update_the_served_policy(smollm2_dir: Path, tmp_path: Path, **extra: Any) -> None:
    """Two GRPO steps of SmolLM2 against the letters agent: each update is served and sampled by the
    next step, and the sampler's logprobs are the learner's. ``extra``: config fields (the engine)."""
    with serving(letters_app) as agent_url:
        config_path = write_run_files(
            tmp_path,
            smollm2_dir,
            agent_url,
            eval_file=None,
            num_generations=2,
            rows_per_step=1,
            max_steps=2,
            max_completion_length=8,
            rollout_timeout_s=600,  # SmolLM2 on a loaded 2-core machine: a demo maze rollout took 137 s
            learning_rate=1e-2,  # one Adam step moves every LoRA weight by ~lr: a visible change
            lora={"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]},
            **extra,
        )
        summary = train(load_config(config_path))
    records = [json.loads(line) for line in (summary.run_dir / "metrics.jsonl").read_text().splitlines()]
    # Step 2 was sampled from the adapter step 1 trained and the engine hot-loaded.
    assert [record["sampled_adapter_versions"] for record in records] == [[0], [1]]
    for record in records:
        assert record["rollouts"]["ok"] == 2
        assert record["update"]["applied"] is True, record["update"]
        # The served adapter is the learner's: sampler and learner logprobs agree after the update too.
        assert record["update"]["mismatch_kl"] < 1e-3
    assert summary.adapter_version == 2


def test_grpo_steps_update_the_policy_the_hf_engine_serves(smollm2_dir: Path, tmp_path: Path) -> None:
    """On vLLM: ``tests/policy_server/test_smollm2.py``, attached to the vLLM its `rft serve` started
    (one SmolLM2 vLLM start in the suite)."""
    grpo_steps_update_the_served_policy(smollm2_dir, tmp_path, engine="hf")
