"""Tool calls end to end on both engines: a real Strands agent, the gateway, hf or real vLLM.

The tiny model is taught (a few dozen LoRA steps) to answer with one `move` tool call; the agent's
tool must then run with the parsed arguments, and the recorded multi-turn trace must extend the
previous prompt + sampled completion token for token, so that the trainer can merge it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from strands import Agent, tool
from strands.models.openai import OpenAIModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.protocol import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server.engines.base import Engine
from policy_server.running import ServerThread
from policy_server.server import PolicyServer

JOB = "arn:aws:sagemaker:us-west-2:000000000000:training-job/tool-calls"
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


# The tool exactly as Strands' OpenAIModel sends it, so the taught prompt is the one the agent renders.
MOVE_SPEC = {
    "type": "function",
    "function": {
        "name": move.tool_spec["name"],
        "description": move.tool_spec["description"],
        "parameters": move.tool_spec["inputSchema"]["json"],
    },
}


def teach_tool_calls(model_dir: Path, out: Path, steps: int = 80) -> Path:
    """A LoRA adapter that answers every turn with `move(direction="up")`, trained on the template."""
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        LoraConfig(r=16, lora_alpha=16, target_modules="all-linear", exclude_modules=[]),
    )
    call = {
        "role": "assistant",
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "move", "arguments": '{"direction": "up"}'}}
        ],
    }
    rows, starts = [], []
    for turn in range(3):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Start."}]
        for _ in range(turn):
            messages += [call, {"role": "tool", "tool_call_id": "c", "content": "Moved."}]
        prompt = tokenizer.apply_chat_template(
            messages, tools=[MOVE_SPEC], add_generation_prompt=True, return_dict=False
        )
        full = tokenizer.apply_chat_template(messages + [call], tools=[MOVE_SPEC], return_dict=False)
        rows.append(list(full[:-1]))  # the template's trailing "\n" is not sampled
        starts.append(len(prompt))
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([row + [0] * (width - len(row)) for row in rows])
    labels = torch.full_like(input_ids, -100)
    for i, (row, start) in enumerate(zip(rows, starts, strict=True)):
        labels[i, start : len(row)] = input_ids[i, start : len(row)]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        logits = model(input_ids).logits[:, :-1]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tool_adapter(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return teach_tool_calls(tiny_model_dir, tmp_path_factory.mktemp("tool-adapter") / "adapter")


def make_engine(kind: str, model_dir: Path, vllm_python: str | None) -> Engine:
    if kind == "vllm":
        from policy_server.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, python=vllm_python, max_lora_rank=16, dtype="float32")
    from policy_server.engines.hf import HFEngine

    return HFEngine(model_dir)


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def served(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tool_adapter: Path
) -> Iterator[tuple[PolicyServer, ServerThread]]:
    python = request.getfixturevalue("vllm_python") if request.param == "vllm" else None
    server = PolicyServer(make_engine(request.param, tiny_model_dir, python))
    thread = ServerThread(server).start()
    try:
        thread.run(server.load_adapter(tool_adapter))
        server.open_job(JOB, max_tokens=48, max_calls_per_rollout=8)
        yield server, thread
    finally:
        thread.stop()


def test_strands_agent_runs_parsed_tool_calls_and_the_trace_extends_token_for_token(
    served: tuple[PolicyServer, ServerThread],
) -> None:
    server, thread = served
    MOVES.clear()

    async def play(rollout_id: str) -> None:
        model = OpenAIModel(
            client_args={
                "base_url": f"{thread.url}/v1",
                "api_key": "unused",
                "default_headers": {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout_id},
            },
            model_id="default",
            params={"temperature": 0.0, "max_tokens": 48},
        )
        agent = Agent(model=model, tools=[move], system_prompt=SYSTEM, callback_handler=None)
        try:
            await agent.invoke_async("Start.")
        except Exception:  # the taught model never stops moving: the call cap ends the episode
            pass

    rollout_id = uuid.uuid4().hex
    server.open_rollout(JOB, rollout_id)
    asyncio.run(play(rollout_id))
    trace = server.take_trace(JOB, rollout_id)

    assert MOVES[:3] == ["up", "up", "up"], "the agent's tool did not run with the parsed arguments"
    assert len(trace.calls) >= 3
    first = trace.calls[0]
    assert first.finish_reason == "tool_calls"
    assert first.tools is not None and first.tools[0]["function"]["name"] == "move"
    for previous, following in zip(trace.calls, trace.calls[1:], strict=False):
        sampled = previous.prompt_token_ids + previous.completion_token_ids
        assert following.prompt_token_ids[: len(sampled)] == sampled, "the next prompt re-tokenized history"
