"""The real probes on this machine, and their registration through the plugin hook."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from forge import plugins
from forge.hardware import probe_all
from forge.hardware.probe import ProbedCard, parse_meminfo, probe_cpu, probe_nvml

HAS_NVIDIA_DRIVER = Path("/dev/nvidiactl").exists()


@pytest.mark.skipif(HAS_NVIDIA_DRIVER, reason="this machine has an NVIDIA driver")
def test_nvml_probe_without_gpu_returns_nothing():
    assert probe_nvml() == []


@pytest.mark.skipif(not HAS_NVIDIA_DRIVER, reason="needs an NVIDIA driver")
def test_nvml_probe_with_gpu_describes_each_card():
    cards = probe_nvml()
    assert cards and [c.index for c in cards] == list(range(len(cards)))
    for c in cards:
        assert (
            c.kind == "gpu"
            and c.model
            and c.memory_gib > 1
            and c.compute_capability.count(".") == 1
        )


def test_cpu_probe_reports_this_host():
    (card,) = probe_cpu()
    assert card.kind == "cpu" and card.model == "cpu" and card.compute_capability is None
    assert 0 < card.available_gib <= card.memory_gib
    assert 1 <= card.cores <= (os.cpu_count() or 1)


def test_probes_are_registered_plugins_and_probe_all_merges_them():
    names = [name for name, _ in plugins.collect("forge_register_probes")]
    assert "nvml" in names and "cpu" in names
    cards = probe_all()
    assert sum(1 for c in cards if c.kind == "cpu") == 1
    assert all(isinstance(c, ProbedCard) for c in cards)
    if not HAS_NVIDIA_DRIVER:
        assert [c for c in cards if c.kind == "gpu"] == []


def test_parse_meminfo():
    text = ("MemTotal:       24684092 kB\nMemFree:         1000 kB\nMemAvailable:   23621496 "
            "kB\nHugePages_Total: 0\n")
    assert parse_meminfo(text) == (24684092 * 1024, 23621496 * 1024)
    assert parse_meminfo("MemTotal: 2048 kB\nMemFree: 1024 kB\n") == (2048 * 1024, 1024 * 1024)
    with pytest.raises(ValueError):
        parse_meminfo("nothing here")
