"""`pytest.importorskip` for a whole module, without the import.

A module-level `pytest.importorskip("vllm")` imports vLLM (seconds, and Ray, torch and transformers
with it) while pytest merely collects the module, also where the module's tests are then deselected
(plain `python -m pytest` runs the fast ones only). `skip_module_unless_installed` asks only whether
the library is installed (importlib.util.find_spec: its top-level package is found on the path,
nothing of it is run) and skips the module, with importorskip's own message, where it is not; the
tests import the library when they run.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

import pytest


def skip_module_unless_installed(*names: str, reason: Optional[str] = None) -> None:
    """Skips the calling module (at collection, as a module-level importorskip would) unless every
    top-level package in `names` is installed."""
    # the skip is reported at the calling module's line, as importorskip's is
    __tracebackhide__ = True
    for name in names:
        if "." in name:
            raise ValueError(f"{name!r}: top-level packages only (find_spec of a submodule imports "
                             "its parent)")
        if importlib.util.find_spec(name) is None:
            pytest.skip(
                reason or f"could not import {name!r}: No module named {name!r}",
                allow_module_level=True,
            )
