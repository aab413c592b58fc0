"""`forge contract new`: a transformers contract from a checkpoint's config.json and a card's
memory.

Every field is written out, each with a comment saying where its number came from
(forge/config/contract_yaml.py). The geometry is read from config.json strictly
(model_size.read_shape); the parameters from the safetensors headers when the folder has them
(compared with what the geometry gives), else from the geometry, so a card can be sized before the
weights are downloaded; the KV pool with the plan's own arithmetic (kvmath, plan.plan_card) and the
backend's working memory (transformers' attention mask), so `forge validate` and `forge provision
--dry-run` compute exactly what the comments say. Defaults follow the flags given (a --budget below
the default prompt length shortens the default prompt), and every refusal says its cause and the
flag that lifts it. Nothing here loads weights or imports torch."""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from forge.config import kvmath
from forge.config.contract_sizing import Lengths, Sizing, size_pool
from forge.config.checkpoint_dir import WEIGHT_GLOBS
from forge.config.files import FileRefused, read_json, shown
from forge.config.model_size import LongNumber, ModelShape, geometry_parameters, read_shape
from forge.config.models import Contract
from forge.config.plan import CardPlan
from forge.config.safetensors_count import count_safetensors
from forge.config.units import GIB, fmt_bytes
from forge.errors import ForgeError

BACKEND = "transformers"
DEFAULT_WEIGHTS = {"cpu": "fp32", "gpu": "bf16"}      # CPUs run fp32 kernels fastest; GPUs bf16
DEFAULT_BUDGET = {"cpu": 512, "gpu": 8192}  # tokens per step: a few prompts on a CPU, many on a GPU
DEFAULT_KV_FRACTION = 0.9
DEFAULT_OUTPUT_LEN = 256
DEFAULT_INPUT_LEN = 1024
DEFAULT_TOKENS_PER_BLOCK = 32
FEW_SLOTS = 8                   # below this the console says why the contract is small
COUNTS_AGREE = 0.01             # headers and geometry within 1%: the same model
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")     # models.Name


@dataclass
class Request:
    """What the user asked for (None: forge's default, derived from the other flags and said so in
    the comment)."""

    checkpoint: Path
    card: str                        # "cpu" | "gpu"
    memory_gib: float
    out: Path
    budget: Optional[int] = None
    slots: Optional[int] = None
    max_input_len: Optional[int] = None
    max_output_len: Optional[int] = None
    tokens_per_block: Optional[int] = None
    weights: Optional[str] = None
    kv_fraction: Optional[float] = None
    compute_capability: Optional[str] = None
    name: Optional[str] = None
    parameters: Optional[int] = None
    attn_implementation: Optional[str] = None


@dataclass
class Drafted:
    contract: Contract
    plan: CardPlan
    working_bytes: int
    full_length_slots: int
    # field -> how its number was reached (the comments)
    notes: dict[str, str] = field(default_factory=dict)
    # what the user should read now (counts differ, ...)
    console: list[str] = field(default_factory=list)
    weights_present: bool = True                               # False: sized from config.json alone


def section_for(attn_implementation: Optional[str]):
    """The backend's `transformers:` section at its defaults, with the attention the user chose."""
    from forge.config.registry import from_plugins

    model = from_plugins().sections.get(BACKEND)
    if model is None:
        raise ForgeError(f"the {BACKEND} backend is not registered (is forge installed whole?)")
    if attn_implementation is None:
        return model()
    try:
        return model.model_validate({"attn_implementation": attn_implementation})
    except Exception:           # pydantic's message names the allowed values
        allowed = model.model_fields["attn_implementation"].annotation.__args__
        raise ForgeError(f"--attn-implementation {attn_implementation}: "
                         "transformers.attn_implementation is one of "
                         f"{', '.join(allowed)}") from None


def _config(ckpt: Path) -> tuple[dict, Path, ModelShape]:
    if not ckpt.is_dir():
        raise ForgeError(f"{shown(ckpt)}: not a checkpoint folder (one holding config.json)")
    cfg_file = ckpt / "config.json"
    try:
        cfg = read_json(cfg_file, parse_int=LongNumber.parse_int)
    except FileRefused as e:
        raise ForgeError(f"{shown(cfg_file)}: {e}") from None
    return cfg, cfg_file, read_shape(cfg, cfg_file)


def _hold(headers) -> str:
    return "hold" if headers.files > 1 else "holds"


