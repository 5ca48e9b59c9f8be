"""An agent written for SageMaker AI's Multi-Turn RL with AWS's own SDK (``sagemaker-train``), as that
service's users write one, importing nothing of rftkit. The suite runs it, unchanged, from an environment
that holds only that SDK, Strands and AgentCore, and trains against it with ``rft train``.

It reads the row from the service's ``prompt`` (a JSON string), calls the policy through a Strands
``OpenAIModel`` wrapped by the SDK's ``wrap_model`` (rollout headers, sampling parameters), signs with
the SDK's bearer token, and lets ``sagemaker_rft_handler`` report the reward. The reward is shaped
(the share of digits in the answer, plus one when it is right) so a random tiny policy gets varied
rewards. ``python main.py PORT`` serves it on 127.0.0.1.
"""

from __future__ import annotations

import json
import logging
import os
import sys

import openai
from bedrock_agentcore.runtime import BedrockAgentCoreApp
from sagemaker.core.token_generator import generate_token
from sagemaker.train.rft import sagemaker_rft_handler
from sagemaker.train.rft.adapters.strands import wrap_model
from strands import Agent
from strands.models.openai import OpenAIModel
from strands.types.exceptions import MaxTokensReachedException

SYSTEM_PROMPT = "Answer the arithmetic question with a number."

app = BedrockAgentCoreApp()


def _text(message: dict) -> str:
    return "".join(block.get("text", "") for block in message.get("content", []))


def shaped_reward(answer_text: str, answer: int) -> float:
    digits = sum(character.isdigit() for character in answer_text)
    share = digits / len(answer_text) if answer_text else 0.0
    return share + (1.0 if str(answer) in answer_text else 0.0)


@app.entrypoint
@sagemaker_rft_handler
async def invoke(payload: dict) -> dict:
    row = json.loads(payload["prompt"])
    endpoint = payload["metadata"]["endpoint"]
    model = wrap_model(
        OpenAIModel(
            client_args={
                "base_url": f"{endpoint}/v1",
                "api_key": generate_token(region=os.environ["AWS_REGION"]),
            },
            model_id="default",
        )
    )
    agent = Agent(model=model, system_prompt=SYSTEM_PROMPT, callback_handler=None)
    try:
        await agent.invoke_async(row["question"])
    except (MaxTokensReachedException, openai.BadRequestError):
        pass  # a cut-off answer is scored as it stands (Strands keeps it in the history)
    answer_text = _text(agent.messages[-1]) if agent.messages[-1]["role"] == "assistant" else ""
    return {"reward": shaped_reward(answer_text, row["answer"])}


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    app.run(port=int(sys.argv[1]))
