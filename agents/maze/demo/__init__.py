"""``rft demo``: the maze demo end to end (``demo``), its plans, model and warm start, the agent's
process, the report, the episode gallery, ``rft sft --maze-demos`` (``sft``) and the exact success
of a trained adapter (``maze_exact``). Imported by module; nothing is re-exported here."""
