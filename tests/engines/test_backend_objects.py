"""A backend is one object (forge.backends.Backend) registered through one hook; built-ins and third
parties alike. What each built-in declares, and what the registry refuses."""
from __future__ import annotations

import sys
import types

import pytest

from forge import plugins
from forge import backends
from forge.errors import ForgeError
from forge.hookspecs import hookimpl


def test_every_built_in_is_one_object():
    got = backends.registered()
    assert sorted(got) == ["faults", "instant", "transformers", "trtllm", "vllm"]
    assert {n: b.section.__name__ if b.section else None for n, b in got.items()} == {
        "faults": "FaultsSection",
        "instant": "InstantSection",
        "transformers": "TransformersSection",
        "trtllm": "TrtllmSection",
        "vllm": "VllmSection",
    }
    assert {n for n, b in got.items() if b.engine_arguments} == {"transformers", "trtllm", "vllm"}
    assert {n for n, b in got.items() if b.working_memory} == {"transformers"}
    assert len(got["transformers"].rules) == 5 and len(got["vllm"].rules) == 1


def test_the_plugin_modules_import_without_engine_libraries():
    import subprocess

    code = ("import sys; from forge.backends import registered; registered(); "
            "print([m for m in ('torch', 'transformers', 'vllm', 'tensorrt_llm') if m in "
            "sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "[]", out.stderr


def test_no_import_circle_between_the_transformers_plugin_and_its_helpers():
    import subprocess

    for first in (
        "forge.engines.transformers.sizing",
        "forge.engines.transformers.graph_shapes",
        "forge.engines.transformers.attention_memory",
    ):
        code = (f"import {first}; import sys; print('forge.engines.transformers.backend' in "
                "sys.modules)")
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        # the helpers never need the plugin module
        assert out.stdout.strip() == "False", (first, out.stderr)


@pytest.fixture
def third_party():
    mod = types.ModuleType("forge_test_backend")

    @hookimpl
    def forge_register_backend(register):
        register(backends.Backend(name="echo-test", factory=lambda contract, plan: None))

    mod.forge_register_backend = forge_register_backend
    plugins.load_plugins()
    plugins.pm.register(mod, name="forge_test_backend")
    try:
        yield mod
    finally:
        plugins.pm.unregister(mod)


def test_a_third_party_backend_registers_the_same_way(third_party):
    from forge.config.registry import from_plugins

    assert "echo-test" in backends.registered() and "echo-test" in from_plugins().backends


def test_a_name_registered_twice_is_refused(third_party):
    twin = types.ModuleType("forge_test_twin")

    @hookimpl
    def forge_register_backend(register):
        register(backends.Backend(name="echo-test", factory=lambda contract, plan: None))

    twin.forge_register_backend = forge_register_backend
    plugins.pm.register(twin, name="forge_test_twin")
    try:
        with pytest.raises(ForgeError, match="backend 'echo-test' is registered twice"):
            backends.registered()
    finally:
        plugins.pm.unregister(twin)
