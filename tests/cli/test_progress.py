"""The live progress says what each figure is: the elapsed time is labelled, tokens/s counts
generated tokens (prompt tokens/s beside it), and a multi-step job shows its calls in flight."""
import io
import time

from forge.functions.progress import Progress, status_line
from forge.stats import RunStats


def test_bar_and_lines_label_the_elapsed_time():
    stats = RunStats(total=10, done=4, started_at=time.time() - 75)
    buf = io.StringIO()
    with Progress("bar", stats, label="fn", stream=buf) as bar:
        bar.update()
    # the run's clock
    assert "4/10 generated 0 tok/s · 0 calls in flight · elapsed 0:01:1" in buf.getvalue()
    assert "| elapsed 0:01:1" in status_line(stats)


def test_tokens_per_second_are_generated_first_then_prompt_and_calls_in_flight_show():
    stats = RunStats(
        total=10,
        done=4,
        in_flight=3,
        calls_in_flight=5,
        input_tokens=9000,
        output_tokens=1000,
        started_at=time.time() - 10,
    )
    line = status_line(stats)
    assert line.startswith("generated 100 tok/s · prompt 900 tok/s | records 4/10 done"), line
    assert "| in flight 3 records, 5 calls |" in line
    buf = io.StringIO()
    with Progress("bar", stats, label="fn", stream=buf) as bar:
        bar.update()
    # in 80 columns
    assert "4/10 generated 100 tok/s · 5 calls in flight · elapsed 0:00:1" in buf.getvalue()
