"""GPU utilisation over a bench window (bench/forge_bench/gpu_sampler.py).

The aggregation is pure logic, tested with a stand-in NVML module that replays scripted readings;
the path a user runs is tested with the real nvidia-ml-py on this machine (no NVML library or no
GPU: nothing sampled, nothing raised) and through a real `forge bench run` in
tests/bench/test_cards.py."""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from forge_bench import gpu_sampler
from forge_bench.cpu_nodes import write_cpu_node
from forge_bench.gpu_sampler import GpuSampler, cell, gpus_of
from forge_bench.report import gpu_util_line, mode_rows
from tests.forge_cli import forge

ROOT = Path(__file__).resolve().parents[2]


class FakeNVMLError(Exception):
    pass


def stand_in(readings: dict[int, list], count: int = 2, init_error: bool = False):
    """An object with pynvml's names; readings[i]: (gpu %, memory %, used bytes) per read (the last
    one repeats), or None for a read that raises NVMLError."""
    calls: list[str] = []
    left = {i: list(r) for i, r in readings.items()}
    now: dict[int, tuple] = {}

    def init():
        calls.append("init")
        if init_error:
            raise FakeNVMLError("NVML Shared Library Not Found")

    def rates(handle):
        got = left[handle].pop(0) if len(left[handle]) > 1 else left[handle][0]
        if got is None:
            raise FakeNVMLError("GPU is lost")
        now[handle] = got
        return SimpleNamespace(gpu=got[0], memory=got[1])

    return SimpleNamespace(
        NVMLError=FakeNVMLError, nvmlInit=init, nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: count, nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=rates,
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(used=now[h][2], total=2**40), calls=calls)


def test_mean_max_and_count_per_card_from_scripted_reads():
    gib = 2**30
    nvml = stand_in({0: [(90, 40, 10 * gib), (70, 20, 30 * gib), (80, 30, 20 * gib)],
                     1: [(10, 5, gib), (30, 15, 2 * gib), (20, 10, gib)]})
    s = GpuSampler({"gpu0": 0, "gpu1": 1}, interval_s=3600, nvml=nvml)
    s.start()  # reads once at once, then waits an hour: the other reads come from sample_once
    s.sample_once()
    s.sample_once()
    got = s.stop()
    assert got["gpu0"] == {
        "gpu": 0,
        "samples": 3,
        "util_mean": 80.0,
        "util_max": 90,
        "memory_util_mean": 30.0,
        "memory_util_max": 40,
        "memory_used_gib_max": 30.0,
        "read_errors": 0,
    }
    assert (
        got["gpu1"]["util_mean"] == 20.0
        and got["gpu1"]["util_max"] == 30
        and got["gpu1"]["samples"] == 3
    )
    assert got["gpu1"]["memory_used_gib_max"] == 2.0 and s.missing is None


def test_the_thread_samples_until_stopped_and_shuts_nvml_down():
    nvml = stand_in({0: [(50, 10, 2**30)]}, count=1)
    s = GpuSampler({"gpu0": 0}, interval_s=0.01, nvml=nvml).start()
    time.sleep(0.2)
    got = s.stop()
    n = got["gpu0"]["samples"]
    assert n >= 3 and got["gpu0"]["util_mean"] == 50.0
    time.sleep(0.05)
    assert got["gpu0"]["samples"] == n                    # stopped: no read after stop()
    assert nvml.calls == ["init", "shutdown"]
    assert s.stop() is None                               # a second stop is harmless


def test_a_refused_read_is_counted_and_left_out_of_the_mean():
    s = GpuSampler(
        {"gpu0": 0}, interval_s=3600, nvml=stand_in({0: [(60, 10, 1), None, (100, 30, 1)]}, count=1)
    )
    s.start()
    s.sample_once()
    s.sample_once()
    got = s.stop()["gpu0"]
    assert (
        got["samples"] == 2
        and got["read_errors"] == 1
        and got["util_mean"] == 80.0
        and got["util_max"] == 100
    )


def test_two_cards_on_one_gpu_read_it_once_each_time():
    nvml = stand_in({0: [(40, 10, 1)]}, count=1)
    s = GpuSampler({"gpu0": 0, "gpu0b": 0}, interval_s=3600, nvml=nvml).start()
    got = s.stop()
    assert got["gpu0"] == got["gpu0b"] and got["gpu0"]["samples"] == 1


