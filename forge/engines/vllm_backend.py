"""The `vllm` engine backend: vLLM's v1 engine in the card worker, sized from the contract (never from vLLM's
device defaults). This module is a pluggy plugin and must import without vLLM: the factory imports it."""
from __future__ import annotations

from forge.backends import Backend
from forge.engines.vllm import mapping
from forge.engines.vllm.section import VllmSection
from forge.engines.vllm.tunables import vllm_tunables
from forge.hookspecs import hookimpl

BACKEND = mapping.BACKEND


def _factory(contract, plan):
    from forge.engines.vllm.factory import build_engine

    return build_engine(contract, plan)


def vllm_contract_rule(loaded) -> list:
    """`forge validate`: what vLLM would refuse or silently change in a vllm contract, before it loads."""
    return [p for c in loaded.contracts.values() if c.backend == BACKEND for p in mapping.problems(c)]


BACKEND_OBJECT = Backend(name=BACKEND, factory=_factory, section=VllmSection, rules=(vllm_contract_rule,),
                         tunables=vllm_tunables, engine_arguments=mapping.engine_arguments,
                         environment=mapping.environment, label="vLLM (v1 LLMEngine, engine core in process)")


@hookimpl
def forge_register_backend(register):
    register(BACKEND_OBJECT)
