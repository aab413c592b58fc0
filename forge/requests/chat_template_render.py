"""A model's chat template rendered within bounds: a template is code from the model's files, and
one that loops (`range(100000)` nested twice) or builds a huge string (`{{ 'x' * 300000000 }}`) must
cost its request, never the node: it held the run's event loop for minutes, or made a 300 MB prompt.

- Time: the render runs in the caller's worker thread (never on an event loop) under a trace hook
  that counts only the template's own frames and raises once RENDER_TIMEOUT_S has passed. (A thread
  cannot be killed; the hook makes the template stop itself, at its next line.)
- Size: `*`, `+`, `**` and `%` are intercepted by the sandbox (jinja2's intercepted_binops), so a
  string, list or number past `limit_chars` is refused before it is made; so is a width past it
  given to a string method (`center`, `ljust`, `zfill`, `format`, ...) or to the filters that pad
  (`center`, `indent`, `format`); the output is gathered piece by piece and refused past the limit
  too.

The environment is what transformers' apply_chat_template gives a template (jinja2's immutable
sandbox with trim_blocks, lstrip_blocks, loop controls, a `tojson` that keeps non-ASCII,
`raise_exception`, `strftime_now`, the `{% generation %}` tag as a plain block), so a template
renders here as it does there."""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from datetime import datetime
from functools import lru_cache
from typing import Any, Optional

from forge.errors import RequestRejected

RENDER_TIMEOUT_S = 5.0            # a real chat template renders in milliseconds
FALLBACK_LIMIT_CHARS = 4 * 2**20  # where the node does not know its longest prompt
TEMPLATE_FILE = "<template>"      # the file name jinja2 gives compiled template code


class _TooBig(Exception):
    pass


_WIDTHS = re.compile(r"[%{:][^a-zA-Z%{}]*?(\d+)")     # the numbers of %-format and {}-format specs


def _check_widths(fmt: Any, limit: int) -> None:
    if isinstance(fmt, str):
        for width in _WIDTHS.findall(fmt):
            if len(width) > 9 or int(width) > limit:
                raise _TooBig(f"a format width of {width}")


def _check_ints(args: tuple, limit: int, what: str) -> None:
    for a in args:
        if isinstance(a, int) and not isinstance(a, bool) and a > limit:
            raise _TooBig(f"{what}({a:,})")


class _TooSlow(Exception):
    pass


def _size(value: Any) -> int:
    if isinstance(value, (str, bytes, list, tuple)):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3          # about its decimal digits
    return 0


