"""GPU utilisation over a bench window: NVML (nvidia-ml-py, as forge/hardware/probe.py uses it) read
every INTERVAL_S in a daemon thread, per GPU index the node's cards use, from the window's start to
its end.

Per card the result keeps running aggregates, not a list of samples, so memory stays bounded however
long the window runs:
    util_mean, util_max                 nvmlDeviceGetUtilizationRates(h).gpu, percent of time a kernel ran
    memory_util_mean, memory_util_max   .memory, percent of time device memory was read or written
    memory_used_gib_max                 nvmlDeviceGetMemoryInfo(h).used, highest seen
    samples, read_errors                how many reads succeeded, and how many the driver refused

Card index = NVML index, the rule the hardware check applies (forge/hardware/probe.py). Without GPU
cards, nvidia-ml-py, the driver or a GPU, nothing is sampled: stop() returns None and `missing` says
why (logged once per process, at the first window it concerns); it is never an error, and the
reports print "—"."""
from __future__ import annotations

import logging
import threading
from typing import Any, Mapping, Optional, Sequence

INTERVAL_S = 0.5
GIB = 2**30
JOIN_TIMEOUT_S = 5.0  # the thread wakes every INTERVAL_S; a driver call that hangs longer is left
log = logging.getLogger("forge.bench")
_said: set[str] = set()


def gpus_of(plans: Sequence[Any]) -> dict[str, int]:
    """card id -> NVML index, for the plans' GPU cards (cpu cards have nothing to sample)."""
    return {p.card_id: p.card.index for p in plans if p.card.kind == "gpu"}


class Aggregate:
    """Running mean and max of one GPU's readings."""

    def __init__(self) -> None:
        self.samples = self.errors = 0
        self.util_sum = self.mem_util_sum = 0.0
        self.util_max = self.mem_util_max = 0.0
        self.used_max = 0

    def add(self, util: float, mem_util: float, used_bytes: int) -> None:
        self.samples += 1
        self.util_sum += util
        self.mem_util_sum += mem_util
        self.util_max = max(self.util_max, util)
        self.mem_util_max = max(self.mem_util_max, mem_util)
        self.used_max = max(self.used_max, used_bytes)

    def result(self, index: int) -> dict:
        n = self.samples
        return {
            "gpu": index,
            "samples": n,
            "util_mean": round(self.util_sum / n, 1) if n else None,
            "util_max": self.util_max if n else None,
            "memory_util_mean": round(self.mem_util_sum / n, 1) if n else None,
            "memory_util_max": self.mem_util_max if n else None,
            "memory_used_gib_max": round(self.used_max / GIB, 2) if n else None,
            "read_errors": self.errors,
        }


class GpuSampler:
    """start() before the window, stop() at its end; stop() -> {card: Aggregate.result} or None (see
    missing).

    `nvml` is the pynvml module (imported at start when not given)."""

    def __init__(
        self, gpus: Mapping[str, int], *, interval_s: float = INTERVAL_S, nvml: Any = None
    ):
        self.gpus = dict(gpus)
        self.interval_s = interval_s
        self.missing: Optional[str] = None
        self._nvml = nvml
        self._handles: dict[int, Any] = {}
        self._aggs: dict[int, Aggregate] = {}
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "GpuSampler":
        if not self.gpus:
            self.missing = "no GPU card in this node"
            return self
        nvml = self._nvml
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError:
                return self._without("no NVML: nvidia-ml-py is not installed")
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:      # library not found, driver not loaded, no permission
            return self._without(f"no NVML: {e}")
        self._nvml = nvml
        try:
            count = nvml.nvmlDeviceGetCount()
            for index in sorted(set(self.gpus.values())):
                if index >= count:
                    raise LookupError(f"GPU {index} does not exist (NVML sees {count})")
                self._handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
                self._aggs[index] = Aggregate()
        except (nvml.NVMLError, LookupError) as e:
            nvml.nvmlShutdown()
            self._handles.clear()
            return self._without(f"NVML could not open the node's GPUs: {e}")
        self._thread = threading.Thread(target=self._loop, name="forge-gpu-sampler", daemon=True)
        self._thread.start()
        return self

    def _without(self, why: str) -> "GpuSampler":
        self.missing = why
        if why not in _said:
            _said.add(why)
            log.warning("GPU utilisation not sampled: %s", why)
        return self

    def sample_once(self) -> None:
        nvml = self._nvml
        for index, handle in self._handles.items():
            try:
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                used = nvml.nvmlDeviceGetMemoryInfo(handle).used
            except nvml.NVMLError:
                # a read the driver refused: left out of the mean, counted
                self._aggs[index].errors += 1
                continue
            self._aggs[index].add(rates.gpu, rates.memory, used)

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> Optional[dict[str, dict]]:
        if self._thread is None:
            return None
        self._stop.set()
        self._thread.join(JOIN_TIMEOUT_S)
        self._thread = None
        if not self._handles:
            return None
        self._handles.clear()
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass  # the figures are taken; a shutdown the driver refuses changes none
        return {card: self._aggs[index].result(index) for card, index in self.gpus.items()}

    def __enter__(self) -> "GpuSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def cell(util: Optional[Mapping[str, dict]]) -> str:
    """"87 / 99 %" for one card, "gpu0 87 / 99 %, gpu1 80 / 98 %" for several, "—" where not
    sampled."""
    if not util:
        return "—"

    def one(r: dict) -> str:
        return (
            "—" if r.get("util_mean") is None else f"{r['util_mean']:.0f} / {r['util_max']:.0f} %"
        )

    if len(util) == 1:
        return one(next(iter(util.values())))
    return ", ".join(f"{card} {one(r)}" for card, r in util.items())
