"""The one plugin manager. Built-ins are registered through the same path as installed plugins."""
from __future__ import annotations

import importlib
import os

import pluggy

from forge import hookspecs

# Built-in plugins: modules with @hookimpl functions. They must import without torch/transformers.
DEFAULT_PLUGINS = (
    "forge.engines.transformers.backend",
    "forge.engines.trtllm.backend",
    "forge.engines.vllm.backend",
    "forge.hardware.probe",
)

pm = pluggy.PluginManager("forge")
pm.add_hookspecs(hookspecs)
_loaded = False


def load_plugins() -> pluggy.PluginManager:
    """Register built-ins and installed entry points once; FORGE_LOAD_PLUGINS=a,b limits third-party
    ones."""
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    for name in DEFAULT_PLUGINS:
        mod = importlib.import_module(name)
        if not pm.is_registered(mod):
            pm.register(mod, name=name)
    only = os.environ.get("FORGE_LOAD_PLUGINS")
    if only is None:
        pm.load_setuptools_entrypoints("forge")
    else:
        for dotted in filter(None, (s.strip() for s in only.split(","))):
            mod = importlib.import_module(dotted)
            if not pm.is_registered(mod):
                pm.register(mod, name=dotted)
    pm.check_pending()
    return pm


def collect(hook_name: str) -> list[tuple]:
    """Call a register-style hook and return every registered tuple of arguments, in call order."""
    load_plugins()
    out: list[tuple] = []
    getattr(pm.hook, hook_name)(register=lambda *args: out.append(args))
    return out