def _parameters(
    req: Request, cfg_file: Path, shape: ModelShape
) -> tuple[int, str, list[str], bool]:
    """(parameters, how they were counted, console notes, whether weights are in the folder)."""
    geo = geometry_parameters(shape)
    headers = count_safetensors(req.checkpoint)
    # *.bin: weights without headers to read
    present = any(any(req.checkpoint.glob(g)) for g in WEIGHT_GLOBS)
    console: list[str] = []
    geo_text = (f"config.json's geometry gives {geo.parameters:,}" if geo.parameters is not None
                else f"config.json's geometry cannot be counted ({geo.why})")
    if req.parameters is not None:
        seen = f"; the {headers.label} {_hold(headers)} {headers.parameters:,}" if headers else ""
        return req.parameters, f"--parameters{seen}; {geo_text}", console, present
    if headers is not None:
        how = f"{headers.label}; {geo_text}"
        if geo.parameters is not None:
            off = (geo.parameters - headers.parameters) / max(headers.parameters, 1)
            if abs(off) > COUNTS_AGREE:
                how += f", {off:+.1%}: the headers' count is used"
                console.append(f"note: the {headers.label} {_hold(headers)} {headers.parameters:,} "
                               "parameters; "
                               f"{shown(cfg_file)}'s "
                               f"geometry gives {geo.parameters:,} ({off:+.1%}). The headers' "
                               "count sizes the weights "
                               "(packed or quantized weights, extra tensors or another layout than "
                               "a Llama-style "
                               "decoder make the two differ); --parameters N states the count "
                               "instead")
            else:
                how += (
                    ", the same"
                    if geo.parameters == headers.parameters
                    else f", within {COUNTS_AGREE:.0%}"
                )
        return headers.parameters, how, console, True
    if geo.parameters is None:
        raise ForgeError(f"{shown(cfg_file)}: no *.safetensors weights in the folder and "
                         f"{geo.why}, so forge cannot "
                         "count the parameters: put the checkpoint's *.safetensors files beside "
                         "it, or state the "
                         "count with --parameters N (the model card's, e.g. 8030261248)")
    console.append(f"note: no *.safetensors in {shown(req.checkpoint)}: {geo.parameters:,} "
                   "parameters counted from "
                   "config.json's geometry" + ("" if present else
                                              "; `forge validate` refuses the contract until the "
                                              "weights are there"))
    return (geo.parameters, f"config.json's geometry: {geo.why}; no *.safetensors headers to "
                            "compare", console,
            present)


def _lengths(req: Request, shape: ModelShape, cfg_file: Path) -> Lengths:
    """max_input_len, max_output_len and max_num_tokens from the flags, each default derived from
    the flags given, or a refusal naming the flags that contradict each other or the model."""
    maxpos, kind, at = shape.max_position, req.card, "$.text_config." if shape.text_path else "$."
    pos_field = f"{shown(cfg_file)}::{at}max_position_embeddings {maxpos}"
    if req.max_input_len and req.budget and req.max_input_len > req.budget:
        raise ForgeError(f"--max-input-len {req.max_input_len} is above --budget {req.budget}: a "
                         "prompt is prefilled "
                         "in one engine step, so the budget (limits.max_num_tokens) must hold the "
                         "longest one: raise "
                         f"--budget to at least {req.max_input_len} or lower --max-input-len")
    if maxpos is not None and req.max_input_len and req.max_output_len and \
            req.max_input_len + req.max_output_len > maxpos:
        raise ForgeError(f"--max-input-len {req.max_input_len} + --max-output-len "
                         f"{req.max_output_len} exceed "
                         f"{pos_field}: the model cannot attend that far; shorten one of them")
    if maxpos is not None and (req.max_input_len or 0) >= maxpos:
        raise ForgeError(f"--max-input-len {req.max_input_len} leaves no room for output within "
                         f"{pos_field}: "
                         "lower it")
    if maxpos is not None and (req.max_output_len or 0) >= maxpos:
        raise ForgeError(f"--max-output-len {req.max_output_len} leaves no room for a prompt "
                         f"within {pos_field}: "
                         "lower it")
    notes: dict[str, str] = {}
    out_len = req.max_output_len or DEFAULT_OUTPUT_LEN
    notes["max_output_len"] = (
        "--max-output-len" if req.max_output_len else f"default {DEFAULT_OUTPUT_LEN}"
    )
    if (
        not req.max_output_len
        and maxpos is not None
        and req.max_input_len
        and req.max_input_len + out_len > maxpos
    ):
        out_len = maxpos - req.max_input_len
        notes["max_output_len"] += (
            f", cut so --max-input-len + output <= max_position_embeddings {maxpos}"
        )
    if req.max_input_len:
        in_len, notes["max_input_len"] = req.max_input_len, "--max-input-len"
    else:
        bounds = [(DEFAULT_INPUT_LEN, f"default {DEFAULT_INPUT_LEN}")]
        if req.budget:
            bounds.append(
                (req.budget, f"--budget {req.budget} (a prompt is prefilled in one step)")
            )
        if maxpos is not None:
            bounds.append((maxpos - out_len, f"max_position_embeddings {maxpos} - max_output_len "
                                             f"{out_len}"))
        in_len, why = min(bounds)
        notes["max_input_len"] = (
            why if in_len == DEFAULT_INPUT_LEN else f"default {DEFAULT_INPUT_LEN}, cut to {why}"
        )
    if req.budget:
        budget, notes["max_num_tokens"] = req.budget, "--budget"
    else:
        budget = min(max(DEFAULT_BUDGET[kind], in_len, req.slots or 0), 2**31 - 1)
        notes["max_num_tokens"] = (
            f"default for a {kind} card: max({DEFAULT_BUDGET[kind]}, "
            f"max_input_len {in_len}"
            + (f", --slots {req.slots}" if req.slots else "")
            + ") so a full-length prompt "
            "fits one step" + (" and every slot can decode in one" if req.slots else "")
        )
    return Lengths(in_len, out_len, budget, notes)


