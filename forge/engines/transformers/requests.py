"""Per-request checks and sampling for the transformers engine. Pure functions (no torch).

transformers' continuous batching picks tokens with one engine-wide rule: `do_sample` and the logits
processors are fixed when the manager is built. With `per_request_processors` the temperature, top-k
and top-p processors read each request's own values, but only if the engine-wide generation config
created them; and there is one random generator per engine; a per-request seed is honoured by a
processor of forge's (seeded.py) that draws a seeded request's tokens with its own generator, on the
eager loop. Hence:

- sampling "per_request": do_sample on, the three processors created with placeholder defaults, and
  every request passes all three values (greedy requests as top_k=1), so the placeholders are never
  used by a request;
- sampling "greedy": no processors, argmax; requests asking for temperature > 0 are refused;
- a sampled request (temperature > 0) with a seed is refused where the seeded processor is not
  installed (greedy mode, or a CUDA graph / compiled / async loop).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from forge import constants
from forge.engines.interface import EngineRequest, Sampling, sampling_problem

# Placeholders that make transformers create the per-request processors (1.0 / 0 / >=1.0 would not).
_PLACEHOLDER_TEMPERATURE = 0.5
_PLACEHOLDER_TOP_P = 0.99


def is_greedy(s: Sampling) -> bool:
    return s.temperature == 0 or s.top_k == 1


def refusal(req: EngineRequest, *, max_input_len: int, max_output_len: int, vocab_size: int,
            sampling_mode: str, guides: frozenset = frozenset(), no_guides_why: str = "",
            seeds: bool = False) -> Optional[str]:
    """Why this engine cannot take the request as asked, or None. Refused requests come back as
    error results."""
    n = len(req.prompt_ids)
    if n == 0:
        return "empty prompt"
    if n > max_input_len:
        return f"prompt has {n} tokens; the contract's max_input_len is {max_input_len}"
    if not 0 <= req.max_new_tokens <= max_output_len:
        return (f"max_new_tokens {req.max_new_tokens} is outside 0..{max_output_len} (the "
                "contract's max_output_len)")
    bad = next(
        (t for t in req.prompt_ids if not (isinstance(t, int) and 0 <= t < vocab_size)), None
    )
    if bad is not None:
        return f"prompt token {bad!r} is outside the vocabulary (0..{vocab_size - 1})"
    if req.guide is not None:
        g = req.guide
        kinds = [k for k in ("choice", "json_schema", "regex") if getattr(g, k) is not None]
        if len(kinds) != 1:
            return ("a guide needs exactly one of choice, json_schema, regex (got "
                    f"{kinds or 'none'})")
        if kinds[0] not in guides:
            why = no_guides_why or f"this engine supports {sorted(guides)}"
            return (f"guided output of kind {kinds[0]} is not supported by the transformers "
                    f"backend here: {why}")
        if not req.sampling.stop_at_eos:
            return "a guided request must stop at EOS (the guide ends the output with it)"
    why = sampling_problem(req.sampling)
    if why is not None:
        return why
    s = req.sampling
    if is_greedy(s):
        return None
    if sampling_mode == "greedy":
        return (f"temperature {s.temperature} asked, but this engine decodes greedily "
                "(transformers.sampling: greedy); "
                "use temperature 0 or a contract with sampling: per_request")
    if s.seed is not None and not seeds:
        return ("a per-request seed cannot be honoured here: per-request seeds need the eager loop "
                f"({no_guides_why or 'this engine has no seeded sampler'}); leave seed unset or "
                "use temperature 0")
    return None


def loop_kwargs_problem(kwargs: dict[str, Any]) -> Optional[str]:
    """The same limits on the values a request hands the loop's processors (what `processor_kwargs`
    made)."""
    t, p, k = kwargs.get("temperature", 1.0), kwargs.get("top_p", 1.0), kwargs.get("top_k", 1)
    if not (isinstance(t, float) and math.isfinite(t) and t > 0):
        return f"temperature {t!r}"
    if not (isinstance(p, float) and math.isfinite(p) and 0 < p <= 1):
        return f"top_p {p!r}"
    if not (isinstance(k, int) and 1 <= k <= constants.INT32_MAX):
        return f"top_k {k!r}"
    return None


def processor_kwargs(s: Sampling, *, sampling_mode: str, vocab_size: int) -> dict[str, Any]:
    """The per-request values handed to the manager's add_request(**kwargs); empty in greedy
    mode."""
    if sampling_mode == "greedy":
        return {}
    if is_greedy(s):
        return {"temperature": 1.0, "top_k": 1, "top_p": 1.0}
    # top_k beyond the vocabulary keeps every token, as top_k 0 does
    return {
        "temperature": float(s.temperature),
        "top_k": min(int(s.top_k), vocab_size) if s.top_k > 0 else vocab_size,
        "top_p": float(s.top_p),
    }


def generation_config_kwargs(*, sampling_mode: str, vocab_size: int, eos_token_id, pad_token_id,
                             bos_token_id, max_output_len: int) -> dict[str, Any]:
    """The engine-wide GenerationConfig: the decoding rule, and EOS as the model defines it."""
    common = dict(eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                  max_new_tokens=max_output_len, num_return_sequences=1)
    if sampling_mode == "greedy":
        return dict(common, do_sample=False)
    return dict(common, do_sample=True, temperature=_PLACEHOLDER_TEMPERATURE, top_k=vocab_size,
                top_p=_PLACEHOLDER_TOP_P)
