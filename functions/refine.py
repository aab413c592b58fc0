"""Two dependent generates per record: a draft, then a refinement that reads the draft."""
import forge


@forge.function(max_output_tokens=64)
async def refine(record: dict, llm: forge.LLM) -> dict:
    draft = await llm.generate(f"Write a title for:\n{record['text']}\nTitle:", max_tokens=24)
    better = await llm.generate(f"Text:\n{record['text']}\nDraft title: {draft.text.strip()}\nBetter title:",
                                max_tokens=24)
    return {"id": record["id"], "draft": draft.text.strip(), "title": better.text.strip(),
            "tokens": draft.output_tokens + better.output_tokens}
