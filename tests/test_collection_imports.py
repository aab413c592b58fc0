"""Plain `python -m pytest` collects without importing vLLM, Ray, torch or transformers.

Collecting imports every test module, also those whose tests -m then deselects: a module-level
`pytest.importorskip("vllm")` or `import ray` cost every run seconds (vLLM alone ~3 s, torch and
transformers ~3-6 s on the 2-core machine) for tests it did not run. Test modules check that a
library is installed with tests/installed.py (no import) and import it in the tests and fixtures
that use it; this test holds that: it collects the whole suite in a subprocess, as a user's `python
-m pytest` does, with a plugin that lists the engine libraries in sys.modules once collection is
done.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE_LIBRARIES = ("vllm", "ray", "torch", "transformers")

# A pytest plugin for the subprocess: after each collector (a module, a conftest's folder) it notes
# which engine library is newly in sys.modules, so a failure names the module that imported it.
PROBE = f"""
import json, os, sys
import pytest

LIBRARIES = {ENGINE_LIBRARIES!r}
first_seen = {{}}

@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    yield
    for name in LIBRARIES:
        if name in sys.modules and name not in first_seen:
            first_seen[name] = collector.nodeid

def pytest_collection_finish(session):
    loaded = {{name: first_seen.get(name, "before collection") for name in LIBRARIES if name in sys.modules}}
    with open(os.environ["COLLECTION_PROBE_OUT"], "w") as f:
        json.dump({{"loaded": loaded, "collected": len(session.items)}}, f)
"""


def test_plain_pytest_collects_without_importing_engine_libraries(tmp_path):
    (tmp_path / "collection_probe.py").write_text(PROBE)
    out = tmp_path / "probe.json"
    env = {
        **os.environ,
        "COLLECTION_PROBE_OUT": str(out),
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH")])
        ),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "collection_probe",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    probe = json.loads(out.read_text())
    assert probe["collected"] > 100, probe  # the suite was collected, not an empty selection
    assert probe["loaded"] == {}, (
        f"collecting the tests imported {probe['loaded']} (library: the collector after which it "
        "was loaded): "
        "a module-level import; check with tests/installed.py skip_module_unless_installed and "
        "import it inside "
        f"the tests and fixtures that use it")
