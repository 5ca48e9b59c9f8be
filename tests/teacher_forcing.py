"""The learner's view of a recorded call, for the tests that compare it with the sampler's logprobs."""

from __future__ import annotations

import torch

from policy_server.trace import CallRecord


def teacher_forced_logprobs(model: torch.nn.Module, call: CallRecord) -> list[float]:
    ids = torch.tensor([call.prompt_token_ids + call.completion_token_ids])
    with torch.no_grad():
        logits = model(ids).logits.float()
    start = len(call.prompt_token_ids)
    logprobs = torch.log_softmax(logits[0, start - 1 : -1], dim=-1)
    return logprobs.gather(-1, torch.tensor(call.completion_token_ids)[:, None])[:, 0].tolist()
