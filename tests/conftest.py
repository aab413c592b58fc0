"""Suite-wide settings: no third-party plugins, a FORGE_HOME and a HOME of its own, nothing written
into the checkout, and the `slow` marker.

`python -m pytest` runs the fast tests (no forge process, worker, Ray cluster or bench run end to
end); `python -m pytest -m ''` (or `--slow`) runs all of them; `-m slow` only the whole-product
runs. Named paths (`python -m pytest tests/e2e`) run every test in them, slow or not, unless -m says
otherwise.
"""
import atexit
import importlib.util
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests import checkout_state
from tests.forge_cli import TEST_PLUGINS

# Tests never load third-party entry points; built-ins register as usual, and forge-bench's plugin
# (`forge bench`, the test engines instant and faults) by name: the README's test command installs
# it.
os.environ.setdefault("FORGE_LOAD_PLUGINS", TEST_PLUGINS)
sys._called_from_test = True  # type: ignore[attr-defined]
ROOT = Path(__file__).resolve().parent.parent


def _private_cache(name: str) -> Path:
    """A folder of this user's in the temp folder that outlives the session (a cache), or, where
    that name is taken by a link or by a folder another user could write (who could plant bytecode
    there), one for this session only."""
    path = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022:
            return path
    except OSError:
        pass
    path = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


# Nothing written into the checkout (tests/test_checkout_clean.py): every interpreter the suite runs
# (this one, xdist's workers, each forge, card worker and Ray process they start) keeps its bytecode
# in one cache in the temp folder (PYTHONPYCACHEPREFIX) instead of __pycache__ beside the sources,
# and writes it there even where the user set PYTHONDONTWRITEBYTECODE (as the development and CI
# machines do, to keep bytecode out of the tree): without bytecode each forge process compiled forge
# again (an instant-engine `forge run`: 0.55 s of CPU instead of 0.40; the suite once byte-compiled
# forge into the checkout for that). The cache outlives the session because a cold one costs a
# process that imports torch and transformers 5 s of CPU. Hypothesis keeps its example database
# beside it.
os.environ.setdefault("PYTHONPYCACHEPREFIX", str(_private_cache("forge-tests-pycache")))
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.pycache_prefix, sys.dont_write_bytecode = os.environ["PYTHONPYCACHEPREFIX"], False
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(_private_cache("forge-tests-hypothesis")))

# Ctrl-C as a terminal gives it: a suite started in the background by a script (`cmd &` without job
# control: POSIX starts it with SIGINT ignored) would pass the ignored SIGINT on to every forge it
# starts, and forge keeps an ignored Ctrl-C ignored on purpose (forge/cli/interrupt.py: a shell's
# background job), so the Ctrl-C tests would test that instead and wait out their timeouts.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A FORGE_HOME for this test process before anything runs, so that a module- or session-scoped
# fixture that provisions a node (before any per-test fixture) never registers it in the user's
# ~/.forge. Each test then gets its own (the autouse fixture below); a subprocess inherits whichever
# is set.
os.environ["FORGE_HOME"] = tempfile.mkdtemp(prefix="forge-home-session-")
atexit.register(shutil.rmtree, os.environ["FORGE_HOME"], ignore_errors=True)

# What the checkout holds beside its tracked files before the run (the controller's view;
# pytest_sessionfinish).
_CHECKOUT_BEFORE = (
    checkout_state.new_paths(ROOT) if "PYTEST_XDIST_WORKER" not in os.environ else None
)
USER_HOME = Path.home()
_USER_ENV = {**os.environ}

# The user's ~/.forge out of reach: HOME is a folder of this session's own, for this process and
# every process it starts, so whatever resolves `~` lands there; at the end of the run its .forge
# must not exist (pytest_sessionfinish). Only what the suite runs is watched: a snapshot of the
# user's own ~/.forge, before and after, failed the run whenever the user's own forge (a node they
# serve) wrote there meanwhile. Caches and configuration stay the user's (XDG_CACHE_HOME,
# XDG_CONFIG_HOME, git's ~/.gitconfig): libraries keep their downloads and font caches, git its
# settings.
os.environ.setdefault("XDG_CACHE_HOME", str(USER_HOME / ".cache"))
os.environ.setdefault("XDG_CONFIG_HOME", str(USER_HOME / ".config"))
if (USER_HOME / ".gitconfig").is_file():
    os.environ.setdefault("GIT_CONFIG_GLOBAL", str(USER_HOME / ".gitconfig"))
