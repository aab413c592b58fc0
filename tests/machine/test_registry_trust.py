"""forge believes only the registry entries it can prove it wrote for this user
(forge/machine/registry_files.py), and sends nothing to a node picked from the registry before the
node proves it is that node (forge/machine/node_proof.py). Real files, modes and owners; a second
user (nobody) through os.setuid where the machine allows it; real HTTP servers on 127.0.0.1 that log
what they receive."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from forge.errors import ForgeError, UsageError
from forge.machine import node_proof, registry, warm_node
from tests.forge_cli import invoke
from tests.logging_server import LoggingServer


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_HOME", str(tmp_path))
    yield tmp_path
    for name in list(registry._claims):
        registry.release(name)


@pytest.fixture
def logger():
    server = LoggingServer()
    yield server
    server.close()


def plant(home: Path, name: str, text: str, mode: int = 0o600, key: str | None = None) -> Path:
    """An entry written by hand, with its lock held by this process (a live node, as far as the lock
    says)."""
    folder = home / "nodes"
    folder.mkdir(exist_ok=True, mode=0o700)
    path = folder / f"{name}.json"
    path.write_text(text)
    os.chmod(path, mode)
    if key is not None:
        (folder / f"{name}.key").write_text(key)
        os.chmod(folder / f"{name}.key", 0o600)
    fd = os.open(folder / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    registry._claims[name] = fd          # released by the fixture
    return path


def entry_text(name: str, url: str, **extra) -> str:
    return json.dumps(
        {"node": name, "pid": os.getpid(), "control_url": url, **registry.origin(), **extra}
    )


MALFORMED = {
    "a pid that is a string": (
        '{"node": "n", "pid": "abc", "control_url": "http://127.0.0.1:1"}',
        "'pid'",
    ),
    "a pid of 1e400": ('{"node": "n", "pid": 1e400, "control_url": "http://127.0.0.1:1"}', "1e400"),
    "a NaN pid": ('{"node": "n", "pid": NaN, "control_url": "http://127.0.0.1:1"}', "NaN"),
    "no control_url": ('{"node": "n", "pid": 12}', "no 'control_url'"),
    "a control_url that is a list": (
        '{"node": "n", "pid": 12, "control_url": ["x"]}',
        "'control_url'",
    ),
    "not JSON": ("{not json", "not strict JSON"),
    "a list": ("[1, 2]", "not a JSON object"),
    "another name than the file's": (
        '{"node": "other", "pid": 12, "control_url": "http://127.0.0.1:1"}',
        "names node 'other', not 'n'",
    ),
    "a name reaching outside": (
        '{"node": "../n", "pid": 12, "control_url": "http://127.0.0.1:1"}',
        "'node'",
    ),
    "bytes that are not UTF-8": ('{"node": "\udcff"}', "not strict JSON"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_entry_is_skipped_with_one_line_naming_its_file(home, case, capsys):
    text, why = MALFORMED[case]
    path = plant(home, "n", "", key=None)
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    assert registry.entries() == [] and registry.nodes() == []
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and err.startswith(f"forge: note: skipping {path}: it ") and why in err
    ), err
    rc, out, err = invoke("status")                 # never `internal error: ValueError`
    assert rc == 0 and "internal error" not in err and "no nodes provisioned" in out, (rc, out, err)


def test_links_fifos_and_huge_files_are_skipped(home, capsys):
    folder = home / "nodes"
    folder.mkdir(mode=0o700)
    target = home / "elsewhere.json"
    target.write_text(entry_text("linked", "http://127.0.0.1:1"))
    (folder / "linked.json").symlink_to(target)
    os.mkfifo(folder / "fifo.json")                 # opened without blocking: never hangs the read
    (folder / "huge.json").write_text(" " * 70_000 + entry_text("huge", "http://127.0.0.1:1"))
    os.chmod(folder / "huge.json", 0o600)
    assert registry.entries() == []
    err = capsys.readouterr().err
    assert f"skipping {folder / 'linked.json'}: it cannot be opened without following links" in err
    assert f"skipping {folder / 'fifo.json'}: it is not a regular file" in err
    assert f"skipping {folder / 'huge.json'}: it is 70," in err


def test_an_entry_others_may_write_or_another_user_owns_is_skipped(home, capsys):
    path = plant(home, "shared", entry_text("shared", "http://127.0.0.1:1"), mode=0o666)
    assert registry.nodes() == []
    assert f"skipping {path}: it is writable by others (mode 666)" in capsys.readouterr().err
    os.chmod(path, 0o600)
    assert [n["node"] for n in registry.nodes()] == ["shared"]
    if os.getuid() != 0:
        pytest.skip("changing a file's owner needs root")
    os.chown(path, 65534, 65534)
    assert registry.nodes() == []
    assert f"skipping {path}: it is owned by uid 65534, not by you" in capsys.readouterr().err


def test_a_registry_folder_others_may_write_is_refused_in_one_line(home):
    (home / "nodes").mkdir(mode=0o700)
    os.chmod(home / "nodes", 0o777)
    with pytest.raises(ForgeError, match=rf"^{home / 'nodes'} is writable by others \(mode 777\): "
                                         r"forge trusts node "
                                         r"entries only in a folder of yours that no one else may "
                                         r"write; set "
                                         rf"FORGE_HOME to a folder of your own"):
        registry.nodes()
    rc, out, err = invoke("status")
    assert (
        rc == 1
        and err.count("\n") == 1
        and "is writable by others" in err
        and "internal error" not in err
    )


def test_bad_names_are_refused(home):
    for name in ("../x", "a/b", "", ".hidden", "x" * 129, "n\nx"):
        with pytest.raises(UsageError, match="a node's name is 1 to 128 letters"):
            registry.claim(name)
        with pytest.raises(UsageError):
            registry.register(name, {"control_url": "http://127.0.0.1:1"})
    assert not (home / "x.lock").exists() and not any(home.rglob("*.lock"))


def test_register_writes_entry_and_key_readable_by_this_user_alone(home):
    key = node_proof.new_key()
    registry.register("mine", {"control_url": "http://127.0.0.1:2"}, key=key)
    folder = home / "nodes"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for f in ("mine.json", "mine.key", "mine.lock"):
        assert stat.S_IMODE((folder / f).stat().st_mode) == 0o600, f
    assert registry.key_of("mine") == (key, None)
    os.chmod(folder / "mine.key", 0o640)
    assert registry.key_of("mine") == (None, "is readable by others (mode 640)")
    registry.unregister("mine")
    assert sorted(p.name for p in folder.iterdir()) == ["mine.lock"]


def test_an_entry_pointing_to_a_logging_server_gets_no_token_nor_record(home, logger, monkeypatch):
    """Same user, an entry that says the node is at a server that is not it (with and without a key
    file)."""
    plant(home, "local", entry_text("local", logger.url))
    monkeypatch.setenv("FORGE_TOKEN", "s3cret-token")
    assert warm_node.proven(registry.nodes()[0]).startswith("cannot prove it is that node (its key "
                                                            "file is missing")
    assert logger.seen == []                        # without a key, nothing at all is sent

    (home / "nodes" / "local.key").write_text(node_proof.new_key())
    os.chmod(home / "nodes" / "local.key", 0o600)
    assert warm_node.proven(registry.nodes()[0]) == (f"the server at {logger.url} did not prove it "
                                                     "is that node "
                                                     "(nothing was sent to it)")
    rc, out, err = invoke(
        "deploy",
        "functions/summarize.py",
        "--input",
        "functions/data/summarize.jsonl",
        "--output",
        home / "out.jsonl",
        "--node",
        "local",
    )
    assert (
        rc == 1 and "did not prove it is that node" in err and not (home / "out.jsonl").exists()
    ), err
    rc, out, err = invoke("status", "--json")
    assert rc == 0 and json.loads(out)[0]["live"]["error"] == "unproven"
    # challenges only: no token, no record
    assert logger.seen and logger.tokens_or_records() == [], logger.seen
    # and a bare GET /health: is anyone there
    assert any("challenge=" in r["path"] for r in logger.seen)


def test_a_warm_node_must_be_on_loopback(home):
    plant(home, "local", entry_text("local", "http://10.255.255.1:9"))
    [entry] = registry.nodes()
    assert not node_proof.is_loopback_url(entry["control_url"])
    for url in ("http://127.0.0.1:5", "http://[::1]:5", "http://localhost:5", "http://127.7.0.1:5"):
        assert node_proof.is_loopback_url(url), url
    for url in (
        "http://127.0.0.1.evil:5",
        "https://127.0.0.1:5",
        "http://user@127.0.0.1:5",
        "http://0.0.0.0:5",
        "http://127.0.0.1:x",
    ):
        assert not node_proof.is_loopback_url(url), url


def test_the_proof_binds_the_key_the_node_and_its_url():
    key = node_proof.new_key()
    prover = node_proof.Prover("local", key)
    assert prover.answer("ab" * 16) is None                 # not bound to its URL yet: no proof
    prover.control_url = "http://127.0.0.1:8000"
    proof = prover.answer("ab" * 16)
    assert proof == node_proof.proof(key, "local", "http://127.0.0.1:8000", "ab" * 16)
    # a relaying proxy's URL
    assert proof != node_proof.proof(key, "local", "http://127.0.0.1:8001", "ab" * 16)
    assert proof != node_proof.proof(key, "other", "http://127.0.0.1:8000", "ab" * 16)
    assert proof != node_proof.proof(
        node_proof.new_key(), "local", "http://127.0.0.1:8000", "ab" * 16
    )
    assert prover.answer("not hex") is None and prover.answer("ab") is None


ATTACKER = textwrap.dedent("""
    import fcntl, json, os, sys, time
    home, url = sys.argv[1], sys.argv[2]
    os.setgid(65534); os.setuid(65534)
    os.makedirs(home + "/nodes", mode=0o777, exist_ok=True)
    os.chmod(home + "/nodes", 0o755)          # the attacker's own folder, writable by no one else
    with open(home + "/nodes/local.json", "w") as f:
        json.dump({"node": "local", "pid": os.getpid(), "control_url": url, "uid": 0, "checkout": sys.argv[3]}, f)
    fd = os.open(home + "/nodes/local.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("planted", flush=True)
    time.sleep(600)
""")


def _can_become_nobody() -> bool:
    return os.getuid() == 0 and shutil.which("true") is not None


@pytest.mark.skipif(not _can_become_nobody(), reason="a second user needs root (os.setuid)")
def test_another_users_planted_registry_in_a_shared_home_is_refused(logger, monkeypatch):
    """The issue's attack: uid nobody plants nodes/local.json and holds its lock in a shared 1777
    FORGE_HOME."""
    shared = Path(tempfile.mkdtemp(prefix="forge-shared-home-", dir="/tmp"))
    os.chmod(shared, 0o1777)
    monkeypatch.setenv("FORGE_HOME", str(shared))
    attacker = subprocess.Popen([sys.executable, "-c", ATTACKER, str(shared), logger.url,
                                 registry.origin()["checkout"]], stdout=subprocess.PIPE, text=True,
                                cwd="/", env={"PATH": os.environ.get("PATH", "")})
    try:
        assert attacker.stdout.readline().strip() == "planted"
        assert (shared / "nodes").stat().st_uid == 65534
        with pytest.raises(ForgeError, match=rf"^{shared / 'nodes'} is owned by uid 65534, not by "
                                             r"you \(uid 0\)"):
            registry.nodes()
        monkeypatch.setenv("FORGE_TOKEN", "s3cret-token")
        for args in (
            ("status",),
            (
                "deploy",
                "functions/summarize.py",
                "--input",
                "functions/data/summarize.jsonl",
                "--output",
                str(shared / "out.jsonl"),
            ),
        ):
            rc, out, err = invoke(*args)
            assert (
                rc == 1 and "is owned by uid 65534, not by you" in err and err.count("\n") == 1
            ), (args, err)
        assert logger.seen == []
    finally:
        attacker.kill()
        attacker.wait()
        shutil.rmtree(shared, ignore_errors=True)
