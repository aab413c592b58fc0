"""The transformers backend's switches for `forge bench sweep`, and the contract rule they share: no
torch here.

The attention candidates are every implementation transformers 5.24's continuous batching accepts
(`ContinuousBatchingManager.switch_to_cb_friendly_attn`,
generation/continuous_batching/continuous_api.py: `paged|eager`, `sdpa`, or any flash
implementation), plus the two names a user might expect and that it does not run as such
(flex_attention, paged|sdpa), each with the reason. Flash kernels are looked up the way transformers
does (transformers/utils/import_utils.py: is_flash_attn_{2,3,4}_available): the module and its
distribution."""
from __future__ import annotations

from importlib import metadata
from typing import Optional

from forge.config.files import shown
# transformers 5.24's query padding (initialization.py)
from forge.engines.transformers.section import Q_PADDING_PRESET
from forge.errors import Problem
from forge.tunables import Choice, Tunable

BACKEND = "transformers"
# implementation -> (module, distribution, minimum version) as transformers 5.24 checks them
FLASH_PACKAGES = {
    "flash_attention_2": ("flash_attn", "flash-attn", "2.3.3"),
    "flash_attention_3": ("flash_attn_interface", "flash-attn-3", None),
    "flash_attention_4": ("flash_attn", "flash-attn-4", None),
}
SECTION_FLASH = ("flash_attention_2", "flash_attention_3")  # the flash values transformers: accepts
GPU_ONLY = {"use_cuda_graph": "CUDA graphs", "async_batching": "async batching (CUDA streams)"}
COMPILE_LEVELS = (1, 2, 3)
# 128: a third fewer shapes on forge's 8B schedule for ~2 % more query tokens (docs/benchmarks.md,
# "forge ÷ direct on one card")
GRAPH_Q_PADDINGS = (Q_PADDING_PRESET, 128, 256)


def pads_queries(section) -> bool:
    """Whether transformers pads a step's query tokens for this section: only for CUDA graphs or
    compile."""
    return section.use_cuda_graph or section.compile_level > 0


def _version_tuple(text: str) -> tuple:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        out.append(int(digits) if digits else 0)
    return tuple(out)


def flash_missing(impl: str) -> Optional[str]:
    """Why this flash implementation cannot load here (None: its package is installed)."""
    module, dist, minimum = FLASH_PACKAGES[impl]
    dists = {d.lower().replace("_", "-") for d in metadata.packages_distributions().get(module, [])}
    if dist not in dists:
        return f"needs the {dist} package (module {module}), not installed here"
    if minimum is not None and _version_tuple(metadata.version(dist)) < _version_tuple(minimum):
        return f"needs {dist} >= {minimum}, found {metadata.version(dist)}"
    return None


def attention_choices(card_kind: str) -> tuple[Choice, ...]:
    out = [Choice("sdpa", note="torch scaled-dot-product attention with an explicit mask over the "
                               "batch"),
           Choice("eager", note="runs as paged|eager in continuous batching")]
    for impl in FLASH_PACKAGES:
        why = flash_missing(impl)
        if why is None and impl not in SECTION_FLASH:
            why = f"installed, but transformers.attn_implementation does not offer {impl} yet"
        elif why is None and card_kind != "gpu":
            why = "flash attention needs a GPU"
        out.append(Choice(impl, unavailable=why, note="enables the decode fast path (block table)"))
    out.append(Choice("flex_attention", unavailable="transformers 5.24's continuous batching "
                                                    "refuses it "
                      "(switch_to_cb_friendly_attn accepts only paged|eager, sdpa or a flash "
                      "implementation)"))
    out.append(Choice("paged|sdpa", unavailable="a deprecated alias: transformers 5.24 drops the "
                                                "paged| prefix "
                      "and runs sdpa, which is the sdpa candidate"))
    return tuple(out)


def transformers_tunables(contract, card) -> list[Tunable]:
    """In the order a sweep tries them: the switches measured to matter first (CUDA graphs: 1.46x on
    the 1.5B H200 tier, docs/benchmarks.md), torch.compile last (its warm-up can take minutes)."""
    gpu = card.kind == "gpu"
    not_here = None if gpu else "needs a GPU card"
    section = contract.sections.get(BACKEND)
    padded = section is not None and pads_queries(section)
    return [
        Tunable(
            f"{BACKEND}.use_cuda_graph",
            (Choice(True, unavailable=not_here), Choice(False)),
            note="capture each forward (+ logits processing + sampling) once per padded shape, "
            "then replay it",
        ),
        Tunable(f"{BACKEND}.attn_implementation", attention_choices(card.kind)),
        Tunable(f"{BACKEND}.scheduler", (Choice("fifo"), Choice("prefill_first"))),
        Tunable(
            f"{BACKEND}.async_batching",
            (Choice(True, unavailable=not_here), Choice(False)),
            note="prepare batch N+1 on the CPU while batch N runs on the GPU (two IO buffers)",
        ),
        Tunable(
            f"{BACKEND}.graph_q_padding",
            tuple(
                Choice(
                    v,
                    unavailable=None
                    if v == Q_PADDING_PRESET or padded
                    else "pads only with use_cuda_graph or compile_level",
                )
                for v in GRAPH_Q_PADDINGS
            ),
            note="query tokens padded to a multiple of this: fewer graph captures, more padded "
            "tokens a step",
        ),
        Tunable(
            f"{BACKEND}.compile_level",
            tuple(Choice(v) for v in (0, *COMPILE_LEVELS)),
            note="1: torch.compile mode default, dynamic; 2: max-autotune-no-cudagraphs, "
            "dynamic; 3: the same, "
            "static shapes (transformers' default_compile_level presets)",
        ),
    ]


def gpu_only_switches(loaded) -> list[Problem]:
    """A validation rule: switches that need CUDA, set in a contract that targets a CPU card."""
    out = []
    for c in loaded.contracts.values():
        section = c.sections.get(BACKEND)
        if c.backend != BACKEND or section is None or c.target.kind == "gpu":
            continue
        file = shown(c.source) if c.source else f"<contract {c.contract}>"
        for name, what in GPU_ONLY.items():
            if getattr(section, name):
                out.append(Problem(file, f"$.{BACKEND}.{name}", f"{what} need a GPU; this contract "
                                                                "targets "
                                   f"{c.target.kind}"))
        if section.attn_implementation in SECTION_FLASH:
            out.append(
                Problem(
                    file,
                    f"$.{BACKEND}.attn_implementation",
                    f"{section.attn_implementation} needs a "
                    f"GPU; this contract targets {c.target.kind}",
                )
            )
    return out


def graph_padding_fits(loaded) -> list[Problem]:
    """A validation rule: graph_q_padding set where it pads nothing, or above the step's token
    budget."""
    out = []
    for c in loaded.contracts.values():
        section = c.sections.get(BACKEND)
        if c.backend != BACKEND or section is None:
            continue
        file = shown(c.source) if c.source else f"<contract {c.contract}>"
        field, q = f"$.{BACKEND}.graph_q_padding", section.graph_q_padding
        if q != Q_PADDING_PRESET and not pads_queries(section):
            out.append(Problem(file, field, f"{q} has no effect: query tokens are padded only with "
                                            "use_cuda_graph or "
                               f"compile_level; leave it at {Q_PADDING_PRESET}"))
        elif q > c.limits.max_num_tokens:
            out.append(Problem(file, field, f"{q} is more than limits.max_num_tokens "
                                            f"({c.limits.max_num_tokens}): "
                               "every step would be padded to the whole budget"))
    return out
