"""`rft collect`: a local teacher (the tiny model with an adapter) plays real agents over HTTP; the
demonstrations it writes are accepted by `rft sft`, multi-turn ones included."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agents.letters.main import app as letters_app
from agents.letters.run_files import serving, write_run_files
from agents.maze.main import app as maze_app
from handlers import serve_in_thread
from tests.scripted_model import ScriptedModel, text
from trainer.distill.collect_cli import main as collect_main
from trainer.sft.cli import main as sft_main


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_multi_turn_agent_gives_whole_conversations_that_rft_sft_trains_on(
    tiny_model_dir: Path, tmp_path: Path, random_adapter: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    teacher_adapter = random_adapter(tmp_path / "teacher", seed=3)
    out = tmp_path / "demos.jsonl"
    with serving(letters_app) as agent_url:
        config = write_run_files(tmp_path / "run", tiny_model_dir, agent_url)
        argv = [str(config), "--teacher", str(tiny_model_dir), "--teacher-adapter", str(teacher_adapter)]
        code = collect_main([*argv, "--out", str(out), "--min-reward", "0.2", "--episodes", "6"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    lines = _lines(out)
    # The letters agent keeps its history: the second call carries the first, so one line per kept
    # episode holds both turns (the user's question, the answer, "say more", the answer).
    assert lines and all(
        [m["role"] for m in line["messages"]] == ["user", "assistant", "user", "assistant"] for line in lines
    )
    assert all(line["messages"][2]["content"] == "say more" for line in lines)
    kept = int(printed.split("kept ")[1].split(" ")[0])
    assert len(lines) <= kept <= 6 and "played 6 episodes" in printed and "failed 0 (none)" in printed
    assert "teacher tokens: prefill" in printed and f"rft sft --data {out}" in printed

    adapter = tmp_path / "warm-start"
    sft_argv = ["--model", str(tiny_model_dir), "--data", str(out), "--out", str(adapter), "--steps", "2"]
    assert sft_main([*sft_argv, "--batch-size", "2"]) == 0
    assert (adapter / "adapter_config.json").is_file()


def test_the_maze_agent_gives_one_demonstration_per_call(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "demos.jsonl"
    with serving(maze_app) as agent_url:
        run = tmp_path / "run"
        config = write_run_files(run, tiny_model_dir, agent_url, max_completion_length=24)
        rows = [{"seed": seed, "size": 4} for seed in range(3)]
        (run / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
        code = collect_main(
            [str(config), "--teacher", str(tiny_model_dir), "--out", str(out), "--min-reward", "0"]
        )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "played 3 episodes: kept 3 (reward >= 0)" in printed
    lines = _lines(out)
    # The maze agent shows each call only the latest observation: every call is a line of its own,
    # ending with the teacher's answer, with the `move` tool the call offered.
    assert lines and all(line["messages"][-1]["role"] == "assistant" for line in lines)
    assert all([tool["function"]["name"] for tool in line["tools"]] == ["move"] for line in lines)
    adapter = tmp_path / "warm-start"
    assert (
        sft_main(["--model", str(tiny_model_dir), "--data", str(out), "--out", str(adapter), "--steps", "1"])
        == 0
    )


def test_an_endpoint_teacher_is_forwarded_with_its_key_and_its_replies_become_demonstrations(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    teacher = ScriptedModel(default_turn=text("abc def"))  # any OpenAI-compatible server: text, no ids
    out = tmp_path / "demos.jsonl"
    with serve_in_thread(teacher.app()) as teacher_url, serving(letters_app) as agent_url:
        config = write_run_files(tmp_path / "run", tiny_model_dir, agent_url)
        argv = [
            str(config),
            "--teacher",
            f"{teacher_url}/v1",
            "--teacher-model",
            "big",
            "--teacher-key",
            "k-1",
        ]
        code = collect_main([*argv, "--out", str(out), "--min-reward", "0.5", "--episodes", "2"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    # The agent called the gateway (the run's key, its rollout headers); the gateway forwarded each
    # call with the endpoint's own key and model name.
    assert len(teacher.calls) == 4
    assert {call.headers["authorization"] for call in teacher.calls} == {"Bearer k-1"}
    assert {call.body["model"] for call in teacher.calls} == {"big"}
    follow_ups = [call for call in teacher.calls if call.body["messages"][-1]["content"] == "say more"]
    assert len(follow_ups) == 2 and all(len(call.body["messages"]) == 3 for call in follow_ups)
    # "abc def": 6 of 7 characters are a-m, a reward of 6/7 for both episodes (rows 1 and 2).
    assert "kept 2 (reward >= 0.5)" in printed and "prefill 4, sample 4" in printed
    contents = sorted([m.get("content") for m in line["messages"]] for line in _lines(out))
    assert contents == [
        [question, "abc def", "say more", "abc def"] for question in ("count to five", "name a fruit")
    ]
    adapter = tmp_path / "warm-start"
    assert (
        sft_main(["--model", str(tiny_model_dir), "--data", str(out), "--out", str(adapter), "--steps", "1"])
        == 0
    )


def test_an_endpoint_teacher_needs_its_model_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = collect_main(
        [str(tmp_path / "x.yaml"), "--teacher", "http://127.0.0.1:1/v1", "--out", str(tmp_path / "d")]
    )
    assert code == 2
    assert "name the model it serves with --teacher-model" in capsys.readouterr().err
