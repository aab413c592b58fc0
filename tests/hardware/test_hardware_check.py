"""check_node_against_hardware: the mismatch rules, on synthetic probes (pure logic)."""
from __future__ import annotations

import pytest

from forge.config.models import Card, Host, Metrics, NodeDescription
from forge.hardware.probe import ProbedCard, check_node_against_hardware

H200 = ProbedCard(
    index=0, kind="gpu", model="NVIDIA H200", memory_gib=143771 / 1024, compute_capability="9.0"
)
HOST = ProbedCard(index=0, kind="cpu", model="cpu", memory_gib=125.7, cores=16, available_gib=110.0)


def gpu(index=0, model="NVIDIA H200", memory_gib=140.0, cc="9.0"):
    return Card(
        index=index,
        kind="gpu",
        model=model,
        memory_gib=memory_gib,
        compute_capability=cc,
        engine="e",
    )


def cpu_card(index=0, memory_gib=2.0):
    return Card(index=index, kind="cpu", model="cpu", memory_gib=memory_gib, engine="e")


def node(*cards, host_gib=64.0, cores=8):
    return NodeDescription(
        node="n1",
        contracts="../c",
        host=Host(memory_gib=host_gib, cpu_cores=cores),
        cards=list(cards),
        metrics=Metrics(port=0),
    )


def test_matching_gpu_node_has_no_mismatch():
    assert check_node_against_hardware(node(gpu()), [H200, HOST]) == []


@pytest.mark.parametrize("declared", [141.0, 140.0, 127.0])
def test_gpu_memory_within_tolerance(declared):
    # NVML says 140.40 GiB: 141 (rounded up) and down to 90 % (126.36) are accepted
    assert check_node_against_hardware(node(gpu(memory_gib=declared)), [H200, HOST]) == []


@pytest.mark.parametrize("declared", [142.0, 126.0, 80.0])
def test_gpu_memory_outside_tolerance(declared):
    lines = check_node_against_hardware(node(gpu(memory_gib=declared)), [H200, HOST])
    assert len(lines) == 1
    assert "$.cards[0].memory_gib" in lines[0] and "140.40 GiB" in lines[0]


def test_model_and_compute_capability_mismatch_are_separate_lines():
    lines = check_node_against_hardware(
        node(gpu(model="NVIDIA H100 80GB HBM3", cc="8.9")), [H200, HOST]
    )
    assert len(lines) == 2
    assert lines[0].endswith("$.cards[0].model: declared 'NVIDIA H100 80GB HBM3'; GPU 0 is 'NVIDIA "
                             "H200'")
    assert "$.cards[0].compute_capability: declared 8.9; GPU 0 is 9.0" in lines[1]


def test_more_gpus_declared_than_present():
    lines = check_node_against_hardware(node(gpu(0), gpu(1)), [H200, HOST])
    assert any("declares 2 GPU card(s); this machine has 1 (NVML)" in x for x in lines)
    assert any(
        "$.cards[1].index: GPU 1 does not exist on this machine (NVML indices: 0)" in x
        for x in lines
    )


def test_gpu_node_on_machine_without_gpus():
    lines = check_node_against_hardware(node(gpu()), [HOST])
    assert any("this machine has 0 (NVML)" in x for x in lines)
    assert any("(NVML indices: none)" in x for x in lines)


def test_undeclared_gpus_are_left_alone():
    second = ProbedCard(
        index=1, kind="gpu", model="NVIDIA H200", memory_gib=140.4, compute_capability="9.0"
    )
    assert check_node_against_hardware(node(gpu(0)), [H200, second, HOST]) == []


def test_cpu_card_needs_no_gpu_and_fits_available_ram():
    assert (
        check_node_against_hardware(node(cpu_card(memory_gib=2.0), host_gib=16.0, cores=2), [HOST])
        == []
    )
    lines = check_node_against_hardware(node(cpu_card(0, 80.0), cpu_card(1, 40.0)), [HOST])
    assert lines == ["<node n1>::$.cards: cpu cards declare 120 GiB together; 110.00 GiB of RAM is "
                     "available now"]


def test_host_memory_and_cores():
    lines = check_node_against_hardware(node(cpu_card(), host_gib=200.0, cores=32), [HOST])
    assert lines == ["<node n1>::$.host.memory_gib: declared 200 GiB; this host has 125.70 GiB of "
                     "RAM",
                     "<node n1>::$.host.cpu_cores: declared 32; this process may use 16 core(s)"]
    # total RAM rounded up to a whole GiB is accepted
    assert check_node_against_hardware(node(cpu_card(), host_gib=126.0, cores=16), [HOST]) == []


def test_missing_cpu_probe_is_reported():
    lines = check_node_against_hardware(node(gpu()), [H200])
    assert lines == ["<node n1>::$.host: no cpu probe reported this host; its memory and cores "
                     "cannot be checked"]


def test_card_cores_this_process_may_not_run_on():
    host = ProbedCard(
        index=0,
        kind="cpu",
        model="cpu",
        memory_gib=125.7,
        cores=4,
        available_gib=110.0,
        core_ids=frozenset({0, 1, 2, 5}),
    )
    pinned = Card(index=0, kind="cpu", model="cpu", memory_gib=2.0, engine="e", cores=[1, 5])
    assert check_node_against_hardware(node(pinned, cores=4), [host]) == []
    outside = Card(index=1, kind="cpu", model="cpu", memory_gib=2.0, engine="e", cores=[2, 3])
    assert check_node_against_hardware(node(pinned, outside, cores=4), [host]) == [
        "<node n1>::$.cards[1].cores: core 3 is not one this process may run on (allowed: 0-2,5)"]
