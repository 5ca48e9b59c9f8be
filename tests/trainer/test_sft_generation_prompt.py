"""A warm start trains each assistant turn after the generation prompt the engine sends: Gemma 4's
prompt ends in an empty thought channel that its rendered history never holds, and before issue 36's
fix the tiny gemma4 learnt its call with ``<|tool_call>call:guess_word{`` out of the loss, so after
the warm start it ended its turn at once."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from policy_server.http import normalize_messages
from policy_server.models.families import TinySizes, family
from trainer.sft.turns import encode_demonstration

TOOL = {
    "type": "function",
    "function": {
        "name": "guess_word",
        "description": "Guess the secret word.",
        "parameters": {"type": "object", "properties": {"guess": {"type": "string"}}, "required": ["guess"]},
    },
}
CALL = {
    "id": "call_0",
    "type": "function",
    "function": {"name": "guess_word", "arguments": '{"guess": "crane"}'},
}
DEMONSTRATION = {
    "messages": [
        {"role": "system", "content": "Play Wordle."},
        {"role": "user", "content": "Make your first guess."},
        {"role": "assistant", "tool_calls": [CALL]},
    ],
    "tools": [TOOL],
}


def test_gemma4_call_is_trained_whole_after_the_engines_generation_prompt(tmp_path: Path) -> None:
    model_dir = family("gemma4").build_tiny(tmp_path, sizes=TinySizes(hidden_size=64, vocab_size=512))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    (encoded,) = encode_demonstration(tokenizer, DEMONSTRATION)
    # What the hf engine sends the model for this turn (policy_server/engines/hf.py, _template_ids).
    prompt = tokenizer.apply_chat_template(
        normalize_messages(DEMONSTRATION["messages"][:2]),
        tools=[TOOL],
        add_generation_prompt=True,
        return_dict=False,
    )
    assert tokenizer.decode(prompt).endswith("<|turn>model\n<|channel>thought\n<channel|>")
    assert encoded.input_ids[: len(prompt)] == list(prompt)
    assert not any(encoded.loss_mask[: len(prompt)])
    trained = [token for token, kept in zip(encoded.input_ids, encoded.loss_mask, strict=True) if kept]
    assert encoded.loss_mask[len(prompt) :] == [True] * len(trained)
    assert (
        tokenizer.decode(trained)
        == '<|tool_call>call:guess_word{guess:<|"|>crane<|"|>}<tool_call|><|tool_response>'
    )
    parsed = family("gemma4").with_tools([TOOL]).parse(tokenizer, trained[:-1], tools=True)
    assert [call["function"]["arguments"] for call in parsed.tool_calls] == ['{"guess": "crane"}']
