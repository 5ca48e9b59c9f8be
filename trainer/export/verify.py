"""The check every export passes: the exported weights decode the same greedy tokens as the trained
policy on a few chat prompts, and give those tokens logprobs within a stated tolerance.

The trained policy is the adapter as the run saved it on the base model, loaded as the hf engine
loads it (peft, the adapter's weights kept in float32) in the export's dtype, so the check measures
what the export changed: the adapter's weights rounded to the base's dtype, or the merge.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

# Chat prompts of different kinds; the check decodes NEW_TOKENS greedy tokens after each.
PROMPTS = (
    "Hello! Who are you?",
    "What is 17 + 25? Answer with the number only.",
    "Route this ticket: my invoice is wrong.",
)
NEW_TOKENS = 16
# The largest |logprob difference| accepted per dtype: float32 differs only by summation order; a
# 16-bit export also rounds the adapter (or the merged weights) to 8 significant bits.
TOLERANCES = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 2e-2}


@dataclass(frozen=True)
class Decoded:
    """One prompt's greedy continuation and the logprobs of its tokens."""

    prompt_ids: list[int]
    tokens: list[int]
    logprobs: list[float]


@dataclass(frozen=True)
class Verification:
    """What the check compared and the largest logprob difference it found."""

    prompts: int
    tokens: int
    max_logprob_diff: float
    tolerance: float
    ties: int = 0  # prompts whose greedy tokens parted at a tie within the tolerance

    def sentence(self) -> str:
        same = "the same tokens"
        if self.ties:
            same += f" but for {self.ties} tie(s) within the tolerance, where decoding parted"
        return (
            f"checked against the trained policy: {self.prompts} chat prompts, {self.tokens} greedy tokens "
            f"each, {same}; logprobs of the policy's tokens within {self.max_logprob_diff:.1e} "
            f"(tolerance {self.tolerance:.0e})"
        )


def prompt_ids(tokenizer: Any) -> list[list[int]]:
    """The check's prompts rendered by ``tokenizer``'s chat template, ready for the assistant's turn."""
    rendered = []
    for prompt in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # transformers 5 returns an encoding
            ids = ids["input_ids"]
        rendered.append([int(token) for token in ids])
    return rendered


@torch.no_grad()
def token_logprobs(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """Teacher-forced logprobs of ``tokens`` after ``prompt``, from the unprocessed logits."""
    ids = torch.tensor([prompt + tokens], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    chosen = torch.tensor(tokens, device=logits.device).unsqueeze(1)
    return torch.log_softmax(logits, dim=-1).gather(1, chosen).squeeze(1).tolist()


@torch.no_grad()
def decode(model: Any, prompts: list[list[int]], new_tokens: int = NEW_TOKENS) -> list[Decoded]:
    """Each prompt's ``new_tokens`` greedy tokens (no stop token, so every token is compared)."""
    model.eval()
    decoded = []
    for prompt in prompts:
        tokens: list[int] = []
        for _ in range(new_tokens):
            ids = torch.tensor([prompt + tokens], device=model.device)
            tokens.append(int(model(input_ids=ids).logits[0, -1].argmax()))
        decoded.append(Decoded(prompt, tokens, token_logprobs(model, prompt, tokens)))
    return decoded


def compare(reference: list[Decoded], model: Any, tolerance: float, what: str) -> Verification:
    """``model`` against the trained policy's ``reference``; the reason it fails as a ValueError.

    Logprobs are compared teacher-forced on the policy's tokens. A greedy token may differ only at a
    tie: where the export prefers its own token over the policy's by no more than ``tolerance`` (a
    16-bit export rounds near-ties either way); the prompt's later tokens then follow other prefixes.
    """
    exported = decode(model, [item.prompt_ids for item in reference])
    worst, ties = 0.0, 0
    for number, (want, got) in enumerate(zip(reference, exported, strict=True), start=1):
        forced = (
            token_logprobs(model, want.prompt_ids, want.tokens) if got.tokens != want.tokens else got.logprobs
        )
        worst = max([worst, *(abs(a - b) for a, b in zip(forced, want.logprobs, strict=True))])
        if got.tokens == want.tokens:
            continue
        at = next(i for i, (a, b) in enumerate(zip(want.tokens, got.tokens, strict=True)) if a != b)
        margin = got.logprobs[at] - forced[at]
        if margin > tolerance:
            raise ValueError(
                f"{what} decodes other greedy tokens than the trained policy on check prompt {number} "
                f"(from token {at}: {got.tokens[at:]} instead of {want.tokens[at:]}; it prefers its token "
                f"by {margin:.2e} in logprob, above the tolerance {tolerance:.0e})"
            )
        ties += 1
    if worst > tolerance:
        raise ValueError(
            f"{what} gives the trained policy's greedy tokens logprobs up to {worst:.2e} apart, above the "
            f"tolerance {tolerance:.0e}"
        )
    return Verification(len(reference), NEW_TOKENS, worst, tolerance, ties)
