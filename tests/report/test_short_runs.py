"""A run of under a second still plots: its few points are marked, so one rate between two samples
shows."""
from matplotlib.image import imread

from forge.report import Sampler, write_report
from forge.report.plots import COLORS, render_plots
from forge.stats import EngineStats, RunStats


def test_a_two_sample_run_draws_its_point(tmp_path):
    engine = EngineStats("local", "cpu0", "tiny", 512, 32, 512)
    run = RunStats(total=6, started_at=1_000.0)
    sampler = Sampler(engines=lambda: [engine], run=lambda: run)
    sampler.sample(1_000.0)
    engine.input_tokens, engine.output_tokens, run.done = 480, 200, 6        # 0.8 s later, all done
    sampler.sample(1_000.8, force=True)
    json_path, _md = write_report(
        tmp_path / "o.jsonl", {"function": "f"}, sampler, final_sample=False
    )
    tokens_png = render_plots(json_path)[0]
    pixels = imread(tokens_png)[:, :1125, :3]  # the plot area, without the legend at the right
    card = tuple(int(COLORS[0][i:i + 2], 16) / 255 for i in (1, 3, 5))
    near = (abs(pixels - card) < 0.08).all(axis=-1)
    assert near.sum() > 20, "the card's rate point is not drawn"
