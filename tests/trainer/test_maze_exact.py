"""The exact maze scorer: it enumerates the requests the agent really sends, its dynamic programme
agrees with the walkers' on an observation-only policy, and the model's call probabilities are the
trainer's teacher-forced logprobs."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from agents.maze.baselines import DIRECTIONS, greedy_walker, success_probability
from agents.maze.dataset import eval_rows, row_maze
from agents.maze.demo.maze_exact import CallScorer, exact_success, reachable_requests
from agents.maze.demonstrations import episode_demonstrations
from policy_server.models import load_tokenizer
from trainer.algo.grpo import token_logprobs
from trainer.sft.turns import encode_demonstration


def test_every_request_a_walker_sends_is_one_of_the_enumerated_states() -> None:
    maze = row_maze(eval_rows()[3])
    found = reachable_requests(maze)
    enumerated = {repr(demo) for demos in found.values() for demo in demos}
    for seed in range(5):
        for demo in episode_demonstrations(maze, noise=0.5, rng=random.Random(seed)):
            assert repr(demo) in enumerated
    # Four demonstrations per state, one per move, in the order of DIRECTIONS.
    for demos in found.values():
        moves = [demo["messages"][-1]["tool_calls"][0]["function"]["arguments"] for demo in demos]
        assert moves == [f'{{"direction": "{direction.value}"}}' for direction in DIRECTIONS]


class _GreedyReader:
    """The greedy walker reading the observation text, with ``formed`` of its mass on well-formed calls."""

    def __init__(self, formed: float) -> None:
        self.formed = formed

    def probabilities(
        self, demonstrations: Sequence[dict[str, Any]], temperature: float = 1.0
    ) -> list[float]:
        out = []
        for demo in demonstrations:
            observation = str(demo["messages"][-2]["content"])
            statuses = dict(re.findall(r"(Up|Down|Left|Right)(Wall|Closer|Farther)", observation))
            closer = [d for d, status in statuses.items() if status == "Closer"]
            choices = closer or [d for d, status in statuses.items() if status != "Wall"]
            move = demo["messages"][-1]["tool_calls"][0]["function"]["arguments"].split('"')[3]
            out.append(self.formed / len(choices) if move.capitalize() in choices else 0.0)
        return out


def test_dynamic_programme_agrees_with_the_walkers_whatever_the_mass_on_well_formed_calls() -> None:
    mazes = [row_maze(row) for row in eval_rows()[:6]]
    greedy = sum(success_probability(maze, greedy_walker) for maze in mazes) / len(mazes)
    for formed in (1.0, 0.9):
        score = exact_success(mazes, _GreedyReader(formed))
        assert score.success == pytest.approx(greedy, abs=1e-12)
        assert score.call_mass == pytest.approx(formed, abs=1e-12)


def test_call_probabilities_are_the_teacher_forced_logprobs(
    tiny_model_dir: Path, random_adapter, tmp_path: Path
) -> None:
    adapter = random_adapter(tmp_path / "adapter", seed=3)
    scorer = CallScorer(tiny_model_dir, adapter)
    maze = row_maze(eval_rows()[0])
    demos = next(iter(reachable_requests(maze).values()))
    for temperature in (1.0, 2.0):
        probabilities = scorer.probabilities(demos, temperature)
        for demo, probability in zip(demos, probabilities, strict=True):
            (encoded,) = encode_demonstration(load_tokenizer(tiny_model_dir), demo)
            ids = torch.tensor([encoded.input_ids])
            with torch.no_grad():
                logprobs = token_logprobs(scorer.model(input_ids=ids).logits / temperature, ids)[0]
            mine = torch.tensor(encoded.loss_mask, dtype=torch.bool)
            assert mine.sum() > 10  # the whole assistant turn, not only the direction
            assert math.isclose(math.log(probability), float(logprobs[mine].sum()), abs_tol=1e-3)
        assert 0.0 < sum(probabilities) <= 1.0


def test_a_vision_model_is_scored_on_the_pictures_the_agent_sends(tiny_vision_dir: Path) -> None:
    maze = row_maze(eval_rows()[0])
    found = reachable_requests(maze, "image")
    assert found.keys() == reachable_requests(maze).keys()
    opening = found[(maze.start, maze.move_limit, None)][0]
    parts = opening["messages"][-2]["content"]
    assert [part["type"] for part in parts] == ["text", "image_url"]
    scorer = CallScorer(tiny_vision_dir)
    probabilities = scorer.probabilities(found[(maze.start, maze.move_limit, None)])
    assert all(0.0 < probability < 1.0 for probability in probabilities)
    score = exact_success([maze], scorer, observation="image")
    assert 0.0 <= score.success <= 1.0 and score.states == len(found)
