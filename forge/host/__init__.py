"""The card worker: one engine behind its admission runtime (engine_host.py), built from the card's
contract and plan, and the process that holds it (worker.py). Importing this package imports
nothing: a node process unpickles tokenizer.py's class without loading any engine library."""
