"""scripts/wheelhouse.py: a slimmed wheel, packed into parts, rejoined and installed by pip with no
index; a damaged part refused naming it. (`make` needs a package registry and is not run here.)"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow          # runs pip in a subprocess

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "wheelhouse.py"


def _module():
    spec = importlib.util.spec_from_file_location("wheelhouse", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wheel(folder: Path) -> Path:
    """A real pure-Python wheel: module whprobe (with an incompressible blob, so parts are several)
    and a kernel the slimming drops."""
    import base64
    import os

    files = {
        "whprobe/__init__.py": b"ANSWER = 42\n",
        "whprobe/blob.bin": os.urandom(300_000),
        "whprobe/_kernel_sm80.so": b"\x7fELF" + b"\0" * 5000,
        "whprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: whprobe\nVersion: 1.0\n",
        "whprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = (
        "".join(
            f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
            f"{len(data)}\n"
            for name, data in files.items()
        )
        + "whprobe-1.0.dist-info/RECORD,,\n"
    )
    path = folder / "whprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("whprobe-1.0.dist-info/RECORD", record)
    return path


def test_slimmed_packed_wheelhouse_installs_with_no_index(tmp_path):
    wh = _module()
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house)
    assert wh.slim_wheel(wheel, ["whprobe/_kernel_*.so"]) == ["whprobe/_kernel_sm80.so"]
    with zipfile.ZipFile(wheel) as z:
        assert "whprobe/_kernel_sm80.so" not in z.namelist()
        assert "_kernel_sm80" not in z.read("whprobe-1.0.dist-info/RECORD").decode()
    (house / wh.MANIFEST).write_text(json.dumps({"wheels": [
        {"name": "whprobe", "version": "1.0", "file": wheel.name, "sha256": wh.sha256(wheel)}]}))
    parts = tmp_path / "parts"
    wh.main(["pack", str(house), str(parts), "--name", "probe"])       # whole MiB parts: one part
    spec = json.loads((parts / wh.PARTS).read_text())
    assert [p["file"] for p in spec["parts"]] == ["probe.tar.xz.000"]
    target, elsewhere = tmp_path / "site", tmp_path / "unpacked"
    out = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "install",
            str(elsewhere),
            "--parts",
            str(parts),
            "--target",
            str(target),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "installed 1 wheels" in out.stdout
    assert (target / "whprobe" / "__init__.py").read_text() == "ANSWER = 42\n"
    assert not (target / "whprobe" / "_kernel_sm80.so").exists()


def test_a_damaged_part_is_refused_naming_it(tmp_path):
    wh = _module()
    house = tmp_path / "house"
    house.mkdir()
    wheel = _wheel(house)
    (house / wh.MANIFEST).write_text(json.dumps({"wheels": [
        {"name": "whprobe", "version": "1.0", "file": wheel.name, "sha256": wh.sha256(wheel)}]}))
    wh.main(["pack", str(house), str(tmp_path / "parts")])
    part = tmp_path / "parts" / "wheelhouse.tar.xz.000"
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as e:
        wh.unpack(tmp_path / "parts", tmp_path / "out")
    assert (
        str(e.value) == f"{part}: sha256 differs from parts.json; the part was damaged on the way"
    )


def test_present_names_are_compared_as_pip_does(tmp_path):
    wh = _module()
    listing = tmp_path / "present.txt"
    listing.write_text("Pydantic_Core==2.50.5\nnvidia.nccl-cu13\n# a comment\n\n")
    assert wh.read_present(listing) == {"pydantic-core": "2.50.5", "nvidia-nccl-cu13": ""}
