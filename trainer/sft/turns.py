"""A demonstration's training sequences, turn by turn as sampling makes them.

Each assistant turn is trained after the prompt the engine sends at that turn: the conversation up to
the turn rendered with the generation prompt (the hf engine's ``apply_chat_template(...,
add_generation_prompt=True)``), then the turn's completion: what the template renders for the turn
when it is the conversation's last message, from the end of that prompt to its end-of-turn token
(the newline a template puts after that token belongs to the next prompt, it is not sampled). Turns
then merge into sequences by the rule sampled calls merge by (``trainer.algo.sequences``): a turn
whose prompt ids start with the sequence so far extends it, one whose template rewrote the history
(Qwen3's think blocks, harmony's analysis, Gemma 4's empty thought channel are rendered on the last
turn only) starts a sequence of its own. So every family warm-starts on multi-turn demonstrations,
and each turn is learnt exactly as its rollout call would be trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policy_server import CallRecord, RolloutTrace
from trainer.algo.sequences import build_sequences


class DemonstrationError(ValueError):
    """A demonstration that cannot be rendered or has nothing to learn from."""


@dataclass(frozen=True)
class EncodedDemonstration:
    """One training sequence of a demonstration: token ids and which of them the loss covers."""

    input_ids: list[int]
    loss_mask: list[bool]


def _render(tokenizer: Any, messages: list[dict[str, Any]], tools: Any, generation_prompt: bool) -> str:
    try:
        return tokenizer.apply_chat_template(
            messages, tools=tools or None, tokenize=False, add_generation_prompt=generation_prompt
        )
    except Exception as error:  # jinja errors come in many classes; the message is what helps
        raise DemonstrationError(f"the chat template could not render it: {error}") from error


def _ids(tokenizer: Any, text: str) -> list[int]:
    """``text``'s ids as ``apply_chat_template(tokenize=True)`` makes them (no special tokens added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_demonstration(tokenizer: Any, demonstration: dict[str, Any]) -> list[EncodedDemonstration]:
    """``demonstration``'s training sequences (see the module docstring), in turn order."""
    from policy_server.http import normalize_messages

    try:
        messages = normalize_messages(list(demonstration["messages"]))
    except (KeyError, TypeError) as exc:
        raise DemonstrationError(f"a demonstration needs a 'messages' list: {exc}") from exc
    tools = demonstration.get("tools")
    calls: list[CallRecord] = []
    for index, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = _render(tokenizer, messages[:index], tools, True)
        history = _render(tokenizer, messages[:index], tools, False)
        turn = _render(tokenizer, messages[: index + 1], tools, False)
        start = _turn_start(tokenizer, turn, prompt, history)
        completion = turn[start : len(turn.rstrip("\n"))]
        calls.append(_call(len(calls), _ids(tokenizer, prompt), _ids(tokenizer, completion)))
    if not calls:
        raise DemonstrationError("a demonstration needs at least one assistant message to learn from")
    sequences = build_sequences(RolloutTrace(job_arn="sft", rollout_id="demonstration", calls=calls))
    encoded = [
        EncodedDemonstration(sequence.token_ids, [bool(mask) for mask in sequence.loss_mask])
        for sequence in sequences
    ]
    return encoded[:-1] + [
        _with_tail(encoded[-1], _ids(tokenizer, _render(tokenizer, messages, tools, False)))
    ]


def _with_tail(last: EncodedDemonstration, whole: list[int]) -> EncodedDemonstration:
    """``last`` with what the whole conversation's rendering holds past it (the template's newline
    after the final end-of-turn token, and any message after the last assistant turn), masked.

    Where the conversation renders prefix-preservingly, its one sequence is then exactly the whole
    rendering's ids, the same sequence a single rendering of the conversation gives (so a warm start
    on such demonstrations trains on the same tensors, shapes included, and repeats its numbers)."""
    if len(whole) <= len(last.input_ids) or whole[: len(last.input_ids)] != last.input_ids:
        return last
    tail = whole[len(last.input_ids) :]
    return EncodedDemonstration(last.input_ids + tail, last.loss_mask + [False] * len(tail))


def _call(index: int, prompt_ids: list[int], completion_ids: list[int]) -> CallRecord:
    """A turn as the record of the call that would have sampled it (the sampler's fields unused)."""
    if not prompt_ids:
        raise DemonstrationError(
            "the chat template rendered an empty prompt before an assistant turn, so nothing predicts "
            "its first token; start the demonstration with a system or user message"
        )
    return CallRecord(
        index=index,
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        completion_logprobs=[0.0] * len(completion_ids),
        adapter_version=0,
        finish_reason="stop",
        started_at=0.0,
        finished_at=0.0,
    )


def _turn_start(tokenizer: Any, turn: str, prompt: str, history: str) -> int:
    """Where in ``turn`` (the conversation rendered up to and with the turn) the turn's completion
    starts: after the rendered history and the generation prompt's opening (``prompt`` past
    ``history``).

    Where the template rewrote earlier turns once this one is rendered (harmony drops an analysis
    before a final answer), the history ends where its longest tail found in ``turn`` ends: the
    messages just before an assistant turn are rendered alike either way. Where the opening holds
    text the rendered turn does not (Gemma 4's empty thought channel after ``<|turn>model``), the
    opening and the rendered turn share their first tokens (the header); the completion starts past
    those. Compared token by token, since a special token's text can share characters with another's."""
    if not prompt.startswith(history):
        raise DemonstrationError(
            "the chat template's generation prompt does not extend the conversation rendered before "
            "the assistant's turn, so the turn's tokens cannot be located; use a template whose "
            "generation prompt only appends"
        )
    end = _history_end(turn, history)
    opening = prompt[len(history) :]
    if turn.startswith(opening, end):
        return end + len(opening)
    found = tokenizer(opening, add_special_tokens=False, return_offsets_mapping=True)
    turn_ids = _ids(tokenizer, turn[end:])
    shared = 0
    while shared < min(len(turn_ids), len(found["input_ids"])) and (
        found["input_ids"][shared] == turn_ids[shared]
    ):
        shared += 1
    return end + (found["offset_mapping"][shared - 1][1] if shared else 0)


def _history_end(turn: str, history: str) -> int:
    """Where the rendered ``history`` ends inside ``turn``: after the longest tail of ``history`` that
    ``turn`` holds (a tail shorter than one found is found too, so the longest is searched by halves)."""
    if turn.startswith(history):
        return len(history)
    low, high = 0, len(history)  # history[-low:] is in turn; history[-high - 1:] is not
    while low < high:
        middle = (low + high + 1) // 2
        if history[len(history) - middle :] in turn:
            low = middle
        else:
            high = middle - 1
    if low == 0:
        raise DemonstrationError(
            "the chat template renders nothing of the conversation before the assistant's turn alike "
            "once the turn is added, so the turn's tokens cannot be located"
        )
    return turn.rfind(history[len(history) - low :]) + low
