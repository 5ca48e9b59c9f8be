"""Run with vLLM's python: parse gpt-oss completions with vLLM's own harmony parser.

Reads ``{"tool_parser": ..., "reasoning_parser": ..., "texts": [...]}`` on stdin (the parser names the
gpt_oss family gives, completions as harmony text after ``<|start|>assistant``) and writes one
``{"reasoning", "content", "tool_calls": [[name, arguments]]}`` per text, as vLLM's chat-completions
server builds them for a request with tools. vLLM reads harmony as o200k token ids, so each text is
encoded with openai-harmony's encoding (TIKTOKEN_ENCODINGS_BASE names the vocabulary's folder).
"""

import json
import sys

from openai_harmony import HarmonyEncodingName, load_harmony_encoding
from vllm.parser.parser_manager import ParserManager


def main() -> None:
    job = json.load(sys.stdin)
    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

    class Tokenizer:  # what the parser decodes a broken message's raw tokens with
        def decode(self, ids: list[int], **kwargs: object) -> str:
            return encoding.decode(ids)

    parser_cls = ParserManager.get_parser(
        tool_parser_name=job["tool_parser"],
        reasoning_parser_name=job["reasoning_parser"],
        enable_auto_tools=True,
        is_harmony=True,
    )
    results = []
    for text in job["texts"]:
        ids = encoding.encode(text, allowed_special="all")
        reasoning, content, calls = parser_cls(Tokenizer()).parse(
            text, None, enable_auto_tools=True, model_output_token_ids=ids
        )
        results.append(
            {
                "reasoning": reasoning,
                "content": content,
                "tool_calls": [[call.name, call.arguments] for call in calls or []],
            }
        )
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
