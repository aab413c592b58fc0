"""`forge report RUN`: render a run report's plots (PNG) beside it or into --out."""
from __future__ import annotations

from pathlib import Path

import click

from forge.errors import UsageError, display_path


def find_report(run: str) -> Path:
    """RUN is a report (its .json or .md), an output file whose `<output>.report.json` sits beside
    it, or a run directory."""
    from forge.report import report_paths

    given = Path(run)
    for suffix in (".report.json", ".report.md"):
        if given.name.endswith(suffix):
            path = given.with_name(given.name.removesuffix(suffix) + ".report.json")
            if path.is_file():
                return path
            raise UsageError(f"{display_path(path)}: no such run report")
    candidate = report_paths(given)[0]
    if candidate.is_file():
        return candidate
    if not given.exists():
        raise UsageError(f"{display_path(given)}: no such output, report or folder")
    raise UsageError(f"{display_path(given)}: no run report found (looked for "
                     f"{display_path(candidate)}; "
                     "forge run and forge deploy write <output>.report.json beside their output)")


def register(cli: click.Group) -> None:
    @cli.command("report")
    @click.argument("run", type=click.Path(dir_okay=True, file_okay=True))
    @click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
                  help="Folder for the PNG files (default: beside the report).")
    def report(run: str, out_dir: str | None) -> None:
        """Plot a run report: tokens/s per card, in flight and queue depth, budget and KV use.

        RUN is the report (.report.json or .report.md), the run's output file (its report sits
        beside it), or a run folder."""
        from forge.report.plots import render_plots

        path = find_report(run)
        for png in render_plots(path, out_dir):
            click.echo(display_path(png))
