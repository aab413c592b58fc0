"""Re-flow the comments and docstrings that have a line over N characters (scripts/wrap_long_lines.py's first
two passes; see there). Only whitespace between words changes: no word is split, reworded or reordered."""
from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass

PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:|isort:|pylint:|mypy:|nosec|ruff:)|#!|-\*-")
LIST_MARKER = re.compile(r"([-*+]|\d+[.)])\s+(?=\S)")
VERBATIM_START = ("|", ">>>", "...", ".. ", "```", "~~~")


# --- what the tokenizer knows about each line -------------------------------------------------------------------

@dataclass
class LineFacts:
    comments: dict[int, int]   # line -> column of its comment
    in_string: set[int]        # lines that begin inside a string (a multi-line string's later lines)


def line_facts(text: str) -> LineFacts:
    facts = LineFacts({}, set())
    starts = []                # open f-strings (Python 3.12+ tokenizes them in parts)
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            facts.comments[tok.start[0]] = tok.start[1]
        elif tok.type == getattr(tokenize, "FSTRING_START", None):
            starts.append(tok.start[0])
        elif tok.type == getattr(tokenize, "FSTRING_END", None):
            facts.in_string.update(range(starts.pop() + 1, tok.end[0] + 1))
        elif tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            facts.in_string.update(range(tok.start[0] + 1, tok.end[0] + 1))
    return facts


# --- re-flowing prose (comment runs and docstrings share this) --------------------------------------------------

def reflow(rows: list[tuple[str, str]], base: str, max_len: int) -> list[str] | None:
    """rows: (prefix, body) per line, where a plain paragraph line's prefix is `base` (the docstring's first line
    carries its quotes in its prefix). Returns the new lines, or None when no paragraph needed re-flowing.
    Paragraphs and list items holding a line over max_len are re-flowed; everything else is kept verbatim."""
    groups: list[tuple[str, list[int]]] = []      # (kind, row indexes); kind: para, item, verbatim
    fenced = unwrapped = False                          # unwrapped: a click \b paragraph (no re-wrap)
    for i, (prefix, body) in enumerate(rows):
        extra = len(prefix) - len(base) if prefix.startswith(base) and not prefix[len(base):].strip() else -1
        stripped = body.strip()
        last = groups[-1] if groups else ("verbatim", [])
        unwrapped = (unwrapped or stripped == "\\b") and bool(stripped)
        if unwrapped:
            groups.append(("verbatim", [i]))
        elif stripped.startswith(("```", "~~~")):
            fenced = not fenced
            groups.append(("verbatim", [i]))
        elif (fenced or not stripped or stripped.startswith(VERBATIM_START) or stripped in ('"""', "'''")
              or PRAGMA.match("#" + stripped)):
            groups.append(("verbatim", [i]))
        elif extra == 0 or (i == 0 and extra < 0):
            kind = "item" if LIST_MARKER.match(stripped) else "para"
            if kind == "para" and last[0] == "para" and i > 0:
                last[1].append(i)
            else:
                groups.append((kind, [i]))
        elif last[0] == "item" and extra == _hang(rows[last[1][0]], base) and not LIST_MARKER.match(stripped):
            last[1].append(i)
        elif last[0] == "item" and extra > 0 and LIST_MARKER.match(stripped):
            groups.append(("item", [i]))                    # a nested list item
        else:
            groups.append(("verbatim", [i]))                # an indented code block, or an odd indentation
    out, touched = [], False
    for kind, idx in groups:
        lines = [rows[i][0] + rows[i][1] for i in idx]
        if kind == "verbatim" or all(len(line) <= max_len for line in lines):
            out.extend(lines)
            continue
        first_prefix, first_body = rows[idx[0]]
        plain = first_prefix.startswith(base) and not first_prefix[len(base):].strip()
        indent = first_prefix if plain else base           # not plain: the docstring's line with its quotes
        first_prefix += first_body[: len(first_body) - len(first_body.lstrip())]
        words = " ".join(rows[i][1].strip() for i in idx)
        marker = LIST_MARKER.match(words) if kind == "item" else None
        if marker:
            first_prefix, words = first_prefix + marker.group(0), words[marker.end():]
            indent += " " * marker.end()
        out.extend(textwrap.wrap(words, width=max_len, initial_indent=first_prefix, subsequent_indent=indent,
                                 break_long_words=False, break_on_hyphens=False))
        touched = True
    return out if touched else None


def _hang(row: tuple[str, str], base: str) -> int:
    prefix, body = row
    marker = LIST_MARKER.match(body.strip())
    return (len(prefix) - len(base)) + (len(body) - len(body.lstrip())) + (len(marker.group(0)) if marker else 0)


# --- pass 1: comments -----------------------------------------------------------------------------------------

