"""Train tokens with and without merging calls, on Wordle-shaped multi-turn traces.

Each game is six model calls of a Wordle agent (system prompt, one ``guess_word`` tool, letter
feedback as tool results), rendered through the tiny model's tokenizer and chat template exactly as
the policy server feeds it: the prompt of call k is ``apply_chat_template(messages, tools=...,
add_generation_prompt=True)``, the completion is the assistant turn the template renders (ending in
``<|im_end|>``), and its logprobs are the tiny model's, teacher-forced, as a sampler records them.
The traces go through :func:`trainer.algo.sequences.count_train_tokens`; the merged sequences are then
scored again by the model to check that merging kept every completion logprob.

    .venv/bin/python bench/merge_ratio.py [--games 32] [--seed 0] [--out bench/results/merge_ratio.json]

``--model DIR`` measures a real model's tokenizer instead of the tiny one (a real BPE splits text
differently, which is where prefix breaks come from); ``--chat-template`` replaces its template, as
the ``chat_template`` setting does when serving (SmolLM2's own has no tool section):

    .venv/bin/python bench/merge_ratio.py --model "$(.venv/bin/rft model smollm2 --cached)" \
        --chat-template chatml-tools --out bench/results/merge_ratio_smollm2.json

The issue's bar: merged train tokens <= 0.5x one sequence per call.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from policy_server.models.chat_templates import load_tokenizer
from policy_server.models.tiny import build_tiny_model
from policy_server.trace import CallRecord, RolloutTrace
from trainer.algo.grpo import token_logprobs
from trainer.algo.sequences import build_sequences, count_train_tokens, pad_batch

TURNS = 6
SYSTEM_PROMPT = (
    "You are playing Wordle. Find the secret five-letter English word in at most six guesses.\n"
    "Make exactly one guess per turn by calling the guess_word tool with a valid five-letter word.\n"
    "After each guess the tool returns feedback for every letter, in order:\n"
    "G (green): the letter is in the word and in the right spot.\n"
    "Y (yellow): the letter is in the word but in another spot.\n"
    "X (gray): the letter is not in the word.\n"
    "Use all the feedback so far: keep green letters in place, move yellow letters to new spots, and "
    "never use gray letters again. Think briefly about the candidates that remain, then call the tool. "
    "Guesses that are not five letters long or not English words waste a turn."
)
GUESS_TOOL = {
    "type": "function",
    "function": {
        "name": "guess_word",
        "description": "Submit one guess in the current Wordle game and receive letter-by-letter feedback.",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "description": "A five-letter English word."}},
            "required": ["word"],
        },
    },
}
WORDS = (
    "crane slate pious lemon night brave cloud sound apple grape house mouse plant trace stone "
    "light sweet dream flame chair table river ocean train bread heart smile water earth music "
    "happy green round sharp quiet fresh storm piano horse tiger zebra candy lucky"
).split()


def feedback(guess: str, secret: str) -> str:
    """Wordle colouring: greens first, then yellows only while the secret has that letter left."""
    marks = ["X"] * 5
    left: dict[str, int] = {}
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = "G"
        else:
            left[s] = left.get(s, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and left.get(g, 0) > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def play(secret: str, rng: random.Random) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Six (request messages, assistant reply) pairs of one game, as the agent would send them."""
    guesses = rng.sample([w for w in WORDS if w != secret], TURNS)
    if rng.random() < 0.5:
        guesses[-1] = secret
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": [{"type": "text", "text": "Let's play Wordle! Make your first guess."}]},
    ]
    calls = []
    for turn, guess in enumerate(guesses, start=1):
        known = [f"{w.upper()}={feedback(w, secret)}" for w in guesses[: turn - 1]]
        thought = (
            f"Turn {turn}. Feedback so far: {', '.join(known) or 'none'}. "
            f"The word {guess.upper()} tests letters I have not ruled out, so I will guess it."
        )
        reply = {
            "role": "assistant",
            "content": thought,
            "tool_calls": [
                {
                    "id": f"call_{turn}",
                    "type": "function",
                    "function": {"name": "guess_word", "arguments": json.dumps({"word": guess})},
                }
            ],
        }
        calls.append((list(messages), reply))
        marks = feedback(guess, secret)
        result = f"{guess.upper()} -> {marks}. " + (
            "Solved!" if guess == secret else f"{TURNS - turn} guesses left."
        )
        messages += [reply, {"role": "tool", "tool_call_id": f"call_{turn}", "content": result}]
    return calls


def render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=[GUESS_TOOL], add_generation_prompt=generation_prompt, tokenize=False
    )


