"""Run with vLLM's python: parse completions with vLLM's own tool-call and reasoning parsers of a family.

Reads jobs from stdin, one JSON line each: ``{"model_dir": ..., "tool_parser": ..., "reasoning_parser":
..., "harmony": bool (optional), "environ": {name: value} (optional, set first), "cases": [{"ids": [...]
or "text": "...", "tools": [...] | null (optional), "enable_thinking": bool (optional)}]}``; for each,
writes one line ``ANSWER {"parsed": [...]}`` (or ``ANSWER {"error": traceback}``) with one
``{"reasoning", "content", "tool_calls": [[name, arguments]]}`` per case, as vLLM's chat-completions
server builds them with ``--reasoning-parser R --tool-call-parser T --enable-auto-tool-choice`` (no
server: the same composed parser class). ``tests/vllm_parsers.py`` keeps one such process for a
pytest worker.

A case's ``ids`` are decoded with the special tokens kept, as the parsers' ``adjust_request`` asks; a
``text`` is encoded with the model's tokenizer. ``harmony``: gpt-oss, which vLLM reads as o200k ids,
so each text is encoded with openai-harmony's encoding (TIKTOKEN_ENCODINGS_BASE names the vocabulary's
folder) and no ``model_dir`` is needed.
"""

import json
import os
import sys
import traceback
from typing import Any

from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager


class HarmonyTokenizer:
    """What vLLM's harmony parser decodes a broken message's raw tokens with: openai-harmony's o200k."""

    def __init__(self) -> None:
        from openai_harmony import HarmonyEncodingName, load_harmony_encoding

        self.encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")

    def decode(self, ids: list[int], **kwargs: object) -> str:
        return self.encoding.decode(ids)


def _parse(job: dict[str, Any], tokenizer: Any, parser_cls: Any, case: dict[str, Any]) -> dict[str, Any]:
    ids = case["ids"] if "ids" in case else tokenizer.encode(case["text"], add_special_tokens=False)
    text = case["text"] if "text" in case else tokenizer.decode(ids, skip_special_tokens=False)
    if job.get("harmony"):
        request, parser = None, parser_cls(tokenizer)
    else:
        kwargs = {"enable_thinking": case.get("enable_thinking", False)}
        request = ChatCompletionRequest(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            tools=case.get("tools"),
            chat_template_kwargs=kwargs,
        )
        parser = parser_cls(tokenizer, request.tools, chat_template_kwargs=kwargs)
    reasoning, content, calls = parser.parse(
        text, request, enable_auto_tools=True, model_output_token_ids=ids
    )
    return {
        "reasoning": reasoning,
        "content": content,
        "tool_calls": [[call.name, call.arguments] for call in calls or []],
    }


ANSWER = "ANSWER "  # vLLM logs to stdout too: the answers are the lines that start with this


def parse_job(job: dict[str, Any]) -> list[dict[str, Any]]:
    os.environ.update(job.get("environ", {}))
    if job.get("harmony"):
        tokenizer: Any = HarmonyTokenizer()
        extra: dict[str, Any] = {"is_harmony": True}
    else:
        from vllm.tokenizers import get_tokenizer

        tokenizer = get_tokenizer(job["model_dir"])
        extra = {"tokenizer": tokenizer}
    parser_cls = ParserManager.get_parser(
        tool_parser_name=job["tool_parser"],
        reasoning_parser_name=job["reasoning_parser"],
        enable_auto_tools=True,
        **extra,
    )
    return [_parse(job, tokenizer, parser_cls, case) for case in job["cases"]]


def main() -> None:
    for line in sys.stdin:
        try:
            answer: dict[str, Any] = {"parsed": parse_job(json.loads(line))}
        except Exception:  # the test that sent the job shows it; the next job is parsed as usual
            answer = {"error": traceback.format_exc()}
        print(ANSWER + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
