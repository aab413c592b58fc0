"""HOME is a folder of the session's own (tests/conftest.py), for the tests and every process they
start: whatever resolves `~` (`~/.forge`, were FORGE_HOME ignored) lands there and the user's own
home is never written; the run fails if that folder's .forge exists at its end. The user's caches
and configuration stay theirs."""
from __future__ import annotations

import os
import pwd
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.forge_cli import forge_env


def test_home_is_the_sessions_own_folder_in_tmp():
    home = Path.home()
    assert os.environ["HOME"] == str(home) and home.name.startswith("forge-tests-home-")
    assert home.parent == Path(tempfile.gettempdir())
    assert home != Path(pwd.getpwuid(os.getuid()).pw_dir)
    # libraries keep their downloads and settings
    for cache in ("XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        assert not Path(os.environ[cache]).is_relative_to(home), cache


def test_a_process_started_as_the_tests_start_forge_resolves_home_there():
    out = subprocess.run([sys.executable, "-c", "import os; print(os.path.expanduser('~/.forge'))"],
                         env=forge_env(), capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == str(Path.home() / ".forge")
