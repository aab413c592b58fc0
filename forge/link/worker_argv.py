"""The command line of a card worker: the forge this node runs, wherever the user stands.

`python -m forge.host` put the working directory first on the worker's import path: started from the
folder that holds a clone named `forge`, the clone's top folder shadowed the installed package and
every worker died at start (ModuleNotFoundError). Two things make the worker import exactly the
node's forge:
- `-P` (Python 3.11's safe_path): no working directory (nor script folder) prepended to the import
  path, so no folder where the user stands shadows forge or any library the engine imports;
- forge itself is loaded from the node's own package folder (by file location, not by a search of
  the path), so a node started from a checkout that is not installed (`python -m forge` inside it)
  gets workers of that same checkout, and an installed node gets the installed one. Only `forge` is
  pinned: every other import resolves as it would for the node, the path's order untouched."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import forge

_BOOT = ("import importlib.util, runpy, sys\n"
         "spec = importlib.util.spec_from_file_location('forge', {init!r}, "
         "submodule_search_locations=[{pkg!r}])\n"
         "module = importlib.util.module_from_spec(spec)\n"
         "sys.modules['forge'] = module\n"
         "spec.loader.exec_module(module)\n"
         "runpy.run_module('forge.host', run_name='__main__', alter_sys=True)\n")


def package_folder() -> Path:
    """The folder of the forge package this process runs."""
    return Path(forge.__file__).resolve().parent


def worker_argv(fd: int) -> list[str]:
    """`python [the interpreter's own flags] -P -c BOOT FD`: forge.host's main, on the socket end
    FD. The interpreter's own flags go along (-X importtime, -W, -O ...), as multiprocessing passes
    them."""
    pkg = package_folder()
    boot = _BOOT.format(init=str(pkg / "__init__.py"), pkg=str(pkg))
    return [sys.executable, *subprocess._args_from_interpreter_flags(), "-P", "-c", boot, str(fd)]
