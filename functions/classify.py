"""Guided output: pick a topic from a fixed catalog (choice) and fill a small typed record (json_schema).

Both outputs are guaranteed to parse: the engine masks every token the guide does not allow, and forge checks
the result before handing it out. Served online with `forge serve functions/classify.py`."""
import json

import forge

CATALOG = ["weather", "travel", "trade", "news from abroad", "schooling", "public works", "other"]

SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {
        "topic": {"enum": CATALOG},
        "urgent": {"type": "boolean"},
        "keywords": {"type": "array", "items": {"type": "string", "maxLength": 24}, "maxItems": 3},
    },
    "required": ["topic", "urgent", "keywords"],
}


@forge.function(max_output_tokens=64)
async def classify(record: dict, llm: forge.LLM) -> dict:
    text = record["text"]
    topic = await llm.generate(f"Text: {text}\nTopic:", max_tokens=8, choice=CATALOG)
    card = await llm.generate(f"Text: {text}\nAs JSON:", max_tokens=64, json_schema=SUMMARY_SCHEMA)
    return {"id": record.get("id"), "topic": topic.text, "card": json.loads(card.text),
            "tokens": topic.output_tokens + card.output_tokens}
