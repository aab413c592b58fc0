"""forge's bounded chat-template renderer (forge/requests/chat_template_render.py): a real template
renders as transformers' apply_chat_template renders it; a hostile one (a model's files are code) is
refused in one line naming the template, within the time bound, before it makes a string past the
size limit. The end-to-end case, on a real tiny model copy served by a node, is
tests/node/test_one_edge.py."""
from __future__ import annotations

import time

import pytest

from forge.errors import RequestRejected
from forge.requests.chat_template_render import render_template

WHERE = "m/tokenizer_config.json's chat_template"
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "héllo"},
            {"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]
REAL = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ "
        "m['content'] | trim }}<</SYS>>"
        "{% elif loop.index0 % 2 == 0 %}[INST] {{ m['content'] }} [/INST]{% else %}{% generation "
        "%} {{ m['content'] }}"
        "{% endgeneration %}{{ eos_token }}{% endif %}{% endfor %}{{ '%-3s|' % 'a' }}{{ "
        "messages[1] | tojson }}"
        "{{ '{:>3}'.format('b') }}{{ 'c'.center(3) }}{% if add_generation_prompt %}<|assistant|>{% "
        "endif %}")


def test_a_real_template_renders_as_transformers_renders_it():
    from transformers.utils.chat_template_utils import render_jinja_template

    special = {"bos_token": "<s>", "eos_token": "</s>"}
    ours = render_template(REAL, MESSAGES, special, limit_chars=10_000, where=WHERE)
    theirs = render_jinja_template(
        conversations=[MESSAGES], chat_template=REAL, add_generation_prompt=True, **special
    )[0][0]
    assert ours == theirs and "héllo" in ours and ours.endswith("<|assistant|>")


@pytest.mark.parametrize("template, said", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran longer than 1 s"),
    ("{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
     "ran longer than 1 s|recursed too deeply"),
    ("{{ 'x' * 300000000 }}", "(1 x 300,000,000)"),
    ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor "
     "%}{{ ns.s }}",
     "a concatenation"),
    ("{{ '%999999999d' % 1 }}", "a format width of 999999999"),
    ("{{ '{:999999999}'.format(1) }}", "a format width of 999999999"),
    ("{{ 'a'.ljust(999999999) }}", "ljust(999,999,999)"),
    ("{{ 'a' | center(999999999) }}", "center(999,999,999)"),
    ("{{ 'a\nb' | indent(999999999) }}", "indent(999,999,999)"),
    ("{% for i in range(100000) %}{{ 'abcdefgh' }}{% endfor %}", "(its output)"),
    ("{{ 7 ** 999999999 }}", "7 ** 999999999"),
])
def test_a_hostile_template_is_refused_in_one_line_in_bounded_time(template, said):
    t0 = time.monotonic()
    with pytest.raises(RequestRejected) as err:
        render_template(template, MESSAGES, {}, limit_chars=100_000, where=WHERE, timeout_s=1.0)
    message = str(err.value)
    assert time.monotonic() - t0 < 20
    assert "\n" not in message and message.startswith("llm.chat: ") and WHERE in message, message
    assert any(s in message for s in said.split("|")), message


def test_the_templates_own_refusal_is_the_callers():
    with pytest.raises(RequestRejected, match="chat template refused the messages: roles must "
                                              "alternate"):
        render_template(
            "{{ raise_exception('roles must alternate') }}",
            MESSAGES,
            {},
            limit_chars=100,
            where=WHERE,
        )
    with pytest.raises(RequestRejected, match="does not compile"):
        render_template("{% for %}", MESSAGES, {}, limit_chars=100, where=WHERE)
