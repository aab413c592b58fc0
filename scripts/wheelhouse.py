"""A wheelhouse for a host with no package registry: made where the registry is reachable, installed offline there.

    make     resolve REQUIREMENTS for the target's Python and platform (pip's resolver, `--dry-run --report`; or take
             `--pinned FILE`, name==version lines, as the resolution), leave
             out what the target already has (`--present FILE`: one distribution name a line, e.g. its `pip list
             --format=freeze`), download the rest as wheels (`pip download --no-deps`, exact versions), optionally
             slim named wheels (`--drop DIST:GLOB`, members the target never loads), and write manifest.json: the
             target, every wheel's name, version, file, bytes and sha256, what was left out as present, what was
             dropped from which wheel.
    pack     the wheelhouse as parts of at most --part-mib for a link that moves little at a time: the wheels stored
             uncompressed in one tar, xz-compressed (whole-stream compression finds far more than each wheel's
             deflate), cut into parts, each part's sha256 in parts.json.
    install  on the target, with the standard library and pip only: parts rejoined and checked, every wheel checked
             against manifest.json, then `pip install --no-index --find-links DIR --no-deps` of exactly the
             manifest's wheels (the resolution was done in `make`; `--no-deps` so nothing is looked up, and a pin
             the target's own packages break is said by `pip check` afterwards, not enforced).

Only `install` runs on the target. Usage: docs/vllm.md ("A GPU host with no package registry")."""
from __future__ import annotations

import argparse
import fnmatch
import hashlib
import io
import json
import lzma
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

MANIFEST = "manifest.json"
PARTS = "parts.json"
DEFAULT_PLATFORMS = ["manylinux_2_%d_x86_64" % n for n in range(17, 40)] + ["manylinux2014_x86_64", "linux_x86_64"]


def canonical(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_present(path: Path | None) -> dict[str, str]:
    """Names the target already has -> their version ('' when the file gives none). Accepts `name`, `name==ver`."""
    if path is None:
        return {}
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonical(name)] = version.strip()
    return out


def target_options(python_version: str, platforms: list[str]) -> list[str]:
    opts = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for p in platforms:
        opts += ["--platform", p]
    return opts


def resolve(requirements: list[str], options: list[str], work: Path) -> list[dict]:
    """pip's resolution for the target: [{name, version}] of every distribution the requirements need."""
    report = work / "resolve-report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
                    "--report", str(report), "--target", str(work / "none"), *options, *requirements], check=True)
    data = json.loads(report.read_text())
    return [{"name": item["metadata"]["name"], "version": item["metadata"]["version"]} for item in data["install"]]


def slim_wheel(path: Path, globs: list[str]) -> list[str]:
    """Rewrite a wheel without the members matching globs (their RECORD lines too); returns the dropped names."""
    dropped, tmp = [], path.with_suffix(".slim")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        names = [i.filename for i in src.infolist()]
        dropped = [n for n in names if any(fnmatch.fnmatch(n, g) for g in globs)]
        for info in src.infolist():
            if info.filename in dropped:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = "".join(line for line in data.decode().splitlines(keepends=True)
                               if line.split(",", 1)[0] not in dropped).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(path)
    return dropped


def make(args) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    options = target_options(args.python_version, args.platform or DEFAULT_PLATFORMS)
    present = read_present(Path(args.present) if args.present else None)
    if args.pinned:             # a lock: an earlier resolution (name==version a line), taken as it is
        resolved = [{"name": n, "version": v} for n, v in read_present(Path(args.pinned)).items()]
    else:
        with tempfile.TemporaryDirectory() as work:
            resolved = resolve(args.requirements, options, Path(work))
    wanted = [d for d in resolved if canonical(d["name"]) not in present]
    left_out = [dict(d, present=present[canonical(d["name"])] or "yes") for d in resolved
                if canonical(d["name"]) in present]
    drops: dict[str, list[str]] = {}
    for spec in args.drop or []:
        dist, _, glob = spec.partition(":")
        drops.setdefault(canonical(dist), []).append(glob)
    local = {canonical(w.name.split("-")[0]): w for w in out.glob("*.whl")}
    for d in wanted:            # one at a time, exact version, no dependencies: the resolution above is the plan
        if canonical(d["name"]) not in local:
            subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *options, "-d", str(out),
                            f"{d['name']}=={d['version']}"], check=True)
    wheels = {canonical(w.name.split("-")[0]): w for w in out.glob("*.whl")}
    entries = []
    for d in wanted:
        path = wheels[canonical(d["name"])]
        dropped = slim_wheel(path, drops[canonical(d["name"])]) if canonical(d["name"]) in drops else []
        entries.append({"name": d["name"], "version": d["version"], "file": path.name,
                        "bytes": path.stat().st_size, "sha256": sha256(path), "dropped": dropped})
    manifest = {"python_version": args.python_version, "platforms": args.platform or DEFAULT_PLATFORMS,
                "requirements": args.requirements, "wheels": entries, "present": left_out,
                "bytes": sum(e["bytes"] for e in entries)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{len(entries)} wheels, {manifest['bytes'] / 2**20:.1f} MiB in {out}; {len(left_out)} already on the "
          f"target; manifest {out / MANIFEST}")


