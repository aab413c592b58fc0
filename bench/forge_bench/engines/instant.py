"""The `instant` backend: NO MODEL. It answers every request with synthetic tokens at once (or at a
configured token rate), so forge's own control plane (broker, admission, ledger, writers) can be
measured without an engine in the way. Its outputs mean nothing; every report of it says "instant
(no model)".

Output: exactly max_new_tokens ids derived from the prompt (crc32 of the ids), never special ids,
finish reason "length". With `instant: {tokens_per_s_limit: R}` the engine spends R tokens per
second (input + output, the quantity the broker balances on) on its requests in FIFO order, which is
how two engines of known, different speeds are tested deterministically. With `instant:
{step_cpu_ms: X}` it is instead a continuous batcher that spends X ms of pure-Python CPU time per
step while holding the GIL, and processes up to the contract's token budget over its slots each step
(instant_steps.py): a CPU-bound engine, so contention between engines and the control plane can be
measured without GPUs.

Tokenizer: `tokenizer.json` from the contract's artifact tokenizer (else checkpoint) directory,
loaded with the `tokenizers` library (no transformers import); a directory with a tokenizer.json but
no `tokenizers` library is refused rather than silently counted differently. Without a
tokenizer.json: a byte tokenizer (id = byte+3, bos 1, eos 2), which the contract's vocab_size must
cover."""
from __future__ import annotations

import json
import math
import threading
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Hashable, Optional, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from forge.backends import Backend
from forge.engines.interface import (
    Engine,
    EngineBusy,
    EngineFailed,
    EngineRequest,
    EngineResult,
    IterationStats,
    Progress,
)
from forge.errors import ConfigError, EngineUnavailable, ForgeError, Problem, display_path
from forge_bench.engines.instant_steps import StepBatcher

BACKEND = "instant"
LABEL = "instant (no model): control-plane ceiling only, outputs are synthetic"
HIDDEN_SIZE = 16          # want_hidden returns this many deterministic floats (not a model state)
BURST_S = 0.25            # a rate-limited engine banks at most this much time's worth of tokens
MAX_STEP_CPU_MS = 1000.0  # one step must fit well inside the runtime's engine-call limits


class InstantSection(BaseModel):
    """`instant:` contract section (optional)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    tokens_per_s_limit: Optional[float] = Field(
        None, gt=0, description="emulate an engine delivering this many (input + output) tokens "
                                "per second; "
        "default: unlimited (every request finishes at the next poll)")
    step_cpu_ms: Optional[float] = Field(
        None, gt=0, le=MAX_STEP_CPU_MS, description="run as a continuous batcher that spends this "
                                                    "many "
        "milliseconds of pure-Python CPU time per step while holding the GIL; each step processes "
        "up to "
        "limits.max_num_tokens tokens over up to limits.max_batch_size requests (decode first, "
        "then prefill)")

    @model_validator(mode="after")
    def _one_speed_model(self) -> "InstantSection":
        if self.tokens_per_s_limit is not None and self.step_cpu_ms is not None:
            raise ValueError("give tokens_per_s_limit or step_cpu_ms, not both")
        return self


def section_of(contract, key: str, model: type[BaseModel]) -> Optional[BaseModel]:
    """A backend section of a contract as its model, whether the loader stored a model or a plain mapping."""
    raw = contract.sections.get(key)
    if raw is None or isinstance(raw, model):
        return raw
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        where = (
            display_path(contract.source) if contract.source else f"contract {contract.contract}"
        )
        raise ConfigError(
            [
                Problem(
                    where,
                    "$." + ".".join([key, *(str(p) for p in err["loc"])]),
                    err["msg"].removeprefix("Value error, "),
                )
                for err in e.errors()
            ]
        ) from None


class ByteTokenizer:
    """One token per UTF-8 byte (id = byte + 3); 0 pad, 1 bos, 2 eos."""

    eos_token_id = 2
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return [1] + [b + 3 for b in text.encode("utf-8")]

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode("utf-8", errors="replace")


class JsonTokenizer:
    """A `tokenizers` tokenizer.json, with the eos id from the directory's config files."""

    def __init__(self, directory: Path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise EngineUnavailable(f"{display_path(directory / 'tokenizer.json')} needs the "
                                    "`tokenizers` library "
                                    "(pip install 'forge-llm[engine]')") from None
        self._tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.vocab_size = self._tok.get_vocab_size()
        self.eos_token_id = _eos_id(directory, self._tok)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)


