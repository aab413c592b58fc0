"""Helpers of the `transformers` engine backend (forge/engines/transformers_backend.py). Only the factory imports
torch/transformers; sizing.py and requests.py are pure mappings."""
