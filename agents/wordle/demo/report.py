"""The Wordle demo's report, as the SageMaker service reports a run: win rate before and after, mean
guesses per win, the invalid-word rate, rollouts processed, prefill / sample / train tokens and what
they cost at the service's list prices and at the config's, wall time and the cost per point gained."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from trainer.config import TokenPrices
from trainer.ops import TokenCost

if TYPE_CHECKING:
    from trainer.ops import MetricsLogger
    from trainer.rollouts import PlayedRollout


class GameStats:
    """An evaluation hook (``trainer.train``'s ``on_evaluation``): each evaluation's games, by step."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, Any]] = {}

    def __call__(self, step: int, played: list[PlayedRollout], _metrics: MetricsLogger) -> None:
        self.by_step[step] = game_stats([rollout.outcome.metrics for rollout in played if rollout.outcome.ok])


def game_stats(games: list[dict[str, float]]) -> dict[str, Any]:
    """Wins, mean guesses per win and invalid words per tool call over the scored games (each one's
    ``metrics`` as the Wordle agent reports them)."""
    wins = [game["guesses"] for game in games if game.get("solved") == 1.0]
    calls = math.fsum(game.get("tool_calls", 0.0) for game in games)
    invalid = math.fsum(game.get("invalid_attempts", 0.0) for game in games)
    return {
        "games": len(games),
        "wins": len(wins),
        "win_rate": len(wins) / len(games) if games else 0.0,
        "guesses_per_win": math.fsum(wins) / len(wins) if wins else None,
        "invalid_word_rate": invalid / calls if calls else 0.0,
        "tool_calls": int(calls),
    }


def billing(tokens: dict[str, int], config_prices: TokenPrices, lift_points: float) -> dict[str, Any]:
    """The tokens by bucket, their cost at the service's list prices and at the config's, and the cost
    per point of win rate gained (None when nothing was gained)."""
    listed = TokenCost(tokens["prefill"], tokens["sample"], tokens["train"], TokenPrices()).dollars
    configured = TokenCost(tokens["prefill"], tokens["sample"], tokens["train"], config_prices).dollars
    return {
        "tokens": tokens,
        "list_prices_per_million": TokenPrices().model_dump(),
        "cost_usd_list_prices": listed,
        "config_prices_per_million": config_prices.model_dump(),
        "cost_usd_config_prices": configured,
        "cost_usd_per_point_list_prices": listed / lift_points if lift_points > 0 else None,
    }


def rollouts_processed(history: list[dict[str, Any]], evaluations: list[dict[str, Any]]) -> dict[str, int]:
    """Rollouts played in training and in the evaluations (the service counts both)."""
    training = sum(int(record["rollouts"]["total"]) for record in history)
    evaluation = sum(int(result["scored"]) + int(result["failed"]) for result in evaluations)
    return {"training": training, "evaluation": evaluation, "total": training + evaluation}


def _number(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def report_table(results: dict[str, Any]) -> str:
    """The console's table: the games before and after, then the run's rollouts, tokens, cost and time."""
    before, after = results["before"], results["after"]
    rows = [
        ("", "before", "after"),
        ("win rate", f"{before['win_rate']:.1%}", f"{after['win_rate']:.1%}"),
        (
            "guesses per win",
            _number(before["guesses_per_win"], ".2f"),
            _number(after["guesses_per_win"], ".2f"),
        ),
        ("invalid words", f"{before['invalid_word_rate']:.1%}", f"{after['invalid_word_rate']:.1%}"),
        ("mean reward", f"{before['mean_reward']:.3f}", f"{after['mean_reward']:.3f}"),
    ]
    lines = [f"{name:<18}{left:>10}{right:>10}" for name, left, right in rows]
    bill, rollouts = results["billing"], results["rollouts"]
    tokens, listed = bill["tokens"], bill["list_prices_per_million"]
    per_point = bill["cost_usd_per_point_list_prices"]
    lines += [
        f"lift: {results['lift_points']:+.1f} points of win rate on {after['games']} held-out secrets",
        f"rollouts processed: {rollouts['total']:,} ({rollouts['training']:,} training, "
        f"{rollouts['evaluation']:,} evaluation)",
        f"tokens: prefill {tokens['prefill']:,}, sample {tokens['sample']:,}, train {tokens['train']:,}",
        f"cost: ${bill['cost_usd_list_prices']:.4f} at the service's list prices "
        f"(${listed['prefill']:.2f} / ${listed['sample']:.2f} / ${listed['train']:.2f} per M), "
        f"${bill['cost_usd_config_prices']:.4f} at the config's; "
        f"{'$' + format(per_point, '.4f') if per_point is not None else 'nothing'} per point gained",
        f"wall time: {results['seconds']:.0f} s",
    ]
    return "\n".join(lines)
