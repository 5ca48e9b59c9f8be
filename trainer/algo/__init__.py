"""GRPO's arithmetic: rollouts' traces as training sequences (``sequences``, with the repo's one padding
routine), the clipped loss and group advantages (``grpo``), token logprobs (``logprobs``).
Imported by module (``from trainer.algo.grpo import grpo_loss``); nothing is re-exported here."""
