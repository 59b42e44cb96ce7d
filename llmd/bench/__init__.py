"""`llmd bench`: streaming quality and speed of any OpenAI-compatible server, or of llmd in-process."""
