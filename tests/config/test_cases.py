"""Data-driven validation cases: add a folder under tests/cases/{valid,invalid}/, no code."""
from __future__ import annotations

import pytest

from forge.config.load import load_paths
from tests.config.casefiles import case_dirs, mismatches, read_expected


@pytest.mark.parametrize("case", case_dirs("valid"), ids=lambda d: d.name)
def test_valid_case(case, monkeypatch):
    monkeypatch.chdir(case)
    loaded = load_paths(["."])
    assert loaded.ok, "\n".join(p.render() for p in loaded.problems)
    assert mismatches(read_expected(case), loaded.problems) == []


@pytest.mark.parametrize("case", case_dirs("invalid"), ids=lambda d: d.name)
def test_invalid_case(case, monkeypatch):
    expected = read_expected(case)
    assert any(e.severity == "error" for e in expected), (
        f"{case.name}: expected.txt must name at least one error"
    )
    monkeypatch.chdir(case)
    loaded = load_paths(["."])
    assert not loaded.ok
    assert mismatches(expected, loaded.problems) == []