def wrap_comments(text: str, max_len: int) -> str:
    lines = text.splitlines()
    facts = line_facts(text)
    edits: list[tuple[int, int, list[str]]] = []          # (first index, end index, replacement)
    n = 1
    while n <= len(lines):
        col = facts.comments.get(n)
        line = lines[n - 1]
        if col is not None and not line[:col].strip():      # a run of whole-line comments at one column
            end = n
            while facts.comments.get(end + 1) == col and not lines[end][:col].strip():
                end += 1
            if any(len(lines[i - 1]) > max_len for i in range(n, end + 1)):
                rows = [_comment_row(lines[i - 1], col) for i in range(n, end + 1)]
                new = reflow(rows, " " * col + "# ", max_len)
                if new is not None:
                    edits.append((n - 1, end, new))
            n = end + 1
            continue
        if col is not None:                                  # trailing comments aligned at one column
            end = n                                         # (and their whole-line continuations)
            while facts.comments.get(end + 1) == col:
                end += 1
            if any(len(lines[i - 1]) > max_len for i in range(n, end + 1)):
                edits.extend(_trailing_run(lines, n, end, col, max_len, facts))
            n = end + 1
            continue
        n += 1
    for start, end, new in reversed(edits):
        lines[start:end] = new
    return "\n".join(lines) + "\n"


def _trailing_run(lines: list[str], first: int, last: int, col: int, max_len: int, facts: LineFacts):
    """Pull the whole run's comments left, still aligned, when that is enough. Else each comment with a long line
    (with its whole-line continuations) on its own: two spaces after its code, or re-flowed onto its own lines
    above the code."""
    codes = [lines[i - 1][:col].rstrip() for i in range(first, last + 1)]
    comments = [lines[i - 1][col:] for i in range(first, last + 1)]
    new_col = max(len(code) for code in codes) + 2
    if new_col < col and all(new_col + len(comment) <= max_len for comment in comments):
        yield first - 1, last, [code.ljust(new_col) + comment for code, comment in zip(codes, comments)]
        return
    units: list[list[int]] = []                     # a code line with its whole-line continuations
    for i, code in enumerate(codes):
        if code.strip() or not units:
            units.append([i])
        else:
            units[-1].append(i)
    for unit in units:
        n, code = first + unit[0], codes[unit[0]]
        text = " ".join(comments[i].lstrip("#").strip() for i in unit)
        if all(len(lines[first + i - 1]) <= max_len for i in unit) or not _movable(lines, n, col, facts):
            continue
        if all(len(code) + 2 + len(comments[i]) <= max_len for i in unit):
            yield n - 1, n + len(unit) - 1, [codes[i].ljust(len(code) + 2) + comments[i] for i in unit]
        else:
            indent = " " * (len(code) - len(code.lstrip()))
            above = textwrap.wrap(text, width=max_len, initial_indent=indent + "# ", subsequent_indent=indent + "# ",
                                  break_long_words=False, break_on_hyphens=False)
            yield n - 1, n + len(unit) - 1, above + [code]


def _comment_row(line: str, col: int) -> tuple[str, str]:
    rest = line[col + 1:]
    if rest.startswith(" ") and not rest.startswith("  "):
        return line[: col + 2], rest[1:]
    if not rest.startswith(" "):                            # `#!`, `#:`, `#---`: never a paragraph line
        return line, ""
    body = rest.lstrip()
    return line[: col + 1] + rest[: len(rest) - len(body)], body


def _movable(lines: list[str], n: int, col: int, facts: LineFacts) -> bool:
    comment = lines[n - 1][col:]
    return (not PRAGMA.search(comment) and n not in facts.in_string
            and not (n > 1 and lines[n - 2].rstrip().endswith("\\")) and bool(lines[n - 1][:col].strip()))


# --- pass 2: docstrings ---------------------------------------------------------------------------------------

def wrap_docstrings(text: str, max_len: int) -> str:
    if "__doc__" in text:
        return text                                 # the module reads docstrings at run time: keep them
    # pydantic and FastAPI put class and function docstrings into schemas and /openapi.json: keep those
    runtime_docs = re.search(r"^\s*(from|import)\s+(pydantic|fastapi)\b", text, re.M) is not None
    lines = text.splitlines()
    edits = []
    for node in ast.walk(ast.parse(text)):
        doc = docstring_expr(node)
        if doc is None or (runtime_docs and not isinstance(node, ast.Module)):
            continue
        if not any(len(lines[i - 1]) > max_len for i in range(doc.lineno, doc.end_lineno + 1)):
            continue
        first, last = lines[doc.lineno - 1], lines[doc.end_lineno - 1]
        opening = re.match(r"[rRuU]?('''|\"\"\")", first[doc.col_offset:])
        source = ast.get_source_segment(text, doc.value)
        if (not opening or first[: doc.col_offset].strip() or last[doc.end_col_offset:].strip() or source is None
                or not source.endswith(opening.group(1)) or source.count(opening.group(1)) != 2
                or any(line.endswith("\\") for line in source.splitlines())):
            continue                                        # single-quoted, concatenated or line-continued
        head = doc.col_offset + opening.end()
        rows = [(first[:head], first[head:])]
        for line in lines[doc.lineno: doc.end_lineno]:
            body = line.lstrip()
            rows.append((line[: len(line) - len(body)], body))
        new = reflow(rows, " " * doc.col_offset, max_len)
        if new is not None:
            edits.append((doc.lineno - 1, doc.end_lineno, new))
    for start, end, new in sorted(edits, reverse=True):
        lines[start:end] = new
    return "\n".join(lines) + "\n"


def docstring_expr(node: ast.AST) -> ast.Expr | None:
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            return first
    return None