SUITE_HOME = Path(tempfile.mkdtemp(prefix="forge-tests-home-"))
os.environ["HOME"] = str(SUITE_HOME)
atexit.register(shutil.rmtree, SUITE_HOME, ignore_errors=True)

# Modules that run the whole product: forge or a card worker in a subprocess, a Ray cluster, a bench
# end to end. A module lists itself here or sets `pytestmark = pytest.mark.slow`; single tests carry
# @pytest.mark.slow.
SLOW_MODULES = frozenset(
    {
        "tests/bench/test_forge_mode_down.py",
        "tests/bench/test_sweep_cli.py",
        "tests/bench/test_direct_child.py",
        "tests/cluster/test_cluster_ray.py",
        "tests/e2e/test_ctrl_c.py",
        "tests/e2e/test_forge_run.py",
        "tests/e2e/test_installed_wheel.py",
        "tests/e2e/test_job_checks.py",
        "tests/e2e/test_node_identity.py",
        "tests/e2e/test_provision_deploy.py",
        "tests/ledger/test_kill9.py",
        "tests/node/test_local_node.py",
        "tests/node/test_worker_lifecycle.py",
        "tests/reliability/test_deploy_faults.py",
        "tests/reliability/test_engine_faults.py",
        "tests/reliability/test_exit_codes.py",
        "tests/reliability/test_full_disk.py",
        "tests/reliability/test_fuzz_functions.py",
        "tests/reliability/test_fuzz_records.py",
        "tests/reliability/test_kill_run.py",
        "tests/reliability/test_ledger_damage.py",
        "tests/reliability/test_cli_never_overwrites.py",
        "tests/reliability/test_report_failures.py",
        "tests/reliability/test_unrepresentable_values_through_the_engine.py",
        "tests/reliability/test_security.py",
        "tests/reliability/test_signals.py",
        "tests/reliability/test_soak.py",
        "tests/serve/test_cancel.py",
        "tests/serve/test_cli_and_load.py",
        "tests/serve/test_client_mistakes.py",
        "tests/serve/test_endpoints.py",
        "tests/serve/test_http_limits.py",
        "tests/serve/test_overload.py",
        "tests/serve/test_prompt_bounds.py",
        "tests/serve/test_remote.py",
        "tests/serve/test_unrepresentable_values_over_http.py",
        "tests/top/test_top_live_node.py",
        "tests/bench/test_vllm_bench.py",
        "tests/e2e/test_chat_and_stop.py",
        "tests/e2e/test_input_shards.py",
        "tests/e2e/test_killed_start_report.py",
        "tests/e2e/test_registry_origin.py",
        "tests/e2e/test_screens_fit.py",
        "tests/node/test_prefix_reuse_replicas.py",
        "tests/reliability/test_closed_streams.py",
        "tests/reliability/test_error_budget.py",
        "tests/reliability/test_parquet_input.py",
        "tests/reliability/test_poison_results.py",
        "tests/reliability/test_side_files.py",
        "tests/e2e/test_warm_node.py",
    }
)
# the real vLLM engine: its engine core is a process of its own
SLOW_FOLDERS = ("tests/vllm_backend/",)
# Modules whose tests share a module-scoped fixture that takes seconds to set up (a worker's engine,
# a Ray cluster, a served node): under -n their tests run on one worker (pytest_xdist_make_scheduler
# below).
SHARED_FIXTURE_MODULES = frozenset(
    {
        "tests/cluster/test_cluster_ray.py",
        "tests/conformance/test_engines.py",
        "tests/e2e/test_retry_errors.py",
        "tests/engines/test_guided.py",
        "tests/engines/test_transformers_backend.py",
        "tests/serve/test_client_messages.py",
        "tests/serve/test_client_mistakes.py",
        "tests/serve/test_endpoints.py",
        "tests/serve/test_hostile_clients.py",
        "tests/serve/test_hostile_guides.py",
        "tests/serve/test_http_limits.py",
        "tests/serve/test_openai_params.py",
        "tests/serve/test_openai_parse.py",
        "tests/serve/test_overload.py",
        "tests/serve/test_prompt_bounds.py",
        "tests/serve/test_unrepresentable_values_over_http.py",
        "tests/top/test_top_live_node.py",
        "tests/vllm_backend/test_engine.py",
        "tests/vllm_backend/test_forge_run.py",
        "tests/vllm_backend/test_refusals_and_preemption.py",
        "tests/vllm_backend/test_serve.py",
        "tests/vllm_backend/test_seeded_run.py",
    }
)



