"""The tiny Gemma 4 end to end on the hf engine: LoRA (peft, the learner's default all-linear
targets) teaches it to call a tool in Gemma 4's format, and a real Strands agent's chat calls go through
the real gateway: the replies carry parsed tool calls, the agent's tool runs with their arguments, and
the trace merges as Gemma's template allows."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from peft import LoraConfig, get_peft_model
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.engines.hf import HFEngine
from policy_server.models.families import family
from policy_server.running import ServerThread
from policy_server.server import PolicyServer

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/gemma4"
SYSTEM = "Walk to the goal. Call move once per turn."
MOVES: list[str] = []


@tool
def move(direction: str) -> str:
    """Move one cell.

    Args:
        direction: up, down, left or right.
    """
    MOVES.append(direction)
    return "Moved."


MOVE_SPEC = {
    "type": "function",
    "function": {
        "name": move.tool_spec["name"],
        "description": move.tool_spec["description"],
        "parameters": move.tool_spec["inputSchema"]["json"],
    },
}
CALL = '<|tool_call>call:move{direction:<|"|>up<|"|>}<tool_call|><|tool_response>'


def teach(model_dir: Path, out: Path, steps: int = 20) -> tuple[Path, list[float]]:
    """A LoRA adapter (all-linear, as the learner's default) answering every turn with move(up)."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        LoraConfig(r=16, lora_alpha=16, target_modules="all-linear"),
    )
    call = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "move", "arguments": {"direction": "up"}}}
        ],
    }
    completion = tokenizer.encode(CALL, add_special_tokens=False)
    rows, starts = [], []
    for turn in range(3):
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Start."},
        ]
        for _ in range(turn):
            messages += [call, {"role": "tool", "tool_call_id": "c", "content": "Moved."}]
        prompt = tokenizer.apply_chat_template(
            messages, tools=[MOVE_SPEC], add_generation_prompt=True, return_dict=False
        )
        rows.append(list(prompt) + completion)
        starts.append(len(prompt))
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    labels = torch.full_like(input_ids, -100)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        labels[i, start : len(row)] = input_ids[i, start : len(row)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(steps):
        logits = model(input_ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.save_pretrained(out)
    return out, losses


@pytest.fixture(scope="module")
def gemma4_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return family("gemma4").build_tiny(tmp_path_factory.mktemp("gemma4") / "model")


@pytest.fixture(scope="module")
def adapter(gemma4_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path, losses = teach(gemma4_dir, tmp_path_factory.mktemp("gemma4-adapter") / "adapter")
    assert losses[-1] < 0.1 * losses[0], f"LoRA did not learn the call: {losses[0]:.3f} -> {losses[-1]:.3f}"
    return path


def chat(url: str, headers: dict[str, str], **settings: Any) -> dict[str, Any]:
    """One raw chat call with the move tool; returns the reply's only choice."""
    body = {
        "model": "default",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Start."}],
        "tools": [MOVE_SPEC],
        "max_tokens": 32,
        **settings,
    }
    reply = httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body, timeout=300)
    assert reply.status_code == 200, reply.text
    choice: dict[str, Any] = reply.json()["choices"][0]
    return choice


def assert_the_taught_call(choice: dict[str, Any]) -> None:
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "move", "arguments": '{"direction": "up"}'}


def test_lora_trains_gemma4_and_the_hf_engine_serves_its_tool_calls(gemma4_dir: Path, adapter: Path) -> None:
    server = PolicyServer(HFEngine(gemma4_dir))
    thread = ServerThread(server).start()
    try:
        thread.run(server.load_adapter(adapter))
        server.open_job(JOB, max_tokens=32, max_calls_per_rollout=6)
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}
        assert_the_taught_call(chat(thread.url, headers, temperature=0.0))
        effort = httpx.post(
            f"{thread.url}/v1/chat/completions",
            headers=headers,
            json={
                "model": "default",
                "messages": [{"role": "user", "content": "Hi."}],
                "reasoning_effort": "low",
            },
            timeout=60,
        )
        assert effort.status_code == 400 and "enable_thinking" in effort.text
        MOVES.clear()
        asyncio.run(_play(thread.url, headers))
        trace = server.take_trace(JOB, rollout_id)
    finally:
        thread.stop()
    assert_learners_logprobs(gemma4_dir, adapter, trace.calls[0])
    assert MOVES[:2] == ["up", "up"], "the agent's tool did not run with the parsed arguments"
    agent_calls = trace.calls[1:]
    assert len(agent_calls) >= 3 and all(call.finish_reason == "tool_calls" for call in agent_calls[:3])
    # The first call's prompt ends in the empty thought channel, which history drops (Gemma's own
    # template does the same); the calls after it in the same model turn extend each other.
    first, second, third = agent_calls[:3]
    assert second.prompt_token_ids[: len(first.prompt_token_ids)] != first.prompt_token_ids
    sampled = second.prompt_token_ids + second.completion_token_ids
    assert third.prompt_token_ids[: len(sampled)] == sampled, "the next prompt re-tokenized history"


