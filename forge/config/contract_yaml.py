"""The YAML `forge contract new` writes: the contract (every field explicit, each number with how it
was reached) and the one-card node that runs it. Every string goes out as a YAML double-quoted
scalar (PyYAML's own escaping), so a name holding a newline, a colon or a `#` reads back as that
name and nothing else. The node leaves what forge cannot know for the user to state: the host
(memory, cores) of the machine that will run it, and a GPU's name as NVML reports it; each is a
placeholder that `forge validate` refuses by name until it is filled in."""
from __future__ import annotations

import os
from pathlib import Path

import yaml

from forge.config.files import shown
from forge.config.placeholders import placeholder
from forge.config.units import fmt_bytes

COMMENT_COLUMN = 34
HOST_MEMORY = placeholder("the memory in GiB of the machine that runs this node (e.g. 64)")
HOST_CORES = placeholder("the CPU cores of the machine that runs this node (e.g. 16)")
GPU_MODEL = placeholder("this GPU's name exactly as NVML reports it: nvidia-smi --query-gpu=name "
                        "--format=csv,noheader (e.g. NVIDIA H100 80GB HBM3)")


def q(text: str) -> str:
    """`text` as a YAML double-quoted scalar that reads back as exactly `text`."""
    return yaml.safe_dump(
        str(text), default_style='"', allow_unicode=False, width=float("inf")
    ).rstrip("\n")


def num(x: float) -> str:
    """A number YAML reads back as that number (PyYAML reads `1e-05` as a string; it writes
    `1.0e-05`)."""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return yaml.safe_dump(float(x)).split("\n")[0]


def _align(line: str, column: int = COMMENT_COLUMN) -> str:
    """`key: value   # comment` with the comments in one column (YAML comments start at ' #')."""
    body, sep, comment = line.partition("  # ")
    if not sep or line.startswith("#"):
        return line
    return f"{body.rstrip():<{column - 1}} # {comment.strip()}"


def _one_line(text: str) -> str:
    """A comment stays one line whatever a path or name in it holds."""
    return " ".join(str(text).split())


def render_contract(drafted, req, cfg_file: Path) -> str:
    c, plan, notes, working = drafted.contract, drafted.plan, drafted.notes, drafted.working_bytes
    m, lim, kv = c.model, c.limits, c.kv_cache
    total = plan.weights_bytes + plan.kv_pool_bytes + working
    n = {k: _one_line(v) for k, v in notes.items()}
    section = c.sections["transformers"]
    lines = [
        f"# Written by `forge contract new` from {_one_line(shown(cfg_file))} for a {req.card} "
        "card of "
        f"{req.memory_gib:g} GiB.",
        f"# On that card: weights {fmt_bytes(plan.weights_bytes)} + KV pool "
        f"{fmt_bytes(plan.kv_pool_bytes)} + "
        f"working memory {fmt_bytes(working)} = {fmt_bytes(total)} of "
        f"{fmt_bytes(plan.card_memory_bytes)}.",
        "# Every field is explicit; each comment says how its number was reached. `forge validate` "
        "checks it again.",
    ]
    if not drafted.weights_present:
        lines.append("# Sized from config.json alone: `forge validate` refuses it until the "
                     "*.safetensors weights are "
                     "in the checkpoint folder.")
    lines += [
        f"contract: {q(c.contract)}",
        f"backend: {q(c.backend)}",
        "model:                            # read from config.json",
        f"  architecture: {q(m.architecture)}  # architectures[0]",
        f"  num_layers: {m.num_layers}  # num_hidden_layers",
        f"  num_kv_heads: {m.num_kv_heads}  # num_key_value_heads (else num_attention_heads)",
        f"  head_dim: {m.head_dim}  # head_dim (else hidden_size / num_attention_heads)",
        f"  vocab_size: {m.vocab_size}  # vocab_size",
        f"  weights_gib: {num(m.weights_gib)}  # {n['weights_gib']}",
        "artifact:",
        f"  checkpoint: {q(c.artifact.checkpoint)}  # "
        + (
            "absolute: not below this file's folder"
            if os.path.isabs(c.artifact.checkpoint)
            else "relative to this file"
        ),
        f"precision:                        # {n['precision']}",
        f"  weights: {c.precision.weights}",
        f"  kv_cache: {c.precision.kv_cache}",
        "limits:",
        f"  max_batch_size: {lim.max_batch_size}  # {n['max_batch_size']}",
        f"  max_num_tokens: {lim.max_num_tokens}  # {n['max_num_tokens']}",
        f"  max_input_len: {lim.max_input_len}  # {n['max_input_len']}",
        f"  max_output_len: {lim.max_output_len}  # {n['max_output_len']}",
        "kv_cache:",
        f"  tokens_per_block: {kv.tokens_per_block}  # {n['tokens_per_block']}",
        f"  max_tokens: {kv.max_tokens}  # {n['max_tokens']}",
        "  host_cache_size: 0  # no host offload (transformers has none)",
        "  block_reuse: true  # reuse the KV blocks of shared prompt prefixes",
        "target:",
        f"  kind: {c.target.kind}",
    ]
    if c.target.compute_capability is not None:
        lines.append(f"  compute_capability: {q(c.target.compute_capability)}")
    lines.append("transformers:                     # the backend's options, each at its stated "
                 "default (forge schema)")
    for key in type(section).model_fields:
        v = getattr(section, key)
        text = "null" if v is None else q(v) if isinstance(v, str) else ("true" if v else "false") \
            if isinstance(v, bool) else str(v)
        why = f"  # {n['attn_implementation']}" if key == "attn_implementation" else ""
        lines.append(f"  {key}: {text}{why}")
    return "\n".join(_align(line) for line in lines) + "\n"


def render_node(c, req, contract_file: Path, node_file: Path, *, host_memory=None, host_cores=None,
                gpu_model=None) -> str:
    """The node running `c` on one card. Without host_memory/host_cores/gpu_model: placeholders the
    user fills in (what is written); with them: the node forge checks the contract on before
    anything is written."""
    rel = os.path.relpath(os.path.abspath(contract_file), os.path.abspath(node_file.parent))
    gpu = req.card == "gpu"
    lines = [f"# Written by `forge contract new`: one {req.card} card running "
             f"{_one_line(c.contract)}.",
             "# Fill in each FILL IN value (`forge validate` names every one left) before "
             "provisioning.",
             f"node: {q(c.contract)}",
             f"contracts: {q(rel)}",
             "host:                             # the machine that will run this node: forge "
             "cannot know it",
             f"  memory_gib: {q(HOST_MEMORY) if host_memory is None else num(host_memory)}",
             f"  cpu_cores: {q(HOST_CORES) if host_cores is None else host_cores}",
             "cards:",
             "  - index: 0",
             f"    kind: {req.card}"]
    if gpu:
        lines += ["    # model must equal the card's name as NVML reports it: `forge provision` "
                  "compares the two and "
                  "refuses a node whose cards differ",
                  f"    model: {q(GPU_MODEL) if gpu_model is None else q(gpu_model)}"]
    else:
        lines.append("    model: cpu")
    lines.append(f"    memory_gib: {num(req.memory_gib)}  # --memory-gib")
    if req.compute_capability is not None:
        lines.append(f"    compute_capability: {q(req.compute_capability)}  # --compute-capability")
    lines += [f"    engine: {q(c.contract)}", "metrics:", "  port: 0  # 0 picks a free port"]
    return "\n".join(_align(line) for line in lines) + "\n"
