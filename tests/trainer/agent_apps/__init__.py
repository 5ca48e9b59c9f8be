"""Small real agent apps (BedrockAgentCoreApp via rft_app) that the trainer's tests train against."""
