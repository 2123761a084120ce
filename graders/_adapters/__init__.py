"""In-process platform adapters: one grader as Ark, verl, TRL, Vertex and OpenAI expect it."""
