"""`forge report` writes its PNGs over earlier PNGs only: a file of that name that is not a PNG is
refused before any plot is drawn (issue 13, item 1: every file forge writes is checked for what it
would overwrite)."""
import pytest

from forge.errors import ForgeError
from forge.report import Sampler, write_report
from forge.report.plots import render_plots

from synthetic_run import SyntheticRun, drive


def _report(tmp_path):
    """A report of a synthetic run beside an (empty) output in tmp_path; its JSON path."""
    sim = SyntheticRun()
    sampler = Sampler(**sim.sources(), interval_s=1.0, max_points=256)
    drive(sampler, sim)
    output = tmp_path / "out.jsonl"
    output.write_text("")
    json_path, _ = write_report(output, {"function": "f"}, sampler, final_sample=False)
    return json_path


def test_plots_never_replace_a_file_that_is_not_a_png(tmp_path):
    json_path = _report(tmp_path)
    paths = render_plots(json_path)                        # first time: written
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    assert render_plots(json_path) == paths                # its own PNGs: written again
    paths[1].write_text("my notes")
    with pytest.raises(ForgeError, match=r"out.jsonl.report.in-flight-queues.png: exists and is "
                                         r"not a PNG"):
        render_plots(json_path)
    assert paths[1].read_text() == "my notes"


def test_a_link_at_a_plot_name_is_replaced_never_written_through(tmp_path):
    """A symlink at OUT.report.NAME.png to someone's PNG: the plot replaces the link, the PNG it
    pointed at is byte for byte what it was (savefig to the path wrote through the link)."""
    json_path = _report(tmp_path)
    theirs = tmp_path / "elsewhere" / "photo.png"
    theirs.parent.mkdir()
    theirs.write_bytes(b"\x89PNG\r\n\x1a\n" + b"their picture")
    link = tmp_path / "out.jsonl.report.tokens-per-s.png"
    link.symlink_to(theirs)
    paths = render_plots(json_path)
    assert link in paths and not link.is_symlink() and link.read_bytes()[:4] == b"\x89PNG"
    assert theirs.read_bytes() == b"\x89PNG\r\n\x1a\n" + b"their picture"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
