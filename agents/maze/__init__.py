"""The maze agent: a policy walks a small grid maze with a ``move`` tool; reward 1.0 at the goal."""
