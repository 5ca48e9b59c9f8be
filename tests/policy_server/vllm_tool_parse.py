"""Run with vLLM's python: parse completions with vLLM's own tool-call and reasoning parsers.

Reads ``{"model_dir", "tool_parser", "reasoning_parser", "tools", "texts"}`` on stdin (the parser names
a family gives, its model's tokenizer, the request's tools, completions as text) and writes one
``{"reasoning", "content", "tool_calls": [[name, arguments]]}`` per text, as vLLM's chat-completions
server builds them for a request with those tools.
"""

import json
import sys

from transformers import AutoTokenizer
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager


def main() -> None:
    job = json.load(sys.stdin)
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"])
    parser_cls = ParserManager.get_parser(
        tool_parser_name=job["tool_parser"],
        reasoning_parser_name=job["reasoning_parser"],
        enable_auto_tools=True,
    )
    request = ChatCompletionRequest(
        model="policy", messages=[{"role": "user", "content": "go"}], tools=job["tools"]
    )
    results = []
    for text in job["texts"]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        reasoning, content, calls = parser_cls(tokenizer).parse(
            text, request, enable_auto_tools=True, model_output_token_ids=ids
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
