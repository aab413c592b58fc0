"""The `transformers` engine backend: Hugging Face transformers' continuous batching (in-flight
batching over a paged KV cache), on CPU or on one GPU.

This module is a pluggy plugin and must import without torch/transformers: the heavy imports happen
inside the factory (forge/engines/transformers/). It registers the backend as one object
(forge.backends.Backend) with its contract section, `transformers:`
(forge/engines/transformers/section.py).
"""
from __future__ import annotations

from forge.backends import Backend
from forge.engines.transformers import attention_memory, graph_shapes, tunables
from forge.engines.transformers.section import BACKEND, TransformersSection
from forge.engines.transformers.sizing import cb_config_kwargs, dtype_of, section_of
from forge.hookspecs import hookimpl

__all__ = ["BACKEND", "TransformersSection"]


def _factory(contract, plan):
    from forge.engines.transformers.factory import build_engine

    return build_engine(contract, plan)


def _engine_arguments(contract, plan):
    """What the factory hands transformers: the continuous-batching config, and the load's dtype and
    attention."""
    section = section_of(plan)
    return {"dtype": dtype_of(plan, section), "attn_implementation": section.attn_implementation,
            "continuous_batching_config": cb_config_kwargs(plan, section)}


BACKEND_OBJECT = Backend(
    name=BACKEND,
    factory=_factory,
    section=TransformersSection,
    tunables=tunables.transformers_tunables,
    working_memory=attention_memory.working_memory,
    rules=(
        tunables.gpu_only_switches,
        tunables.graph_padding_fits,
        attention_memory.eager_scores_fit,
        attention_memory.attention_masks_fit,
        graph_shapes.cache_problems,
    ),
    engine_arguments=_engine_arguments,
    label="Hugging Face transformers continuous batching",
)


@hookimpl
def forge_register_backend(register):
    register(BACKEND_OBJECT)
