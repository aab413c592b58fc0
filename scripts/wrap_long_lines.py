"""Re-wrap only the statements, comments and docstrings that have a line over N characters (issue 51).

    python scripts/wrap_long_lines.py [PATH ...] [--max N] [--dry-run] [--list-remaining]

PATH defaults to forge/ (a directory is searched for *.py; a file is taken as is), N to 100. Every other line
of a file is left as it was: this tool is not `ruff format`, which would restyle the whole code base.

Per file, in three passes, each on the text the one before left:
1. Comments. A run of whole-line `#` comments with a line over N has that line's paragraph (or list item)
   re-flowed to N; a trailing comment that makes its line too long is pulled nearer its code, else moved onto
   its own lines above the code. Pragma comments (noqa, type:, pragma, fmt: ...) never move.
2. Docstrings (triple-quoted) with a line over N: that paragraph or list item is re-flowed to N, keeping the
   indentation; code blocks (indented or fenced), tables (`|`), doctest lines (`>>>`) and directives stay.
3. Code. Each remaining statement with a line over N goes through `ruff format --line-length N --range`, which
   formats the statements enclosing the range (for a compound statement, only its header); the result is kept
   only if it changed nothing outside that statement and left it with fewer lines over N. So a statement that is
   long because of one string literal stays as it is: ruff never splits a string, and neither does this tool.

Safety: a file is written only if its AST, docstrings whitespace-collapsed, is identical before and after;
otherwise it is left as it was and named in the output. Comments are not in the AST: they are only moved or
re-flowed, never reworded.
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

PRAGMA = re.compile(r"#\s*(noqa|type:|pragma|fmt:|isort:|pylint:|mypy:|nosec|ruff:)|#!|-\*-")
LIST_MARKER = re.compile(r"([-*+]|\d+[.)])\s+(?=\S)")
VERBATIM_START = ("|", ">>>", "...", ".. ", "```", "~~~")


@dataclass
class Tally:
    files: int = 0
    changed: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    before: list[int] = field(default_factory=lambda: [0, 0, 0, 0])  # lines, over N, chars, non-blank lines
    after: list[int] = field(default_factory=lambda: [0, 0, 0, 0])
    remaining: list[str] = field(default_factory=list)


def measure(text: str, max_len: int, into: list[int]) -> None:
    for line in text.splitlines():
        into[0] += 1
        into[1] += len(line) > max_len
        into[2] += len(line)
        into[3] += bool(line.strip())


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
        doc = _docstring_expr(node)
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


def _docstring_expr(node: ast.AST) -> ast.Expr | None:
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            return first
    return None


# --- string literals: split into adjacent literals, which Python joins into the very same constant ------------

def split_strings(text: str, max_len: int) -> str:
    """Split, at a space, each one-line string literal inside brackets that crosses column max_len, continuing it
    on the next line at its own column (`"a b"` -> `"a "` / `"b"`). The AST does not see the difference: the
    parser joins adjacent literals, f-strings included. Python 3.12+ tokenizes f-strings in parts: there only
    plain literals are split."""
    while True:
        lines, depth, before = text.splitlines(), 0, None
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
            elif (tok.type == tokenize.STRING and tok.start[0] == tok.end[0] and tok.start[1] < max_len < tok.end[1]
                  and len(lines[tok.start[0] - 1]) > max_len):
                line, (start, end) = lines[tok.start[0] - 1], (tok.start[1], tok.end[1])
                new = None
                if depth > 0:
                    new = _split_literal(line, start, end, max_len)
                elif before in ("=", "return", "yield") and not line[end:].strip():   # `x = "..."` -> `x = ("..." ...)`
                    new = _split_literal(line[:start] + "(" + line[start:], start + 1, end + 1, max_len)
                    new = new and [new[0], new[1] + ")"]
                if new:
                    lines[tok.start[0] - 1: tok.start[0]] = new
                    text = "\n".join(lines) + "\n"
                    break
            if tok.type not in (tokenize.NL, tokenize.COMMENT):
                before = tok.string
        else:
            return text


def _split_literal(line: str, start: int, end: int, max_len: int) -> list[str] | None:
    literal = line[start:end]
    opening = re.match(r"([a-zA-Z]*)(['\"])", literal)
    if opening is None or literal.startswith(opening.group(0) * 3) or "b" in opening.group(1).lower():
        return None
    prefix, quote = opening.groups()
    raw, fmt = "r" in prefix.lower(), "f" in prefix.lower()
    body = literal[opening.end(): -1]
    if not raw and "\\N{" in body:
        return None
    depth, cut, i = 0, None, 0
    while i < len(body):
        ch = body[i]
        if fmt and ch in "{}" and body[i: i + 2] in ("{{", "}}") and depth == 0:
            i += 2
            continue
        depth += (ch == "{") - (ch == "}") if fmt else 0
        if ch == "\\" and not raw:
            i += 2
            continue
        if (ch == " " and depth == 0 and start + opening.end() + i + 2 <= max_len and i > 10
                and (i + 1 == len(body) or body[i + 1] != " ")):
            cut = i + 1                                 # the space ends the first part, as the house writes it
        i += 1
    if cut is None or cut >= len(body):
        return None

    def part(text: str) -> str:
        keep = prefix if not fmt or "{" in text or "}" in text else prefix.replace("f", "").replace("F", "")
        return keep + quote + text + quote

    return [line[:start] + part(body[:cut]), " " * start + part(body[cut:]) + line[end:]]


# --- pass 3: code, through ruff -------------------------------------------------------------------------------

def ruff_command() -> list[str]:
    exe = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    return [exe] if Path(exe).exists() else [sys.executable, "-m", "ruff"]


def wrap_code(text: str, path: Path, max_len: int, ruff: list[str]) -> str:
    facts = line_facts(text)
    docs = set()
    for node in ast.walk(ast.parse(text)):
        doc = _docstring_expr(node)
        if doc is not None:
            docs.update(range(doc.lineno, doc.end_lineno + 1))
    lines = text.splitlines()
    targets = [n for n, line in enumerate(lines, 1) if len(line) > max_len and n not in docs
               and not (n in facts.comments and not line[: facts.comments[n]].strip())]
    limit = len(lines) + 1                      # lines at or after this were rewritten with a later statement
    tried: set[tuple[int, str]] = set()
    for n in reversed(targets):
        if n >= limit:
            continue
        old = text.splitlines()
        if len(old[n - 1]) <= max_len:
            continue
        spec = f"--range={n}:1-{n}:{len(old[n - 1]) + 1}"
        done = subprocess.run(ruff + ["format", "--line-length", str(max_len), "--config",
                                      "format.quote-style='preserve'", spec, "--stdin-filename", str(path), "-"],
                              input=text, capture_output=True, text=True)
        if done.returncode != 0 or (n, done.stdout) in tried:
            continue
        tried.add((n, done.stdout))
        new = done.stdout.splitlines()
        head = 0
        while head < min(len(old), len(new)) and old[head] == new[head]:
            head += 1
        tail = 0
        while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
            tail += 1
        if not head < n <= len(old) - tail or any(PRAGMA.search(line) for line in old[head: len(old) - tail]):
            continue                            # unchanged, changed elsewhere, or a noqa that must stay put
        over = sum(len(line) > max_len for line in old[head: len(old) - tail])
        if sum(len(line) > max_len for line in new[head: len(new) - tail]) < over:
            text, limit = done.stdout, head + 1
    return text


# --- the safety check and the driver --------------------------------------------------------------------------

def normalized_dump(text: str) -> str:
    tree = ast.parse(text)
    for node in ast.walk(tree):
        doc = _docstring_expr(node)
        if doc is not None:
            doc.value.value = " ".join(doc.value.value.split())
    return ast.dump(tree)


def wrap_file(path: Path, max_len: int, ruff: list[str], tally: Tally, write: bool) -> None:
    original = path.read_text()
    measure(original, max_len, tally.before)
    tally.files += 1
    text = original
    if any(len(line) > max_len for line in original.splitlines()):
        text = wrap_comments(text, max_len)
        text = wrap_docstrings(text, max_len)
        text = split_strings(text, max_len)
        text = wrap_code(text, path, max_len, ruff)
        text = split_strings(text, max_len)
        if not original.endswith("\n"):
            text = text[:-1]
        if text != original and normalized_dump(text) != normalized_dump(original):
            tally.refused.append(str(path))
            text = original
    measure(text, max_len, tally.after)
    if text != original:
        tally.changed.append(str(path))
        if write:
            path.write_text(text)
    _note_remaining(path, text, max_len, tally)


def _note_remaining(path: Path, text: str, max_len: int, tally: Tally) -> None:
    facts = line_facts(text)
    docs, kept = set(), set()
    runtime_docs = re.search(r"^\s*(from|import)\s+(pydantic|fastapi)\b", text, re.M) is not None
    for node in ast.walk(ast.parse(text)):
        doc = _docstring_expr(node)
        if doc is not None:
            docs.update(range(doc.lineno, doc.end_lineno + 1))
            if "__doc__" in text or (runtime_docs and not isinstance(node, ast.Module)):
                kept.update(range(doc.lineno, doc.end_lineno + 1))
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) > max_len:
            col = facts.comments.get(n)
            why = ("docstring read at run time" if n in kept else "docstring" if n in docs else "comment" if col is not None and not line[:col].strip()
                   else "in a multi-line string" if n in facts.in_string
                   else "pragma comment" if col is not None and PRAGMA.search(line[col:])
                   else "string literal" if re.search(r"[\"']", line) else "code")
            tally.remaining.append(f"{path}:{n}: [{why}] {len(line)} chars")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", default=["forge"], help="files or directories (default: forge)")
    parser.add_argument("--max", type=int, default=100, metavar="N", help="longest line wanted (default 100)")
    parser.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")
    parser.add_argument("--list-remaining", action="store_true", help="name every line still over N, and why")
    args = parser.parse_args(argv)
    files = []
    for name in args.paths:
        p = Path(name)
        files.extend(sorted(p.rglob("*.py")) if p.is_dir() else [p])
    tally, ruff, started = Tally(), ruff_command(), time.monotonic()
    for path in files:
        wrap_file(path, args.max, ruff, tally, write=not args.dry_run)
    b, a = tally.before, tally.after
    if args.list_remaining:
        print("\n".join(tally.remaining))
    print(f"{tally.files} files, {len(tally.changed)} {'would change' if args.dry_run else 'changed'}, "
          f"{time.monotonic() - started:.1f} s")
    for label, t in (("before", b), ("after", a)):
        print(f"{label:>6}: {t[0]} lines, {t[1]} over {args.max} ({100 * t[1] / max(t[0], 1):.1f} %), mean length "
              f"{t[2] / max(t[0], 1):.1f} ({t[2] / max(t[3], 1):.1f} over non-blank lines)")
    for path in tally.refused:
        print(f"left as it was (its AST would have changed): {path}")
    return 1 if tally.refused else 0


if __name__ == "__main__":
    sys.exit(main())
