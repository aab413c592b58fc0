"""The `vllm` engine backend: vLLM's v1 engine in the card worker, sized from the contract (never
from vLLM's device defaults). This module is a pluggy plugin and must import without vLLM: the
factory imports it."""
from __future__ import annotations

from forge.backends import Backend
from forge.engines.vllm import mapping
from forge.engines.vllm.section import VllmSection
from forge.engines.vllm.tunables import vllm_tunables
from forge.hookspecs import hookimpl

BACKEND = mapping.BACKEND
CONFIG_CHECK_TIMEOUT_S = 300        # a vLLM import on a busy small machine takes tens of seconds


def _factory(contract, plan):
    from forge.engines.vllm.factory import build_engine

    return build_engine(contract, plan)


def vllm_contract_rule(loaded) -> list:
    """`forge validate`: what vLLM would refuse or silently change in a vllm contract, before it
    loads."""
    return [
        p for c in loaded.contracts.values() if c.backend == BACKEND for p in mapping.problems(c)
    ]


def vllm_engine_check(contract, plan) -> list:
    """`forge validate`, where vLLM is importable: vLLM's own EngineArgs and model config built from
    the engine arguments forge would pass (no device touched), in a process of its own
    (forge/engines/vllm/config_check.py), each refusal at the contract's field
    (forge/engines/vllm/rules.py)."""
    import json
    import subprocess
    import sys

    from forge.errors import Problem

    where = mapping.where(contract)
    request = json.dumps([{"where": where, "arguments": mapping.engine_arguments(contract, plan)}])
    found, why = None, f"took over {CONFIG_CHECK_TIMEOUT_S} s"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "forge.engines.vllm.config_check"],
            input=request,
            capture_output=True,
            text=True,
            timeout=CONFIG_CHECK_TIMEOUT_S,
        )
        why = " ".join((proc.stderr.strip().splitlines() or ["no output"])[-1].split())[:200]
        found = (
            json.loads(proc.stdout.strip().splitlines()[-1])[0] if proc.returncode == 0 else None
        )
    except (subprocess.TimeoutExpired, ValueError, IndexError):
        pass
    if found is None:
        return [Problem(where, "$.vllm", "the installed vLLM could not build its configuration "
                                         "from this "
                        f"contract's engine arguments (its check process: {why}); the card may "
                        "still be refused "
                        f"at load", "warning")]
    return [Problem(where, path, message) for path, message in found]


BACKEND_OBJECT = Backend(
    name=BACKEND,
    factory=_factory,
    section=VllmSection,
    rules=(vllm_contract_rule,),
    engine_check=vllm_engine_check,
    engine_library="vllm",
    tunables=vllm_tunables,
    engine_arguments=mapping.engine_arguments,
    environment=mapping.environment,
    label="vLLM (v1 LLMEngine, engine core in process)",
)


@hookimpl
def forge_register_backend(register):
    register(BACKEND_OBJECT)