def pack(args) -> None:
    house, dest = Path(args.wheelhouse), Path(args.to)
    manifest = json.loads((house / MANIFEST).read_text())
    dest.mkdir(parents=True, exist_ok=True)
    if args.part_mib < 1:
        sys.exit(f"--part-mib: {args.part_mib}; a part is at least 1 MiB")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for e in manifest["wheels"]:
            if args.preset < 0:                   # no compression: the wheels as they are
                _add(tar, e["file"], (house / e["file"]).read_bytes())
                continue
            stored = io.BytesIO()                 # the same members, stored: xz then sees the raw bytes
            with zipfile.ZipFile(house / e["file"]) as src, zipfile.ZipFile(stored, "w", zipfile.ZIP_STORED) as dst:
                for info in src.infolist():
                    dst.writestr(info, src.read(info), compress_type=zipfile.ZIP_STORED)
            e["sha256_as_made"], e["sha256"] = e["sha256"], hashlib.sha256(stored.getvalue()).hexdigest()
            _add(tar, e["file"], stored.getvalue())
        _add(tar, MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())   # the stored wheels' sha256s
    blob = lzma.compress(buf.getvalue(), preset=args.preset) if args.preset >= 0 else buf.getvalue()
    size = args.part_mib << 20
    parts = []
    for i in range(0, len(blob), size):
        name = f"{args.name}.{'tar.xz' if args.preset >= 0 else 'tar'}.{i // size:03d}"
        (dest / name).write_bytes(blob[i:i + size])
        parts.append({"file": name, "bytes": len(blob[i:i + size]),
                      "sha256": hashlib.sha256(blob[i:i + size]).hexdigest()})
    (dest / PARTS).write_text(json.dumps({"name": args.name, "parts": parts, "bytes": len(blob),
                                          "sha256": hashlib.sha256(blob).hexdigest()}, indent=1) + "\n")
    print(f"{len(parts)} parts of at most {args.part_mib} MiB, {len(blob) / 2**20:.1f} MiB in all, in {dest}")


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def unpack(parts_dir: Path, into: Path) -> None:
    """Rejoin and check the parts in parts_dir, and extract the wheelhouse into `into`."""
    spec = json.loads((parts_dir / PARTS).read_text())
    h, chunks = hashlib.sha256(), []
    for p in spec["parts"]:
        data = (parts_dir / p["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != p["sha256"]:
            sys.exit(f"{parts_dir / p['file']}: sha256 differs from {PARTS}; the part was damaged on the way")
        h.update(data)
        chunks.append(data)
    if h.hexdigest() != spec["sha256"]:
        sys.exit(f"{parts_dir}: the rejoined parts differ from {PARTS}")
    into.mkdir(parents=True, exist_ok=True)
    blob = b"".join(chunks)
    if blob[:6] == b"\xfd7zXZ\x00":          # xz's magic: packed with compression
        blob = lzma.decompress(blob)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r") as tar:
        tar.extractall(into, filter="data")


def install(args) -> None:
    house = Path(args.wheelhouse)
    if args.parts:
        for parts_dir in args.parts:
            unpack(Path(parts_dir), house)
    manifest = json.loads((house / MANIFEST).read_text())
    files = []
    for e in manifest["wheels"]:
        path = house / e["file"]
        if not path.exists():
            sys.exit(f"{path}: missing (manifest lists {e['name']} {e['version']})")
        if sha256(path) != e["sha256"]:
            sys.exit(f"{path}: sha256 differs from {house / MANIFEST}; not installing a changed wheel")
        files.append(str(path))
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--find-links", str(house), "--no-deps",
           "--no-compile", "--quiet", *(["--target", args.target] if args.target else []), *files]
    subprocess.run(cmd, check=True)
    print(f"installed {len(files)} wheels from {house} with no package index"
          + (f" into {args.target}" if args.target else ""))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    m = sub.add_parser("make", help="resolve and download, where the registry is reachable")
    m.add_argument("out")
    m.add_argument("requirements", nargs="*")
    m.add_argument("--pinned", help="file of name==version lines: the resolution to use (e.g. from an earlier "
                   "manifest), instead of resolving the requirements")
    m.add_argument("--python-version", required=True, help="the target's, e.g. 3.12")
    m.add_argument("--platform", action="append", help="the target's wheel platform tags (repeat)")
    m.add_argument("--present", help="file: distributions the target already has, one a line")
    m.add_argument("--drop", action="append", help="DIST:GLOB, members of DIST's wheel the target never loads")
    p = sub.add_parser("pack", help="cut the wheelhouse into compressed parts")
    p.add_argument("wheelhouse")
    p.add_argument("to")
    p.add_argument("--part-mib", type=int, default=48)
    p.add_argument("--name", default="wheelhouse")
    p.add_argument("--preset", type=int, default=6, help="xz preset 0-9; -1: no compression (a tar of the wheels as "
                   "they are, when the packing machine has no CPU to spare)")
    i = sub.add_parser("install", help="on the target: install with no package index")
    i.add_argument("wheelhouse")
    i.add_argument("--parts", action="append", help="a folder of parts (parts.json) to rejoin first (repeat)")
    i.add_argument("--target", help="pip's --target folder (else the running Python's site-packages)")
    args = ap.parse_args(argv)
    {"make": make, "pack": pack, "install": install}[args.verb](args)


if __name__ == "__main__":
    main()
