"""Two steps per product: a short summary, then a category from a fixed list (choice).

A choice answers one of the choices on every card, whatever the card's engine (docs/functions.md, "Guided
output"): max_tokens=8 holds each category's tokens in the model's own tokenization."""
import forge

CATEGORIES = ["outdoor", "kitchen", "electronics", "fitness", "other"]


@forge.function(max_output_tokens=40)
async def categorize(record: dict, llm: forge.LLM) -> dict:
    summary = await llm.generate(f"Product: {record['text']}\nShort summary:", max_tokens=32)
    category = await llm.generate(f"Product: {summary.text.strip()}\nCategory:", max_tokens=8, choice=CATEGORIES)
    return {"id": record["id"], "summary": summary.text.strip(), "category": category.text}