@pytest.mark.parametrize("gpus, nvml, why", [
    ({}, None, "no GPU card in this node"),
    ({"gpu0": 0}, stand_in({0: [(1, 1, 1)]}, init_error=True), "no NVML: NVML Shared Library Not "
                                                               "Found"),
    ({"gpu3": 3}, stand_in({0: [(1, 1, 1)]}, count=2), "NVML could not open the node's GPUs: GPU 3 "
                                                       "does not exist"),
])
def test_nothing_to_sample_is_none_with_the_reason_said_once(caplog, monkeypatch, gpus, nvml, why):
    monkeypatch.setattr(gpu_sampler, "_said", set())
    caplog.set_level(logging.WARNING, logger="forge.bench")
    for _ in range(2):
        s = GpuSampler(gpus, nvml=nvml).start()
        assert s.stop() is None and s.missing.startswith(why)
    said = [r.getMessage() for r in caplog.records if "not sampled" in r.getMessage()]
    assert len(said) == (0 if not gpus else 1)            # a CPU node is not worth a warning
    if nvml is not None and gpus == {"gpu3": 3}:
        assert nvml.calls == ["init", "shutdown"] * 2       # each start: opened, refused, closed


def test_the_real_nvml_on_this_machine_never_raises():
    s = GpuSampler({"gpu0": 0}).start()
    got = s.stop()
    if got is None:        # this CPU machine: no libnvidia-ml (or no GPU 0)
        assert s.missing.startswith(("no NVML", "NVML could not open"))
    else:                  # a GPU machine: the thread's first read is taken at once
        assert got["gpu0"]["samples"] >= 1 and 0 <= got["gpu0"]["util_mean"] <= 100


def test_gpus_of_maps_gpu_cards_to_their_index_and_skips_cpu_cards():
    plans = [SimpleNamespace(card_id="gpu1", card=SimpleNamespace(kind="gpu", index=1)),
             SimpleNamespace(card_id="cpu0", card=SimpleNamespace(kind="cpu", index=0))]
    assert gpus_of(plans) == {"gpu1": 1}


def test_report_cells_say_dash_where_not_sampled():
    one = {"gpu0": {"util_mean": 87.4, "util_max": 99}}
    two = dict(one, gpu1={"util_mean": None, "util_max": None})
    assert cell(None) == "—" and cell(one) == "87 / 99 %" and cell(two) == "gpu0 87 / 99 %, gpu1 —"
    row = {
        "mode": "forge",
        "variant": "grouped",
        "completed": 1,
        "requests": 1,
        "window_s": 1.0,
        "tokens_per_s": 10.0,
        "output_tokens_per_s": 5.0,
        "gpu_util": None,
        "gpu_util_missing": "no NVML: x",
    }
    assert mode_rows([row])[2].endswith("| — |  |") and "GPU util mean / max" in mode_rows([row])[0]
    assert gpu_util_line([row]) == "GPU util: not sampled (no NVML: x)."
    assert "read every 0.5 s" in gpu_util_line([dict(row, gpu_util=one)])


def gpu_declared_node(folder: Path, cards: int) -> Path:
    """CPU-bound instant cards (no model) declared as H200s: the bench samples the GPU indices they
    name, while the engines need no GPU, so the real sampling path runs here too."""
    path = write_cpu_node(folder, f"gpu-{cards}", [2.0] * cards)
    node = yaml.safe_load(path.read_text())
    for c in node["cards"]:
        c.update(kind="gpu", model="NVIDIA H200", memory_gib=141, compute_capability="9.0")
    path.write_text(yaml.safe_dump(node, sort_keys=False))
    contract = folder / "cpu-steps-2ms.yaml"
    doc = yaml.safe_load(contract.read_text())
    doc["target"] = {"kind": "gpu", "compute_capability": "9.0"}
    contract.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_real_bench_run_records_gpu_util_or_says_why_not(tmp_path):
    node = gpu_declared_node(tmp_path / "nodes", 2)
    args = [
        "bench",
        "run",
        "docs/bench/workloads/cpu-steps.yaml",
        "--node",
        node,
        "--records",
        20,
        "--warmup",
        2,
        "--modes",
        "forge",
        "--out",
        tmp_path / "out",
    ]
    proc = forge(*args, timeout=170)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    data = json.loads((tmp_path / "out" / "bench.json").read_text())
    md = (tmp_path / "out" / "bench.md").read_text()
    assert [r["scope"] for r in data["results"]] == ["gpu0", "gpu1", "together"]
    row = data["summary"]["forge"]["repeats"][0]
    if data["results"][0]["gpu_util"] is None:           # this CPU machine: no libnvidia-ml
        for r in data["results"]:
            assert r["gpu_util"] is None and r["gpu_util_missing"].startswith(
                ("no NVML", "NVML could not open")
            )
        assert proc.stderr.count("GPU utilisation not sampled") == 1  # said once, not per window
        assert row["gpu_util"] is None and row["alone_gpu_util"] == {"gpu0": None, "gpu1": None}
        assert f"GPU util: not sampled ({data['results'][0]['gpu_util_missing']})." in md
        assert md.count("| — |  |") == 3  # every run's GPU util cell (notes empty)
    else:                                 # a machine with two GPUs: every window sampled
        assert set(row["gpu_util"]) == {"gpu0", "gpu1"} and row["gpu_util"]["gpu1"]["samples"] >= 1
    assert "| GPU util mean / max, per card (together) |" in md and "| GPU util mean / max |" in md
