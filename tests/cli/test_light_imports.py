"""A light command starts without the heavy libraries: `forge validate`, `forge --help` and `forge
run --help` load none of the engine libraries, the web stack, plotting, Arrow or Ray (each costs
seconds of start-up on a small machine; the commands that need one import it when they do). Checked
in a fresh interpreter that runs the real CLI and then reads its own sys.modules."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "vllm", "fastapi", "uvicorn", "matplotlib", "pyarrow", "ray")

PROBE = """
import json, sys
sys.argv = ["forge", *json.loads(sys.argv[1])]
try:
    from forge.cli import main
    main()
except SystemExit as e:
    code = e.code
print("LOADED=" + json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(%r))))
print("CODE=" + json.dumps(code))
"""


def _loaded(args: list[str]) -> tuple[list[str], object, str]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE % (list(HEAVY),), json.dumps(args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = dict(
        line.split("=", 1)
        for line in proc.stdout.splitlines()
        if line.startswith(("LOADED=", "CODE="))
    )
    assert "LOADED" in lines, proc.stdout + proc.stderr
    return json.loads(lines["LOADED"]), json.loads(lines["CODE"]), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args",
    [["validate", "node_descriptions/local.yaml"], ["--help"], ["run", "--help"]],
    ids=["validate", "help", "run-help"],
)
def test_light_command_loads_no_heavy_library(args):
    loaded, code, out = _loaded(args)
    assert code in (0, None), out
    assert loaded == [], f"`forge {' '.join(args)}` imported {loaded}"