async def _play(url: str, headers: dict[str, str]) -> None:
    model = OpenAIModel(
        client_args={"base_url": f"{url}/v1", "api_key": "unused", "default_headers": headers},
        model_id="default",
        params={"temperature": 0.0, "max_tokens": 32},
    )
    agent = Agent(model=model, tools=[move], system_prompt=SYSTEM, callback_handler=None)
    try:
        await agent.invoke_async("Start.")
    except Exception:  # the taught model never stops moving: the call cap ends the episode
        pass


def assert_learners_logprobs(model_dir: Path, adapter: Path | None, call: Any) -> None:
    """The engine's recorded logprobs are a teacher-forced pass of the learner's model: the prompt is
    longer than the sliding window, so the engine's local layers must see only the window too."""
    from peft import PeftModel

    model: Any = AutoModelForCausalLM.from_pretrained(model_dir)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    assert len(call.prompt_token_ids) > model.config.sliding_window
    ids = call.prompt_token_ids + call.completion_token_ids
    with torch.no_grad():
        logprobs = torch.log_softmax(model.eval()(torch.tensor([ids])).logits[0].float(), dim=-1)
    start = len(call.prompt_token_ids) - 1
    expected = [logprobs[start + i, token].item() for i, token in enumerate(call.completion_token_ids)]
    assert max(abs(a - b) for a, b in zip(expected, call.completion_logprobs, strict=True)) < 1e-4


def random_adapter(model_dir: Path, out: Path, exclude: str) -> Path:
    """A random all-linear LoRA adapter (non-zero B) without the modules ``exclude`` matches."""
    torch.manual_seed(1)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", exclude_modules=exclude),
    )
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(parameter, std=0.3)
    model.save_pretrained(out)
    return out


@pytest.mark.vllm
def test_vllm_cpu_serves_gemma4_with_its_parsers_and_the_learners_logprobs(
    gemma4_dir: Path, adapter: Path, vllm_python: str, tmp_path: Path
) -> None:
    from policy_server.engines.vllm import VLLMEngine

    # A LoRA on k_proj of a layer whose values reuse its keys (attention_k_eq_v: Gemma 4's global
    # layers) is served by vLLM 0.32 with other logprobs than the learner's (docs/models.md#gemma4);
    # every other module matches.
    unshared = random_adapter(gemma4_dir, tmp_path / "unshared", exclude=r".*layers\.1\.self_attn\.k_proj")
    engine = VLLMEngine(
        gemma4_dir,
        python=vllm_python,
        tool_call_parser="gemma4",
        reasoning_parser="gemma4",
        max_lora_rank=16,
        dtype="float32",
    )
    server = PolicyServer(engine)
    thread = ServerThread(server).start()
    try:
        server.open_job(JOB, max_tokens=32, max_calls_per_rollout=6)
        rollout_id = uuid.uuid4().hex
        server.open_rollout(JOB, rollout_id)
        headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id}
        chat(thread.url, headers, temperature=1.0, seed=3)
        thread.run(server.load_adapter(adapter))
        assert_the_taught_call(chat(thread.url, headers, temperature=0.0))
        thread.run(server.load_adapter(unshared))
        chat(thread.url, headers, temperature=1.0, seed=3)
        trace = server.take_trace(JOB, rollout_id)
    finally:
        thread.stop()
    base, _, adapted = trace.calls
    assert_learners_logprobs(gemma4_dir, None, base)
    assert_learners_logprobs(gemma4_dir, unshared, adapted)
