"""Run reports: a bounded sampler of stats objects, the JSON + Markdown report, and its plots.

`plots` (matplotlib) is imported only by `forge report`, not here, so a run pays nothing for it."""
from forge.report.report import build_report, report_paths, write_report
from forge.report.sampler import Sampler

__all__ = ["Sampler", "build_report", "report_paths", "write_report"]
