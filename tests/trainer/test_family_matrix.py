"""The family matrix of docs/models.md: each text family's tiny model, warm-started on a solver's
Wordle calls in its own format, plays the real Strands Wordle agent (``agents/wordle/main.py`` on
uvicorn) for two GRPO steps of ``rft train``'s loop, sampled by the hf engine and, for the families
vLLM's CPU build runs with LoRA, by vLLM; its multi-turn ``guess_word`` calls parse, the first update
is hot-loaded for the second step's games, and the step records give the fidelity figures and the
prefix merge. A gpt_oss run parsed with the wrong parser stops at step 1 with the sentence."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.maze.demo.agent_process import serve_agent
from policy_server.engines.base import GenerationResult
from policy_server.engines.vllm_server import onednn_may_use
from policy_server.models.families import family
from policy_server.recording import looks_like_unparsed_tool_call
from tests.trainer.family_matrix_rows import check_update_hot_loaded, matrix_row, step_records
from tests.trainer.wordle_families import PLAN, grpo_config, prepare
from trainer.errors import TrainingError
from trainer.loop import train

SEED = 0
Prepared = Callable[[str], tuple[Path, Path, Path]]


def test_harmony_and_gemma4_calls_left_in_the_content_count_as_unparsed() -> None:
    harmony = '<|channel|>commentary to=functions.guess_word <|constrain|>json<|message|>{"guess": "crane"}'
    gemma4 = '<|tool_call>call:guess_word{guess:<|"|>crane<|"|>}<tool_call|>'
    for content in (harmony, gemma4):
        assert looks_like_unparsed_tool_call(GenerationResult([1], [2], [-0.1], "raw", "stop", content))


@pytest.fixture(scope="module")
def agent_url() -> Iterator[str]:
    with serve_agent("agents.wordle.main") as url:
        yield url


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    """Each family's tiny model and warm start, built once for the module."""
    built: dict[str, tuple[Path, Path, Path]] = {}

    def get(name: str) -> tuple[Path, Path, Path]:
        if name not in built:
            built[name] = prepare(name, tmp_path_factory.mktemp(f"family-{name}"), SEED)
        return built[name]

    return get


def check_two_steps(records: list[dict[str, Any]], max_abs_diff: float = 1e-3) -> None:
    """What a Wordle row asks of its two steps (``max_abs_diff``: of the sampler's logprobs from
    the learner's, check_update_hot_loaded)."""
    for record in records:
        assert record["rollouts"]["total"] == 8
        assert record["fidelity"]["unparsed_tool_call_fraction"] < 1.0
    # guess_word calls parsed and played by the agent, and games that went on to a second call.
    assert sum(record["agent_metrics"]["tool_calls"] for record in records) > 0.0
    assert max(record["fidelity"]["calls"] - record["rollouts"]["total"] for record in records) > 0
    check_update_hot_loaded(records, max_abs_diff)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt_oss", "gemma4", "qwen3_5"])
def test_a_family_plays_wordle_for_two_grpo_steps(
    name: str, agent_url: str, prepared: Prepared, tmp_path: Path
) -> None:
    config = grpo_config(*prepared(name), tmp_path / "grpo", agent_url, SEED)
    assert train(config).steps == 2
    records = step_records(config)
    print(f"family matrix, hf, {name}: {json.dumps(matrix_row(records))}")
    check_two_steps(records)


