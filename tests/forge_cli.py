"""Running forge's CLI in tests, one way each.

- `invoke(...)`: in this process, through click's CliRunner isolation and `forge.cli.main` (so its
  error handling: one line, the exit code). For refusals and usage errors, where no process is
  needed.
- `forge(...)`: `python -m forge ...` in a subprocess, as a user runs it. For whatever needs a real
  process: signals, a card worker, what an interpreter imports (`importtime=True`), exit at
  interpreter level.
- `forge_argv(...)` and `forge_env(...)`: the same command line and environment, for tests that
  start the process themselves (Popen) and talk to it while it runs.
- `provisioned(home, ...)`: a node brought up as users do (`forge provision`), for as long as a
  `with` block runs.

Both paths run with the repository root as the working directory, FORGE_LOAD_PLUGINS=TEST_PLUGINS
(forge-bench's plugin, no other third-party one) and FORGE_DEBUG unset (a traceback is a failure,
not a debug aid); the test's own FORGE_HOME (tests/conftest.py) is inherited.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
TEST_PLUGINS = "forge_bench.plugin"  # `forge bench` and the test engines instant and faults
WORKER_MARK = "runpy.run_module('forge.host'"      # forge/link/worker_argv.py's bootstrap


def forge_env(extra: Optional[dict] = None) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "FORGE_LOAD_PLUGINS": TEST_PLUGINS,
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("FORGE_DEBUG", None)
    env.update(extra or {})
    return env


def runs_the_product(args) -> bool:
    """Whether a process's command line runs forge (its CLI or a card worker) or Ray: what makes a
    test slow. Only what starts them counts: the program itself (`forge`, `ray`, their console
    scripts), `-m forge...` / `-m ray...`, or forge's card-worker bootstrap
    (forge/link/worker_argv.py); an argument that merely names a path through a folder called
    `forge` (a clone of that name: `ruff check .../forge`) does not."""
    if isinstance(args, (str, bytes, os.PathLike)):
        text = os.fsdecode(args)
        argv = shlex.split(text) if " " in text else [text]
    else:
        argv = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in args]
    if not argv:
        return False
    if os.path.basename(argv[0]) in ("forge", "ray"):
        return True
    for flag, value in zip(argv, argv[1:]):
        if flag == "-m" and value.split(".")[0] in ("forge", "ray"):
            return True
        if flag == "-c" and WORKER_MARK in value:
            return True
    return False


def forge_argv(*args, importtime: bool = False) -> list[str]:
    return [
        sys.executable,
        *(["-X", "importtime"] if importtime else []),
        "-m",
        "forge",
        *map(str, args),
    ]


def forge(
    *args,
    cwd: Path = REPO,
    env: Optional[dict] = None,
    timeout: float = 240,
    importtime: bool = False,
    **kw,
) -> subprocess.CompletedProcess:
    """`forge ARGS` in a subprocess. With importtime, `.imported` is the set of modules it imported,
    `.torch_loaded` whether torch was among them, and `.message` its stderr without the importtime
    lines."""
    r = subprocess.run(
        forge_argv(*args, importtime=importtime),
        cwd=cwd,
        env=forge_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,
    )
    if importtime:
        lines = r.stderr.splitlines()
        # a card worker writes its own import lines (it gets -X importtime too) to its engine log
        # file, named once on stderr: those count as well
        logs = [
            line.split(" logs to ", 1)[1]
            for line in lines
            if ": its engine library logs to " in line
        ]
        worker_lines = [x for log in logs if Path(log).is_file()
                        for x in Path(log).read_text(errors="replace").splitlines()]
        r.imported = {line.rsplit("|", 1)[-1].strip() for line in lines + worker_lines
                      if line.startswith("import time:")}
        r.torch_loaded = "torch" in r.imported            # any engine library pulls torch in
        r.message = "\n".join(line for line in lines if not line.startswith("import time:"))
    return r


@dataclass
class Invoked:
    returncode: int
    stdout: str
    stderr: str

    def __iter__(self):               # rc, out, err = invoke(...)
        return iter((self.returncode, self.stdout, self.stderr))


def invoke(*args, env: Optional[dict] = None, cwd: Path = REPO) -> Invoked:
    """`forge ARGS` in this process: its exit code, stdout and stderr, as the subprocess would give
    them."""
    from click.testing import CliRunner

    import forge.cli

    runner = CliRunner()
    extra = {"FORGE_LOAD_PLUGINS": TEST_PLUGINS, "FORGE_DEBUG": None, **(env or {})}
    before = Path.cwd()
    os.chdir(cwd)
    try:
        with runner.isolation(env=extra) as (out, err, _):
            try:
                forge.cli.main([str(a) for a in args])
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            sys.stdout.flush()
            sys.stderr.flush()
            stdout, stderr = out.getvalue().decode(), err.getvalue().decode()
    finally:
        os.chdir(before)
    return Invoked(code, stdout, stderr)


def fill_in(node_file: Path, **values) -> Path:
    """What a user does with the node `forge contract new --node-out` writes: each `KEY: "FILL IN:
    ..."` line gets the value given for KEY (memory_gib=, cpu_cores=, model=); returns the file."""
    import re

    text = node_file.read_text()
    for key, value in values.items():
        text, n = re.subn(
            rf'^(\s*{key}): "FILL IN:[^"]*"', lambda m: f"{m.group(1)}: {value}", text, flags=re.M
        )
        assert n == 1, f"no FILL IN placeholder for {key} in {node_file}"
    node_file.write_text(text)
    return node_file


@contextlib.contextmanager
def provisioned(
    home: Path,
    *extra,
    env: Optional[dict] = None,
    description: str = "node_descriptions/local.yaml",
):
    """`forge provision DESCRIPTION` on free ports, registered in `home` (its FORGE_HOME), until the
    block ends; then SIGINT (it drains and unregisters). Yields its control `url`, its whole `env`
    (a value None in `env` removes that variable), `proc` and its registry `entry`."""
    import pytest

    home.mkdir(parents=True, exist_ok=True)
    full = forge_env(
        {"FORGE_HOME": str(home), **{k: v for k, v in (env or {}).items() if v is not None}}
    )
    for k in [k for k, v in (env or {}).items() if v is None]:
        full.pop(k, None)
    ready = home / "ready"
    proc = subprocess.Popen(
        forge_argv(
            "provision",
            description,
            "--port",
            0,
            "--metrics-port",
            0,
            "--ready-file",
            ready,
            *extra,
        ),
        cwd=REPO,
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not (ready.exists() and ready.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the node did not come up: {proc.communicate()[0][-1500:]}")
        time.sleep(0.1)
    [entry] = [json.loads(f.read_text()) for f in (home / "nodes").glob("*.json")]
    try:
        yield {"url": ready.read_text().strip(), "env": full, "proc": proc, "entry": entry}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)         # a test may have stopped it
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
