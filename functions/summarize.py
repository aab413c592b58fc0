"""One generate per record: summarize a text."""
import forge


@forge.function(max_output_tokens=64)
async def summarize(record: dict, llm: forge.LLM) -> dict:
    out = await llm.generate(f"Summarize in one sentence:\n{record['text']}\nSummary:", max_tokens=48)
    return {"id": record["id"], "summary": out.text.strip(), "tokens": out.output_tokens}
