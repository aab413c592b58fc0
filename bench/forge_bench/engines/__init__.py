"""The test engines, registered only with forge-bench installed: `instant` (no model: synthetic
tokens at once, at a token rate, or CPU-bound steps; instant.py, instant_steps.py) and `faults` (any
backend with faults injected; faults.py)."""
