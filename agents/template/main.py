"""The template agent: the smallest useful rftkit agent. Copy this directory and change three things:
the task (what a row holds and what the agent is asked), the tools, and the reward.

The task here: answer an arithmetic question with the help of a ``calculate`` tool. A row is
``{"question": "What is 12 * (3 + 4)?", "answer": 84}`` (or that object as a JSON string).

Run locally with ``python agents/template/main.py`` (port 8080), then
``rft smoke http://localhost:8080 --payload agents/template/payloads/smoke.json``.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from strands import Agent, tool

from handlers import RolloutContext, ends_episode, refused_by_endpoint, rft_app

SYSTEM_PROMPT = (
    "Answer the arithmetic question. Use the calculate tool for every computation, "
    "then give the final answer as a number on the last line."
)
SOLVED_REWARD = 1.0
WRONG_REWARD = 0.0
# The model endpoint refused to play (for example `rft smoke`'s 400 "Could not find job"): below any
# played episode, so a model that plays is always preferred.
NO_PLAY_REWARD = -1.0
# The answer was cut off (max tokens) or the context overflowed: an outcome of play, scored as wrong.
TRUNCATED_REWARD = WRONG_REWARD

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
}


def evaluate(expression: str) -> float:
    """Evaluate + - * / and parentheses over numbers; anything else raises ValueError."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")

    try:
        return walk(ast.parse(expression, mode="eval").body)
    except SyntaxError as error:
        raise ValueError(f"not an expression: {error.msg}") from error


@tool
def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / and parentheses, for example "12 * (3 + 4)".
    """
    try:
        return f"{evaluate(expression):g}"
    except (ValueError, ZeroDivisionError) as error:
        return f"cannot evaluate {expression!r}: {error}"


def reward(final_text: str, answer: float) -> float:
    """1.0 when the last number in the final answer is the expected one, else 0.0."""
    numbers = re.findall(r"-?\d+(?:\.\d+)?", final_text.replace(",", ""))
    return SOLVED_REWARD if numbers and abs(float(numbers[-1]) - answer) < 1e-6 else WRONG_REWARD


async def rollout(row: dict[str, Any], ctx: RolloutContext) -> float:
    # async: it runs on the app's one event loop, so it must never block (no time.sleep, no sync client).
    agent = Agent(
        model=ctx.strands_model(), tools=[calculate], system_prompt=SYSTEM_PROMPT, callback_handler=None
    )
    try:
        result = await agent.invoke_async(row["question"])
    except Exception as error:
        # A 400 from the model endpoint (rft smoke's "Could not find job"), a truncated answer or a
        # context overflow ends the episode and is scored; anything else (5xx, a dropped connection)
        # propagates: the rollout is reported failed, never scored as zero.
        if not ends_episode(error):
            raise
        return NO_PLAY_REWARD if refused_by_endpoint(error) else TRUNCATED_REWARD
    return reward(str(result), float(row["answer"]))


app = rft_app(rollout, row_format="json")  # a BedrockAgentCoreApp; no decorator stacking to get wrong

if __name__ == "__main__":
    app.run()  # port 8080, as AgentCore Runtime expects
