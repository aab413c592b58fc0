"""Hugging Face transformers as a forge engine (continuous batching over a paged KV cache):
backend.py (the plugin: its Backend object), section.py (the `transformers:` contract section),
sizing.py and requests.py (pure mappings), factory.py (builds the engine; only it imports
torch/transformers). Inside this package `import transformers` is absolute and gets the library."""
