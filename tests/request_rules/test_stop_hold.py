"""Stop strings applied to text that arrives in pieces (forge/requests/stops.py::StopHold): whatever
the pieces, what it lets out joins into a prefix of the whole text cut by apply_stop, and into all
of it once the text is complete."""
import itertools
import random

import pytest

from forge.requests.stops import StopHold, StopRule, apply_stop_text

TEXTS = [
    "Hello world. The end. More",
    "abcabcabd",
    "no stop in here at all",
    "xx<|END|>yy<|END|>",
    "END",
]
RULES = [
    StopRule(("end",)),
    StopRule(("abd", "ca")),
    StopRule(("<|END|>",), include=True),
    StopRule(("END", "D")),
    StopRule(("zz",)),
    StopRule(("c", "cab"), include=True),
]


@pytest.mark.parametrize("text,rule", list(itertools.product(TEXTS, RULES)))
def test_pieces_join_into_the_whole_cut(text, rule):
    rng = random.Random(7)
    whole = apply_stop_text(text, rule)
    for _ in range(20):
        hold, out, at = StopHold(rule), "", 0
        while at < len(text):
            step = rng.randint(1, 4)
            out += hold.take(text[at:at + step])
            at += step
            assert whole.startswith(out), (text, rule, out)
        # what is held back at the end is what the final answer adds (Node.stream sends the rest of
        # the cut text)
        assert whole.startswith(out) and (
            hold.matched or len(whole) - len(out) < max(map(len, rule.strings))
        )


def test_text_that_may_begin_a_stop_string_waits_for_the_next_piece():
    hold = StopHold(StopRule(("STOP",)))
    assert hold.take("abc ST") == "abc "
    assert hold.take("O") == ""
    assert hold.take("Y here") == "STOY here"
    assert hold.take(" STOP and more") == " " and hold.matched and hold.take("x") == ""
