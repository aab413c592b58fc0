import os
import sys

# Tests never load third-party entry points; built-ins register as usual.
os.environ.setdefault("FORGE_LOAD_PLUGINS", "")
sys._called_from_test = True  # type: ignore[attr-defined]
