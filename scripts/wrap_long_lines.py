"""Re-wrap only the statements, comments and docstrings that have a line over N characters (issue 51).

    python scripts/wrap_long_lines.py [PATH ...] [--max N] [--dry-run] [--list-remaining]

PATH defaults to forge (a directory is searched for *.py; a file is taken as is), N to 100. Every other line of
a file is left as it was: this is not `ruff format`, which would restyle the whole code base. Run it again on a
result and nothing changes.

Per file, each pass on the text the one before left:
1. Comments (wrap_prose.py). A run of whole-line `#` comments with a line over N has that line's paragraph (or
   list item) re-flowed to N. Trailing comments aligned in a column are pulled left together when that is
   enough; else a long one (with its whole-line continuations) goes two spaces after its code, or onto its own
   lines above the code. Pragma comments (noqa, type:, pragma, fmt: ...) never move.
2. Docstrings (wrap_prose.py, triple-quoted ones): the paragraph or list item with a line over N is re-flowed,
   keeping its indentation; code blocks (indented or fenced), tables (`|`), doctest lines (`>>>`), directives
   and click's `\b` paragraphs stay as written. Docstrings read at run time stay too: every docstring of a
   module that mentions `__doc__`, class and function docstrings of a module importing pydantic or FastAPI
   (they end up in JSON schemas and /openapi.json).
3. String literals inside brackets that cross column N are split at a space into adjacent literals, continued
   on the next line at their own column; `x = "..."`, `return "..."` and `yield "..."` get parentheses for
   it. The parser joins adjacent literals (f-strings too) into the very same constant: the AST is identical.
4. Code. Each statement still with a line over N goes through `ruff format --line-length N --range` (quotes
   preserved), which formats the statements enclosing the range (for a compound statement, only its header).
   The result is kept only if it changed nothing outside that statement, moved no noqa comment, and left the
   statement with fewer lines over N. Then pass 3 again, for strings at their new indentation.

Safety: a file is written only if its AST, docstrings whitespace-collapsed, is the same before and after;
otherwise it is left as it was, named in the output, and the exit status is 1. Comments are not in the AST:
they are only moved or re-flowed, never reworded. What stays over N is listed, with the reason, by
--list-remaining: words longer than the room, tables, string literals ruff cannot place, pragma lines.
"""
from __future__ import annotations

import argparse
import ast
import io
import re
import shutil
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

from wrap_prose import PRAGMA, docstring_expr, line_facts, wrap_comments, wrap_docstrings

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
        doc = docstring_expr(node)
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
        doc = docstring_expr(node)
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
        doc = docstring_expr(node)
        if doc is not None:
            docs.update(range(doc.lineno, doc.end_lineno + 1))
            if "__doc__" in text or (runtime_docs and not isinstance(node, ast.Module)):
                kept.update(range(doc.lineno, doc.end_lineno + 1))
    for n, line in enumerate(text.splitlines(), 1):
        if len(line) > max_len:
            col = facts.comments.get(n)
            why = ("docstring read at run time" if n in kept else "docstring" if n in docs
                   else "comment" if col is not None and not line[:col].strip()
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
