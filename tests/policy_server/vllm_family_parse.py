"""Run with vLLM's python: parse completions with vLLM's own tool-call and reasoning parsers of a family.

Reads ``{"model_dir": ..., "tool_parser": ..., "reasoning_parser": ..., "cases": [{"ids": [...],
"tools": [...] | null, "enable_thinking": bool}]}`` on stdin and writes one ``{"reasoning", "content",
"tool_calls": [[name, arguments]]}`` per case, as vLLM's chat-completions server builds them with
``--reasoning-parser R --tool-call-parser T --enable-auto-tool-choice`` (no server: the same composed
parser class, the text decoded with the special tokens kept, as the parsers' ``adjust_request`` asks).
"""

import json
import sys

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.tokenizers import get_tokenizer


def main() -> None:
    job = json.load(sys.stdin)
    tokenizer = get_tokenizer(job["model_dir"])
    parser_cls = ParserManager.get_parser(
        tool_parser_name=job["tool_parser"],
        reasoning_parser_name=job["reasoning_parser"],
        enable_auto_tools=True,
        tokenizer=tokenizer,
    )
    results = []
    for case in job["cases"]:
        kwargs = {"enable_thinking": case["enable_thinking"]}
        request = ChatCompletionRequest(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            tools=case["tools"],
            chat_template_kwargs=kwargs,
        )
        parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs)
        text = tokenizer.decode(case["ids"], skip_special_tokens=False)
        reasoning, content, calls = parser.parse(
            text, request, enable_auto_tools=True, model_output_token_ids=case["ids"]
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
