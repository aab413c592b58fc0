"""forge: provisioning and function deployment for bulk LLM generation.

The public API for function authors is small and imports nothing heavy:

    import forge

    @forge.function(max_output_tokens=128)
    async def summarize(record: dict, llm: forge.LLM) -> dict: ...
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["function", "LLM", "Generation", "__version__"]


def __getattr__(name: str):
    # Lazy so that `import forge` stays cheap (the CLI and the config loader never need the
    # runtime).
    if name in ("function", "LLM", "Generation"):
        from forge.functions import api

        return getattr(api, name)
    raise AttributeError(f"module 'forge' has no attribute {name!r}")
