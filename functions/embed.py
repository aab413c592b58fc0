"""The final hidden state of each record's text (the backend's embedding)."""
import math

import forge


@forge.function(max_output_tokens=1)
async def embed(record: dict, llm: forge.LLM) -> dict:
    vec = await llm.embed(record["text"])
    norm = math.sqrt(sum(v * v for v in vec)) or 1.0
    return {"id": record["id"], "dim": len(vec), "embedding": [round(v / norm, 5) for v in vec]}
