"""The operator's windows in the environment (FORGE_STALL_WINDOW_S, FORGE_SESSION_LEASE_S): read
once per process, refused in one line naming the variable when they are not seconds in range. The
tests that run a node with a short window are the fault tests
(tests/reliability/test_deploy_faults.py, test_signals.py)."""
from __future__ import annotations

import math

import pytest

from forge import constants
from tests.forge_cli import invoke


@pytest.fixture
def problems(monkeypatch):
    found: list[str] = []
    monkeypatch.setattr(constants, "ENVIRONMENT_PROBLEMS", found)
    return found


@pytest.mark.parametrize(
    "text, want", [(None, 30.0), ("", 30.0), ("8", 8.0), ("2.5", 2.5), ("3600", 3600.0)]
)
def test_a_window_in_range_is_taken_and_unset_is_the_default(monkeypatch, problems, text, want):
    if text is None:
        monkeypatch.delenv("FORGE_TEST_WINDOW_S", raising=False)
    else:
        monkeypatch.setenv("FORGE_TEST_WINDOW_S", text)
    assert constants._seconds_from_environment("FORGE_TEST_WINDOW_S", 30.0, 1.0, 3600.0) == want
    assert problems == []


@pytest.mark.parametrize("text", ["abc", "0", "0.5", "3601", "nan", "inf", "-8", "8s"])
def test_anything_else_is_a_problem_naming_the_variable(monkeypatch, problems, text):
    monkeypatch.setenv("FORGE_TEST_WINDOW_S", text)
    got = constants._seconds_from_environment("FORGE_TEST_WINDOW_S", 30.0, 1.0, 3600.0)
    assert got == 30.0 and not math.isnan(got)
    assert problems == [f"environment variable FORGE_TEST_WINDOW_S={text!r}: expected seconds from "
                        "1 to 3600 "
                        "(unset: 30)"]


def test_the_cli_refuses_to_start_on_a_problem_in_one_line(problems):
    problems.append("environment variable FORGE_STALL_WINDOW_S='abc': expected seconds from 1 to "
                    "3600 (unset: 30)")
    r = invoke("status")
    assert r.returncode == constants.EXIT_USAGE
    assert r.stderr.strip() == ("forge: environment variable FORGE_STALL_WINDOW_S='abc': expected "
                                "seconds from 1 to "
                                "3600 (unset: 30)")
    assert r.stdout == ""
