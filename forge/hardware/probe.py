"""Hardware probes and the check of a node description against what they find.

Built-in probes, registered through forge_register_probes like any third-party probe:
  nvml  one ProbedCard per NVIDIA GPU (nvidia-ml-py). No library, driver or GPU -> [] (not an error).
  cpu   one ProbedCard for the host: RAM from /proc/meminfo (capped by a cgroup limit), usable cores.

check_node_against_hardware applies these rules, one line per mismatch:
  gpu card  its index exists in NVML; model equals NVML's name; compute_capability equals NVML's;
            0.90 x real <= memory_gib <= real rounded up to a whole GiB (so "141" fits an H200's 140.4 GiB,
            and a card is never declared larger than it is by a GiB or more).
            More declared GPUs than NVML sees is a mismatch; GPUs the node does not declare are left alone.
  cpu card  needs no GPU; the cpu cards' memory_gib together <= RAM available now.
  host      memory_gib <= total RAM rounded up to a whole GiB; cpu_cores <= cores this process may use.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from forge.config.models import NodeDescription
from forge.errors import ForgeError, display_path
from forge.hookspecs import hookimpl

GIB = 2**30
GPU_MEMORY_FLOOR = 0.90          # a declared GPU may under-state its memory by at most 10 %


@dataclass(frozen=True)
class ProbedCard:
    index: int
    kind: str                                 # "gpu" | "cpu"
    model: str                                # NVML's name, or "cpu"
    memory_gib: float  # total memory (GPU memory, or host RAM for the cpu card)
    compute_capability: Optional[str] = None  # "M.m" for a GPU
    cores: Optional[int] = None               # cpu card: cores this process may run on
    core_ids: Optional[frozenset[int]] = None  # cpu card: their ids (the affinity mask)
    available_gib: Optional[float] = None     # cpu card: RAM available now


@hookimpl
def forge_register_probes(register):
    register("nvml", probe_nvml)
    register("cpu", probe_cpu)


def probe_nvml() -> list[ProbedCard]:
    """One ProbedCard per GPU NVML reports; [] where nvidia-ml-py, the driver or a GPU is
    missing."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:   # library not found, driver not loaded, no permission: no usable GPUs
        return []
    try:
        cards = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            cards.append(ProbedCard(index=i, kind="gpu", model=name.strip(),
                                    memory_gib=pynvml.nvmlDeviceGetMemoryInfo(handle).total / GIB,
                                    compute_capability=f"{major}.{minor}"))
        return cards
    except pynvml.NVMLError as e:  # a driver that answers but cannot describe a GPU is not "no GPU"
        raise ForgeError(f"NVML could not describe this machine's GPUs: {e}") from None
    finally:
        pynvml.nvmlShutdown()


def probe_cpu() -> list[ProbedCard]:
    """The host as one cpu card: RAM (total and available, within any cgroup limit) and usable
    cores."""
    total, available = _host_memory_bytes()
    return [
        ProbedCard(
            index=0,
            kind="cpu",
            model="cpu",
            memory_gib=total / GIB,
            cores=_usable_cores(),
            core_ids=_allowed_cores(),
            available_gib=available / GIB,
        )
    ]