def _environment():
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` (assistant masks for training) renders its body
        as is."""
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller):
            return caller()

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "+", "**", "%"})

        def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805 - jinja2's own signature
            owner = getattr(__obj, "__self__", None)
            if isinstance(owner, str):      # a str method's width (center, ljust, zfill, ...)
                limit = _limit()
                _check_ints(
                    args + tuple(kwargs.values()),
                    limit,
                    getattr(__obj, "__name__", "a string method"),
                )
            return super().call(__context, __obj, *args, **kwargs)

        def wrap_str_format(self, value):      # str.format and format_map: the spec's widths first
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None

            def bounded(*args, **kwargs):
                _check_widths(value.__self__, _limit())
                return wrapped(*args, **kwargs)
            return bounded

        def call_binop(self, context, operator, left, right):
            limit = _limit()
            if operator == "%":
                _check_widths(left, limit)
            elif operator == "*" and (
                isinstance(left, (str, list, tuple)) or isinstance(right, (str, list, tuple))
            ):
                seq, times = (
                    (left, right) if isinstance(left, (str, list, tuple)) else (right, left)
                )
                if isinstance(times, int) and len(seq) * max(times, 0) > limit:
                    raise _TooBig(f"{len(seq):,} x {times:,}")
            elif operator == "+" and _size(left) + _size(right) > limit:
                raise _TooBig("a concatenation")
            elif (
                operator == "**"
                and isinstance(left, int)
                and isinstance(right, int)
                and right > 0
                and abs(left) > 1
                and right * max(abs(left).bit_length(), 1) > 64 * 1024
            ):
                raise _TooBig(f"{left} ** {right}")
            return super().call_binop(context, operator, left, right)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = Bounded(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols]
    )
    for name in ("center", "indent", "format", "wordwrap", "truncate"):
        env.filters[name] = _bounded_filter(name, env.filters[name])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_RENDERING = threading.local()      # this thread's render: its size limit


def _limit() -> int:
    return getattr(_RENDERING, "limit_chars", FALLBACK_LIMIT_CHARS)


def _bounded_filter(name: str, inner):
    """A jinja2 filter that pads or formats, refusing a width past the render's limit before it
    runs."""
    import functools

    @functools.wraps(inner)
    def bounded(*args, **kwargs):
        limit = _limit()
        _check_ints(args[1:] + tuple(kwargs.values()), limit, name)
        if name == "format" and args:
            _check_widths(args[0], limit)
        return inner(*args, **kwargs)

    return bounded
_ENV_LOCK = threading.Lock()
_ENV: list = []


@lru_cache(maxsize=16)
def _compiled(source: str):
    with _ENV_LOCK:
        if not _ENV:
            _ENV.append(_environment())
    return _ENV[0].from_string(source)


def _deadline_tracer(deadline: float):
    """A trace function for this thread: the template's own lines (and the jinja2 runtime calls they
    make) check the clock; every other frame runs untraced."""
    def local(frame, event, arg):
        if time.monotonic() > deadline:
            raise _TooSlow()
        return local

    def trace(frame, event, arg):
        if time.monotonic() > deadline:
            raise _TooSlow()
        return local if frame.f_code.co_filename == TEMPLATE_FILE else None

    return trace


def render_template(
    source: str,
    messages: list[dict],
    special_tokens: dict,
    *,
    limit_chars: int,
    where: str,
    timeout_s: Optional[float] = None,
) -> str:
    """The template rendered for `messages` with the generation prompt, or RequestRejected in one
    line naming `where` (the model's template). Blocking: call it in a worker thread."""
    import jinja2

    limit = limit_chars or FALLBACK_LIMIT_CHARS
    timeout_s = RENDER_TIMEOUT_S if timeout_s is None else timeout_s
    variables = {**special_tokens, "messages": messages, "tools": None, "documents": None,
                 "add_generation_prompt": True}
    previous = sys.gettrace()
    _RENDERING.limit_chars = limit
    # the compile too: it folds constants
    sys.settrace(_deadline_tracer(time.monotonic() + timeout_s))
    pieces, size = [], 0
    try:
        try:
            template = _compiled(source)
        except jinja2.TemplateError as e:
            raise RequestRejected(f"llm.chat: {where} does not compile: {_first_line(e)}") from None
        for piece in template.generate(**variables):
            size += len(piece)
            if size > limit:
                raise _TooBig("its output")
            pieces.append(piece)
    except RequestRejected:
        raise
    except _TooSlow:
        raise RequestRejected(f"llm.chat: {where} ran longer than {timeout_s:g} s for these "
                              "messages; refused "
                              "(a template must render in milliseconds)") from None
    except _TooBig as e:
        raise RequestRejected(f"llm.chat: {where} makes more than {limit:,} characters ({e}), "
                              "longer than any prompt "
                              "this node takes; refused") from None
    except RecursionError:
        raise RequestRejected(
            f"llm.chat: {where} recursed too deeply for these messages; refused"
        ) from None
    except Exception as e:  # noqa: BLE001 - the template's own refusal (roles that must alternate, ...): the caller's
        raise RequestRejected("llm.chat: the model's chat template refused the messages: "
                              f"{_first_line(e)}") from None
    finally:
        sys.settrace(previous)
    return "".join(pieces)


def _first_line(e: BaseException) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]