def _eos_id(directory: Path, tok) -> Optional[int]:
    for name, key in (("config.json", "eos_token_id"), ("tokenizer_config.json", "eos_token"),
                      ("special_tokens_map.json", "eos_token")):
        try:
            value = json.loads((directory / name).read_text()).get(key)
        except (OSError, ValueError):
            continue
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and tok.token_to_id(value) is not None:
            return tok.token_to_id(value)
    return None


def load_tokenizer(contract):
    art = contract.artifact
    directory = contract.resolve(art.tokenizer or art.checkpoint)
    if directory is not None and (directory / "tokenizer.json").is_file():
        return JsonTokenizer(directory)
    tok = ByteTokenizer()
    if contract.model.vocab_size < tok.vocab_size:
        where = (
            display_path(contract.source) if contract.source else f"contract {contract.contract}"
        )
        raise ForgeError(f"{where}::$.model.vocab_size: the instant backend's byte "
                         f"tokenizer needs {tok.vocab_size} ids (no tokenizer.json found), got "
                         f"{contract.model.vocab_size}")
    return tok


@dataclass
class _Job:
    req: EngineRequest
    blocks: int
    cost: int                       # input + output tokens
    prompt_len: int
    spent: int = 0
    error: Optional[str] = None

    def produced(self) -> int:
        return max(0, min(self.spent - self.prompt_len, self.req.max_new_tokens))


def synthetic_output(prompt: Sequence[int], n: int, lo: int, hi: int) -> list[int]:
    """n ids in [lo, hi), a pure function of the prompt."""
    h = zlib.crc32(b",".join(str(i).encode() for i in prompt))
    return [lo + (h + i * 7919) % (hi - lo) for i in range(n)]


