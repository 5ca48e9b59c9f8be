"""The Wordle reference agent: one ``guess_word`` tool, six guesses, reward computed inside the agent."""
