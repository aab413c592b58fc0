"""`forge report` writes its PNGs over earlier PNGs only: a file of that name that is not a PNG is refused
before any plot is drawn (issue 13, item 1: every file forge writes is checked for what it would overwrite)."""
import pytest

from forge.errors import ForgeError
from forge.report import Sampler, write_report
from forge.report.plots import render_plots

from synthetic_run import SyntheticRun, drive


def test_plots_never_replace_a_file_that_is_not_a_png(tmp_path):
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0, max_points=256)
    drive(sampler, sim)
    output = tmp_path / "out.jsonl"
    output.write_text("")
    json_path, _ = write_report(output, {"function": "f"}, sampler, final_sample=False)
    paths = render_plots(json_path)                        # first time: written
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    assert render_plots(json_path) == paths                # its own PNGs: written again
    paths[1].write_text("my notes")
    with pytest.raises(ForgeError, match=r"out.jsonl.report.in-flight-queues.png: exists and is not a PNG"):
        render_plots(json_path)
    assert paths[1].read_text() == "my notes"