class InstantEngine(Engine):
    name = BACKEND
    supports_hidden = True
    supports_guides = frozenset()

    def __init__(self, contract, plan, section: Optional[InstantSection] = None):
        self.contract, self.plan = contract, plan
        self.section = section or InstantSection()
        self.tokenizer = load_tokenizer(contract)
        self._lim, self._tpb = contract.limits, contract.kv_cache.tokens_per_block
        self._lo, self._hi = (
            3,
            max(4, min(contract.model.vocab_size, getattr(self.tokenizer, "vocab_size", 1 << 30))),
        )
        self._jobs: "OrderedDict[str, _Job]" = OrderedDict()
        self._cancels: set[str] = set()
        self._cond = threading.Condition()
        self._closed = False
        self._credit = 0.0
        self._refilled = time.monotonic()
        self._steps = self._last_step_tokens = 0
        self._batcher: Optional[StepBatcher] = None
        if self.section.step_cpu_ms is not None:
            self._batcher = StepBatcher(
                cpu_ms=self.section.step_cpu_ms,
                token_budget=self._lim.max_num_tokens,
                tokens_per_block=self._tpb,
                cache_blocks=plan.num_blocks,
                block_reuse=contract.kv_cache.block_reuse,
            )

    def describe(self) -> dict[str, Any]:
        return {
            "backend": BACKEND,
            "label": LABEL,
            "tokens_per_s_limit": self.section.tokens_per_s_limit,
            "step_cpu_ms": self.section.step_cpu_ms,
            "tokenizer": type(self.tokenizer).__name__,
        }

    def submit(self, requests: Sequence[EngineRequest]) -> None:
        with self._cond:
            if self._closed:
                raise EngineFailed("instant engine is shut down")
            blocks = [
                math.ceil((len(r.prompt_ids) + r.max_new_tokens) / self._tpb) for r in requests
            ]
            used = sum(j.blocks for j in self._jobs.values())
            if (
                len(self._jobs) + len(requests) > self._lim.max_batch_size
                or used + sum(blocks) > self.plan.num_blocks
            ):
                raise EngineBusy(f"instant engine full ({len(self._jobs)} active, {used} blocks "
                                 "used)")
            if not self._jobs:           # an idle engine banks no credit
                self._refilled, self._credit = time.monotonic(), 0.0
            for r, b in zip(requests, blocks):
                if r.request_id in self._jobs:
                    raise ValueError(f"request {r.request_id!r} is already in the engine")
                job = _Job(
                    req=r,
                    blocks=b,
                    cost=len(r.prompt_ids) + r.max_new_tokens,
                    prompt_len=len(r.prompt_ids),
                )
                if (
                    len(r.prompt_ids) > self._lim.max_input_len
                    or r.max_new_tokens > self._lim.max_output_len
                ):
                    job.error = (f"prompt {len(r.prompt_ids)} / output {r.max_new_tokens} tokens "
                                 "exceed the contract's "
                                 f"max_input_len {self._lim.max_input_len} / max_output_len "
                                 f"{self._lim.max_output_len}")
                elif r.guide is not None:
                    job.error = "the instant backend does not support guided output"
                elif self._batcher is not None:
                    self._batcher.admit(job, r.prompt_ids)
                self._jobs[r.request_id] = job
            self._cond.notify_all()

    def cancel(self, request_id: Hashable) -> None:
        with self._cond:
            if request_id in self._jobs:
                self._cancels.add(request_id)
                self._cond.notify_all()

    def poll(self, timeout_s: float) -> Progress:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if self._batcher is not None:
            return self._poll_steps(deadline)
        with self._cond:
            while True:
                progress = self._step(time.monotonic())
                remaining = deadline - time.monotonic()
                if progress.results or progress.new_tokens or self._closed or remaining <= 0:
                    return progress
                rate = self.section.tokens_per_s_limit
                self._cond.wait(min(remaining, 1.0 / rate) if rate and self._jobs else remaining)

    def _poll_steps(self, deadline: float) -> Progress:
        """Step the batcher until a request finishes or the deadline passes (a step started before the
        deadline runs to its end, as a real engine's does); tokens of every step are reported."""
        out = Progress()
        with self._cond:
            while True:
                self._settle(out)
                live = [
                    j
                    for j in self._jobs.values()
                    if j.error is None and j.req.request_id not in self._cancels
                ]
                if live and not self._closed:
                    out.new_tokens += self._batcher.step(live)
                    self._steps, self._last_step_tokens = (
                        self._batcher.steps,
                        self._batcher.last_step_tokens,
                    )
                    self._settle(out)
                remaining = deadline - time.monotonic()
                if out.results or self._closed or remaining <= 0:
                    return out
                if not live:
                    self._cond.wait(remaining)

    def _settle(self, out: Progress) -> None:
        """Hand out every job that is finished, cancelled or refused."""
        for key, job in list(self._jobs.items()):
            if key in self._cancels or job.error is not None or job.spent >= job.cost:
                out.results.append(self._result(job, "cancelled" if key in self._cancels else None))
                del self._jobs[key]
                self._cancels.discard(key)

    def _step(self, now: float) -> Progress:
        rate = self.section.tokens_per_s_limit
        if not self._jobs:
            self._refilled = now
            return Progress()
        if rate:
            self._credit = min(
                self._credit + rate * (now - self._refilled), max(rate * BURST_S, 1.0)
            )
        self._refilled = now
        out, new_tokens = Progress(), 0
        for key, job in list(self._jobs.items()):
            before = job.produced()
            if key not in self._cancels and job.error is None:
                if rate is None:
                    job.spent = job.cost
                else:
                    take = min(int(self._credit), job.cost - job.spent)
                    job.spent += take
                    self._credit -= take
            new_tokens += job.produced() - before
            if key in self._cancels or job.error is not None or job.spent >= job.cost:
                out.results.append(self._result(job, "cancelled" if key in self._cancels else None))
                del self._jobs[key]
                self._cancels.discard(key)
        out.new_tokens = new_tokens
        if out.results or new_tokens:
            self._steps += 1
            self._last_step_tokens = new_tokens
        return out

    def _result(self, job: _Job, reason: Optional[str]) -> EngineResult:
        r = job.req
        if job.error is not None:
            return EngineResult(
                request_id=r.request_id, output_ids=[], finish_reason="error", error=job.error
            )
        ids = synthetic_output(r.prompt_ids, job.produced(), self._lo, self._hi)
        hidden = None
        if r.want_hidden:
            hidden = [
                (x % 1000) / 1000.0 for x in synthetic_output(r.prompt_ids, HIDDEN_SIZE, 0, 1 << 20)
            ]
        return EngineResult(
            request_id=r.request_id, output_ids=ids, finish_reason=reason or "length", hidden=hidden
        )

    def stats(self) -> IterationStats:
        with self._cond:
            used = sum(j.blocks for j in self._jobs.values())
            hits = self._batcher.prefix_hit_tokens if self._batcher is not None else 0
            return IterationStats(
                active=len(self._jobs),
                queued=0,
                kv_blocks_used=used,
                kv_blocks_free=self.plan.num_blocks - used,
                tokens_last_step=self._last_step_tokens,
                steps=self._steps,
                prefix_hit_tokens=hits,
            )

    def shutdown(self, timeout_s: float) -> None:
        with self._cond:
            self._closed = True
            self._jobs.clear()
            self._cond.notify_all()


def _factory(contract, plan) -> InstantEngine:
    return InstantEngine(contract, plan, section_of(contract, BACKEND, InstantSection))


def backend() -> Backend:
    """The `instant` backend as one object; forge_bench.plugin registers it."""
    return Backend(name=BACKEND, factory=_factory, section=InstantSection, label=LABEL)
