"""`forge serve`: deployed functions and OpenAI-compatible generation as HTTP endpoints
(docs/serve.md)."""
