"""Where a bench ran: date, hardware, software versions, command. Every figure in a report carries
it."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import sys
from importlib import metadata
from typing import Optional


def _version(dist: str) -> Optional[str]:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _gpus(load_torch: bool) -> list[dict]:
    """GPUs as torch sees them; only when the bench already uses torch (the instant bench never
    imports it)."""
    if not load_torch or "torch" not in sys.modules:
        return []
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": p.name,
                "memory_gib": round(p.total_memory / 2**30, 2),
                "compute_capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count,
            }
        )
    return out


def describe(argv: Optional[list[str]] = None, *, load_torch: bool = True) -> dict:
    from forge import __version__

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    gpus = _gpus(load_torch)
    sw = {"python": platform.python_version(), "forge": __version__}
    for dist in ("torch", "transformers", "pydantic"):
        v = _version(dist)
        if dist in sys.modules and getattr(sys.modules[dist], "__version__", None):
            v = sys.modules[dist].__version__      # what this process really imported
        if v:
            sw[dist] = v
    if gpus and "torch" in sys.modules:
        sw["cuda"] = sys.modules["torch"].version.cuda
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "hardware": {
            "cpu": _cpu_model(),
            "cpu_cores_usable": cores,
            "machine": platform.machine(),
            "gpus": gpus,
        },
        "software": sw,
        "command": " ".join(
            shlex.quote(a) for a in (argv if argv is not None else ["forge", *sys.argv[1:]])
        ),
    }


def hardware_line(env: dict) -> str:
    hw = env["hardware"]
    if hw["gpus"]:
        g = hw["gpus"][0]
        return (f"{len(hw['gpus'])}x {g['name']} ({g['memory_gib']:g} GiB, cc "
                f"{g['compute_capability']}); {hw['cpu']}")
    return f"{hw['cpu']}, {hw['cpu_cores_usable']} core(s) usable"


def software_line(env: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in env["software"].items())
