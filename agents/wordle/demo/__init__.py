"""``rft demo --task wordle``: a policy learns the SageMaker service's own task, Wordle, through the
real Strands agent (``demo``); its plans (``plans``), the secrets, model and warm start (``model``),
the solver whose games warm-start it (``solver``) and the report as the service bills a run
(``report``). Imported by module; nothing is re-exported here."""
