"""Playing rollouts: requests to the agents and their outcomes (``fanout``), the event loop they play
on (``producer``), which step's rollouts start when (``pipeline``), evaluations (``evaluation``) and
the rows they are played on (``dataset``). Imported by module; nothing is re-exported here."""