def record_game(
    tokenizer: Any, model: Any | None, game: int, calls: list[tuple[list[dict[str, Any]], dict[str, Any]]]
) -> RolloutTrace:
    records = []
    end = tokenizer.eos_token  # "<|im_end|>": where the sampler stops; the "\n" after it is the template's
    for index, (messages, reply) in enumerate(calls):
        prompt_ids = tokenizer.apply_chat_template(
            messages, tools=[GUESS_TOOL], add_generation_prompt=True, return_dict=True
        )["input_ids"]
        prompt_text = render(tokenizer, messages, generation_prompt=True)
        turn_text = render(tokenizer, [*messages, reply], generation_prompt=False)
        if not turn_text.startswith(prompt_text):
            raise RuntimeError(f"game {game} call {index}: the template renders the history differently")
        completion_text = turn_text[len(prompt_text) : turn_text.rindex(end) + len(end)]
        completion_ids = tokenizer(completion_text, add_special_tokens=False)["input_ids"]
        if model is None:  # --tokens-only: counts and prefix breaks need no logprobs
            logprobs = torch.zeros(len(completion_ids))
        else:
            with torch.no_grad():
                ids = torch.tensor([prompt_ids + completion_ids])
                logprobs = token_logprobs(model(input_ids=ids).logits, ids)[0, len(prompt_ids) :]
        records.append(
            CallRecord(
                index=index,
                prompt_token_ids=prompt_ids,
                completion_token_ids=completion_ids,
                completion_logprobs=logprobs.tolist(),
                adapter_version=0,
                finish_reason="tool_calls",
                started_at=0.0,
                finished_at=0.0,
            )
        )
    return RolloutTrace(job_arn="bench", rollout_id=f"game-{game}", calls=records, status="ready")


def prefix_breaks(tokenizer: Any, trace: RolloutTrace) -> list[dict[str, Any]]:
    """Where a call's prompt fails to extend the previous prompt + completion: the first differing token."""
    breaks = []
    for previous, current in zip(trace.calls, trace.calls[1:], strict=False):
        expected = previous.prompt_token_ids + previous.completion_token_ids
        actual = current.prompt_token_ids[: len(expected)]
        if actual != expected:
            at = next(
                (i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b), len(actual)
            )
            breaks.append(
                {
                    "rollout": trace.rollout_id,
                    "call": current.index,
                    "position": at,
                    "expected": tokenizer.convert_ids_to_tokens(expected[at : at + 8]),
                    "actual": tokenizer.convert_ids_to_tokens(actual[at : at + 8]),
                }
            )
    return breaks


def max_logprob_drift(model: Any, traces: list[RolloutTrace], pad_token_id: int) -> float:
    """Largest |merged-sequence logprob - recorded per-call logprob| over all trained tokens."""
    drift = 0.0
    for trace in traces:
        batch = pad_batch(build_sequences(trace), pad_token_id)
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        on = batch.loss_mask > 0
        rescored = token_logprobs(logits, batch.input_ids)[on]
        drift = max(drift, float((rescored - batch.behavior_logprobs[on]).abs().max()))
    return drift


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "merge_ratio.json")
    parser.add_argument("--model", type=Path, help="model directory (default: a tiny model built here)")
    parser.add_argument("--chat-template", help="template replacing the model's own (e.g. chatml-tools)")
    parser.add_argument(
        "--tokens-only",
        action="store_true",
        help="skip the model (no logprobs, no drift check): token counts and prefix breaks depend only "
        "on the tokenizer, and scoring a real model's long games is slow on a CPU",
    )
    args = parser.parse_args(argv)

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model or build_tiny_model(Path(tmp) / "model", seed=args.seed)
        tokenizer = load_tokenizer(model_dir, args.chat_template)
        model = None
        if not args.tokens_only:
            model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = random.Random(args.seed)
    traces = [record_game(tokenizer, model, game, play(rng.choice(WORDS), rng)) for game in range(args.games)]
    counts = count_train_tokens(traces)
    sequences = [sequence for trace in traces for sequence in build_sequences(trace)]
    breaks = [b for trace in traces for b in prefix_breaks(tokenizer, trace)]
    result = {
        "games": args.games,
        "calls_per_game": TURNS,
        "calls": sum(len(trace.calls) for trace in traces),
        "sequences": len(sequences),
        "per_call_train_tokens": counts.per_call,
        "merged_train_tokens": counts.merged,
        "ratio": round(counts.ratio, 4),
        "sampled_tokens": sum(s.num_completion_tokens for s in sequences),
        "mean_merged_sequence_tokens": round(counts.merged / max(1, len(sequences)), 1),
        "max_logprob_drift": None
        if model is None
        else max_logprob_drift(model, traces, tokenizer.pad_token_id),
        "prefix_breaks": breaks,
        "seed": args.seed,
        "tokenizer_vocab": len(tokenizer),
        "model": str(args.model or "tiny"),
        "chat_template": args.chat_template,
        "seconds": round(time.perf_counter() - started, 2),
        "command": " ".join(
            [".venv/bin/python bench/merge_ratio.py", *(sys.argv[1:] if argv is None else argv)]
        ),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"{result['games']} Wordle games, {result['calls']} calls -> {result['sequences']} sequences: "
        f"merged {counts.merged} vs per-call {counts.per_call} train tokens, ratio {counts.ratio:.3f} "
        f"(bar: <= 0.5); prefix breaks {len(breaks)}; max logprob drift {result['max_logprob_drift']}"
    )
    print(f"wrote {args.out}")
    return 0 if counts.ratio <= 0.5 and not breaks else 1


if __name__ == "__main__":
    raise SystemExit(main())
