"""The live progress says what each figure is: the bar's elapsed time is labelled, the lines carry it too."""
import io
import time

from forge.functions.progress import Progress, status_line
from forge.stats import RunStats


def test_bar_and_lines_label_the_elapsed_time():
    stats = RunStats(total=10, done=4, started_at=time.time() - 75)
    buf = io.StringIO()
    with Progress("bar", stats, label="fn", stream=buf) as bar:
        bar.update()
    assert "· elapsed 0:00:0" in buf.getvalue()            # the bar times itself from its start
    assert "| elapsed 0:01:1" in status_line(stats)
