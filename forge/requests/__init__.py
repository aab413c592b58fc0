"""The request rules, in one package: what a caller may ask of a node and what the node checks at
its edge.

    params.py        GenerateParams (with the checks every edge applies), Generation, RequestOptions below the edge
    prompt_bounds.py a prompt's checks and its length before tokenizing
    schema_check.py  a guided request's JSON Schema, refused up front when it cannot guide
    guided.py        the node's check of a guided output
    stops.py         stop strings applied to a finished generation
    messages.py      Chat: a prompt given as chat messages, checked where they come in
    chat_template.py chat messages to a prompt with the model's own template (chat_template_render.py: bounded)

Only forge/node (whose Node.submit applies them, once per request) imports the rules (prompt bounds,
schema check, guided check, stops, chat templates); everyone else imports the request types (params,
messages) from here or, for function authors, from forge/functions/api.py."""
from forge.requests.params import (DEFAULT_OPTIONS, REFUSED, GenerateParams, Generation, RequestOptions,  # noqa: F401
                                   params_problem, plain_token_ids, prompt_problem)

__all__ = ["REFUSED", "RequestOptions", "DEFAULT_OPTIONS", "Generation", "GenerateParams",
           "params_problem", "prompt_problem", "plain_token_ids"]
