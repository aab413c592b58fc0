"""vLLM as a forge engine: backend.py (the plugin: its Backend object), section.py (the `vllm:`
contract section), mapping.py (contract -> engine arguments, pure), engine.py (the Engine over
vLLM's LLMEngine, imported only in the card worker)."""
