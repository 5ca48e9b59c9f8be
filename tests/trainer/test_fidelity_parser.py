"""Unparsed tool calls stop a run by default (``fidelity.max_unparsed_tool_call_fraction``), with a
sentence naming the model's family, the parser in use and the one the family expects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agents.letters.run_files import serving, write_run_files
from handlers import RolloutContext, rft_app
from policy_server.models.families import resolve_parsers
from policy_server.models.tiny import build_tiny_model
from trainer.config import FidelityConfig, load_config
from trainer.errors import TrainingError
from trainer.fidelity import check_fidelity
from trainer.loop import train

CALL = '<tool_call>{"name":"move","arguments":{}}</tool_call>'
MOVE = {"type": "function", "function": {"name": "move", "description": "Move.", "parameters": {}}}


def _always_calling(out: Path) -> Path:
    """A tiny model that answers every prompt with CALL, whatever it says: its BPE holds CALL as
    tokens that each occur once; every layer adds nothing to the residual stream (output projections
    zeroed), so the logits depend on the last token alone; and the head maps each token of the chain
    (the generation prompt's closing newline, CALL's tokens) to the next, the last to <|im_end|>."""
    build_tiny_model(out, corpus=[CALL] * 64)
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Go."}], add_generation_prompt=True, return_dict=False
    )
    chain = [prompt[-1], *tokenizer(CALL, add_special_tokens=False)["input_ids"]]
    chain.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    assert len(set(chain)) == len(chain)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        states = model.model.norm(model.model.embed_tokens.weight[chain[:-1]])
        head = torch.zeros_like(model.lm_head.weight)
        for state, following in zip(states, chain[1:], strict=True):
            head[following] += 60.0 * state / state.dot(state)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(out)
    return out


async def _one_move(row: dict[str, Any], ctx: RolloutContext) -> float:
    """One call offering the `move` tool; the reward: whether a call came back parsed."""
    async with ctx.async_openai_client() as client:
        answer = await client.chat.completions.create(
            model=ctx.model_id,
            messages=[{"role": "user", "content": "Go."}],
            tools=[MOVE],
            **ctx.openai_params(),
        )
    return 1.0 if answer.choices[0].message.tool_calls else 0.0


def test_the_default_limit_stops_on_unparsed_calls_naming_the_parsers(tiny_model_dir: Path) -> None:
    parsers = resolve_parsers(tiny_model_dir, None, None)
    assert FidelityConfig().max_unparsed_tool_call_fraction == 0.5
    check_fidelity(FidelityConfig(), 1, {"unparsed_tool_call_fraction": 0.35}, parsers)  # the demos' worst
    with pytest.raises(TrainingError, match="the model's family, llama, expects 'hermes'"):
        check_fidelity(FidelityConfig(), 1, {"unparsed_tool_call_fraction": 0.75}, parsers)
    right = resolve_parsers(tiny_model_dir)
    with pytest.raises(TrainingError, match="expects 'hermes' too: most likely the policy writes calls"):
        check_fidelity(FidelityConfig(), 1, {"unparsed_tool_call_fraction": 0.75}, right)


@pytest.fixture(scope="module")
def calling_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _always_calling(tmp_path_factory.mktemp("always-calling") / "model")


def test_the_same_model_under_its_familys_parser_trains_with_every_call_parsed(
    calling_model: Path, tmp_path: Path
) -> None:
    with serving(rft_app(_one_move)) as agent_url:
        config = load_config(write_run_files(tmp_path, calling_model, agent_url, eval_file=None, max_steps=1))
        summary = train(config)
    assert summary.steps == 1
    (record,) = [json.loads(line) for line in (config.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["fidelity"]["unparsed_tool_calls"] == 0 and record["fidelity"]["calls"] == 8


def test_a_run_whose_engine_parses_with_the_wrong_parser_stops_at_step_1(
    calling_model: Path, tmp_path: Path
) -> None:
    """The engine (hf) is told to parse no tool calls (``vllm.tool_call_parser: null``) while the
    model writes a hermes call in every reply."""
    model = calling_model
    with serving(rft_app(_one_move)) as agent_url:
        config_path = write_run_files(
            tmp_path / "run", model, agent_url, eval_file=None, max_steps=2, vllm={"tool_call_parser": None}
        )
        with pytest.raises(TrainingError) as stopped:
            train(load_config(config_path))
    message = str(stopped.value)
    print(message)  # the sentence docs/fidelity.md quotes
    assert message.startswith("step 1: training does not see what sampling did: fidelity unparsed_tool_call")
    assert (
        "the engine parses tool calls with no parser (tool_call_parser null); the model's family, llama, "
        "expects 'hermes' (vllm.tool_call_parser: auto picks it), so the model's calls stay in the text"
    ) in message
    run_dir = tmp_path / "run" / "run"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1]
    assert records[0]["fidelity"]["unparsed_tool_call_fraction"] > 0.5