# vLLM's CPU build runs the llama, qwen3 and qwen3_5 architectures with LoRA; gpt_oss it cannot, and
# gemma4's tiny model needs the embeddings and the output head adapted, which vLLM's Gemma 4 does not
# load (docs/models.md). The hf rows' warm starts, so a row's difference is the engine's. Two gateway
# workers (processes) serve the agents, so the trainer's API (jobs, traces, adapter loads) works
# across them. vllm.dtype auto: float32, as the learner, except qwen3_5's bfloat16 (the only dtype
# that build runs Gated DeltaNet in), whose logprobs then differ from the float32 learner's by
# bfloat16's rounding: up to 0.25 on a sampled token here, not the few nats of a misaligned token.
VLLM_MAX_ABS_DIFF = {"llama": 1e-3, "qwen3": 1e-3, "qwen3_5": 0.5}


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize("name", list(VLLM_MAX_ABS_DIFF))
def test_a_family_plays_wordle_for_two_grpo_steps_on_vllm(
    name: str, agent_url: str, prepared: Prepared, tmp_path: Path, vllm_python: str
) -> None:
    wanted = family(name).vllm_cpu_flags
    if onednn_may_use(wanted) is False:
        pytest.skip(
            f"vLLM's CPU build runs {name}'s bfloat16 kernels only where oneDNN may use "
            f"{' or '.join(wanted)}, which this CPU lacks (or ONEDNN_MAX_CPU_ISA hides): a limit of "
            "vLLM's, which rftkit refuses up front with a sentence (test_vllm_settings.py); the hf "
            "row of the same family runs here"
        )
    vllm = {"python": vllm_python, "dtype": "auto", "max_lora_rank": PLAN.lora_r}
    config = grpo_config(
        *prepared(name),
        tmp_path / "grpo",
        agent_url,
        SEED,
        engine="vllm",
        vllm=vllm,
        policy_server={"gateway_workers": 2},
    )
    assert train(config).steps == 2
    records = step_records(config)
    print(f"family matrix, vllm, {name}: {json.dumps(matrix_row(records))}")
    check_two_steps(records, VLLM_MAX_ABS_DIFF[name])
    # vLLM's raw logprobs and the learner's agree closely: the tokens trained are the ones it sampled.
    assert all(record["update"]["mismatch_kl"] < 1e-3 for record in records if record["update"]["applied"])


@pytest.mark.slow
def test_a_gemma4_run_on_vllm_with_k_proj_adapted_is_refused_naming_the_module(
    agent_url: str, prepared: Prepared, tmp_path: Path
) -> None:
    """The hf row's warm start adapts k_proj, the embeddings and the output head; sampling it with
    vLLM is refused before vLLM starts (its python does not exist), naming them and what to set."""
    vllm = {"python": "/nonexistent/python-never-started", "dtype": "float32"}
    config = grpo_config(*prepared("gemma4"), tmp_path / "grpo", agent_url, SEED, engine="vllm", vllm=vllm)
    with pytest.raises(TrainingError) as refused:
        train(config)
    message = str(refused.value)
    print(message)
    assert message.startswith(
        "vLLM cannot sample a LoRA on k_proj, embed_tokens, lm_head of the gemma4 family as the learner "
        "computes it (k_proj: served with other logprobs; embed_tokens, lm_head: the adapter refused at "
        "load; docs/models.md, gemma4)"
    )
    assert "e.g. lora.target_modules: [q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]" in message


@pytest.mark.slow
def test_gpt_oss_parsed_as_hermes_stops_at_step_1_naming_the_parsers(
    agent_url: str, prepared: Prepared, tmp_path: Path
) -> None:
    """The hf engine is told to parse with hermes (``vllm.tool_call_parser: hermes``) while the tiny
    gpt_oss writes harmony calls."""
    hermes, limit = {"tool_call_parser": "hermes"}, {"max_unparsed_tool_call_fraction": 0.5}
    config = grpo_config(
        *prepared("gpt_oss"), tmp_path / "grpo", agent_url, SEED, vllm=hermes, fidelity=limit
    )
    with pytest.raises(TrainingError) as stopped:
        train(config)
    message = str(stopped.value)
    print(message)
    assert message.startswith("step 1: training does not see what sampling did: fidelity unparsed_tool_call")
    assert (
        "the engine parses tool calls with vLLM's 'hermes' parser; the model's family, gpt_oss, expects "
        "'openai' (vllm.tool_call_parser: auto picks it)"
    ) in message
    assert [record["step"] for record in step_records(config)] == [1]
