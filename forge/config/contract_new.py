"""`forge contract new`: a transformers contract from a checkpoint's config.json and a card's memory.

Every field is written out, each with a comment saying where its number came from. The geometry is read from
config.json (checkpoint_dir.geometry, the reading validation checks the contract against); the weights from the
safetensors headers (parameter count x the weights' bytes); the KV pool with the plan's own arithmetic
(kvmath.pool_tokens, plan.plan_card) and the backend's working memory (its forge_register_working_memory hook),
so `forge validate` and `forge provision --dry-run` compute exactly what the comments say. Nothing here loads
weights or imports torch."""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from forge.config import kvmath
from forge.config.checkpoint_dir import geometry
from forge.config.files import FileRefused, read_json
from forge.config.models import Artifact, Card, Contract, KvCache, Limits, ModelGeometry, Precision, Target
from forge.config.plan import CardPlan, plan_card
from forge.config.units import GIB, fmt_bytes
from forge.errors import ForgeError, display_path

BACKEND = "transformers"
DEFAULT_WEIGHTS = {"cpu": "fp32", "gpu": "bf16"}      # CPUs run fp32 kernels fastest; GPUs bf16
DEFAULT_BUDGET = {"cpu": 512, "gpu": 8192}            # tokens per step: a few prompts on a CPU, many on a GPU
DEFAULT_KV_FRACTION = 0.9
DEFAULT_OUTPUT_LEN = 256
DEFAULT_INPUT_LEN = 1024
DEFAULT_TOKENS_PER_BLOCK = 32
MAX_DEFAULT_SLOTS = 256
_SAFETENSORS_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                            "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_MAX_HEADER = 100 << 20


@dataclass
class Request:
    """What the user asked for (None: forge's default, said so in the comment)."""

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


@dataclass
class Drafted:
    contract: Contract
    plan: CardPlan
    working_bytes: int
    yaml: str
    notes: dict[str, str] = field(default_factory=dict)


def count_parameters(ckpt: Path) -> tuple[int, str]:
    """Parameters in the checkpoint's *.safetensors files (read from their headers), and how that was found."""
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise ForgeError(f"{display_path(ckpt)}: no *.safetensors weights to count parameters from "
                         "(contract new reads their headers, never the weights)")
    total = 0
    for f in files:
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > _MAX_HEADER:
                    raise ValueError(f"header of {n} bytes")
                header = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error) as e:
            raise ForgeError(f"{display_path(f)}: not a readable safetensors file: {e}") from None
        for name, t in header.items():
            if name != "__metadata__":
                total += math.prod(t.get("shape") or [1])
    shown = files[0].name if len(files) == 1 else f"{len(files)} *.safetensors files"
    return total, f"{shown} header{'s' if len(files) > 1 else ''}"


