"""A two-turn agent whose reward is the share of early-alphabet letters in the model's replies.

Real parts only: an ``rft_app`` (BedrockAgentCoreApp) whose rollout asks the policy endpoint twice
through the OpenAI client the rollout context hands out. The reward is computed from the text, so it
varies from rollout to rollout and a policy can learn it. The sampling seed the trainer sends in
``inferenceParams`` is passed on to every call, which makes rollouts reproducible under batching.
"""

from __future__ import annotations

from typing import Any

from handlers import RolloutContext, rft_app

TARGET_LETTERS = frozenset("abcdefghijklm")


def reward_of(texts: list[str]) -> float:
    """Share of characters that are letters a-m, over all replies (0.0 for empty replies)."""
    characters = "".join(texts)
    if not characters:
        return 0.0
    return sum(character in TARGET_LETTERS for character in characters) / len(characters)


async def rollout(row: dict[str, Any], ctx: RolloutContext) -> dict[str, Any]:
    params = ctx.openai_params()
    seed = (ctx.inference_params.model_extra or {}).get("seed")
    if seed is not None:
        params["seed"] = int(seed)
    messages: list[dict[str, Any]] = [{"role": "user", "content": row["question"]}]
    replies = []
    async with ctx.async_openai_client() as client:
        for follow_up in ("say more", None):
            answer = await client.chat.completions.create(model=ctx.model_id, messages=messages, **params)
            text = answer.choices[0].message.content or ""
            replies.append(text)
            if follow_up is None:
                break
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
    return {"reward": reward_of(replies), "metrics": {"reply_chars": float(sum(map(len, replies)))}}


app = rft_app(rollout)

if __name__ == "__main__":
    app.run(port=8081)  # beside the template's 8080, as docs/walkthrough.md runs both
