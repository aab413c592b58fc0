"""Engine backends. Each backend is one module registered as a pluggy plugin (see
forge/plugins.py)."""