def parse_meminfo(text: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo text."""
    values = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key.strip()] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    if "MemTotal" not in values:
        raise ValueError("no MemTotal line")
    return values["MemTotal"], values.get("MemAvailable", values.get("MemFree", 0))


def _host_memory_bytes() -> tuple[int, int]:
    try:
        total, available = parse_meminfo(Path("/proc/meminfo").read_text())
    except (OSError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    # a container may own less than the host
    limit = _cgroup_number(Path("/sys/fs/cgroup/memory.max"))
    if limit is not None and limit < total:
        used = _cgroup_number(Path("/sys/fs/cgroup/memory.current")) or 0
        total, available = limit, min(available, max(limit - used, 0))
    return total, available


def _allowed_cores() -> Optional[frozenset[int]]:
    return frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def _ranges(cores: frozenset[int]) -> str:
    """{0, 1, 2, 5} -> '0-2,5' (how Linux writes a core list)."""
    out, run = [], []
    for c in sorted(cores):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _usable_cores() -> int:
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    try:   # cgroup v2 "quota period", e.g. "200000 100000" = 2 cores
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cores = min(cores, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return cores


def _cgroup_number(path: Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def probe_all() -> list[ProbedCard]:
    """Every registered probe's cards, merged in registration order. A probe that crashes is an
    error."""
    from forge import plugins   # here, not at import: plugins imports this module

    cards: list[ProbedCard] = []
    for name, probe in plugins.collect("forge_register_probes"):
        try:
            cards.extend(probe())
        except ForgeError:
            raise
        except Exception as e:
            raise ForgeError(f"hardware probe {name!r} failed: {type(e).__name__}: {e}") from None
    return cards


def check_node_against_hardware(node: NodeDescription, probed: Sequence[ProbedCard]) -> list[str]:
    """One line per way the node description differs from the probed machine (rules: module
    docstring)."""
    where = display_path(node.source) if node.source else f"<node {node.node}>"
    gpus = {c.index: c for c in probed if c.kind == "gpu"}
    cpu = next((c for c in probed if c.kind == "cpu"), None)
    out: list[str] = []
    declared = [(pos, c) for pos, c in enumerate(node.cards) if c.kind == "gpu"]
    if len(declared) > len(gpus):
        out.append(f"{where}::$.cards: declares {len(declared)} GPU card(s); this machine has "
                   f"{len(gpus)} (NVML)")
    for pos, card in declared:
        at, real = f"{where}::$.cards[{pos}]", gpus.get(card.index)
        if real is None:
            seen = ", ".join(str(i) for i in sorted(gpus)) or "none"
            out.append(f"{at}.index: GPU {card.index} does not exist on this machine (NVML "
                       f"indices: {seen})")
            continue
        if card.model.strip() != real.model:
            out.append(f"{at}.model: declared {card.model!r}; GPU {card.index} is {real.model!r}")
        low, high = GPU_MEMORY_FLOOR * real.memory_gib, _whole_gib_above(real.memory_gib)
        if not low <= card.memory_gib <= high:
            out.append(f"{at}.memory_gib: declared {card.memory_gib:g} GiB; GPU {card.index} has "
                       f"{real.memory_gib:.2f} GiB (accepted: {low:.2f} to {high:g})")
        if card.compute_capability != real.compute_capability:
            out.append(f"{at}.compute_capability: declared {card.compute_capability}; GPU "
                       f"{card.index} is "
                       f"{real.compute_capability}")
    if cpu is None:
        out.append(f"{where}::$.host: no cpu probe reported this host; its memory and cores cannot "
                   "be checked")
        return out
    cpu_cards = [c for c in node.cards if c.kind == "cpu"]
    cpu_gib = sum(c.memory_gib for c in cpu_cards)
    if cpu_cards and cpu.available_gib is not None and cpu_gib > cpu.available_gib:
        out.append(f"{where}::$.cards: cpu cards declare {cpu_gib:g} GiB together; "
                   f"{cpu.available_gib:.2f} GiB of RAM is available now")
    if node.host.memory_gib > _whole_gib_above(cpu.memory_gib):
        out.append(f"{where}::$.host.memory_gib: declared {node.host.memory_gib:g} GiB; this host "
                   "has "
                   f"{cpu.memory_gib:.2f} GiB of RAM")
    allowed = cpu.core_ids
    for i, card in enumerate(node.cards):
        outside = sorted(set(card.cores or ()) - allowed) if allowed is not None else []
        if outside:
            out.append(f"{where}::$.cards[{i}].cores: core {outside[0]} is not one this process "
                       "may run on "
                       f"(allowed: {_ranges(allowed)})")
    if cpu.cores is not None and node.host.cpu_cores > cpu.cores:
        out.append(f"{where}::$.host.cpu_cores: declared {node.host.cpu_cores}; this process may "
                   "use "
                   f"{cpu.cores} core(s)")
    return out


def _whole_gib_above(gib: float) -> float:
    """Real memory rounded up to a whole GiB (a tiny epsilon keeps 80.0000001 from becoming 81)."""
    return float(math.ceil(gib - 1e-6))
