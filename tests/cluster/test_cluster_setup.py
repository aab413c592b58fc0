"""What `--cluster` refuses before Ray is touched, and the Ray CPUs a card's engine actor asks for
(no Ray here: the actor's real threads are checked on a real cluster in test_cluster_ray.py)."""
from __future__ import annotations

import pytest

from forge.cluster import connect
from forge.cluster.agent import refuse_cluster_switch_off
from forge.cluster.threads import card_threads, cpu_reservations
from forge.config.load import load_node
from forge.errors import UsageError
from tests.cluster.harness import FIXTURES


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "give the head's HOST:PORT"),
    (":6379", "give the head's HOST:PORT"),
    ("127.0.0.1:http", "must be a number from 1 to 65535, got 'http'"),
    ("127.0.0.1:70000", "must be a number from 1 to 65535"),
    ("127.0.0.1:0", "must be a number from 1 to 65535"),
])
def test_an_address_that_cannot_name_a_head_is_refused_in_one_line(monkeypatch, address, why):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(UsageError, match=why) as e:
        connect.check_environment(address)
    assert "\n" not in str(e.value)


def test_good_addresses_pass(monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    for address in ("127.0.0.1:6379", "localhost:6380", "[::1]:6379"):
        assert connect.check_environment(address) == "disabled"


def test_an_unreachable_head_in_rays_worker_ports_says_why():
    line = connect.unreachable_line("127.0.0.1:12345", "Connection refused")
    assert "worker port range 10002-19999" in line and "6379" in line and "\n" not in line
    assert "worker port" not in connect.unreachable_line("127.0.0.1:6379", "Connection refused")
    assert "worker port" not in connect.unreachable_line("127.0.0.1:20000", "Connection refused")


def test_the_cluster_switch_off_is_refused_before_ray_starts(monkeypatch):
    for off in ("0", "false", "no"):
        monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", off)
        with pytest.raises(UsageError, match="RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=.* stops `ray "
                                             "start --address`"):
            refuse_cluster_switch_off("linux")
    for on in ("1", "true"):
        monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", on)
        refuse_cluster_switch_off("linux")
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    refuse_cluster_switch_off("linux")
    with pytest.raises(UsageError, match="on darwin, .* only with "
                                         "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1"):
        refuse_cluster_switch_off("darwin")
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "1")
    refuse_cluster_switch_off("darwin")


def test_a_cpu_card_asks_ray_for_its_threads_and_says_when_the_node_has_fewer():
    named = load_node(FIXTURES / "nodes" / "e.yaml")              # cores: [0, 1]
    # no cores named: the node's (host.cpu_cores 1)
    unnamed = load_node(FIXTURES / "nodes" / "b.yaml")
    assert card_threads(named.plans[0], named.node.host.cpu_cores) == 2
    assert card_threads(unnamed.plans[0], unnamed.node.host.cpu_cores) == 1
    assert cpu_reservations(named.plans, 2, node_cpus=4) == ({"cpu0": 2.0}, [])
    cpus, warnings = cpu_reservations(named.plans, 2, node_cpus=1)
    assert cpus == {"cpu0": 1.0}
    assert (
        len(warnings) == 1
        and "reserves 1 of its 2" in warnings[0]
        and "--num-cpus 2" in warnings[0]
    )


def test_the_dry_run_names_the_ray_cpus_and_each_engines_threads():
    from tests.forge_cli import invoke

    rc, out, err = invoke(
        "provision", str(FIXTURES / "nodes" / "e.yaml"), "--dry-run", "--cluster", "127.0.0.1:6380"
    )
    assert rc == 0, err
    assert "Ray CPUs (ray start --num-cpus): 2; engine threads: cpu0 2" in out, out
