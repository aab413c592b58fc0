"""The shipped Grafana dashboard and Prometheus config only name series forge exports."""
import json
import re
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from forge.metrics import ForgeMetrics

from sample_stats import observe_all

DOCS = Path(__file__).resolve().parents[2] / "docs"
METRIC = re.compile(r"\bforge_[a-z_]+")
SELECTOR = re.compile(r"\b(forge_[a-z_]+)\{([^}]*)\}")
MATCHER = re.compile(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)")
BY = re.compile(r"\bby\s*\(([^)]*)\)")


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """Every sample name forge exports (with _total/_sum/_count), mapped to its label names."""
    metrics = ForgeMetrics()
    observe_all(metrics)
    names: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(metrics.exposition().decode()):
        for s in fam.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads((DOCS / "grafana" / "forge.json").read_text())


def queries(dashboard: dict) -> list[tuple[str, str]]:
    out = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


def _balanced(expr: str) -> bool:
    stack, pairs = [], {")": "(", "]": "[", "}": "{"}
    for ch in re.sub(r'"[^"]*"', '""', expr):        # brackets inside label values do not count
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs and (not stack or stack.pop() != pairs[ch]):
            return False
    return not stack


def test_dashboard_is_a_grafana_dashboard_with_the_promised_panels(dashboard):
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"] == "forge"
    titles = {p["title"] for p in dashboard["panels"]}
    for wanted in (
        "Tokens/s per card",
        "Token budget use per card",
        "In flight vs slots",
        "Queue depth per stage",
        "Stalls, progress-only steps, refusals, retries",
        "Prefix reuse",
        "Padding",
        "KV cache blocks",
        "Ledger commit latency",
        "Requests by outcome",
    ):
        assert wanted in titles
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"DS_PROMETHEUS", "node", "card"} <= variables
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"], p["title"]


def test_every_query_names_only_exported_metrics_and_labels(dashboard, exported):
    seen = set()
    for title, expr in queries(dashboard):
        assert _balanced(expr), f"{title}: unbalanced brackets in {expr}"
        names = METRIC.findall(expr)
        assert names, f"{title}: query names no forge metric: {expr}"
        for name in names:
            assert name in exported, f"{title}: {name} is not exported by ForgeMetrics"
            seen.add(name)
        for name, matchers in SELECTOR.findall(expr):
            for label in MATCHER.findall(matchers):
                assert label in exported[name], f"{title}: {name} has no label {label}"
        for group in BY.findall(expr):
            labels = {x.strip() for x in group.split(",")}
            assert any(labels <= exported[n] for n in names), (
                f"{title}: no metric in `{expr}` has labels {labels}"
            )
    assert len(seen) >= 25


def test_prometheus_example_scrapes_node_and_run():
    config = yaml.safe_load((DOCS / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"forge-node", "forge-run"}
    for job in jobs.values():
        assert job["metrics_path"] == "/metrics"
        assert all(re.fullmatch(r"[\w.-]+:\d+", t) for t in job["static_configs"][0]["targets"])


def test_metrics_doc_lists_every_family():
    doc = (DOCS / "metrics.md").read_text()
    metrics = ForgeMetrics()
    observe_all(metrics)
    for fam in text_string_to_metric_families(metrics.exposition().decode()):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        assert f"`{name}`" in doc, f"docs/metrics.md does not describe {name}"
