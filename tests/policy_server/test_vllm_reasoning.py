"""Reasoning through the vllm engine: vLLM's reasoning parser splits ``<think>...</think>`` off into
``reasoning_content``, while the recorded completion keeps every sampled token, the reasoning included,
so the trainer trains on what was sampled.

The model is the tiny Llama with ``<think>``/``</think>`` added to its vocabulary (reasoning parsers
look them up there) and trained outright, in a few dozen steps, to answer with a thought and a reply.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.engines.vllm import VLLMEngine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer

pytestmark = pytest.mark.vllm

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/reasoning"
THOUGHT = "The goal is up."
REPLY = "Go up."
QUESTION = "Where to?"


def thinking_model(tiny_model_dir: Path, out: Path, steps: int = 60) -> Path:
    """A copy of the tiny model that answers QUESTION with `<think>THOUGHT</think>REPLY`."""
    shutil.copytree(tiny_model_dir, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_tokens(["<think>", "</think>"])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer))
    messages = [{"role": "user", "content": QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    answer = f"<think>\n{THOUGHT}\n</think>\n\n{REPLY}<|im_end|>"
    ids = torch.tensor([list(prompt) + tokenizer(answer, add_special_tokens=False)["input_ids"]])
    labels = ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_path = out / "tokenizer_config.json"  # vLLM's transformers needs the fast class by name
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config_path.write_text(json.dumps(config))
    return out


def test_reasoning_comes_back_and_its_tokens_are_recorded(
    tiny_model_dir: Path, vllm_python: str, tmp_path: Path
) -> None:
    model_dir = thinking_model(tiny_model_dir, tmp_path / "thinking")
    engine = VLLMEngine(model_dir, python=vllm_python, dtype="float32", reasoning_parser="qwen3")
    server = PolicyServer(engine)
    with ServerThread(server) as thread:
        server.open_job(JOB, max_tokens=32, auto_open_rollouts=True)
        rollout_id = uuid.uuid4().hex
        client = openai.OpenAI(
            base_url=f"{thread.url}/v1",
            api_key="unused",
            default_headers={JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id},
            max_retries=0,
        )
        answer = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": QUESTION}],
            temperature=0.0,
            max_tokens=32,
        )
        (call,) = server.take_trace(JOB, rollout_id).calls
    message = answer.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content", "").strip() == THOUGHT
    assert (message.content or "").strip() == REPLY
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    think, end_think = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert think in call.completion_token_ids and end_think in call.completion_token_ids
    recorded = tokenizer.decode(call.completion_token_ids)
    assert THOUGHT in recorded and REPLY in recorded, recorded
    assert len(call.completion_logprobs) == len(call.completion_token_ids)
