import os
import sys

# Tests never load third-party entry points; built-ins register as usual.
os.environ.setdefault("FORGE_LOAD_PLUGINS", "")
sys._called_from_test = True  # type: ignore[attr-defined]


def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the tests marked `long` (soak, many kill points, long fault runs)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--long"):
        return
    import pytest

    skip = pytest.mark.skip(reason="long test: run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip)
