"""Putting what `forge contract new` drafted on disk: checked first by the load pipeline `forge
validate` runs (the contract in a temporary file beside --out, on a node holding its card in forge's
own temporary folder), then put in place with a hard link, which never replaces a file that appeared
meanwhile. Nothing is written over, through a link, or twice (--out and --node-out naming one file);
a refusal names the path as the user gave it."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from forge.errors import ForgeError, display_path

# What validation says of a checkpoint folder holding config.json alone: expected when sizing before
# a download.
NOT_DOWNLOADED = ("no weight files", "no tokenizer files")


@dataclass
class Written:
    files: list[Path]
    warnings: list[str] = field(default_factory=list)  # validation's warnings, rendered
    pending: list[str] = field(default_factory=list)   # what validation refuses until the download


def check_targets(out: Path, node_out: Optional[Path]) -> None:
    """Refuse, before any work, a target that exists, a folder through a dangling link, or one file
    named twice."""
    for path, flag in ((out, "--out"), (node_out, "--node-out")):
        if path is None:
            continue
        if os.path.lexists(path):
            what = "is a symbolic link" if os.path.islink(path) else "exists"
            raise ForgeError(f"{display_path(path)}: {what}; {flag} never writes over a file or "
                             "through a link: "
                             "choose another path")
        _check_folders(path, flag)
    if node_out is not None and _same_file(out, node_out):
        raise ForgeError(f"{display_path(node_out)}: --node-out names the same file as --out "
                         f"({display_path(out)}): "
                         "the node would overwrite the contract just written: give the node a path "
                         "of its own")


def _check_folders(path: Path, flag: str) -> None:
    """Each existing folder above `path` is a folder (a link to a missing folder is named as the
    link)."""
    folder = Path(os.path.abspath(path)).parent
    for above in [*reversed(folder.parents), folder]:
        if not os.path.lexists(above):
            return                      # created when writing
        if os.path.islink(above) and not os.path.exists(above):
            raise ForgeError(f"{display_path(path)}: its folder {display_path(above)} is a "
                             "symbolic link to "
                             f"{os.readlink(above)}, which does not exist: create that folder or "
                             f"choose another {flag}")
        if not os.path.isdir(above):
            raise ForgeError(f"{display_path(path)}: {display_path(above)} is not a folder: choose "
                             f"another {flag}")


def _same_file(a: Path, b: Path) -> bool:
    ra, rb = os.path.realpath(a), os.path.realpath(b)
    return ra == rb or os.path.abspath(a) == os.path.abspath(b)


def _make_folder(path: Path) -> None:
    try:
        os.makedirs(Path(os.path.abspath(path)).parent, exist_ok=True)
    except OSError as e:
        raise ForgeError(f"{display_path(path)}: cannot create its folder: {e.strerror}") from None


def _staged(path: Path, text: str) -> Path:
    """`text` in a fresh temp file beside `path` (mkstemp: a new name, never a link)."""
    try:
        fd, tmp = tempfile.mkstemp(
            dir=Path(os.path.abspath(path)).parent,
            prefix=f".{path.name[:100]}.",
            suffix=".new.yaml",
        )
    except OSError as e:
        raise ForgeError(f"{display_path(path)}: cannot write there: {e.strerror}") from None
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
    except BaseException:
        os.unlink(tmp)
        raise
    return Path(tmp)


def _put(tmp: Path, path: Path, flag: str) -> None:
    """tmp becomes path, unless something is there by now (then tmp goes and the user is told)."""
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ForgeError(f"{display_path(path)}: appeared while forge was drafting it; {flag} "
                             "never writes over "
                             "a file: choose another path") from None
        except OSError:  # a filesystem without hard links: rename, after one more look
            if os.path.lexists(path):
                raise ForgeError(
                    f"{display_path(path)}: exists; {flag} never writes over a file"
                ) from None
            os.rename(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_checked(contract_text: str, node_text_for, out: Path, node_out: Optional[Path], *,
                  weights_present: bool) -> Written:
    """Check the contract on its card through the load pipeline, then write it (and the node).
    `node_text_for( contract_file, node_file, checked)`: the node's YAML; checked=True is the fully
    stated node the check uses."""
    from forge.config.files import shown
    from forge.config.load import load_paths

    check_targets(out, node_out)
    _make_folder(out)
    tmp = _staged(out, contract_text)
    written = Written(files=[])
    try:
        with tempfile.TemporaryDirectory(prefix="forge-contract-new-") as d:
            check_node = Path(d) / "node.yaml"
            check_node.write_text(node_text_for(tmp, check_node, True), encoding="utf-8")
            loaded = load_paths([tmp, check_node])
            names = {shown(tmp): display_path(out),
                     shown(check_node): display_path(node_out) if node_out else "<its one-card "
                                                                                "node>"}
        errors = []
        for p in loaded.problems:
            line = (
                f"{names.get(p.file, p.file)}::{p.path}: "
                + ("" if p.severity == "error" else "warning: ")
                + p.message.replace(str(tmp), str(out))
            )
            if p.severity != "error":
                written.warnings.append(line)
            elif (
                not weights_present
                and p.path == "$.artifact.checkpoint"
                and p.message.startswith(NOT_DOWNLOADED)
            ):
                written.pending.append(line)
            else:
                errors.append(line)
        if errors:
            raise ForgeError("the contract drafted from these flags fails forge's own checks, so "
                             "nothing was "
                             "written:\n" + "\n".join(errors))
        _put(tmp, out, "--out")
    finally:
        if tmp.exists():
            tmp.unlink()
    written.files.append(out)
    if node_out is not None:
        try:
            _make_folder(node_out)
            _put(_staged(node_out, node_text_for(out, node_out, False)), node_out, "--node-out")
        except BaseException:
            out.unlink()                # the contract just written goes too: a rerun starts clean
            raise
        written.files.append(node_out)
    return written
