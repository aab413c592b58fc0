"""The registry of nodes provisioned on this machine, with real processes: a name is held by one
live process, a killed process's entry heals away, and a process only ever removes its own entry."""
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from forge.errors import ForgeError
from forge.machine import registry

HOLDER = textwrap.dedent("""
    import sys, time
    from forge.machine import registry
    registry.register(sys.argv[1], {"control_url": "http://127.0.0.1:1", "source": "x.yaml"})
    print("registered", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path))
    yield tmp_path
    for name in list(registry._claims):
        registry.release(name)


def _holder(name: str, env_home) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, name], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "FORGE_HOME": str(env_home)})
    assert proc.stdout.readline().strip() == "registered"
    return proc


def test_a_name_held_by_a_live_process_is_refused_and_healed_after_kill_9(home):
    proc = _holder("local", home)
    try:
        with pytest.raises(ForgeError, match=r"a node named 'local' is already provisioned on "
                                             r"this machine "
                                             rf"\(pid {proc.pid}, control http://127.0.0.1:1, from "
                                             r"x.yaml\)"):
            registry.claim("local")
        assert [n["node"] for n in registry.nodes()] == ["local"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # kill -9: no cleanup ran; the entry is reported dead once, removed, and the name is free again
    [entry] = registry.entries()
    assert entry["node"] == "local" and entry["alive"] is False
    assert registry.entries() == [] and not (home / "nodes" / "local.json").exists()
    registry.claim("local")


def test_a_dead_entry_is_dead_even_when_its_pid_is_reused(home):
    proc = _holder("n1", home)
    proc.kill()
    proc.wait()
    path = home / "nodes" / "n1.json"
    # a live pid, not the holder
    path.write_text(json.dumps({**json.loads(path.read_text()), "pid": os.getpid()}))
    assert registry.nodes() == []


def test_unregister_never_removes_another_process_entry(home):
    proc = _holder("shared", home)
    try:
        registry.unregister("shared")           # this process does not hold it: nothing happens
        assert [n["node"] for n in registry.nodes()] == ["shared"]
    finally:
        proc.kill()
        proc.wait()


def test_resolve_says_what_happened_to_a_dead_node(home):
    proc = _holder("gone", home)
    proc.kill()
    proc.wait()
    with pytest.raises(ForgeError, match=r"node 'gone' is not running: its process \(pid \d+\) "
                                         r"ended without "
                                         r"stopping it .* `forge provision x.yaml`"):
        registry.resolve("gone")


def test_register_and_unregister_in_one_process(home):
    registry.register("mine", {"control_url": "http://127.0.0.1:2"})
    [n] = registry.nodes()
    assert n["pid"] == os.getpid()
    registry.unregister("mine")
    assert registry.nodes() == [] and "mine" not in registry._claims
    registry.claim("mine")                      # the name is free again at once