def draft(req: Request) -> Drafted:
    """The contract for `req` and its plan on the card, or a ForgeError naming what is missing or
    does not fit."""
    if req.card == "gpu" and req.compute_capability is None:
        raise ForgeError("--card gpu needs --compute-capability (e.g. 9.0 for an H100/H200): a GPU "
                         "engine runs on "
                         "the capability it was planned for")
    if req.name is not None and not NAME_PATTERN.match(req.name):
        raise ForgeError(f"--name {req.name!r}: a contract name is 1-128 letters, digits, '.', '_' "
                         "or '-', starting "
                         "with a letter or digit")
    cfg, cfg_file, shape = _config(req.checkpoint)
    section = section_for(req.attn_implementation)
    params, counted_from, console, weights_present = _parameters(req, cfg_file, shape)
    weights_prec = req.weights or DEFAULT_WEIGHTS[req.card]
    dtype_bytes = kvmath.KV_DTYPE_BYTES[weights_prec]
    # rounded up: never understated
    weights_gib = math.ceil(params * dtype_bytes / GIB * 1000) / 1000
    lengths = _lengths(req, shape, cfg_file)
    notes = {"weights_gib": f"{params:,} parameters ({counted_from}) x {dtype_bytes} bytes "
                            f"({weights_prec}) = "
                            f"{fmt_bytes(params * dtype_bytes)}, rounded up to 0.001 GiB",
             "precision": ("--weights" if req.weights else f"the default for a {req.card} card") +
                          "; transformers keeps the KV cache in the model's dtype, so kv_cache is "
                          "the same",
             "tokens_per_block": "--tokens-per-block" if req.tokens_per_block else
                                 f"default {DEFAULT_TOKENS_PER_BLOCK}",
             "attn_implementation": "--attn-implementation" if req.attn_implementation else
                                    "the backend's default (--attn-implementation changes it)",
             **lengths.notes}
    sizing = Sizing(
        req=req,
        shape=shape,
        weights_gib=weights_gib,
        precision=weights_prec,
        lengths=lengths,
        tpb=req.tokens_per_block or DEFAULT_TOKENS_PER_BLOCK,
        fraction=req.kv_fraction or DEFAULT_KV_FRACTION,
        section=section,
        name=req.name or _name_for(req.checkpoint, req.card),
        checkpoint=_artifact_path(req),
    )
    pool = size_pool(sizing)
    notes.update(pool.notes)
    if pool.slots < FEW_SLOTS and not req.slots:
        console.append(pool.few_slots_note)
    return Drafted(
        contract=pool.contract,
        plan=pool.plan,
        working_bytes=pool.working_bytes,
        full_length_slots=pool.full,
        notes=notes,
        console=console,
        weights_present=weights_present,
    )


def _artifact_path(req: Request) -> str:
    art = os.path.relpath(os.path.abspath(req.checkpoint), os.path.abspath(req.out.parent))
    # not below the contract's folder
    return os.path.abspath(req.checkpoint) if art.startswith("..") else art


def _name_for(ckpt: Path, kind: str) -> str:
    base = (
        re.sub(r"[^A-Za-z0-9._-]+", "-", Path(os.path.abspath(ckpt)).name).strip("-._") or "model"
    )
    return f"{base[:120]}-{kind}"