def draft(req: Request) -> Drafted:
    """The contract for `req` and its plan on the card, or a ForgeError naming what is missing or does not fit."""
    ckpt = req.checkpoint
    if not ckpt.is_dir():
        raise ForgeError(f"{display_path(ckpt)}: not a checkpoint folder (one holding config.json)")
    try:
        cfg = read_json(ckpt / "config.json")
    except FileRefused as e:
        raise ForgeError(f"{display_path(ckpt / 'config.json')}: {e}") from None
    geo = geometry(cfg)
    for key, hf in (("num_layers", "num_hidden_layers"), ("num_kv_heads", "num_key_value_heads"),
                    ("head_dim", "head_dim (or hidden_size / num_attention_heads)"), ("vocab_size", "vocab_size")):
        if not isinstance(geo[key], int) or geo[key] <= 0:
            raise ForgeError(f"{display_path(ckpt / 'config.json')}: has no {hf}; a contract needs the model's {key}")
    archs = cfg.get("architectures")
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        raise ForgeError(f"{display_path(ckpt / 'config.json')}: names no architectures")
    maxpos = geo["max_position_embeddings"] if isinstance(geo["max_position_embeddings"], int) else None

    kind = req.card
    if kind == "gpu" and req.compute_capability is None:
        raise ForgeError("--card gpu needs --compute-capability (e.g. 9.0 for an H100/H200): a GPU engine runs on "
                         "the capability it was planned for")
    weights_prec = req.weights or DEFAULT_WEIGHTS[kind]
    params, counted_from = count_parameters(ckpt)
    dtype_bytes = kvmath.KV_DTYPE_BYTES[weights_prec]
    weights_gib = math.ceil(params * dtype_bytes / GIB * 1000) / 1000      # rounded up: never understated
    notes: dict[str, str] = {
        "weights_gib": f"{params:,} parameters ({counted_from}) x {dtype_bytes} bytes ({weights_prec}) = "
                       f"{fmt_bytes(params * dtype_bytes)}, rounded up to 0.001 GiB",
        "precision": ("--weights" if req.weights else f"the default for a {kind} card") +
                     "; transformers keeps the KV cache in the model's dtype, so kv_cache is the same",
    }

    out_len = req.max_output_len or DEFAULT_OUTPUT_LEN
    in_len = req.max_input_len or DEFAULT_INPUT_LEN
    if maxpos is not None and req.max_input_len is None and in_len + out_len > maxpos:
        in_len = maxpos - out_len
    notes["max_output_len"] = "--max-output-len" if req.max_output_len else f"default {DEFAULT_OUTPUT_LEN}"
    notes["max_input_len"] = ("--max-input-len" if req.max_input_len else
                              f"default {DEFAULT_INPUT_LEN}" + (f", cut so input + output <= max_position_embeddings "
                                                                f"{maxpos}" if in_len != DEFAULT_INPUT_LEN else ""))
    if in_len <= 0:
        raise ForgeError(f"--max-output-len {out_len} leaves no room for a prompt in max_position_embeddings {maxpos}")
    tpb = req.tokens_per_block or DEFAULT_TOKENS_PER_BLOCK
    notes["tokens_per_block"] = "--tokens-per-block" if req.tokens_per_block else f"default {DEFAULT_TOKENS_PER_BLOCK}"
    budget = req.budget or max(DEFAULT_BUDGET[kind], in_len)
    notes["max_num_tokens"] = ("--budget" if req.budget else
                               f"default for a {kind} card: max({DEFAULT_BUDGET[kind]}, max_input_len {in_len}) so a "
                               "full-length prompt fits one step")
    fraction = req.kv_fraction or DEFAULT_KV_FRACTION

    name = req.name or _name_for(ckpt, kind)
    art_path = os.path.relpath(os.path.abspath(ckpt), os.path.abspath(req.out.parent))
    if art_path.startswith(".."):       # not below the contract's folder: where it is
        art_path = os.path.abspath(ckpt)
    model = ModelGeometry(architecture=archs[0], num_layers=geo["num_layers"], num_kv_heads=geo["num_kv_heads"],
                          head_dim=geo["head_dim"], vocab_size=geo["vocab_size"], weights_gib=weights_gib)
    target = Target(kind=kind, compute_capability=req.compute_capability)
    card = Card(index=0, kind=kind, model="cpu" if kind == "cpu" else "gpu", memory_gib=req.memory_gib,
                compute_capability=req.compute_capability, engine=name)
    precision = Precision(weights=weights_prec, kv_cache=weights_prec)

    def contract_with(pool_tokens: int, slots: int) -> Contract:
        c = Contract(contract=name, backend=BACKEND, model=model, artifact=Artifact(checkpoint=art_path),
                     precision=precision,
                     limits=Limits(max_batch_size=slots, max_num_tokens=budget, max_input_len=in_len,
                                   max_output_len=out_len),
                     kv_cache=KvCache(tokens_per_block=tpb, max_tokens=max(pool_tokens, tpb), host_cache_size=0,
                                      block_reuse=True),
                     target=target)
        c._source = req.out.resolve()
        return c

    # The largest whole-block pool that takes at most `fraction` of what the weights and the backend's working memory
    # (transformers: an attention mask that grows with the pool) leave of the card: a search over block counts, each
    # step the plan's own arithmetic (plan_card) and the backend's own working memory, as validation computes them.
    bpt = kvmath.kv_bytes_per_token(model.num_layers, model.num_kv_heads, model.head_dim, precision.kv_cache)
    card_bytes = kvmath.gib(req.memory_gib)
    weights_bytes = kvmath.gib(weights_gib)

    def fits(blocks: int) -> tuple[bool, int]:
        plan = plan_card(card, contract_with(blocks * tpb, 1))
        work = _working(plan)
        return plan.kv_pool_bytes <= fraction * (card_bytes - weights_bytes - work), work

    lo, hi = 0, kvmath.pool_tokens(card_memory_bytes=card_bytes, weights_bytes=weights_bytes, bytes_per_token=bpt,
                                   tokens_per_block=tpb, free_gpu_memory_fraction=fraction, max_tokens=None) // tpb
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid)[0]:
            lo = mid
        else:
            hi = mid - 1
    pool = lo * tpb
    working_at_pool = fits(lo)[1] if lo else 0
    seq = in_len + out_len
    per_seq = kvmath.blocks_for(seq, tpb)
    if pool // tpb < per_seq:
        raise ForgeError(f"--memory-gib {req.memory_gib:g}: after the weights ({fmt_bytes(weights_bytes)}) and the "
                         f"backend's working memory, {fraction:g} of the card holds {pool:,} KV tokens; one full-length "
                         f"sequence ({in_len} + {out_len} tokens) needs {per_seq * tpb:,}: give more memory or "
                         "shorter --max-input-len / --max-output-len")
    full = (pool // tpb) // per_seq
    slots = req.slots or min(full, MAX_DEFAULT_SLOTS, budget)
    notes["max_batch_size"] = ("--slots" if req.slots else
                               f"the full-length sequences the pool holds ({full:,}), at most {min(MAX_DEFAULT_SLOTS, budget)}")
    contract = contract_with(pool, slots)
    plan = plan_card(card, contract)
    working = _working(plan)
    notes["max_tokens"] = (f"the largest pool of whole blocks within {fraction:g} x (card {fmt_bytes(card_bytes)} - "
                           f"weights {fmt_bytes(weights_bytes)} - working memory {fmt_bytes(working_at_pool)}) at "
                           f"{bpt:,} bytes per token "
                           f"(2 x {model.num_layers} layers x {model.num_kv_heads} KV heads x {model.head_dim} "
                           f"head_dim x {kvmath.KV_DTYPE_BYTES[precision.kv_cache]} bytes) = "
                           f"{plan.num_blocks:,} blocks, {fmt_bytes(plan.kv_pool_bytes)}; {full:,} full-length "
                           f"({seq}-token) sequences")
    yaml = render(contract, req, notes, cfg_path=ckpt / "config.json", working=working, plan=plan)
    return Drafted(contract=contract, plan=plan, working_bytes=working, yaml=yaml, notes=notes)


def _working(plan: CardPlan) -> int:
    from forge.config.working_memory import working_memory

    return sum(n for _, n in working_memory(plan))


def _name_for(ckpt: Path, kind: str) -> str:
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", ckpt.resolve().name).strip("-._") or "model"
    return f"{base}-{kind}"[:128]


def _q(text: str) -> str:
    return json.dumps(text)         # a JSON string is a YAML string


def render(c: Contract, req: Request, notes: dict[str, str], *, cfg_path: Path, working: int, plan: CardPlan) -> str:
    m, lim, kv = c.model, c.limits, c.kv_cache
    from_cfg = f"{display_path(cfg_path)}"
    section = _section_lines()
    total = plan.weights_bytes + plan.kv_pool_bytes + working
    lines = [
        f"# Written by `forge contract new` from {from_cfg} for a {req.card} card of {req.memory_gib:g} GiB.",
        f"# On that card: weights {fmt_bytes(plan.weights_bytes)} + KV pool {fmt_bytes(plan.kv_pool_bytes)} + "
        f"working memory {fmt_bytes(working)} = {fmt_bytes(total)} of {fmt_bytes(plan.card_memory_bytes)}.",
        "# Every field is explicit; each comment says how its number was reached. `forge validate` checks it again.",
        f"contract: {c.contract}",
        f"backend: {c.backend}",
        "model:                            # read from config.json",
        f"  architecture: {m.architecture}             # architectures[0]",
        f"  num_layers: {m.num_layers}                  # num_hidden_layers",
        f"  num_kv_heads: {m.num_kv_heads}                # num_key_value_heads (else num_attention_heads)",
        f"  head_dim: {m.head_dim}                    # head_dim (else hidden_size / num_attention_heads)",
        f"  vocab_size: {m.vocab_size}                # vocab_size",
        f"  weights_gib: {m.weights_gib}              # {notes['weights_gib']}",
        "artifact:",
        f"  checkpoint: {_q(c.artifact.checkpoint)}  # "
        + ("absolute: not below this file's folder" if os.path.isabs(c.artifact.checkpoint) else "relative to this file"),
        f"precision:                        # {notes['precision']}",
        f"  weights: {c.precision.weights}",
        f"  kv_cache: {c.precision.kv_cache}",
        "limits:",
        f"  max_batch_size: {lim.max_batch_size}              # {notes['max_batch_size']}",
        f"  max_num_tokens: {lim.max_num_tokens}             # {notes['max_num_tokens']}",
        f"  max_input_len: {lim.max_input_len}              # {notes['max_input_len']}",
        f"  max_output_len: {lim.max_output_len}             # {notes['max_output_len']}",
        "kv_cache:",
        f"  tokens_per_block: {kv.tokens_per_block}            # {notes['tokens_per_block']}",
        f"  max_tokens: {kv.max_tokens}                # {notes['max_tokens']}",
        "  host_cache_size: 0               # no host offload (transformers has none)",
        "  block_reuse: true                # reuse the KV blocks of shared prompt prefixes",
        "target:",
        f"  kind: {c.target.kind}",
    ]
    if c.target.compute_capability is not None:
        lines.append(f"  compute_capability: {_q(c.target.compute_capability)}")
    lines += [f"{BACKEND}:                     # the backend's options, each at its stated default (forge schema)",
              *section]
    return "\n".join(_align(line) for line in lines) + "\n"


def _align(line: str, column: int = 34) -> str:
    """`key: value   # comment` with the comments in one column (YAML comments start at ' #')."""
    body, sep, comment = line.partition("  # ")
    if not sep or line.startswith("#"):
        return line
    return f"{body.rstrip():<{column - 1}} # {comment.strip()}"


def _section_lines() -> list[str]:
    from forge.config.registry import from_plugins

    section = from_plugins().sections.get(BACKEND)
    if section is None:
        raise ForgeError(f"the {BACKEND} backend is not registered (is forge installed whole?)")
    out = []
    for key, f in section.model_fields.items():
        v = f.default
        text = "null" if v is None else json.dumps(v) if isinstance(v, (bool, str)) else str(v)
        out.append(f"  {key}: {text}")
    return out


def node_yaml(c: Contract, req: Request, contract_file: Path, node_file: Path) -> str:
    rel = os.path.relpath(os.path.abspath(contract_file), os.path.abspath(node_file.parent))
    cores = os.cpu_count() or 1
    lines = [f"# Written by `forge contract new`: one {req.card} card running {c.contract}.",
             f"node: {c.contract}",
             f"contracts: {_q(rel)}",
             "host:",
             f"  memory_gib: {max(req.memory_gib, 1):g}                 # at least the card's memory (a CPU card's is the host's)",
             f"  cpu_cores: {cores}                   # this machine's (os.cpu_count)",
             "cards:",
             "  - index: 0",
             f"    kind: {req.card}",
             f"    model: {'cpu' if req.card == 'cpu' else _q('NVIDIA GPU')}",
             f"    memory_gib: {req.memory_gib:g}                # --memory-gib"]
    if req.compute_capability is not None:
        lines.append(f"    compute_capability: {_q(req.compute_capability)}")
    lines += [f"    engine: {c.contract}", "metrics:", "  port: 0                          # 0 picks a free port"]
    return "\n".join(lines) + "\n"