def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the tests marked `long` (soak, many kill points, long fault "
                          "runs)")
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked `slow` (the same as -m '')")


def pytest_configure(config):
    if importlib.util.find_spec("forge_bench") is None:
        raise pytest.UsageError("the tests need forge-bench (`forge bench`, the engines instant "
                                "and faults): "
                                "pip install -e '.[bench]' -e ./bench")
    # Plain `python -m pytest` (no test paths given) selects the fast tests; named paths run as
    # asked, and an explicit -m (even -m '') or --slow decides otherwise.
    if config.getoption("--slow"):
        config.option.markexpr = ""
    elif (config.args_source != pytest.Config.ArgsSource.ARGS
          and not any(a == "-m" or a.startswith("-m") for a in config.invocation_params.args)):
        config.option.markexpr = "not slow"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: before the core deselects by -m, so the marks added here count.
    for item in items:
        path = Path(item.path).resolve()
        name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else ""
        if name in SLOW_MODULES or name.startswith(SLOW_FOLDERS):
            item.add_marker(pytest.mark.slow)
    if config.getoption("--long"):
        return
    skip = pytest.mark.skip(reason="long test: run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)


def pytest_xdist_make_scheduler(config, log):
    """Under `-n`: xdist's load scheduling, except that the tests of a module in
    SHARED_FIXTURE_MODULES go to one worker together, so its module-scoped fixture (a vLLM load, a
    Ray cluster, a served node) is set up once, not once on each worker. (xdist's own `--dist
    loadgroup` does not group under pytest 9.2: its worker renames `item._nodeid`, which the node id
    no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in SHARED_FIXTURE_MODULES else nodeid

    config.option.loadscopereorder = False  # the files' order, as xdist's load scheduling keeps it
    return SharedFixtureScheduling(config, log)


def pytest_sessionfinish(session, exitstatus):
    """A run that wrote ~/.forge or left files in the checkout fails, whatever its tests said.

    ~/.forge is the session's own HOME's (above; tests/test_hermetic.py says why nothing may land
    there): whatever is found there, only the suite wrote. The user's own ~/.forge is out of the
    suite's reach and no longer watched: comparing it before and after failed the run whenever the
    user's own forge wrote there meanwhile."""
    forge_dir = SUITE_HOME / ".forge"
    if forge_dir.exists():
        written = sorted(str(p.relative_to(SUITE_HOME)) for p in forge_dir.rglob("*")) or [".forge"]
        sys.stderr.write("\nthe test run wrote ~/.forge (FORGE_HOME ignored somewhere): "
                         f"{written[:10]}\n")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if "PYTEST_XDIST_WORKER" not in os.environ:
        left = checkout_state.left_behind(
            _CHECKOUT_BEFORE, checkout_state.new_paths(ROOT, env=_USER_ENV)
        )
        if left:
            sys.stderr.write(f"\nthe test run left files in the checkout {ROOT}: {left[:10]} "
                             "(write to tmp_path)\n")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def forge_home(tmp_path_factory, monkeypatch):
    """Every test its own FORGE_HOME (provisioned nodes' state files): nothing reads or writes
    ~/.forge."""
    home = tmp_path_factory.mktemp("forge-home")
    monkeypatch.setenv("FORGE_HOME", str(home))
    return home


# What makes a test slow: a process that runs forge (the CLI or a card worker) or Ray. A test that
# starts one and is not marked slow fails, so plain `pytest` stays the fast tests as tests are
# added.
_started: list = []
_real_popen_init = subprocess.Popen.__init__


def _recording_popen_init(self, args, *a, **kw):
    _started.append(args)
    _real_popen_init(self, args, *a, **kw)


subprocess.Popen.__init__ = _recording_popen_init


@pytest.fixture(autouse=True)
def _fast_tests_start_no_product(request):
    """Fails a test that is not marked slow but starts forge, a card worker or Ray in a process of
    its own."""
    _started.clear()
    yield
    if request.node.get_closest_marker("slow") is None:
        from tests.forge_cli import runs_the_product

        product = [a for a in _started if runs_the_product(a)]
        if product:
            pytest.fail(f"{request.node.nodeid} starts {product[0]!r} in a process of its own: "
                        "mark it slow "
                        "(tests/conftest.py SLOW_MODULES, or @pytest.mark.slow), or use "
                        "tests/forge_cli.py invoke()",
                        pytrace=False)
